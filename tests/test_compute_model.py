"""The compute model switch (``compute_model: roofline | kernels``): calibrated retargeting by the kernel
model, analytic times from it, the per-layer view, replay --gpu, and a precision a GPU has not got."""

import json

import pytest
from typer.testing import CliRunner

from trainsim.cli import app
from trainsim.errors import TrainsimError
from trainsim.formats.workload import TimeModel, Workload
from trainsim.sim.compute.analytic_models import build_analytic
from trainsim.sim.compute.kernels.layers import layer_estimate, layer_kernels
from trainsim.sim.compute.roofline import layer_time, layer_times, retarget, times_report
from trainsim.sim.core.devices import cpu_device, get_device
from trainsim.sim.replay.op_work import op_work
from trainsim.sim.replay.trace_graph import GpuOp
from trainsim.sim.replay.whatif import WhatIf, compute_ratio

runner = CliRunner()


def _measured(device: str = "h200", precision: str = "fp32") -> Workload:
    wl = build_analytic("resnet18", image_size=64)
    layers = []
    for i, layer in enumerate(wl.layers):
        fwd = TimeModel.from_points([(8, 1e-5 * (i + 1), 0.0), (32, 4e-5 * (i + 1), 1e-6)])
        bwd = TimeModel.from_points([(8, 2e-5 * (i + 1), 0.0), (32, 8e-5 * (i + 1), 1e-6)])
        layers.append(layer.model_copy(update={"forward": fwd, "backward": bwd}))
    provenance = wl.provenance.model_copy(update={"device": device, "device_spec": device,
                                                  "precision": precision})
    return wl.model_copy(update={"layers": layers, "provenance": provenance})


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_prediction_on_the_gpu_it_was_measured_on_is_the_measurement(precision):
    wl = _measured("h200", precision)
    for model in ("roofline", "kernels"):
        times = layer_times(wl, "h200", 16, precision, model=model)
        assert times == [(layer.forward.at(16), layer.backward.at(16)) for layer in wl.layers]  # ratio 1
    assert {r["source"] for r in times_report(wl, "h200", 16, precision, model="kernels")["layers"]} == {
        "measured"}


def test_retargeting_scales_each_layer_by_its_own_kernels():
    wl = _measured("h200")
    moved = layer_times(wl, "a100-80gb", 16, model="kernels")
    conv = next(i for i, layer in enumerate(wl.layers) if layer.name == "layer1.0.conv1")
    forward, _ = layer_kernels(wl.layers[conv], 16, "fp32", wl.dtype)
    launch = 5e-6  # the roofline's launch overhead per kernel, on both sides
    ratio = ((layer_estimate(forward, "a100-80gb").seconds + launch)
             / (layer_estimate(forward, "h200").seconds + launch))
    assert moved[conv][0] == pytest.approx(wl.layers[conv].forward.at(16) * ratio)
    assert ratio != pytest.approx(
        layer_time(wl.layers[conv], "a100-80gb", 16)[0] / layer_time(wl.layers[conv], "h200", 16)[0])
    # the same GPU in another precision: the kernel model's precision ratio
    bf16 = layer_times(wl, "h200", 16, "bf16", model="kernels")
    assert bf16[conv][0] < wl.layers[conv].forward.at(16)
    # and a whole retargeted workload agrees at its measured batches (between them it refits the points)
    assert retarget(wl, "a100-80gb", model="kernels").layers[conv].forward.at(32) == pytest.approx(
        layer_times(wl, "a100-80gb", 32, model="kernels")[conv][0], rel=1e-6)


def test_cpu_devices_keep_the_roofline():
    wl = build_analytic("tiny-cnn")
    cpu = cpu_device(8, 50e9, 50e9, memory_bytes=2**34)
    assert layer_times(wl, cpu, 4, model="kernels") == layer_times(wl, cpu, 4, model="roofline")
    assert layer_times(wl, "h100", 4, model="kernels") != layer_times(wl, "h100", 4, model="roofline")


def test_an_unknown_compute_model_names_the_field():
    with pytest.raises(TrainsimError) as info:
        layer_times(build_analytic("tiny-cnn"), "h100", 4, model="kernel")
    assert info.value.field == "compute_model" and "roofline" in str(info.value)


def test_the_view_gives_class_bound_rate_and_range():
    report = times_report(build_analytic("resnet50"), "h100", 32, "bf16", model="kernels")
    conv = next(r for r in report["layers"] if r["name"] == "layer3.0.conv2")
    assert conv["source"] == "kernels" and conv["forward"]["kernel_class"] == "conv"
    assert conv["forward"]["bound"] in ("compute", "memory", "launch")
    assert conv["forward"]["low_s"] < conv["forward_s"] < conv["forward"]["high_s"]
    assert report["forward_low_s"] < report["forward_s"] < report["forward_high_s"]
    relu = next(r for r in report["layers"] if r["kind"] == "relu")
    assert relu["forward"]["bound"] == "memory" and relu["forward"]["achieved_unit"] == "B/s"


def test_cli_workload_times_with_the_kernel_model():
    result = runner.invoke(app, ["workload", "times", "gpt2-small", "-d", "h100", "-b", "4", "--precision",
                                 "bf16", "--compute-model", "kernels", "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.output)
    head = next(r for r in record["layers"] if r["name"] == "lm_head")
    assert head["forward"]["kernel_class"] == "matmul" and record["compute_model"] == "kernels"
    result = runner.invoke(app, ["workload", "times", "gpt2-small", "-d", "h100", "--compute-model",
                                 "kernels"])
    assert result.exit_code == 0 and "TFLOP/s" in result.output and "kernels" in result.output
    result = runner.invoke(app, ["workload", "times", "gpt2-small", "-d", "h100", "--compute-model", "fast"])
    assert result.exit_code == 2 and "compute_model" in result.output and "roofline" in result.output


def test_a_scenario_runs_with_either_model_and_a_bad_one_names_the_field():
    base = ["simulate", "scenarios/single-gpu-resnet50.yaml", "--json"]
    roofline = runner.invoke(app, [*base, "--set", "compute_model=roofline"])
    kernels = runner.invoke(app, base)  # the default
    assert json.loads(kernels.output)["iteration_time_s"] == json.loads(
        runner.invoke(app, [*base, "--set", "compute_model=kernels"]).output)["iteration_time_s"]
    assert roofline.exit_code == kernels.exit_code == 0, kernels.output
    assert json.loads(roofline.output)["iteration_time_s"] != json.loads(kernels.output)["iteration_time_s"]
    bad = runner.invoke(app, [*base, "--set", "compute_model=fast"])
    assert bad.exit_code == 2 and "compute_model" in bad.output


@pytest.mark.parametrize("model", ["roofline", "kernels"])
def test_a_precision_the_gpu_has_not_got_is_one_line(model):
    result = runner.invoke(app, ["simulate", "scenarios/ddp-resnet50-dgx1-v100.yaml", "--set",
                                 "precision=tf32", "--set", f"compute_model={model}"])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "precision" in lines[0] and "fp16, fp32" in lines[0]


def _op(name: str, work) -> GpuOp:
    from trainsim.formats.kineto import GpuEvent

    return GpuOp(0, GpuEvent("kernel", name, 0, 7, 0.0, 1e-3), work=work)


def test_replay_gpu_by_the_kernel_model():
    gemm = op_work("aten::mm", [[4096, 4096], [4096, 4096]], ["float", "float"])
    tf32 = _op("sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32", gemm)
    a100, v100, h100 = get_device("a100-40gb"), get_device("v100-32gb"), get_device("h100-sxm")
    assert compute_ratio(tf32, a100, a100, "kernels") == pytest.approx(1.0)  # the same GPU: as measured
    # TF32 on an A100 is FP32 on a V100 (it has no TF32): far slower than the fp32 peaks' ratio
    assert compute_ratio(tf32, a100, v100, "kernels") > 4 * compute_ratio(tf32, a100, v100, "roofline")
    assert compute_ratio(tf32, a100, h100, "kernels") < 1
    # no shapes: the peak ratio, as before
    bare = _op("sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n", None)
    assert compute_ratio(bare, a100, v100, "kernels") == compute_ratio(bare, a100, v100, "roofline")
    with pytest.raises(TrainsimError, match="compute_model"):
        WhatIf(gpu="v100", compute_model="fast")
    assert WhatIf.from_options(gpu="v100", sets=["compute_model=kernels"]).compute_model == "kernels"


def test_workload_times_refuses_a_precision_the_device_lacks_as_simulate_does():
    result = runner.invoke(app, ["workload", "times", "resnet50", "-d", "v100", "--precision", "tf32"])
    assert result.exit_code == 2
    assert "precision" in result.output and "valid choices: fp16, fp32" in result.output
    assert "Traceback" not in result.output
