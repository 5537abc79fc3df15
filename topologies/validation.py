"""Turning pydantic's validation errors on topology files into one-line TrainsimErrors.

Fields are written the way a user finds them in the file: ``links[3].b``, ``nodes[0].memory_gib``.
"""

from __future__ import annotations

from pydantic import ValidationError

from trainsim.errors import TrainsimError, pydantic_message, unknown_name

from .schema import NODE_KINDS


def field_path(loc: tuple) -> str:
    """``("links", 3, "b")`` -> ``links[3].b``; drops the union tag pydantic puts after a node's index."""
    out = ""
    previous = None
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(previous, int) and part in NODE_KINDS:
            pass  # pydantic's discriminated-union tag, not a field of the file
        else:
            out += f".{part}" if out else str(part)
        previous = part
    return out


def validation_error(exc: ValidationError, *, file: str | None = None) -> TrainsimError:
    """The first error of ``exc`` as a TrainsimError naming the file and field."""
    first = exc.errors()[0]
    loc = tuple(first.get("loc", ()))
    field = field_path(loc) or None
    kind = first.get("type")
    if kind == "union_tag_invalid":
        tag = first.get("ctx", {}).get("tag", "?")
        return unknown_name("node kind", str(tag), NODE_KINDS, file=file, field=f"{field}.kind")
    if kind == "union_tag_not_found":
        return TrainsimError(f"missing kind; valid kinds: {', '.join(NODE_KINDS)}", file=file,
                             field=f"{field}.kind")
    if kind == "extra_forbidden":
        return TrainsimError("unknown field", file=file, field=field)
    return TrainsimError(pydantic_message(first), file=file, field=field)
