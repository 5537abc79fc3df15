"""Reading YAML and JSON files the one way every loader does: a syntax error is one line with the position,
a key given twice in one mapping is an error (PyYAML would silently keep the last one), and ``1e-9`` is a
number as YAML 1.2 and JSON read it (PyYAML follows YAML 1.1, where a float needs a dot, so it was a string).

What no person writes is refused before it is built, as one line naming the place: values nested deeper than
`MAX_DEPTH` (PyYAML's composer and Python's JSON decoder recurse, and 100,000 brackets end them in a
RecursionError), and aliases that expand a document by more than `MAX_ALIAS_EXPANSION` values or into itself
(a "billion laughs" file of a few lines names 10^9 values: every reader that walks it would run for hours).
"""

from __future__ import annotations

import json
import re

import yaml

from trainsim.errors import TrainsimError

#: the deepest nesting of mappings and lists read (the deepest shipped file has under 10 levels)
MAX_DEPTH = 100
#: how many values aliases (``*name``) may add to a document beyond those written in it
MAX_ALIAS_EXPANSION = 100_000


class LimitError(yaml.MarkedYAMLError):
    """A document beyond `MAX_DEPTH` or `MAX_ALIAS_EXPANSION` (a YAMLError, so every reader catches it)."""

    def __init__(self, problem: str, mark):
        super().__init__(problem=problem, problem_mark=mark)


class _DuplicateKey(Exception):
    def __init__(self, key, mark):
        super().__init__(key)
        self.key = key
        self.mark = mark


class NumberLoader(yaml.SafeLoader):
    """SafeLoader whose floats are YAML 1.2's: ``1e-9``, ``2E+3`` and ``-1.5e3`` as well as ``1.5``, and
    which refuses documents nested deeper than `MAX_DEPTH` or expanded by aliases (`LimitError`)."""

    _depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise LimitError(f"values nested deeper than {MAX_DEPTH} levels", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self):
        node = super().compose_document()
        _check_aliases(node)
        return node


def _check_aliases(root) -> None:
    """Refuse a composed document whose aliases repeat more than `MAX_ALIAS_EXPANSION` values, or put a
    value inside itself. Each distinct node is sized once (its expanded count), so this is quick even for a
    document that names 10^9 values."""
    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            children = _children(node)
            size[key] = 1 + sum(size[id(c)] for c in children)
            continue
        if key in size:
            continue
        if key in on_path:
            raise LimitError("an alias inside the value it names (the value would contain itself)",
                             node.start_mark)
        on_path.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in on_path:
                raise LimitError("an alias inside the value it names (the value would contain itself)",
                                 child.start_mark)
            if id(child) not in size:
                stack.append((child, False))
    written = len(size)
    if size[id(root)] - written > MAX_ALIAS_EXPANSION:
        raise LimitError(f"aliases expand {written:,} values into {size[id(root)]:,}; at most "
                         f"{MAX_ALIAS_EXPANSION:,} may be repeated (a YAML alias bomb?)", root.start_mark)


def _children(node) -> list:
    if isinstance(node, yaml.SequenceNode):
        return node.value
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


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
    except LimitError as exc:
        mark = exc.problem_mark
        raise TrainsimError(f"not read: {exc.problem}", file=label,
                            field=f"line {mark.line + 1}, column {mark.column + 1}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else None
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise TrainsimError(f"malformed YAML: {problem}", file=label, field=where) from None
    if not isinstance(data, dict):
        raise TrainsimError(f"a {what} must be a YAML mapping", file=label)
    return data


def parse_json(text: str, label: str | None, what: str = "file"):
    """Decode JSON ``text`` (from ``label``, a ``what``); bad syntax or nesting deeper than Python's decoder
    recurses (about 1,000 levels; `MAX_DEPTH` is far more than any trainsim file has) is one TrainsimError."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise TrainsimError(f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
                            file=label) from None
    except RecursionError:
        raise TrainsimError(f"not read: values nested deeper than a {what} has (thousands of levels)",
                            file=label) from None
