"""The gloo-VM host plug-in on its own: when it is chosen, its latency model, and the measured rank step it
reads from a workload (`trainsim.sim.hosts`)."""

import json
from pathlib import Path

import pytest
from simtools import scenario as make_scenario
from simtools import tiny_topology

from trainsim.api import simulation
from trainsim.formats.provenance import IterationRecord, RankStepRecord
from trainsim.formats.workload import load_workload, parse_workload
from trainsim.sim.compute.costs import rank_costs
from trainsim.sim.core.devices import get_device
from trainsim.sim.core.latency import CallSite, RouteLatency
from trainsim.sim.hosts import GlooVmHost, RunMeasurements, host_model_for
from trainsim.sim.hosts.call_latency import GlooCallLatency, MeasuredLatency, TimerTick

BUNDLE = Path(__file__).parent / "data" / "bundle-cpu-2rank"  # a 2-rank gloo calibration, workload/1


def _bundle_scenario(strategy: str = "ddp") -> dict:
    return {"schema": "trainsim.scenario/1", "name": "t", "topology": "calibrated",
            "workload": {"name": "tiny-cnn"}, "strategy": {"name": strategy}, "batch_size": 32, "gpus": 2,
            "iterations": 2, "warmup_iterations": 1}


def test_chosen_where_the_bundle_measured_gloo_calls():
    sim = simulation(_bundle_scenario(), calibration=str(BUNDLE))
    assert isinstance(sim.host, GlooVmHost) and sim.ctx.plugins.host is sim.host
    assert sim.machine.latency is sim.host.latency and isinstance(sim.machine.latency, GlooCallLatency)
    assert {"allreduce", "p2p"} <= set(sim.machine.latency.calls) and sim.machine.latency.tick is not None
    assert sim.machine.latency.blocking_calls
    assert sim.ctx.settings.jitter_spec is not None  # the measured spread of the rank step
    assert sim.run().iteration_time_s > 0


def test_not_chosen_for_a_gpu_scenario_whose_machine_has_the_route_latency():
    sim = simulation(make_scenario(tiny_topology(gpus=2), "tiny-cnn", "ddp", 8))
    assert sim.host is None and sim.ctx.plugins.host is None
    assert isinstance(sim.machine.latency, RouteLatency) and not sim.machine.latency.blocking_calls
    assert host_model_for({}, load_workload("tiny-cnn"), {"a100": get_device("a100")}) is None
    legs = sim.machine.topology.gpu_copy_legs(*sim.ranks)
    assert sim.machine.message_latencies(legs, 1e6, CallSite("allgather")) == [None] * len(legs)


def test_the_route_latency_charges_nothing_of_its_own():
    route = RouteLatency()
    assert route.cost(CallSite("allreduce", skew_s=0.0), 1e6, now=0.0) is None
    assert route.message_cost(None, 1e6, now=0.0) is None


def test_a_gloo_call_pays_its_measured_latency_a_message_the_send_recv_s():
    model = GlooCallLatency({"reduce": 2e-3, "p2p": 5e-4})
    assert model.cost(CallSite("reduce"), 4096, now=0.0) == pytest.approx(2e-3)
    assert model.cost(CallSite("allgather"), 4096, now=0.0) is None  # not measured: the route's
    assert model.message_cost(CallSite("allgather"), 4096, now=0.0) == pytest.approx(5e-4)  # a message
    assert model.message_cost(CallSite("reduce"), 4096, now=0.0) == pytest.approx(2e-3)
    assert model.message_cost(None, 4096, now=0.0) == pytest.approx(5e-4)


def test_every_part_of_one_call_stalls_with_the_others_and_ends_on_a_tick():
    half = MeasuredLatency((4096.0,), ((1e-4,) * 5 + (5e-3,) * 5,))
    model = GlooCallLatency({"reduce": half}, TimerTick(4e-3, dead_time_s=1.5e-3))
    for it in range(50):
        first = model.cost(CallSite("reduce", ("push", it)), 4096, now=0.0)
        second = model.cost(CallSite("reduce", ("push", it)), 4096, now=1e-3)
        assert (first > 1e-3) == (second > 1e-3)  # one call: both parts or neither
        if first > 1e-3:
            assert first == pytest.approx(4e-3) and second == pytest.approx(3e-3)  # on the tick at 4 ms
    # an all-reduce whose ranks met within the probe's "together" stalls with the probe's share for that
    tick = TimerTick(4e-3, dead_time_s=1.5e-3, together_s=5e-5, stall_together=1.0, stall_apart=0.0,
                     probe_bytes=4096)
    met = GlooCallLatency({"allreduce": half}, tick)
    assert all(met.cost(CallSite("allreduce", skew_s=0.0), 4096, now=0.0) > 1e-3 for _ in range(10))
    assert all(met.cost(CallSite("allreduce", skew_s=1e-3), 4096, now=0.0) < 1e-3 for _ in range(10))


def test_a_version_1_rank_step_reads_as_named_fields():
    data = json.loads((BUNDLE / "workload-tiny-cnn.json").read_text())
    assert data["schema"] == "trainsim.workload/1"
    raw = data["provenance"]["rank_step"]["points"][0]
    workload = parse_workload(data)
    assert workload.schema_ == "trainsim.workload/2"
    point = workload.provenance.rank_step.points[0]
    assert (point.batch, point.alone_s, point.together_s, point.sigma_log, point.data_alone_s,
            point.data_together_s, point.data_warm_s, point.sigma_rank_log) == tuple(raw)
    written = json.loads(workload.model_dump_json(by_alias=True))
    assert written["provenance"]["rank_step"]["points"][0]["alone_s"] == raw[1]
    assert parse_workload(written).provenance.rank_step == workload.provenance.rank_step
    short = RankStepRecord.model_validate({"ranks": 2, "points": [[16, 0.01, None, 0.05]]})
    assert short.points[0].together_s is None and short.points[0].data_alone_s is None


def test_run_measurements_travel_with_the_bundle():
    from trainsim.api import load_bundle
    from trainsim.errors import TrainsimError

    scenario = _bundle_scenario()
    measured = RunMeasurements(prep_s_per_sample=2.5e-4)
    through_api = simulation(scenario, calibration=str(BUNDLE), measurements=measured)
    carried = load_bundle(str(BUNDLE)).with_run(measured)
    assert carried.run == measured
    by_bundle = simulation(scenario, calibration=carried)
    prep = by_bundle.ctx.settings.prep_s_per_sample
    assert through_api.ctx.settings.prep_s_per_sample == pytest.approx(prep)
    assert by_bundle.ctx.settings.prep_s_per_sample > 2.5e-4  # the loop's cold start and sharing on top
    plain = simulation(scenario, calibration=str(BUNDLE))
    assert plain.ctx.settings.prep_s_per_sample != pytest.approx(by_bundle.ctx.settings.prep_s_per_sample)
    with pytest.raises(TrainsimError, match="calibration bundle"):
        simulation(scenario, measurements=measured)
    with pytest.raises(ValueError):
        RunMeasurements(codec_s=-1.0)


def _with_rank_step(wl, points, ranks=2, plain=None, device_spec="cpu"):
    """``points``: [batch, alone_s, together_s]; ``plain``: the profile's plain step per batch."""
    plain = plain or [[b, 0.010] for b, *_ in points]
    extra = {"iteration": IterationRecord(plain=plain),
             "rank_step": RankStepRecord.model_validate({"ranks": ranks, "points": points})}
    provenance = wl.provenance.model_copy(update={**extra, "device_spec": device_spec})
    return wl.model_copy(update={"provenance": provenance})


def test_rank_step_scale_is_the_pinned_step_over_the_profiles_and_the_slowdown_together():
    from trainsim.sim.hosts.rank_step import rank_step_scale

    wl = _with_rank_step(load_workload("tiny-cnn"), [[16, 0.011, 0.0132], [64, 0.044, 0.0484]],
                         plain=[[16, 0.010], [64, 0.040]])
    assert rank_step_scale(wl, 16) == pytest.approx(1.1)  # one rank: alone / the profile's plain step
    assert rank_step_scale(wl, 16, 2) == pytest.approx(1.1 * 1.2)  # two at once: x together / alone
    assert rank_step_scale(wl, 40, 2) == pytest.approx(1.1 * 1.15)  # linear in batch between the points
    assert rank_step_scale(wl, 256, 2) == pytest.approx(1.1 * 1.1)  # the nearest point beyond them
    assert rank_step_scale(wl, 16, 4) == pytest.approx(1.1 * 1.6)  # each extra rank adds the measured excess
    faster = _with_rank_step(load_workload("tiny-cnn"), [[16, 0.010, 0.009]])
    assert rank_step_scale(faster, 16, 2) == 1.0  # faster together is noise
    alone_only = _with_rank_step(load_workload("tiny-cnn"), [[16, 0.012, None]], ranks=1)
    assert rank_step_scale(alone_only, 16, 2) == pytest.approx(1.2)  # no measured slowdown to apply
    assert rank_step_scale(load_workload("tiny-cnn"), 16, 2) == 1.0  # not measured


def test_a_calibrated_cpu_ranks_layers_scale_by_the_rank_step_and_gpus_do_not():
    from trainsim.sim.core.devices import cpu_device

    cpu = cpu_device(1, 50e9, 20e9)
    wl = _with_rank_step(load_workload("tiny-cnn"), [[8, 0.010, 0.0125]])
    host = GlooVmHost(wl, {})
    alone = rank_costs(wl, cpu, 8, "fp32", "momentum", scale=host.step_scale(cpu, 8, 1))
    shared = rank_costs(wl, cpu, 8, "fp32", "momentum", scale=host.step_scale(cpu, 8, 2))
    assert shared.forward_s == pytest.approx([f * 1.25 for f in alone.forward_s])
    assert shared.backward_s == pytest.approx([b * 1.25 for b in alone.backward_s])
    assert shared.step_s == pytest.approx(alone.step_s * 1.25)
    a100 = get_device("a100")
    gpu = rank_costs(wl, a100, 8, "fp32", "momentum", scale=host.step_scale(a100, 8, 2))  # their own SMs
    assert gpu.forward_s == rank_costs(wl, get_device("a100"), 8, "fp32", "momentum").forward_s


def test_rank_step_sigma_interpolates_the_measured_spread():
    from trainsim.sim.hosts.rank_step import rank_step_sigma

    wl = _with_rank_step(load_workload("tiny-cnn"), [[16, 0.01, 0.011, 0.05], [64, 0.04, 0.044, 0.15]])
    assert rank_step_sigma(wl, 16) == pytest.approx((0.05, 0.0))  # not split: all the rank's own
    assert rank_step_sigma(wl, 40) == pytest.approx((0.10, 0.0))
    assert rank_step_sigma(wl, 128) == pytest.approx((0.15, 0.0))
    old = _with_rank_step(load_workload("tiny-cnn"), [[16, 0.01, 0.011]])  # recorded before the spread was
    assert rank_step_sigma(old, 16) == (0.0, 0.0)
    assert rank_step_sigma(load_workload("tiny-cnn"), 16) == (0.0, 0.0)


def test_rank_step_sigma_splits_the_ranks_own_part_from_the_shared():
    from trainsim.sim.hosts.rank_step import rank_step_sigma

    point = [16, 0.01, 0.011, 0.05, 0.001, 0.001, 0.0008, 0.03]
    own, shared = rank_step_sigma(_with_rank_step(load_workload("tiny-cnn"), [point]), 16)
    assert own == pytest.approx(0.03) and shared == pytest.approx(0.04)  # 0.03^2 + 0.04^2 = 0.05^2
    above = [*point[:7], 0.08]  # the own part measured above the whole (anti-correlated ranks): all its own
    wl = _with_rank_step(load_workload("tiny-cnn"), [above])
    assert rank_step_sigma(wl, 16) == pytest.approx((0.05, 0.0))


def test_rank_data_slowdown_is_preparation_together_over_alone():
    from trainsim.sim.hosts.rank_step import rank_data_slowdown

    wl = _with_rank_step(load_workload("tiny-cnn"), [[16, 0.01, 0.011, 0.05, 0.002, 0.0025],
                                                     [64, 0.04, 0.044, 0.05, 0.008, 0.0088]])
    assert rank_data_slowdown(wl, 16, 2) == pytest.approx(1.25)
    assert rank_data_slowdown(wl, 40, 2) == pytest.approx(1.175)
    assert rank_data_slowdown(wl, 16, 3) == pytest.approx(1.5)  # each other rank adds the measured excess
    assert rank_data_slowdown(wl, 16, 1) == 1.0
    old = _with_rank_step(load_workload("tiny-cnn"), [[16, 0.01, 0.011, 0.05]])  # recorded without it
    assert rank_data_slowdown(old, 16, 2) == 1.0


# rank-step points with the input pipeline: [batch, alone, together, sigma, data alone, data together,
# data back to back]
DATA_POINTS = [[16, 0.01, 0.011, 0.05, 0.002, 0.0025, 0.0015], [64, 0.04, 0.044, 0.05, 0.006, 0.0070, 0.0040]]


def test_rank_data_cold_s_is_the_in_loop_preparation_over_back_to_back_per_batch():
    from trainsim.sim.hosts.rank_step import rank_data_cold_s

    wl = _with_rank_step(load_workload("tiny-cnn"), DATA_POINTS)
    assert rank_data_cold_s(wl, 16) == pytest.approx(0.0005)
    assert rank_data_cold_s(wl, 40) == pytest.approx(0.00125)  # linear between the measured sizes
    assert rank_data_cold_s(wl, 128) == pytest.approx(0.004)  # proportional beyond them
    warmer = _with_rank_step(load_workload("tiny-cnn"), [[16, 0.01, 0.011, 0.05, 0.002, 0.0025, 0.003]])
    assert rank_data_cold_s(warmer, 16) == 0.0  # never negative
    assert rank_data_cold_s(load_workload("tiny-cnn"), 16) == 0.0


def test_rank_data_in_loop_s_is_the_measured_in_loop_preparation_per_batch():
    from trainsim.sim.hosts.rank_step import rank_data_in_loop_s

    wl = _with_rank_step(load_workload("tiny-cnn"), DATA_POINTS)
    assert rank_data_in_loop_s(wl, 16) == pytest.approx(0.002)
    assert rank_data_in_loop_s(wl, 40) == pytest.approx(0.004)  # linear between the measured sizes
    assert rank_data_in_loop_s(wl, 128) == pytest.approx(0.012)  # proportional beyond them
    assert rank_data_in_loop_s(wl, 8) == pytest.approx(0.001)
    assert rank_data_in_loop_s(load_workload("tiny-cnn"), 16) == 0.0
