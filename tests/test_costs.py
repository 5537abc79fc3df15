"""Per-rank costs: bytes per parameter by precision and optimizer, the optimizer step, layer times."""

import pytest

from trainsim.sim.compute.costs import optimizer_traffic, rank_costs, state_bytes
from trainsim.sim.compute.roofline import layer_times
from trainsim.sim.compute.workload import load_workload
from trainsim.sim.core.devices import get_device


def test_mixed_precision_adam_is_16_bytes_per_parameter():
    # REFERENCE.md: 2 (fp16 weights) + 2 (grads) + 12 (fp32 master, m, v)
    wl = load_workload("tiny-cnn")
    costs = rank_costs(wl, get_device("a100"), 4, "fp16", "adam")
    psi = wl.num_params
    assert costs.param_bytes == 2 * psi and costs.grad_bytes == 2 * psi and costs.state_bytes == 12 * psi
    fp32 = rank_costs(wl, get_device("a100"), 4, "fp32", "momentum")
    assert fp32.param_bytes == 4 * psi and fp32.grad_bytes == 4 * psi and fp32.state_bytes == 4 * psi
    assert state_bytes(psi, "fp32", "sgd") == 0


def test_activations_scale_with_precision_and_batch():
    wl = load_workload("tiny-cnn")
    a = rank_costs(wl, get_device("a100"), 8, "fp32", "sgd")
    b = rank_costs(wl, get_device("a100"), 8, "bf16", "sgd")
    assert a.saved_bytes == pytest.approx(wl.saved_activation_bytes(8))
    assert b.saved_bytes == pytest.approx(a.saved_bytes / 2)
    assert a.input_bytes == 8 * wl.input.bytes_per_sample


def test_layer_times_come_from_the_roofline_module():
    wl = load_workload("resnet50")
    device = get_device("v100")
    costs = rank_costs(wl, device, 32, "fp32", "sgd")
    times = layer_times(wl, device, 32, "fp32")
    assert costs.forward_s == [f for f, _ in times] and costs.backward_s == [b for _, b in times]


def test_unmeasured_optimizer_step_is_memory_bound():
    wl = load_workload("resnet50")
    device = get_device("a100")
    psi = wl.num_params
    costs = rank_costs(wl, device, 32, "fp32", "adam")
    # Adam fp32: read grads (4), read+write weights (8), read+write m and v (16) = 28 B per parameter
    assert optimizer_traffic(psi, "fp32", "adam") == 28 * psi
    assert costs.step_s == pytest.approx(28 * psi / device.memory_bandwidth)
    # SGD: read grads, read and write weights
    assert optimizer_traffic(psi, "fp32", "sgd") == 12 * psi


def test_unattributed_time_of_a_calibrated_workload():
    from types import SimpleNamespace

    from trainsim.sim.compute.costs import unattributed_s

    def wl(points):
        extra = {"iteration": {"unattributed": points}} if points is not None else {}
        return SimpleNamespace(provenance=SimpleNamespace(model_extra=extra))

    points = [[16, -0.001], [32, 0.002], [64, 0.004]]
    assert unattributed_s(wl(points), 48) == pytest.approx(0.003)  # linear between measured sizes
    assert unattributed_s(wl(points), 128) == pytest.approx(0.008)  # proportional beyond them
    assert unattributed_s(wl(points), 16) == 0.0  # negative: the hooks' own cost, not work
    assert unattributed_s(wl(None), 32) == 0.0


def _with_rank_step(wl, points, ranks=2, plain=None, device_spec="cpu"):
    """``points``: [batch, alone_s, together_s]; ``plain``: the profile's plain step per batch."""
    plain = plain or [[b, 0.010] for b, *_ in points]
    extra = {**(wl.provenance.model_extra or {}), "iteration": {"plain": plain},
             "rank_step": {"ranks": ranks, "points": points}}
    provenance = wl.provenance.model_copy(update={**extra, "device_spec": device_spec})
    return wl.model_copy(update={"provenance": provenance})


def test_rank_step_scale_is_the_pinned_step_over_the_profiles_and_the_slowdown_together():
    from trainsim.sim.compute.costs import rank_step_scale

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
    alone = rank_costs(wl, cpu, 8, "fp32", "momentum")
    shared = rank_costs(wl, cpu, 8, "fp32", "momentum", sharing=2)
    assert shared.forward_s == pytest.approx([f * 1.25 for f in alone.forward_s])
    assert shared.backward_s == pytest.approx([b * 1.25 for b in alone.backward_s])
    assert shared.step_s == pytest.approx(alone.step_s * 1.25)
    gpu = rank_costs(wl, get_device("a100"), 8, "fp32", "momentum", sharing=2)  # GPUs have their own SMs
    assert gpu.forward_s == rank_costs(wl, get_device("a100"), 8, "fp32", "momentum").forward_s


def test_rank_step_sigma_interpolates_the_measured_spread():
    from trainsim.sim.compute.costs import rank_step_sigma

    wl = _with_rank_step(load_workload("tiny-cnn"), [[16, 0.01, 0.011, 0.05], [64, 0.04, 0.044, 0.15]])
    assert rank_step_sigma(wl, 16) == pytest.approx((0.05, 0.0))  # not split: all the rank's own
    assert rank_step_sigma(wl, 40) == pytest.approx((0.10, 0.0))
    assert rank_step_sigma(wl, 128) == pytest.approx((0.15, 0.0))
    old = _with_rank_step(load_workload("tiny-cnn"), [[16, 0.01, 0.011]])  # recorded before the spread was
    assert rank_step_sigma(old, 16) == (0.0, 0.0)
    assert rank_step_sigma(load_workload("tiny-cnn"), 16) == (0.0, 0.0)


def test_rank_step_sigma_splits_the_ranks_own_part_from_the_shared():
    from trainsim.sim.compute.costs import rank_step_sigma

    point = [16, 0.01, 0.011, 0.05, 0.001, 0.001, 0.0008, 0.03]
    own, shared = rank_step_sigma(_with_rank_step(load_workload("tiny-cnn"), [point]), 16)
    assert own == pytest.approx(0.03) and shared == pytest.approx(0.04)  # 0.03^2 + 0.04^2 = 0.05^2
    above = [*point[:7], 0.08]  # the own part measured above the whole (anti-correlated ranks): all its own
    wl = _with_rank_step(load_workload("tiny-cnn"), [above])
    assert rank_step_sigma(wl, 16) == pytest.approx((0.05, 0.0))


def test_rank_data_slowdown_is_preparation_together_over_alone():
    from trainsim.sim.compute.costs import rank_data_slowdown

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
    from trainsim.sim.compute.costs import rank_data_cold_s

    wl = _with_rank_step(load_workload("tiny-cnn"), DATA_POINTS)
    assert rank_data_cold_s(wl, 16) == pytest.approx(0.0005)
    assert rank_data_cold_s(wl, 40) == pytest.approx(0.00125)  # linear between the measured sizes
    assert rank_data_cold_s(wl, 128) == pytest.approx(0.004)  # proportional beyond them
    warmer = _with_rank_step(load_workload("tiny-cnn"), [[16, 0.01, 0.011, 0.05, 0.002, 0.0025, 0.003]])
    assert rank_data_cold_s(warmer, 16) == 0.0  # never negative
    assert rank_data_cold_s(load_workload("tiny-cnn"), 16) == 0.0


def test_rank_data_in_loop_s_is_the_measured_in_loop_preparation_per_batch():
    from trainsim.sim.compute.costs import rank_data_in_loop_s

    wl = _with_rank_step(load_workload("tiny-cnn"), DATA_POINTS)
    assert rank_data_in_loop_s(wl, 16) == pytest.approx(0.002)
    assert rank_data_in_loop_s(wl, 40) == pytest.approx(0.004)  # linear between the measured sizes
    assert rank_data_in_loop_s(wl, 128) == pytest.approx(0.012)  # proportional beyond them
    assert rank_data_in_loop_s(wl, 8) == pytest.approx(0.001)
    assert rank_data_in_loop_s(load_workload("tiny-cnn"), 16) == 0.0
