"""Reading YAML files the one way every loader does: a syntax error is one line with the position."""

from __future__ import annotations

import yaml

from trainsim.errors import TrainsimError


def parse_yaml_mapping(text: str, label: str, what: str = "file") -> dict:
    """Parse ``text`` (from ``label``) into a mapping; ``what`` names the kind of file in the error."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else None
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise TrainsimError(f"malformed YAML: {problem}", file=label, field=where) from None
    if not isinstance(data, dict):
        raise TrainsimError(f"a {what} must be a YAML mapping", file=label)
    return data
