"""Writing the calibration bundle (the folder ``trainsim calibrate`` writes): atomic JSON and YAML files.

The bundle's file models, constants and reader are the format's (`trainsim.formats.bundle`); they are
imported here for the measurement code that writes and re-reads its files.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from trainsim.formats.bundle import (  # noqa: F401 (the writers' names for the files and their models)
    COLLECTIVES,
    LINKS,
    MACHINE,
    META,
    TOPOLOGY,
    CollectivesFile,
    LinksFile,
    MachineFile,
    MetaFile,
    read_file,
    workload_file,
)

_UMASK = os.umask(0)
os.umask(_UMASK)


def write_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file and a rename, so no reader sees half a file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the file the mode open() would
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_json(path: Path, data: Any) -> Path:
    return write_atomic(path, json.dumps(data, indent=1, default=str) + "\n")


def write_yaml(path: Path, data: Any) -> Path:
    return write_atomic(path, yaml.safe_dump(data, sort_keys=False, width=110))
