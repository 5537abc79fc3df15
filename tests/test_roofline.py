"""Roofline estimates, measured/retargeted layer times and efficiency fitting."""

import pytest

from trainsim.errors import TrainsimError
from trainsim.formats.workload import Layer, TimeModel, Workload
from trainsim.sim.compute.analytic_models import build_analytic
from trainsim.sim.compute.roofline import (
    Efficiency,
    compute_time,
    fit_efficiency,
    layer_time,
    layer_times,
    retarget,
    times_report,
)
from trainsim.sim.core.devices import cpu_device, get_device

NO_LAUNCH = Efficiency(compute=1.0, memory=1.0, launch_overhead_s=0.0)


def _layer(kind="linear", flops=0.0, traffic=0.0, params=0, **kwargs) -> Layer:
    return Layer(name="x", kind=kind, param_bytes=params, saved_activation_bytes_per_sample=0,
                 output_bytes_per_sample=0, flops_forward_per_sample=flops,
                 flops_backward_per_sample=2 * flops, memory_bytes_forward_per_sample=traffic,
                 memory_bytes_backward_per_sample=2 * traffic, **kwargs)


def test_compute_bound_layer_runs_at_peak_times_efficiency():
    v100 = get_device("v100")
    layer = _layer(flops=1e9, traffic=1e3)  # 1e6 FLOP/byte: far above the ridge point (17 FLOP/byte)
    half = Efficiency(compute=0.5, memory=1.0, launch_overhead_s=0)
    fwd, bwd = layer_time(layer, v100, 10, efficiency=half)
    assert fwd == pytest.approx(10 * 1e9 / (15.7e12 * 0.5))
    assert bwd == pytest.approx(2 * fwd)


def test_memory_bound_layer_runs_at_bandwidth_times_efficiency_plus_launches():
    v100 = get_device("v100")
    layer = _layer(kind="relu", flops=0.0, traffic=1e6)
    eff = Efficiency(compute=1.0, memory=0.5, launch_overhead_s=4e-6)
    fwd, bwd = layer_time(layer, v100, 8, efficiency=eff)
    assert fwd == pytest.approx(8e6 / 450e9 + 4e-6)
    assert bwd == pytest.approx(16e6 / 450e9 + 4e-6)


def test_parameters_are_read_once_per_batch():
    a100 = get_device("a100")
    layer = _layer(traffic=1e3, params=4_000_000)
    one = layer_time(layer, a100, 1, efficiency=NO_LAUNCH)
    many = layer_time(layer, a100, 100, efficiency=NO_LAUNCH)
    assert one[0] == pytest.approx((1e3 + 4e6) / 1555e9)
    assert many[0] == pytest.approx((1e5 + 4e6) / 1555e9)
    assert many[1] == pytest.approx((2e5 + 2 * 4e6) / 1555e9)  # read weights + write their grads


def test_tied_weights_count_as_traffic():
    a100 = get_device("a100")
    shared = _layer(traffic=0.0, shared_param_bytes=4_000_000)
    assert layer_time(shared, a100, 1, efficiency=NO_LAUNCH)[0] == pytest.approx(4e6 / 1555e9)


def test_half_precision_uses_tensor_peak_and_halves_traffic():
    a100 = get_device("a100")
    compute = _layer(flops=1e9, traffic=1.0)
    memory = _layer(kind="relu", traffic=1e6)
    assert layer_time(compute, a100, 1, "fp16", NO_LAUNCH)[0] == pytest.approx(1e9 / 312e12)
    assert layer_time(compute, a100, 1, "tf32", NO_LAUNCH)[0] == pytest.approx(1e9 / 156e12)
    assert layer_time(memory, a100, 1, "bf16", NO_LAUNCH)[0] == pytest.approx(0.5e6 / 1555e9)
    with pytest.raises(TrainsimError, match="precision on k80"):
        layer_time(compute, "k80", 1, "fp16")
    with pytest.raises(TrainsimError, match="unknown precision 'fp8'"):
        layer_time(compute, a100, 1, "fp8")


def test_identity_layer_costs_nothing():
    assert layer_time(_layer(kind="dropout"), "v100", 32) == (0.0, 0.0)


def test_efficiency_validation():
    with pytest.raises(TrainsimError, match="efficiency.compute"):
        Efficiency(compute=1.5)
    with pytest.raises(TrainsimError, match="efficiency.launch_overhead_s"):
        Efficiency(launch_overhead_s=-1)


def test_analytic_workload_on_faster_gpu_is_faster():
    wl = build_analytic("resnet50")
    v100 = compute_time(wl, "v100", 32)
    h100 = compute_time(wl, "h100", 32)
    assert h100[0] < v100[0] and h100[1] < v100[1]
    # ResNet-50 is mostly compute-bound: the H100/V100 ratio sits between the bandwidth ratio (3.7x) and
    # the fp32 peak ratio (4.3x)
    assert 3.0 < v100[0] / h100[0] < 4.3


def _measured_on_v100() -> Workload:
    wl = build_analytic("tiny-cnn")
    layers = []
    for i, layer in enumerate(wl.layers):
        fwd = TimeModel.from_points([(1, 1e-5 * (i + 1), 0.0), (16, 4e-5 * (i + 1), 1e-6)])
        bwd = TimeModel.from_points([(1, 2e-5 * (i + 1), 0.0), (16, 8e-5 * (i + 1), 1e-6)])
        layers.append(layer.model_copy(update={"forward": fwd, "backward": bwd}))
    provenance = wl.provenance.model_copy(update={"device": "Tesla V100-SXM2-16GB",
                                                  "device_spec": "v100-16gb"})
    return wl.model_copy(update={"layers": layers, "provenance": provenance,
                                 "optimizer_step": TimeModel(points=[(1, 1e-3, 0.0)])})


def test_layer_times_uses_measurements_on_the_measured_device():
    wl = _measured_on_v100()
    times = layer_times(wl, "V100", 4)
    assert times[0] == (wl.layers[0].forward.at(4), wl.layers[0].backward.at(4))
    assert times_report(wl, "v100", 4)["layers"][0]["source"] == "measured"


def test_retarget_scales_each_point_by_the_roofline_ratio():
    wl = _measured_on_v100()
    moved = retarget(wl, "a100", model="roofline")
    assert moved.provenance.device_spec == "a100-40gb"
    assert moved.provenance.retargeted_from == "v100-16gb"
    for before, after in zip(wl.layers, moved.layers, strict=True):
        for batch, seconds, _ in before.forward.points:
            ratio = layer_time(before, "a100", batch)[0] / layer_time(before, "v100", batch)[0]
            assert after.forward.at(batch) == pytest.approx(seconds * ratio)
    assert moved.optimizer_step.at(1) == pytest.approx(1e-3 * 900 / 1555)
    # layer_times for another device applies the same ratio without building a workload
    direct = layer_times(wl, "a100", 16, model="roofline")
    assert direct[3][1] == pytest.approx(moved.layers[3].backward.at(16))
    assert times_report(wl, "a100", 16, model="roofline")["layers"][3]["source"] == "retargeted"


def test_analytic_workload_times_are_the_roofline():
    wl = build_analytic("tiny-cnn")
    assert layer_times(wl, "t4", 8, model="roofline")[0] == layer_time(wl.layers[0], "t4", 8)
    assert times_report(wl, "t4", 8, model="roofline")["layers"][0]["source"] == "roofline"
    assert times_report(wl, "t4", 8)["layers"][0]["source"] == "kernels"  # the default compute model


def test_measured_workload_needs_a_device_to_scale_from():
    wl = _measured_on_v100()
    bare = wl.model_copy(update={"provenance": wl.provenance.model_copy(update={"device_spec": None})})
    with pytest.raises(TrainsimError, match="provenance.device_spec"):
        layer_times(bare, "a100", 8)
    # a calibrated CPU (not in the library) is passed explicitly
    cpu = cpu_device(8, 50e9, 50e9, memory_bytes=2**34)
    assert layer_times(bare, "a100", 8, measured_on=cpu)[0][0] > 0
    unknown = wl.model_copy(update={"provenance": wl.provenance.model_copy(update={"device_spec": "v200"})})
    with pytest.raises(TrainsimError, match="provenance.device_spec: unknown device 'v200'"):
        retarget(unknown, "a100")


def test_fit_efficiency_recovers_the_efficiency_that_made_the_times():
    truth = Efficiency(compute=0.45, memory=0.65, launch_overhead_s=8e-6)
    wl = build_analytic("resnet18", image_size=64)
    layers = []
    for layer in wl.layers:
        update = {}
        for index, key in enumerate(("forward", "backward")):
            points = [(b, layer_time(layer, "v100", b, efficiency=truth)[index], 0.0) for b in (4, 64)]
            update[key] = TimeModel(points=points)
        layers.append(layer.model_copy(update=update))
    measured = wl.model_copy(update={"layers": layers, "provenance": wl.provenance.model_copy(
        update={"device": "Tesla V100", "device_spec": "v100"})})
    fitted = fit_efficiency(measured)
    assert fitted.compute == pytest.approx(truth.compute, rel=1e-3)
    assert fitted.memory == pytest.approx(truth.memory, rel=1e-3)
    assert fitted.launch_overhead_s == pytest.approx(truth.launch_overhead_s, rel=1e-3)


def test_fit_efficiency_needs_measurements():
    with pytest.raises(TrainsimError, match="no measured layer times"):
        fit_efficiency(build_analytic("tiny-cnn"), "v100")
