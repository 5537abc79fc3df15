"""FP8 matrix work (``strategy.mesh.fp8``, sim/parallel/fp8.py): linear GEMMs at the fp8 peak plus their
casts, the fp8 copy of the saved input, attention and norms untouched; the closed forms follow; a GPU
without fp8 is one line."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from trainsim.cli import app
from trainsim.formats.workload import load_workload
from trainsim.resolve import resolve
from trainsim.sim.compute import roofline
from trainsim.sim.core.devices import get_device
from trainsim.sim.parallel.analytic import LayoutTimer
from trainsim.sim.parallel.fp8 import CAST_BYTES, gpus_with_fp8
from trainsim.sim.parallel.memory import layout_memory
from trainsim.sim.parallel.stage_costs import Layout, ModelCosts
from trainsim.sim.simulation import Simulation

H100 = get_device("h100-sxm")


def test_a_blocks_linears_run_at_the_fp8_peak_plus_their_casts():
    wl = load_workload("llama3-8b")
    layout = Layout(tp=8, sequence_parallel=True)
    bf16 = ModelCosts(wl, H100, "bf16", "adam").blocks(layout)
    fp8 = ModelCosts(wl, H100, "bf16", "adam", fp8=True).blocks(layout)
    b = bf16.names.index("block1")
    assert fp8.forward[b] < 0.8 * bf16.forward[b] and fp8.backward[b] < 0.8 * bf16.backward[b]
    assert fp8.core[b] == bf16.core[b]  # attention stays in bf16
    assert fp8.forward[-1] == bf16.forward[-1]  # the LM head stays in bf16 (TE's recipes)
    assert fp8.saved[b] < bf16.saved[b]  # the linear layers keep the fp8 copy of their inputs
    assert fp8.params == bf16.params  # bf16 weights, fp32 master in the optimizer


def test_a_compute_bound_gemm_halves_on_an_h100_and_its_casts_are_counted_in_full():
    from trainsim.sim.compute.costs import rank_costs
    from trainsim.sim.parallel.fp8 import fp8_costs

    wl = load_workload("llama3-8b")
    costs = rank_costs(wl, H100, 1, "bf16", "adam")
    fp8 = fp8_costs(costs, wl, H100, 1, 2)
    i = next(k for k, layer in enumerate(wl.layers) if layer.name == "model.layers.1.mlp.gate_up_proj")
    layer = wl.layers[i]
    x = costs.saved_bytes_per_layer[i] / 2  # its input: 8192 tokens x 4096
    assert x == 8192 * 4096
    w, y = layer.param_bytes / wl.itemsize, costs.output_bytes_per_layer[i] / 2
    ratio = H100.peak("bf16") / H100.peak("fp8")  # 990 / 1979 TFLOP/s: the GEMM is compute-bound
    cast_f = roofline.streaming_seconds(H100, CAST_BYTES * (x + w)) + 2 * 5e-6
    cast_b = roofline.streaming_seconds(H100, CAST_BYTES * y) + 5e-6
    assert fp8.forward_s[i] == pytest.approx(costs.forward_s[i] * ratio + cast_f, rel=1e-3)
    assert fp8.backward_s[i] == pytest.approx(costs.backward_s[i] * ratio + cast_b, rel=1e-3)
    assert fp8.saved_bytes_per_layer[i] == x  # one byte an element
    core = next(k for k, layer in enumerate(wl.layers) if layer.kind == "flash_attention")
    assert fp8.forward_s[core] == costs.forward_s[core]


def scenario(mesh: dict, topology="dgx-h100", **top) -> dict:
    return {"name": "fp8", "topology": topology, "workload": {"name": "llama3-8b", "seq_len": 2048},
            "strategy": {"name": "mesh", "collectives": "analytic", "mesh": mesh}, "batch_size": 16,
            "precision": "bf16", "optimizer": {"name": "adam"}, "iterations": 1, "warmup_iterations": 0,
            **top}


@pytest.mark.parametrize("mesh", [{"zero": 3}, {"tp": 4, "pp": 2, "sequence_parallel": True, "zero": 1,
                                                "recompute": "selective", "schedule": "zb-h1"}])
def test_fp8_is_faster_and_the_closed_forms_follow(mesh):
    steps = {}
    for fp8 in (False, True):
        run = resolve(scenario({**mesh, "fp8": fp8}))
        result = Simulation(run, record=False).run()
        model = ModelCosts(run.workload, H100, "bf16", "adam", fp8=fp8)
        layout = Layout.of(mesh)
        predicted = LayoutTimer(model, run.topology, run.ranks, 16).time(layout)
        assert predicted.iteration_s == pytest.approx(result.iteration_time_s, rel=1e-6)
        assert layout_memory(model, layout, 8, 16).peak == pytest.approx(
            max(g.memory_peak_bytes for g in result.gpus), rel=1e-9)
        steps[fp8] = result.iteration_time_s
    assert steps[True] < 0.9 * steps[False]


def test_fp8_on_a_gpu_without_it_is_one_line(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario({"zero": 3, "fp8": True}, topology="dgx-a100")))
    result = CliRunner().invoke(app, ["simulate", str(path)])
    assert result.exit_code == 2
    line = result.output.strip()
    assert "\n" not in line and "strategy.mesh.fp8" in line and "a100" in line.lower()
    assert "h100-sxm" in line and "h100-sxm" in gpus_with_fp8() and "a100-sxm4-40gb" not in gpus_with_fp8()
