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
    choices = ", ".join(sorted(valid))
    return TrainsimError(f"unknown {kind} {name!r}; valid choices: {choices}", file=file, field=field)


def given_bool(error: dict) -> str:
    """``", got true"`` when a pydantic error is a bool given for a number (strict fields), else ``""``."""
    given = error.get("input")
    return f", got {str(given).lower()}" if isinstance(given, bool) and error.get("type", "").endswith(
        ("int_type", "float_type")) else ""


def from_validation_error(exc, *, file: str | None = None, prefix: str = "") -> TrainsimError:
    """Turn the first error of a pydantic ValidationError into a one-line TrainsimError."""
    first = exc.errors()[0]
    loc = ".".join(str(p) for p in first.get("loc", ()))
    field = f"{prefix}.{loc}" if prefix and loc else (prefix or loc or None)
    msg = first.get("msg", str(exc)).removeprefix("Value error, ")  # a validator's own words
    if first.get("type") == "extra_forbidden":
        msg = "unknown field"
    msg += given_bool(first)
    return TrainsimError(msg, file=file, field=field)


def error_record(exc: TrainsimError, exit_code: int) -> dict:
    """The JSON form of an error, for commands run with ``--json``."""
    return {"error": exc.reason, "file": exc.file, "field": exc.field, "exit_code": exit_code}
