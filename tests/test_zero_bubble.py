"""sim/parallel/zero_bubble.py: ZB-H1's pass order, its bubble against 1F1B's, the replay's fast path, and the
mesh strategy running it (time and memory equal to the closed forms, the peak stage's memory 1F1B's)."""

from __future__ import annotations

import random

import pytest

from trainsim.errors import TrainsimError
from trainsim.resolve import resolve
from trainsim.sim.core.devices import get_device
from trainsim.sim.parallel.analytic import LayoutTimer
from trainsim.sim.parallel.memory import layout_memory
from trainsim.sim.parallel.stage_costs import Layout, ModelCosts
from trainsim.sim.parallel.zero_bubble import replay, zb_h1_ends, zb_h1_order
from trainsim.sim.simulation import Simulation

H100 = get_device("h100-sxm")


def one_f_one_b(s: int, pp: int, M: int) -> list[tuple[str, int]]:
    """1F1B as F, B and W passes with W right after its B (a fused backward: the gradient leaves after
    both)."""
    warm = min(pp - s - 1, M)
    out = [("F", m) for m in range(warm)]
    for i in range(M - warm):
        out += [("F", warm + i), ("B", i), ("W", i)]
    for m in range(M - warm, M):
        out += [("B", m), ("W", m)]
    return out


@pytest.mark.parametrize(("pp", "M"), [(2, 8), (4, 8), (4, 16), (8, 32)])
def test_every_stage_holds_at_most_pp_micro_batches_and_runs_each_pass_once(pp, M):
    for s in range(pp):
        order = zb_h1_order(s, pp, M)
        for kind in "FBW":
            assert sorted(m for k, m in order if k == kind) == list(range(M))
        forward = weights = most = 0
        for kind, m in order:
            forward += kind == "F"
            weights += kind == "W"
            most = max(most, forward - weights)
            if kind == "W":
                assert order.index(("B", m)) < order.index(("W", m))
        assert most == pp  # stage 0 under 1F1B holds pp; each stage holds as many, no more


@pytest.mark.parametrize(("pp", "M"), [(4, 8), (4, 24), (8, 32)])
def test_the_bubble_is_a_third_of_1f1bs_with_equal_passes(pp, M):
    # Qi et al. 2023, Figure 3: F = B = W = 1; 1F1B idles (pp - 1)(F + B + W) per stage,
    # ZB-H1 (pp - 1)(F + B - W)
    durations = [{"F": 1.0, "B": 1.0, "W": 1.0}] * pp
    zb = max(replay([zb_h1_order(s, pp, M) for s in range(pp)], durations, [0.0] * (pp - 1)))
    fused = [{"F": 1.0, "B": 2.0, "W": 0.0}] * pp  # 1F1B's backward is B and W together
    ob = max(replay([one_f_one_b(s, pp, M) for s in range(pp)], fused, [0.0] * (pp - 1)))
    assert ob - 3 * M == pytest.approx(3 * (pp - 1))
    assert zb - 3 * M == pytest.approx(pp - 1)


def test_the_fast_replay_is_the_replay():
    rng = random.Random(7)
    for _ in range(60):
        pp = rng.choice([2, 3, 4, 8, 16])
        M = rng.choice([1, pp, 3 * pp + 5, 8 * pp, 200])
        durations = [{"F": rng.uniform(0.5, 2), "B": rng.uniform(0.5, 2), "W": rng.uniform(0.1, 2)}
                     for _ in range(pp)]
        messages = [rng.uniform(0, 0.2) for _ in range(pp - 1)]
        exact = replay([zb_h1_order(s, pp, M) for s in range(pp)], durations, messages)
        assert zb_h1_ends(pp, M, durations, messages) == pytest.approx(exact, rel=1e-12)


def scenario(mesh: dict, **top) -> dict:
    # the roofline's pass durations (the bubble's size below depends on F : B : W; the schedule does not)
    return {"name": "zb", "topology": "dgx-h100", "workload": {"name": "llama3-8b", "seq_len": 2048},
            "strategy": {"name": "mesh", "collectives": "analytic", "mesh": mesh}, "batch_size": 16,
            "gpus": 4, "precision": "bf16", "optimizer": {"name": "adam"}, "iterations": 1,
            "warmup_iterations": 0, "compute_model": "roofline", **top}


def run(mesh: dict, **top):
    r = resolve(scenario(mesh, **top))
    return r, Simulation(r, record=False).run()


def test_zb_h1_shrinks_the_bubble_and_keeps_stage_zeros_peak():
    _, plain = run({"pp": 4})
    r, zb = run({"pp": 4, "schedule": "zb-h1"})
    assert zb.iteration_time_s < plain.iteration_time_s
    assert zb.breakdown_s["idle"] < 0.5 * plain.breakdown_s["idle"]
    assert zb.gpus[0].memory_peak_bytes == pytest.approx(plain.gpus[0].memory_peak_bytes, rel=1e-12)
    # the later stages hold micro-batches between B and W: more than under 1F1B
    assert zb.gpus[1].memory_peak_bytes > plain.gpus[1].memory_peak_bytes
    model = ModelCosts(r.workload, H100, "bf16", "adam", compute_model="roofline")
    layout = Layout(pp=4, schedule="zb-h1")
    assert layout_memory(model, layout, 4, 16).peak == pytest.approx(
        max(g.memory_peak_bytes for g in zb.gpus), rel=1e-9)
    predicted = LayoutTimer(model, r.topology, r.ranks, 16).time(layout)
    assert predicted.iteration_s == pytest.approx(zb.iteration_time_s, rel=1e-6)
    assert predicted.bubble_s < LayoutTimer(model, r.topology, r.ranks, 16).time(Layout(pp=4)).bubble_s


def test_a_backward_splits_into_input_and_weight_gradients():
    r = resolve(scenario({"pp": 2}))
    model = ModelCosts(r.workload, H100, "bf16", "adam")
    table = model.blocks(Layout())
    b = table.names.index("block1")
    # the block's linear layers' backward halves are W; the core, norms, RoPE and SwiGLU are all B
    assert 0 < table.weight_grad[b] < 0.5 * table.backward[b]
    assert table.weight_grad[0] == pytest.approx(table.backward[0])  # the embedding's backward is all W
    assert table.weight_kept[b] > 0


def test_zb_h1_with_virtual_stages_is_one_line():
    with pytest.raises(TrainsimError, match="zb-h1 runs one model chunk per pipeline rank") as err:
        resolve(scenario({"pp": 2, "virtual_stages": 2, "schedule": "zb-h1"}))
    assert "strategy" in (err.value.field or "")
