"""cuBLAS workspaces: PyTorch's default size per (handle, stream) pair, two pairs on every training GPU."""

import json
from pathlib import Path

import pytest
from simtools import scenario as make_scenario
from simtools import tiny_topology, tiny_workload
from typer.testing import CliRunner

from trainsim.api import simulate
from trainsim.cli import app
from trainsim.errors import TrainsimError
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


@pytest.mark.parametrize(("config", "pair"), [
    (":4096:8", 32 * MIB),  # what deterministic training is told to set
    (":16:8", 128 * 1024),
    (":4096:2:16:8", 8 * MIB + 128 * 1024),
])
def test_a_stated_workspace_config_sizes_every_gpu_alike(config, pair):
    for device in ("h100-sxm", "a100-80gb"):
        assert cublas_workspace_bytes(get_device(device), config) == pair
    assert cublas_workspace_bytes(cpu_device(4, 1e10, 1e10, memory_bytes=2**30), config) == 0


def _peak_workspaces(tmp_path, workload: dict, **extra) -> float:
    wl = tmp_path / "wl.json"
    wl.write_text(json.dumps(workload))
    result = simulate(make_scenario(tiny_topology(gpus=1), str(wl), "single", 8, **extra))
    return result.gpus[0].memory_at_peak["workspaces"]


def test_the_scenario_or_else_the_calibration_states_the_workspace_config(tmp_path):
    workload = tiny_workload(LAYERS, batch=8)
    default = training_workspace_bytes(get_device("a100"))
    assert _peak_workspaces(tmp_path, workload) == pytest.approx(default)
    stated = {"host": {"cublas_workspace_config": ":16:8"}}
    assert _peak_workspaces(tmp_path, workload, **stated) == pytest.approx(2 * 128 * 1024)
    # a calibration records the variable the process ran with; the scenario's still wins
    workload["provenance"]["cublas_workspace_config"] = ":4096:8"
    assert _peak_workspaces(tmp_path, workload) == pytest.approx(2 * 32 * MIB)
    assert _peak_workspaces(tmp_path, workload, **stated) == pytest.approx(2 * 128 * 1024)
    # one PyTorch could not parse left it at its default, and so does the simulator
    workload["provenance"]["cublas_workspace_config"] = "4096x8"
    assert _peak_workspaces(tmp_path, workload) == pytest.approx(default)


@pytest.mark.parametrize("config", ["4096:8", ":4096", ":a:8", "", ":4096:8:"])
def test_a_malformed_workspace_config_is_named(tmp_path, config):
    wl = tmp_path / "wl.json"
    wl.write_text(json.dumps(tiny_workload(LAYERS, batch=8)))
    sc = make_scenario(tiny_topology(gpus=1), str(wl), "single", 8, host={"cublas_workspace_config": config})
    with pytest.raises(TrainsimError) as exc:
        simulate(sc)
    assert "host.cublas_workspace_config" in str(exc.value) and "':SIZE:COUNT'" in str(exc.value)


def test_a_config_yaml_read_as_a_number_says_so():
    # `--set host.cublas_workspace_config=4096:8`: YAML 1.1 reads 4096:8 as 4096 * 60 + 8
    scenario = Path(__file__).parents[1] / "scenarios" / "single-gpu-resnet50.yaml"
    result = CliRunner().invoke(app, ["simulate", str(scenario), "--set",
                                      "host.cublas_workspace_config=4096:8"])
    assert result.exit_code == 2
    assert "host.cublas_workspace_config" in result.output and "YAML read a number (245768)" in result.output
    assert "start it with a colon or quote it" in result.output
