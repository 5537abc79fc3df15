"""The one user-facing exception type.

Anything wrong with what the user gave us (a file, a field, a name) raises `TrainsimError` with a message
that names the file and field. The CLI prints it as one line and exits non-zero; no traceback.
"""

from __future__ import annotations

from collections.abc import Iterable


class TrainsimError(Exception):
    """Bad input or an impossible request, described in one line."""

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None):
        self.file = file
        self.field = field
        self.reason = message  # what is wrong, without the file and field
        where = ": ".join(part for part in (file, field) if part)
        super().__init__(f"{where}: {message}" if where else message)


def unknown_name(kind: str, name: str, valid: Iterable[str], *, file: str | None = None,
                 field: str | None = None) -> TrainsimError:
    """The error for a name that is not one of the valid choices, listing them."""
    choices = ", ".join(sorted(str(v) for v in valid))
    return TrainsimError(f"unknown {kind} {name!r}; valid choices: {choices}", file=file, field=field)


def given_bool(error: dict) -> str:
    """``", got true"`` when a pydantic error is a bool given for a number (strict fields), else ``""``."""
    given = error.get("input")
    return f", got {str(given).lower()}" if isinstance(given, bool) and error.get("type", "").endswith(
        ("int_type", "float_type")) else ""


def from_validation_error(exc, *, file: str | None = None, prefix: str = "") -> TrainsimError:
    """Turn the first error of a pydantic ValidationError into a one-line TrainsimError.

    A field of several kinds (``gpus: int | list[int]``) fails once per kind, each error's location naming
    the kind (``gpus.list[int]``). Those names are not the user's fields: an error inside one kind (an
    item of the list) is reported without them, and a value of none of the kinds as what it should be
    (``gpus: should be an integer or a list``).
    """
    errors = exc.errors()
    first = errors[0]
    loc = tuple(first.get("loc", ()))
    if len(loc) >= 2 and loc[-1] == "[key]":  # a mapping's key is wrong, not its value
        if first.get("type") == "string_type":
            where = ".".join(str(p) for p in (prefix, *loc[:-2]) if p != "")
            return TrainsimError(f"the key {loc[-2]!r} should be a string (quote it in YAML)", file=file,
                                 field=where or None)
        loc = loc[:-1]  # a key that is not one of the valid ones: named as the field it makes
    kind_at = next((i for i, part in enumerate(loc) if _is_kind(part)), None)
    msg = None
    if kind_at is not None:
        branches = [e for e in errors if tuple(e.get("loc", ()))[:kind_at] == loc[:kind_at]
                    and len(e["loc"]) > kind_at and _is_kind(e["loc"][kind_at])]
        inside = [e for e in branches if len(e["loc"]) > kind_at + 1]
        if inside:  # the value was of this kind; the error is within it
            first = inside[0]
        else:
            kinds = dict.fromkeys(_KIND_WORDS.get(e["loc"][kind_at].split("[")[0].lower(), "a mapping")
                                  for e in branches)
            msg = f"should be {' or '.join(kinds)}, got {first.get('input')!r}"
        loc = tuple(part for part in first["loc"] if not _is_kind(part))
    where = ".".join(str(p) for p in loc)
    field = f"{prefix}.{where}" if prefix and where else (prefix or where or None)
    if msg is None:
        msg = first.get("msg", str(exc)).removeprefix("Value error, ")  # a validator's own words
        if first.get("type") == "extra_forbidden":
            msg = "unknown field"
        msg += given_bool(first)
    return TrainsimError(msg, file=file, field=field)


#: how a kind of value a union field takes reads in a message (pydantic's names for them, lower case)
_KIND_WORDS = {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false",
               "none": "null", "list": "a list", "tuple": "a list", "dict": "a mapping",
               "literal": "one of the named values"}


def _is_kind(part) -> bool:
    """Whether a location part names a kind of a union (``str``, ``list[int]``, a model's class name)
    rather than a field or key: field names are lower case and never hold brackets."""
    return isinstance(part, str) and bool(part) and (
        "[" in part or part in _KIND_WORDS or part[0].isupper())


def error_record(exc: TrainsimError, exit_code: int) -> dict:
    """The JSON form of an error, for commands run with ``--json``."""
    return {"error": exc.reason, "file": exc.file, "field": exc.field, "exit_code": exit_code}
