"""The one user-facing exception type.

Anything wrong with what the user gave us (a file, a field, a name) raises `TrainsimError` with a message
that names the file and field. The CLI prints it as one line and exits non-zero; no traceback.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable


class TrainsimError(Exception):
    """Bad input or an impossible request, described in one line."""

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None):
        self.file = file
        self.field = field
        self.reason = message  # what is wrong, without the file and field
        where = ": ".join(part for part in (file, field) if part)
        super().__init__(f"{where}: {message}" if where else message)


def raised_first(exc: TrainsimError) -> TrainsimError:
    """The TrainsimError as it was raised: SimPy re-raises a failed process's exception as a copy made from
    its message (without its file and field), with the original as the cause, once per process it crosses."""
    while isinstance(exc.__cause__, TrainsimError):
        exc = exc.__cause__
    return exc


#: more valid choices than this are not all listed (a model's layers, a cluster's nodes): the closest few are
MAX_LISTED = 30


def unknown_name(kind: str, name: str, valid: Iterable[str], *, file: str | None = None,
                 field: str | None = None) -> TrainsimError:
    """The error for a name that is not one of the valid choices, listing them; of a long list, the names
    closest to ``name`` and the list's ends, with its length."""
    choices = sorted({str(v) for v in valid})
    if len(choices) <= MAX_LISTED:
        return TrainsimError(f"unknown {kind} {name!r}; valid choices: {', '.join(choices)}", file=file,
                             field=field)
    close = difflib.get_close_matches(str(name), choices, n=5, cutoff=0.6)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    ends = f"{', '.join(choices[:5])}, ..., {', '.join(choices[-3:])}"
    return TrainsimError(f"unknown {kind} {name!r}{hint} ({len(choices)} valid choices: {ends})", file=file,
                         field=field)


def pydantic_message(error: dict) -> str:
    """One pydantic error in the words of the others: what the value should be and, where the value is the
    problem, what was given (``should be a valid number, got 'abc'``; ``should be greater than 0, got -1``);
    a validator's own words as they are."""
    msg = error.get("msg", "").removeprefix("Value error, ")
    kind = error.get("type", "")
    if kind == "missing":
        return "missing (required)"
    if msg.startswith("Input should be"):
        msg = msg.removeprefix("Input ").split(", unable to parse")[0].split(", got a number with")[0]
        msg = re.sub(r"a valid dictionary( or instance of \w+)?", "a mapping", msg)  # not our class names
        if "input" in error and not isinstance(error["input"], dict):
            msg += f", got {_shown(error['input'])}"
    elif kind.endswith("_parsing") or kind.endswith("_type"):
        msg += f", got {_shown(error.get('input'))}"
    return msg


def _shown(value) -> str:
    """A given value as the user wrote it in YAML: true/false/null, strings quoted, long ones cut."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


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
        inside = [e for e in branches if len(e["loc"]) > kind_at + 1 or not _wrong_kind(e)]
        if inside:  # the value was of this kind; the error is within it or in its constraint
            first = inside[0]
        else:
            kinds = dict.fromkeys(_kind_words(e, e["loc"][kind_at]) for e in branches)
            msg = f"should be {' or '.join(kinds)}, got {first.get('input')!r}"
        loc = tuple(part for part in first["loc"] if not _is_kind(part))
    where = ".".join(str(p) for p in loc)
    field = f"{prefix}.{where}" if prefix and where else (prefix or where or None)
    if msg is None:
        msg = "unknown field" if first.get("type") == "extra_forbidden" else pydantic_message(first)
    return TrainsimError(msg, file=file, field=field)


#: how a kind of value a union field takes reads in a message (pydantic's names for them, lower case)
_KIND_WORDS = {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false",
               "none": "null", "list": "a list", "tuple": "a list", "dict": "a mapping",
               "literal": "one of the named values"}


def _is_kind(part) -> bool:
    """Whether a location part names a kind of a union (``str``, ``list[int]``, ``constrained-int``, a
    model's class name) rather than a field or key: field names are lower case and never hold brackets."""
    return isinstance(part, str) and bool(part) and (
        "[" in part or part.startswith("constrained-") or part in _KIND_WORDS or part[0].isupper())


def _wrong_kind(error: dict) -> bool:
    """Whether a union branch failed because the value is not of its kind (not on a constraint)."""
    kind = error.get("type", "")
    return kind.endswith(("_type", "_parsing")) or kind in ("literal_error", "int_from_float", "enum",
                                                            "is_instance_of")


def _kind_words(error: dict, part: str) -> str:
    """How the kind a union branch wanted reads: ``an integer``; a literal's values (``'a' or 'b'``)."""
    if error.get("type") == "literal_error" and error.get("ctx", {}).get("expected"):
        return error["ctx"]["expected"]
    # list[int] -> list, constrained-int -> int; a model's class name -> a mapping
    return _KIND_WORDS.get(part.split("[")[0].removeprefix("constrained-").lower(), "a mapping")


def error_record(exc: TrainsimError, exit_code: int) -> dict:
    """The JSON form of an error, for commands run with ``--json``."""
    return {"error": exc.reason, "file": exc.file, "field": exc.field, "exit_code": exit_code}
