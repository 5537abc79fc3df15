"""Provenance recorded in every file a command writes."""

from __future__ import annotations

import datetime as _dt
import platform
import sys
from importlib.metadata import PackageNotFoundError, version

import trainsim


def _maybe_version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def provenance(*, timestamp: bool = True, **extra) -> dict:
    """Tool, Python and (if installed) torch versions, the host, the command line and the date.

    Simulation outputs pass ``timestamp=False`` so the same inputs give byte-identical files.
    Callers that measured hardware add device names, CUDA/NCCL versions, etc. through ``extra``.
    """
    record = {
        "tool": "trainsim",
        "tool_version": trainsim.__version__,
        "python": platform.python_version(),
        "torch": _maybe_version("torch"),
        "command_line": " ".join(["trainsim", *sys.argv[1:]]) if sys.argv else None,
    }
    if timestamp:
        record["host"] = platform.node()
        record["date"] = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    record.update(extra)
    return record
