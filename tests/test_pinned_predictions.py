"""The simulator's predictions for the CPU validation scenario, from one pinned calibration bundle, stay as
they were: refactors of the model (formats, host plug-ins, module moves) must not move them. The expected
figures come from tests/pinned/make_predictions.py; regenerate them only for an intended physics change."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

MAKER = Path(__file__).parent / "pinned" / "make_predictions.py"


def _maker():
    spec = importlib.util.spec_from_file_location("make_predictions", MAKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_predictions_of_the_pinned_bundle_are_unchanged():
    maker = _maker()
    expected = json.loads(maker.OUT.read_text())
    got = maker.predictions()
    assert sorted(got) == sorted(expected)
    for key, want in expected.items():
        have = got[key]
        if "error" in want:
            assert have == want, key
            continue
        assert have["iteration_times_s"] == pytest.approx(want["iteration_times_s"], rel=1e-9, abs=1e-15), key
        assert have["breakdown_s"] == pytest.approx(want["breakdown_s"], rel=1e-9, abs=1e-15), key
        assert have["memory_peak_bytes"] == want["memory_peak_bytes"], key
