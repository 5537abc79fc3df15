"""Writing the calibration bundle (the folder ``trainsim calibrate`` writes): atomic JSON and YAML files.

The bundle's file models, constants and reader are the format's (`trainsim.formats.bundle`); they are
imported here for the measurement code that writes and re-reads its files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from trainsim.files import write_atomic  # noqa: F401 (the validate report writes through it)
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
    is_bundle_file,
    read_file,
    workload_file,
)


def write_json(path: Path, data: Any) -> Path:
    return write_atomic(path, json.dumps(data, indent=1, default=str) + "\n")


def write_yaml(path: Path, data: Any) -> Path:
    return write_atomic(path, yaml.safe_dump(data, sort_keys=False, width=110))
