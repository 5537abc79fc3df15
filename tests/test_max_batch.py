"""The largest batch that fits, with and without offload, on a case whose memory is hand-computable."""

import json

import yaml
from simtools import scenario as make_scenario
from simtools import tiny_topology, tiny_workload
from typer.testing import CliRunner

from trainsim.cli import app
from trainsim.resolve import resolve
from trainsim.sim.compute.workspaces import training_workspace_bytes
from trainsim.sim.core.devices import get_device
from trainsim.sim.planning.max_batch import max_batch

LAYERS = [
    {"name": "a", "fwd": 0.010, "bwd": 0.020, "params": 4_000, "saved": 100_000},
    {"name": "b", "fwd": 0.005, "bwd": 0.007, "params": 40_000, "saved": 50_000},
    {"name": "c", "fwd": 0.001, "bwd": 0.003, "params": 0, "saved": 200_000},
]
INPUT = 1000
MEMORY_GIB = 0.025
# sgd in fp32: weights + gradients; and the cuBLAS workspaces of the training process's two matmul threads
MODEL = 2 * 44_000 + training_workspace_bytes(get_device("a100"))


def scenario_file(tmp_path):
    wl = tmp_path / "wl.json"
    wl.write_text(json.dumps(tiny_workload(LAYERS, batch=8, input_bytes=INPUT)))
    topo = tiny_topology(gpus=1, nvlink=False, memory_gib=MEMORY_GIB)
    path = tmp_path / "sc.yaml"
    path.write_text(yaml.safe_dump(make_scenario(topo, str(wl), "single", 8)))
    return str(path)


def test_largest_batch_follows_the_memory_model(tmp_path):
    doc = max_batch(resolve(scenario_file(tmp_path)), policy=["a"])
    capacity = MEMORY_GIB * 2**30
    # without offload the peak is at the turn: input + every layer's saved activations per sample
    assert doc["without_offload"]["per_gpu_batch"] == int((capacity - MODEL) // (INPUT + 350_000))
    # with a offloaded (c saves more than a, so the peak is input + b + c at the turn)
    assert doc["with_offload"]["per_gpu_batch"] == int((capacity - MODEL) // (INPUT + 250_000))
    assert doc["batch_gain"] > 1.3
    assert doc["with_offload"]["samples_per_s"] > 0 and doc["without_offload"]["samples_per_s"] > 0
    assert doc["with_offload"]["memory_peak_gib"] <= MEMORY_GIB


def test_cli_max_batch_json_and_bad_strategy(tmp_path):
    path = scenario_file(tmp_path)
    runner = CliRunner()
    result = runner.invoke(app, ["max-batch", path, "--offload", "a", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["schema"] == "trainsim.max_batch/1" and doc["offload"] == ["a"]
    assert doc["with_offload"]["per_gpu_batch"] > doc["without_offload"]["per_gpu_batch"]
    bad = runner.invoke(app, ["max-batch", path, "--set", "strategy.name=pipeline"])
    assert bad.exit_code == 2 and "strategy.name" in bad.output
    unknown = runner.invoke(app, ["max-batch", path, "--offload", "a,z"])
    assert unknown.exit_code == 2
    assert unknown.output.startswith("error: --offload: unknown layer 'z'; valid choices: a, b, c")
