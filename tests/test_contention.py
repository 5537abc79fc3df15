"""CPU ranks computing at once: the measurement (real, 2 ranks) and how the simulator uses it."""

import pytest

from trainsim.calibrate.contention import ContentionPoint, contention_record


def test_the_record_keeps_both_medians_and_their_ratio():
    point = ContentionPoint(batch=8, alone_s=0.010, together_s=0.012, steps_alone=5, steps_together=10)
    assert point.slowdown == pytest.approx(1.2)
    record = contention_record([point], 2)
    assert record["ranks"] == 2 and record["points"] == [[8, 0.010, 0.012, 1.2]]


def test_two_pinned_ranks_measure_alone_and_together():
    pytest.importorskip("torch")
    from trainsim.calibrate.contention import measure_contention

    points = measure_contention("tiny-cnn", [2, 4], 2, windows=2, window_s=0.02, options={"image_size": 16})
    assert [p.batch for p in points] == [2, 4]
    for p in points:
        assert p.alone_s > 0 and p.together_s > 0
        assert p.steps_alone >= 4 and p.steps_together >= 8  # two windows of at least two steps, per rank
        assert p.slowdown == pytest.approx(p.together_s / p.alone_s)


def test_the_calibration_step_writes_the_slowdown_into_the_workload_and_the_simulator_uses_it(tmp_path):
    pytest.importorskip("torch")
    from trainsim.calibrate import runner
    from trainsim.scenarios.loader import load_scenario
    from trainsim.sim.costs import contention_slowdown, rank_costs
    from trainsim.sim.simulation import Simulation
    from trainsim.sim.workload import load_workload

    out = tmp_path / "bundle"
    runner.run_calibration(runner.CalibrationConfig(
        model="tiny-cnn", out=out, device="cpu", ranks=2, quick=True, batch_sizes=(4,),
        steps=("probe", "layers", "contention"), model_options={"image_size": 16}))
    workload = load_workload(out / "workload-tiny-cnn.json")
    record = workload.provenance.model_extra["contention"]
    assert record["ranks"] == 2 and [p[0] for p in record["points"]] == [4]
    summary = runner.summarize(out)
    assert "2 ranks computing at once" in summary["steps"]["contention"]["headline"]

    scenario = {"schema": "trainsim.scenario/1", "name": "t", "topology": "calibrated",
                "workload": {"name": "tiny-cnn", "image_size": 16}, "strategy": {"name": "ddp"},
                "batch_size": 8, "gpus": 2, "iterations": 2, "warmup_iterations": 0}
    sim = Simulation(load_scenario(scenario), calibration=str(out))
    slow = contention_slowdown(sim.workload, 4, 2)
    gpu = sim.ranks[0]
    device = sim.machine.gpus[gpu].device
    alone = rank_costs(sim.workload, device, 4, "fp32", "momentum", measured_on=device)
    assert sim.ctx.costs[gpu].forward_s == pytest.approx([f * slow for f in alone.forward_s])
