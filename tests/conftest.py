"""Shared test set-up: make helper modules in tests/ (e.g. simtools.py) importable under importlib mode."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
