"""Reading YAML files the one way every loader does: a syntax error is one line with the position, a key
given twice in one mapping is an error (PyYAML would silently keep the last one), and ``1e-9`` is a number
as YAML 1.2 and JSON read it (PyYAML follows YAML 1.1, where a float needs a dot, so it was a string)."""

from __future__ import annotations

import re

import yaml

from trainsim.errors import TrainsimError


class _DuplicateKey(Exception):
    def __init__(self, key, mark):
        super().__init__(key)
        self.key = key
        self.mark = mark


class NumberLoader(yaml.SafeLoader):
    """SafeLoader whose floats are YAML 1.2's: ``1e-9``, ``2E+3`` and ``-1.5e3`` as well as ``1.5``."""


NumberLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                  |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
                  |[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?
                  |[-+]?\.(?:inf|Inf|INF)
                  |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


def load_yaml(text: str):
    """One YAML document with `NumberLoader` (raises yaml.YAMLError on bad syntax)."""
    return yaml.load(text, Loader=NumberLoader)  # noqa: S506 - a SafeLoader subclass


class _UniqueKeyLoader(NumberLoader):
    """SafeLoader that refuses a mapping with the same key twice."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            # only the mapping's own keys: a key that overrides one merged in with ``<<:`` is fine
            own = [key_node for key_node, _ in node.value if key_node.tag != "tag:yaml.org,2002:merge"]
            for key_node in own:
                key = self.construct_object(key_node, deep=deep)
                try:
                    duplicate = key in seen
                except TypeError:  # an unhashable key; the base class reports it
                    break
                if duplicate:
                    raise _DuplicateKey(key, key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def parse_yaml_mapping(text: str, label: str, what: str = "file") -> dict:
    """Parse ``text`` (from ``label``) into a mapping; ``what`` names the kind of file in the error."""
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except _DuplicateKey as exc:
        where = f"line {exc.mark.line + 1}"
        raise TrainsimError(f"duplicate key {exc.key!r} (a key may appear once per mapping)", file=label,
                            field=where) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else None
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise TrainsimError(f"malformed YAML: {problem}", file=label, field=where) from None
    if not isinstance(data, dict):
        raise TrainsimError(f"a {what} must be a YAML mapping", file=label)
    return data
