"""Async tensor parallelism (``async_tp``, sim/parallel/comms.py): sequence parallelism's all-gathers and
reduce-scatters in tp steps under the GEMMs beside them; the strategy and the closed form agree."""

from __future__ import annotations

import pytest

from trainsim.errors import TrainsimError
from trainsim.resolve import resolve
from trainsim.sim.core.devices import get_device
from trainsim.sim.parallel.analytic import LayoutTimer
from trainsim.sim.parallel.comms import Call, call_seconds, pass_calls
from trainsim.sim.parallel.memory import layout_memory
from trainsim.sim.parallel.stage_costs import Layout, ModelCosts
from trainsim.sim.simulation import Simulation

H100 = get_device("h100-sxm")


def exposed(compute: float, comm: float, steps: int) -> float:
    return call_seconds(Call("tp_allgather", "allgather", "tp", 1.0, hidden_s=compute, steps=steps),
                        lambda op, dim, nbytes: comm)


def test_a_decomposed_collective_takes_the_larger_plus_one_step():
    # 8 GEMM steps and 7 transfers, each transfer beside a GEMM step: max(C, X + C / 8)
    assert exposed(0.0, 3.0, 8) == pytest.approx(3.0)  # nothing to hide under
    assert exposed(8.0, 1.0, 8) == pytest.approx(0.0)  # each transfer under a larger GEMM step
    assert exposed(8.0, 7.0, 8) == pytest.approx(0.0)  # equal steps: the transfers fill the GEMM's
    assert exposed(4.0, 7.0, 8) == pytest.approx(7.0 + 4 / 8 - 4.0)  # comm-bound: one GEMM step beyond X
    assert exposed(4.0, 7.0, 8) < 7.0  # never worse than in turn


def scenario(mesh: dict, **top) -> dict:
    return {"name": "async", "topology": "dgx-h100", "workload": {"name": "llama3-8b", "seq_len": 2048},
            "strategy": {"name": "mesh", "collectives": "analytic", "mesh": mesh}, "batch_size": 8,
            "precision": "bf16", "optimizer": {"name": "adam"}, "iterations": 1, "warmup_iterations": 0,
            **top}


@pytest.mark.parametrize(("mesh", "top"), [
    ({"tp": 8, "sequence_parallel": True}, {}),
    ({"tp": 4, "pp": 2, "zero": 1, "sequence_parallel": True, "recompute": "full"}, {"batch_size": 16}),
    ({"tp": 4, "pp": 2, "sequence_parallel": True, "schedule": "zb-h1"}, {"batch_size": 16}),
])
def test_async_tp_hides_tensor_parallel_collectives_and_the_closed_forms_follow(mesh, top):
    results = {}
    for flag in (False, True):
        run = resolve(scenario({**mesh, "async_tp": flag}, **top))
        result = Simulation(run, record=False).run()
        model = ModelCosts(run.workload, H100, "bf16", "adam")
        layout = Layout.of({**mesh, "async_tp": flag})
        gpus, batch = len(run.ranks), run.scenario.batch_size
        predicted = LayoutTimer(model, run.topology, run.ranks, batch).time(layout)
        assert predicted.iteration_s == pytest.approx(result.iteration_time_s, rel=1e-6)
        peak = max(g.memory_peak_bytes for g in result.gpus)
        assert layout_memory(model, layout, gpus, batch).peak == pytest.approx(peak, rel=1e-9)
        results[flag] = (result, predicted)
    plain, fast = results[False], results[True]
    assert fast[1].inline_comm_s < 0.8 * plain[1].inline_comm_s
    assert fast[0].iteration_time_s < plain[0].iteration_time_s
    assert fast[1].compute_s == pytest.approx(plain[1].compute_s)  # no slow-down invented for the GEMMs


def test_each_row_layer_pairs_with_its_gemms():
    run = resolve(scenario({"tp": 8, "sequence_parallel": True}))
    model = ModelCosts(run.workload, H100, "bf16", "adam")
    layout = Layout(tp=8, sequence_parallel=True, async_tp=True)
    table = model.blocks(layout)
    b = table.names.index("block1")
    assert len(table.tp_gemms[b]) == table.row_layers[b] == 2  # attention's o_proj, the MLP's down_proj
    calls = pass_calls(table, b, layout, model.config, 2, "F")
    assert [c.steps for c in calls] == [8] * 4 and all(c.hidden_s > 0 for c in calls)
    head = pass_calls(table, len(table) - 1, layout, model.config, 2, "F")  # the head: as before
    assert all(c.steps == 1 for c in head)


def test_async_tp_without_sequence_parallelism_is_one_line():
    with pytest.raises(TrainsimError, match="async_tp overlaps sequence parallelism") as err:
        resolve(scenario({"tp": 8, "async_tp": True}))
    assert "strategy" in (err.value.field or "")


def test_the_search_tries_async_tp_on_request():
    from trainsim.formats.workload import load_workload
    from trainsim.sim.parallel.search import SearchSpace, enumerate_layouts

    model = ModelCosts(load_workload("llama3-8b"), H100, "bf16", "adam")
    plain = enumerate_layouts(model, 8, 16, SearchSpace())
    both = enumerate_layouts(model, 8, 16, SearchSpace(async_tp=(False, True)))
    added = [layout for layout in both if layout.async_tp]
    assert not any(layout.async_tp for layout in plain)
    assert added and all(layout.sequence_parallel for layout in added)
    assert len(both) == len(plain) + len(added)
