"""The input files of a command, known before it runs: what its outputs are checked against, so that no run
overwrites what it reads (`trainsim.files.check_not_input`).

They are found the same way for every command: each argument or option value that names an existing file
or folder (a scenario, a trace, a bundle, a sweep file; ``--set KEY=VALUE`` values too), except the
command's outputs, and the files a scenario or sweep file among them names under ``topology``,
``workload``, ``scenario`` or ``node`` (cheap to know: one YAML file each, read as the command will read
it). Files found only while the command runs are checked as they are read (`trainsim.files.read_text`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

#: the keys of a scenario or sweep file whose values may name other input files
REFERENCE_KEYS = ("topology", "workload", "scenario", "node")
#: file names that may be YAML documents naming other files (scenarios, sweeps)
_YAML = (".yaml", ".yml")


def command_inputs(params: dict[str, Any], names: dict[str, str], outputs: Iterable[str] = ()
                   ) -> list[tuple[str, str]]:
    """(what, path) of every existing file or folder among a command's parameter values: ``params`` its
    values by parameter name, ``names`` how the user wrote each (``SCENARIO``, ``--calibration``),
    ``outputs`` the names of the output parameters (left out)."""
    found: list[tuple[str, str]] = []
    skip = set(outputs)
    for name, value in params.items():
        if name in skip:
            continue
        shown = names.get(name, name)
        for given, what in _values(value, shown):
            if not os.path.lexists(given):
                continue
            kind = "folder" if os.path.isdir(given) else "file"
            found.append((f"the {what} {kind} this command reads", given))
            if kind == "file" and given.endswith(_YAML):
                found += referenced_files(given)
    return found


def _values(value: Any, shown: str) -> Iterator[tuple[str, str]]:
    """(path, how the user gave it) of each string in a parameter's value: a list item each, and of
    ``KEY=VALUE`` both the whole and VALUE (``--set topology=t.yaml``)."""
    items = value if isinstance(value, list | tuple) else [value]
    for item in items:
        if not isinstance(item, str | os.PathLike) or not str(item).strip():
            continue
        text = os.fspath(item)
        yield text, shown
        key, sep, rest = text.partition("=")
        if sep and rest.strip():
            yield rest.strip(), f"{shown} {key.strip()}"


def referenced_files(path: str | os.PathLike) -> list[tuple[str, str]]:
    """(what, path) of the existing files a scenario or sweep file names under `REFERENCE_KEYS`, at any
    depth (variants, a sweep's grid), relative to its folder or the working folder. A file that does not
    parse names none (its own error comes when the command reads it)."""
    from trainsim.errors import TrainsimError
    from trainsim.files import read_text
    from trainsim.yamlio import parse_yaml_mapping

    label = os.fspath(path)
    try:
        data = parse_yaml_mapping(read_text(path, label, note=False), label)
    except TrainsimError:
        return []
    folder = Path(os.path.realpath(label)).parent
    found = []
    for key, text in _references(data):
        for candidate in (folder / text, Path(text)):
            if candidate.is_file():
                found.append((f"the {key} file that {label} names", str(candidate)))
                break
    return found


def _references(data: Any, key: str | None = None, depth: int = 0) -> Iterator[tuple[str, str]]:
    if depth > 16:  # deeper than any scenario or sweep field
        return
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _references(v, k if k in REFERENCE_KEYS else None, depth + 1)
    elif isinstance(data, list):
        for v in data:
            yield from _references(v, key, depth + 1)
    elif key is not None and isinstance(data, str) and data.strip():
        yield key, data.strip()
