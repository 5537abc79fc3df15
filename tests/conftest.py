"""Shared test set-up: make helper modules in tests/ (e.g. simtools.py) importable under importlib mode, and
reach the files kept beside the repository.

Some tests read real traces or kernel measurements from the ``shared/`` folder next to the checkout
(``../shared/traces``, ``../shared/kernels``); a fresh clone has none. They reach it only through the
``shared_file`` fixture, which skips the test when the file is absent. ``TRAINSIM_SHARED=DIR`` points it at
another folder (``TRAINSIM_SHARED=/nonexistent`` shows what a clone without it runs).
"""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def rank_functions(monkeypatch):
    """The helper module the ranks import (they are fresh interpreters: give them the tests folder)."""
    here = str(Path(__file__).parent)
    monkeypatch.syspath_prepend(here)
    monkeypatch.setenv("PYTHONPATH", here)
    import rank_functions

    return rank_functions


def shared_root() -> Path:
    """The folder beside the repository that holds traces and measurements too large to check in."""
    return Path(os.environ.get("TRAINSIM_SHARED") or Path(__file__).resolve().parents[2] / "shared")


@pytest.fixture
def shared_file():
    """``shared_file("traces", "x.json.gz")``: that file under `shared_root`, or the test skips."""

    def find(*parts: str) -> Path:
        path = shared_root().joinpath(*parts)
        if not path.exists():
            pytest.skip(f"{'/'.join(parts)} is not in the shared folder ({shared_root()})")
        return path

    return find
