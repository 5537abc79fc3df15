"""The gloo-VM host plug-in on its own: when it is chosen, its latency model, and the measured rank step it
reads from a workload (`trainsim.sim.hosts`)."""


import pytest

from trainsim.sim.costs import rank_costs
from trainsim.sim.devices import get_device
from trainsim.sim.hosts import GlooVmHost
from trainsim.sim.workload import load_workload


def _with_rank_step(wl, points, ranks=2, plain=None, device_spec="cpu"):
    """``points``: [batch, alone_s, together_s]; ``plain``: the profile's plain step per batch."""
    plain = plain or [[b, 0.010] for b, *_ in points]
    extra = {**(wl.provenance.model_extra or {}), "iteration": {"plain": plain},
             "rank_step": {"ranks": ranks, "points": points}}
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
    from trainsim.sim.devices import cpu_device

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
