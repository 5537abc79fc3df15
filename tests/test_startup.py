"""Start-up: `trainsim simulate` of a shipped 8-GPU scenario imports only what that run uses (the figures are
benchmarks/scale_bench.py's); the collector setting a run uses is put back afterwards."""

import gc
import json
import subprocess
import sys

from trainsim.sim.core.collector import YOUNG_THRESHOLD, fewer_collections
from trainsim.sim.strategies.registry import MODULES, get_strategy, strategies

PROBE = """
import contextlib, io, json, runpy, sys
sys.argv = ["trainsim", "simulate", "ddp-resnet50-dgx-a100"]
with contextlib.redirect_stdout(io.StringIO()):
    try:
        runpy.run_module("trainsim.cli", run_name="__main__")
    except SystemExit as exc:
        assert not exc.code, exc.code
print(json.dumps(sorted(sys.modules)))
"""

UNUSED = [
    "torch",
    "matplotlib",
    "scipy",
    "trainsim.formats.bundle",  # no calibration bundle given
    "trainsim.sim.strategies.pipeline",  # the run is DDP
    "trainsim.sim.strategies.spatial",
    "trainsim.sim.strategies.easgd",
    "trainsim.sim.optimizations.offload",  # no activation offload
    "trainsim.sweeps",
]


def test_an_8_gpu_simulate_imports_only_what_it_uses():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    loaded = set(json.loads(out.stdout))
    assert "trainsim.sim.strategies.ddp" in loaded
    assert [m for m in UNUSED if m in loaded] == []


def test_the_registry_imports_a_strategy_when_asked():
    assert set(MODULES) <= set(strategies())
    assert get_strategy("pipeline").starts.__module__ == "trainsim.sim.strategies.pipeline"
    assert get_strategy("hybrid").rank_batch_of is not None and get_strategy("ddp").rank_batch_of is None


def test_fewer_collections_puts_the_threshold_back():
    before = gc.get_threshold()
    with fewer_collections():
        assert gc.get_threshold()[0] == max(before[0], YOUNG_THRESHOLD)
    assert gc.get_threshold() == before
