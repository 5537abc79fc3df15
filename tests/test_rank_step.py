"""A CPU rank's whole step in pinned processes, alone and all at once: the measurement (real, 2 ranks), the
calibration step that records it and how the simulator uses it."""

import pytest

from trainsim.calibrate.execute.rank_step import RankStepPoint, rank_step_record


def test_the_record_keeps_both_medians():
    point = RankStepPoint(batch=8, alone_s=0.010, together_s=0.012, steps_alone=5, steps_together=10)
    assert point.slowdown == pytest.approx(1.2)
    record = rank_step_record([point], 2, 1)
    assert (record.ranks, record.threads_per_rank) == (2, 1)
    assert [p.model_dump() for p in record.points] == [
        {"batch": 8, "alone_s": 0.010, "together_s": 0.012, "sigma_log": 0.0, "data_alone_s": None,
         "data_together_s": None, "data_warm_s": None, "sigma_rank_log": None}]
    assert RankStepPoint(8, 0.01, None, 5, 0).slowdown is None


def test_together_is_the_mean_over_the_ranks_of_their_medians():
    from trainsim.calibrate.execute.rank_step import summarise_point

    alone = [(0.001, 0.010), (0.001, 0.012), (0.002, 0.011)]
    fast = [(0.001, 0.010)] * 3
    slow = [(0.002, 0.013), (0.002, 0.013), (0.002, 0.014)]
    point = summarise_point(8, alone, [fast, slow], [0.0008, 0.0009])
    assert (point.alone_s, point.data_alone_s) == (0.011, 0.001)
    assert point.together_s == pytest.approx(0.0115) and point.data_together_s == pytest.approx(0.0015)
    assert point.data_warm_s == pytest.approx(0.00085)
    assert (point.steps_alone, point.steps_together) == (3, 6)
    one = summarise_point(8, alone, [], [0.001])
    assert one.together_s is None and one.data_together_s is None and one.sigma_rank_log is None


def test_a_rank_s_own_spread_leaves_out_what_the_ranks_share_and_a_slower_core():
    import numpy as np

    from trainsim.calibrate.execute.rank_step import rank_spread

    host = np.exp(np.random.default_rng(1).normal(0, 0.05, 400))  # the host's speed, the same for both
    assert rank_spread([0.01 * host, 0.013 * host]) == pytest.approx(0.0, abs=1e-12)  # 30 % slower core
    own = np.exp(np.random.default_rng(2).normal(0, 0.01, (2, 400)))
    assert rank_spread([0.01 * host * own[0], 0.01 * host * own[1]]) == pytest.approx(0.01, rel=0.15)


@pytest.mark.slow
def test_two_pinned_ranks_measure_alone_and_together_round_after_round():
    pytest.importorskip("torch")
    from trainsim.calibrate.execute.rank_step import measure_rank_step

    points = measure_rank_step("tiny-cnn", [2, 4], 2, rounds=2, window_s=0.02, options={"image_size": 16})
    assert [p.batch for p in points] == [2, 4]
    for p in points:
        assert p.alone_s > 0 and p.together_s > 0 and p.data_alone_s > 0 and p.data_together_s > 0
        assert p.data_warm_s > 0
        assert p.steps_alone >= 4 and p.steps_together >= 8  # two windows of at least two steps, per rank
    one = measure_rank_step("tiny-cnn", [2], 1, rounds=1, window_s=0.01, options={"image_size": 16})
    assert one[0].together_s is None and one[0].steps_alone >= 2


def _calibrate(out, batch: int, rank_step: bool = True, collectives: bool = False):
    """A quick 2-rank bundle of the tiny CNN at one batch size, with its rank step or without (and its gloo
    calls)."""
    from trainsim.calibrate.measure import runner

    steps = ("probe", "layers", "rank_step") if rank_step else ("probe", "layers")
    steps += ("collectives",) if collectives else ()
    runner.run_calibration(runner.CalibrationConfig(
        model="tiny-cnn", out=out, device="cpu", ranks=2, quick=True, batch_sizes=(batch,), steps=steps,
        model_options={"image_size": 16}))
    return out


@pytest.mark.slow
def test_the_calibration_step_records_it_and_the_simulator_scales_the_ranks_by_it(tmp_path):
    pytest.importorskip("torch")
    from trainsim.api import simulation
    from trainsim.calibrate.measure import runner
    from trainsim.formats.scenario_loader import load_scenario
    from trainsim.formats.workload import load_workload
    from trainsim.sim.compute.costs import rank_costs
    from trainsim.sim.hosts.rank_step import rank_step_scale

    out = _calibrate(tmp_path / "bundle", batch=4)
    workload = load_workload(out / "workload-tiny-cnn.json")
    assert workload.schema_ == "trainsim.workload/2"
    assert '"alone_s"' in (out / "workload-tiny-cnn.json").read_text()  # written in the named form
    record = workload.provenance.rank_step
    assert record.ranks == 2 and [p.batch for p in record.points] == [4]
    headline = runner.summarize(out)["steps"]["rank_step"]["headline"]
    assert "one rank alone batch 4" in headline and "2 at once" in headline

    scenario = {"schema": "trainsim.scenario/1", "name": "t", "topology": "calibrated",
                "workload": {"name": "tiny-cnn", "image_size": 16}, "strategy": {"name": "ddp"},
                "batch_size": 8, "gpus": 2, "iterations": 2, "warmup_iterations": 0}
    sim = simulation(load_scenario(scenario), calibration=str(out))
    gpu = sim.ranks[0]
    device = sim.machine.gpus[gpu].device
    unscaled = rank_costs(sim.workload.model_copy(update={"provenance": sim.workload.provenance.model_copy(
        update={"rank_step": None})}), device, 4, "fp32", "momentum", measured_on=device)
    scale = rank_step_scale(sim.workload, 4, 2)
    assert sim.ctx.costs[gpu].forward_s == pytest.approx([f * scale for f in unscaled.forward_s])


def test_log_spread_is_the_iqr_of_each_ranks_log_deviations():
    import math

    from trainsim.calibrate.execute.rank_step import log_spread

    rank0 = [math.exp(x) for x in (0.0, 0.1, -0.1, 0.2, -0.2)]
    rank1 = [2 * t for t in rank0]  # another median, the same scatter
    assert log_spread([rank0, rank1]) == pytest.approx(0.2 / 1.349)
    assert log_spread([[0.01] * 5]) == 0.0


@pytest.mark.slow
def test_a_round_of_validation_can_measure_the_rank_step_and_gloo_calls_again_in_a_copy(tmp_path):
    pytest.importorskip("torch")
    from trainsim.calibrate.measure import bundle as bf
    from trainsim.calibrate.validate.run import refresh_bundle
    from trainsim.formats.workload import load_workload

    out = _calibrate(tmp_path / "bundle", batch=2, collectives=True)
    before = {name: (out / name).read_text() for name in ("workload-tiny-cnn.json", "collectives.json")}
    fresh = refresh_bundle(str(out), tmp_path / "round-2")
    assert fresh is not None  # the bundle kept, the copy measured again
    assert all((out / name).read_text() == text for name, text in before.items())
    copy = load_workload(tmp_path / "round-2" / "workload-tiny-cnn.json")
    record = copy.provenance.rank_step
    assert [p.batch for p in record.points] == [2] and record.ranks == 2
    assert (tmp_path / "round-2" / "topology.yaml").is_file()
    calls = bf.read_file(tmp_path / "round-2" / "collectives.json", bf.CollectivesFile)
    then = bf.read_file(out / "collectives.json", bf.CollectivesFile)
    assert [r.points[0].samples_s for r in calls.results] != [r.points[0].samples_s for r in then.results]
    assert calls.timer_tick is not None
    assert {r.collective for r in calls.results} >= {"all_reduce", "exchange"}
    no_record = _calibrate(tmp_path / "old", batch=2, rank_step=False)
    assert refresh_bundle(str(no_record), tmp_path / "nothing") is None


@pytest.mark.slow
def test_a_loader_thread_beside_the_step_is_measured_both_ways():
    pytest.importorskip("torch")
    import os

    from trainsim.calibrate.execute.config import DataConfig
    from trainsim.calibrate.execute.rank_step import measure_loader_overlap

    overlap = measure_loader_overlap("tiny-cnn", 4, DataConfig(), options={"image_size": 16}, rounds=2,
                                     window_s=0.1)
    if len(os.sched_getaffinity(0)) < 2:
        assert overlap is None  # no free core for the loader
    else:
        assert set(overlap) == {"step", "prep"} and min(overlap.values()) >= 1.0
