"""sim/parallel/analytic.py: the closed-form iteration time of a layout against the mesh strategy's simulated
one (a few % at most, on layouts of every kind), its parts, and its speed."""

from __future__ import annotations

import time

import pytest

from trainsim.formats.workload import load_workload
from trainsim.resolve import resolve
from trainsim.sim.core.devices import get_device
from trainsim.sim.parallel import analytic
from trainsim.sim.parallel.analytic import LayoutTimer
from trainsim.sim.parallel.stage_costs import Layout, ModelCosts
from trainsim.sim.simulation import Simulation

H100 = get_device("h100-sxm")
LLAMA8 = {"name": "llama3-8b", "seq_len": 2048}
MIXTRAL = {"name": "mixtral-8x7b", "seq_len": 1024}
RAIL = {"generator": "rail_optimised", "node": "dgx-h100", "nodes": 128, "network": "ib", "generation": "ndr",
        "radix": 256}


def compare(mesh: dict, *, topology="dgx-h100", workload=LLAMA8, batch=8, gpus=None, collectives="analytic"):
    doc = {"name": "analytic", "topology": topology, "workload": workload,
           "strategy": {"name": "mesh", "collectives": collectives, "mesh": mesh}, "batch_size": batch,
           "precision": "bf16", "optimizer": {"name": "adam"}, "iterations": 1, "warmup_iterations": 0}
    if gpus:
        doc["gpus"] = gpus
    run = resolve(doc)
    simulated = Simulation(run, record=False).run().iteration_time_s
    timer = LayoutTimer(ModelCosts(run.workload, H100, "bf16", "adam"), run.topology, run.ranks, batch)
    return timer.time(Layout.of(mesh)), simulated


CASES = {
    "fsdp": ({"zero": 3}, {}),
    "fsdp, 4 micro-batches": ({"zero": 3}, {"batch": 32}),
    "tp+sp": ({"tp": 8, "sequence_parallel": True}, {}),
    "ddp pp 1f1b": ({"pp": 4}, {"gpus": 4, "batch": 16}),
    "zero-1 tp": ({"zero": 1, "tp": 2}, {"batch": 16}),
    "hsdp": ({"zero": 3, "shard": 2, "micro_batch": 2}, {"batch": 32}),
    "zero-2 gpipe": ({"zero": 2, "tp": 2, "pp": 2, "schedule": "gpipe"}, {"batch": 16}),
    "full recompute": ({"zero": 3, "tp": 2, "pp": 2, "recompute": "full"}, {"batch": 16}),
    "selective": ({"zero": 1, "tp": 2, "pp": 2, "recompute": "selective", "sequence_parallel": True},
                  {"batch": 16}),
    "interleaved": ({"pp": 4, "tp": 2, "virtual_stages": 2, "zero": 1}, {"batch": 32}),
    "context, ring": ({"zero": 3, "tp": 2, "cp": 2, "context": "ring"}, {"topology": "dgx-h100-4node",
                                                                        "batch": 16}),
    "context x pp, two nodes": ({"zero": 1, "tp": 8, "pp": 2, "sequence_parallel": True},
                                {"topology": "dgx-h100-4node", "batch": 64}),
    "uneven stages": ({"tp": 4, "pp": 4, "stage_blocks": [6, 10, 10, 6]},
                      {"topology": "dgx-h100-4node", "batch": 32}),
    "experts": ({"ep": 8, "zero": 1, "tp": 2, "sequence_parallel": True},
                {"topology": "dgx-h100-4node", "workload": MIXTRAL, "batch": 16}),
    "experts, ddp x pp": ({"ep": 4, "tp": 2, "pp": 2}, {"topology": "dgx-h100-4node", "workload": MIXTRAL,
                                                       "batch": 16}),
    "flow collectives": ({"tp": 2, "pp": 4, "zero": 3}, {"batch": 64, "collectives": "flow"}),
    "zb-h1": ({"pp": 4, "tp": 2, "zero": 1, "schedule": "zb-h1"}, {"batch": 32}),
    "zb-h1, fsdp, selective": ({"pp": 2, "tp": 2, "zero": 3, "schedule": "zb-h1", "recompute": "selective",
                                "sequence_parallel": True}, {"batch": 16}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_closed_form_iteration_agrees_with_the_simulation(name):
    mesh, kw = CASES[name]
    predicted, simulated = compare(mesh, **kw)
    assert predicted.iteration_s == pytest.approx(simulated, rel=0.01), name


@pytest.mark.parametrize("mesh", [
    {"tp": 8, "pp": 4, "zero": 1, "sequence_parallel": True},
    {"tp": 8, "pp": 8, "zero": 1, "sequence_parallel": True, "recompute": "selective", "virtual_stages": 2},
    {"tp": 4, "pp": 4, "zero": 3, "sequence_parallel": True, "micro_batch": 2},
    {"tp": 8, "pp": 4, "cp": 2, "zero": 1, "shard": 8, "sequence_parallel": True},
])
def test_seventy_billion_on_1024_gpus(mesh):
    predicted, simulated = compare(mesh, topology=RAIL, workload={"name": "llama3-70b", "seq_len": 8192},
                                   batch=256)
    assert predicted.iteration_s == pytest.approx(simulated, rel=0.02)


def _blocks(compute, gather, sync, share=1.0, inline=0.0):
    return (compute, inline, gather, sync, share, share)


def test_a_pass_hides_the_prefetched_gathers_and_shows_the_slower_ones():
    compute_bound = [_blocks(2.0, 1.0, 0.0)] * 4
    assert analytic._pass(compute_bound, True) == (1.0 + 4 * 2.0, 0.0)  # the first gather, then compute
    comm_bound = [_blocks(1.0, 3.0, 0.0)] * 4
    assert analytic._pass(comm_bound, True)[0] == 4 * 3.0 + 1.0  # each block waits for its gather
    # the last backward's syncs: queued as each block ends; what the last block does not hide is the tail
    duration, tail = analytic._pass([_blocks(1.0, 0.0, 1.5)] * 3, False)
    assert duration == 3.0 and tail == pytest.approx(1.0 + 3 * 1.5 - 3.0)


def test_compute_beside_a_collective_runs_on_the_sms_its_channels_leave():
    # two blocks of 2 s, the second's 1 s gather beside the first: half the SMs for that second, so the
    # first block does 0.5 s of work in it and ends at 1 (first gather) + 1 + 1.5; inline collectives after
    duration, _ = analytic._pass([_blocks(2.0, 1.0, 0.0, share=0.5, inline=0.25)] * 2, True)
    assert duration == pytest.approx(1.0 + (1.0 + 1.5 + 0.25) + (2.0 + 0.25))
    assert analytic._advance(0.0, 3.0, [(1.0, 2.0, 0.5)]) == pytest.approx(1.0 + 1.0 + 1.5)
    assert analytic._advance(0.0, 3.0, []) == 3.0


def test_the_pipeline_fill_is_the_other_stages_micro_batch_and_interleaving_shrinks_it():
    run = resolve({"name": "p", "topology": "dgx-h100", "workload": LLAMA8, "strategy": {"name": "mesh"},
                   "batch_size": 16, "gpus": 4, "precision": "bf16"})
    timer = LayoutTimer(ModelCosts(run.workload, H100, "bf16", "adam"), run.topology, run.ranks, 16)
    plain = timer.time(Layout(pp=4))
    two = timer.time(Layout(pp=4, virtual_stages=2))
    assert two.bubble_s < plain.bubble_s
    assert plain.compute_s == pytest.approx(two.compute_s, rel=0.05)
    assert plain.iteration_s == pytest.approx(plain.pipeline_s + plain.exposed_sync_s + plain.optimizer_s
                                              + plain.param_gather_s, rel=1e-9)


def test_a_layout_costs_well_under_a_millisecond_once_its_stages_are_known():
    run = resolve({"name": "p", "topology": RAIL, "workload": {"name": "llama3-70b", "seq_len": 8192},
                   "strategy": {"name": "mesh"}, "batch_size": 512, "precision": "bf16"})
    timer = LayoutTimer(ModelCosts(load_workload("llama3-70b"), H100, "bf16", "adam"), run.topology,
                        run.ranks, 512)
    layouts = [Layout(tp=tp, pp=pp, zero=zero, sequence_parallel=tp > 1, recompute=rc)
               for tp in (2, 4, 8) for pp in (2, 4, 8) for zero in (0, 1, 3) for rc in ("none", "full")]
    for layout in layouts:
        timer.time(layout)
    start = time.perf_counter()
    for _ in range(5):
        for layout in layouts:
            timer.time(layout)
    per_layout = (time.perf_counter() - start) / (5 * len(layouts))
    assert per_layout < 1e-3
