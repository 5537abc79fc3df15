"""Shared test set-up: make helper modules in tests/ (e.g. simtools.py) importable under importlib mode."""

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
