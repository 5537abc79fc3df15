"""cuBLAS workspaces: PyTorch's default size per (handle, stream) pair, two pairs on every training GPU."""

import json

import pytest
from simtools import scenario as make_scenario
from simtools import tiny_topology, tiny_workload

from trainsim.api import simulate
from trainsim.sim.compute.workspaces import cublas_workspace_bytes, training_workspace_bytes
from trainsim.sim.core.devices import cpu_device, get_device

MIB = 2**20
LAYERS = [{"name": "a", "fwd": 0.01, "bwd": 0.02, "params": 4_000, "saved": 100_000}]


@pytest.mark.parametrize(("device", "pair"), [
    ("h100-sxm", 32 * MIB),  # CUBLAS_WORKSPACE_CONFIG ":4096:8" on compute capability 9.0
    ("h200", 32 * MIB),
    ("a100-80gb", 8 * MIB + 128 * 1024),  # ":4096:2:16:8" everywhere else
    ("v100-16gb", 8 * MIB + 128 * 1024),
    ("rtx4090", 8 * MIB + 128 * 1024),
])
def test_pytorch_default_workspace_per_pair(device, pair):
    assert cublas_workspace_bytes(get_device(device)) == pair
    assert training_workspace_bytes(get_device(device)) == 2 * pair  # forward thread and autograd's


def test_a_cpu_rank_holds_no_cublas_workspace():
    assert training_workspace_bytes(cpu_device(4, 1e10, 1e10, memory_bytes=2**30)) == 0


@pytest.mark.parametrize("strategy", ["single", "ddp", "dp-gpu0", "pipeline"])
def test_every_training_gpu_holds_the_workspaces_for_the_whole_run(tmp_path, strategy):
    layers = LAYERS + [{"name": "b", "fwd": 0.01, "bwd": 0.02, "params": 8_000, "saved": 50_000}]
    wl = tmp_path / "wl.json"
    wl.write_text(json.dumps(tiny_workload(layers, batch=8)))
    gpus = 1 if strategy == "single" else 2
    sc = make_scenario(tiny_topology(gpus=gpus), str(wl), strategy, 8)
    if strategy == "pipeline":
        sc["strategy"]["pipeline"] = {"stages": 2}
    result = simulate(sc)
    expected = training_workspace_bytes(get_device("a100"))
    for gpu in result.gpus:
        assert gpu.memory_at_peak["workspaces"] == pytest.approx(expected)
        held = [e for e in result.machine.gpus[gpu.name].memory.timeline if e.category == "workspaces"]
        assert [e.time for e in held] == [0.0] and held[0].delta == pytest.approx(expected)
