"""The facade: kernel_time picks the class, adds dispatch, marks launch-bound kernels; the shipped figures."""

import pytest
from kernel_fixtures import GPU4, params

from trainsim.errors import TrainsimError
from trainsim.sim.compute.kernels import (
    Attention,
    Conv2d,
    Gemm,
    Streaming,
    kernel_time,
    load_params,
)


def test_a_tiny_kernel_is_launch_bound():
    estimate = kernel_time(Streaming("elementwise", 1000), GPU4, params())
    assert estimate.bound == "launch"
    assert estimate.dispatch_s == pytest.approx(10e-6) and estimate.seconds == pytest.approx(8e3 / 1e11)


def test_a_large_kernel_keeps_its_bound():
    estimate = kernel_time(Gemm(m=4096, n=4096, k=4096), GPU4, params())
    assert estimate.bound == "compute" and estimate.seconds > estimate.dispatch_s


def test_not_a_kernel_spec():
    with pytest.raises(TypeError, match="valid: Gemm, Conv2d, Attention, Streaming"):
        kernel_time("gemm", GPU4, params())


def test_unknown_device_lists_the_library():
    with pytest.raises(TrainsimError, match="unknown device 'v200'"):
        kernel_time(Gemm(8, 8, 8), "v200")


def test_tf32_and_fp8_on_a_v100_are_refused():
    for dtype in ("tf32", "fp8"):
        with pytest.raises(TrainsimError, match=f"'v100-16gb' has no {dtype} matrix units"):
            kernel_time(Gemm(1024, 1024, 1024, dtype=dtype), "v100")


@pytest.mark.parametrize("kernel", [
    Gemm(m=4096, n=4096, k=4096), Gemm(m=64, n=1024, k=1024, batch=96),
    Conv2d(batch=32, in_channels=64, out_channels=64, height=56, width=56, kernel=(3, 3), padding=1),
    Attention(batch=8, heads=16, q_len=2048, kv_len=2048, head_dim=64, causal=True),
    Streaming("layernorm", 8 * 2048 * 1024, row=1024), Streaming("elementwise", 1 << 24, reads=2),
])
@pytest.mark.parametrize("device", ["v100", "a100-80gb", "h100-sxm", "l4", "b200"])
def test_shipped_figures_give_a_time_within_its_range(kernel, device):
    if device == "v100" and kernel.dtype not in ("fp32", "fp16"):
        kernel = type(kernel)(**{**kernel.__dict__, "dtype": "fp16"})
    estimate = kernel_time(kernel, device)
    assert 0 < estimate.low <= estimate.seconds <= estimate.high
    assert estimate.achieved > 0


def test_shipped_figures_name_their_evidence():
    shipped = load_params()
    assert shipped.data["evidence"]["neusight"]["licence"].startswith("MIT")
    a100 = shipped.devices["a100-pcie-40gb"]
    assert "NVIDIA_A100-PCIE-40GB" in a100["matmul"]["evidence"] and a100["matmul"]["rows"] > 1000
    assert {"matmul", "conv", "elementwise", "layernorm", "softmax"} <= set(shipped.data["held_out"])
    # the tensor-core figures fitted on the H200's measured kernels name the rows they rest on
    h200 = shipped.devices["h200"]
    assert "h200-kernels" in h200["tensor_evidence"]["conv.tensor_efficiency_tf32"]
    assert "h200-kernels" in h200["tensor_evidence"]["matmul.tensor_efficiency_bf16"]
    assert shipped.data["held_out"]["tensor.conv2d.tf32"]["rows"] >= 10
    assert "matmul.tensor_efficiency_bf16" in shipped.data["unfitted"]


def test_a_measured_gpu_uses_its_own_figures_and_a_new_one_its_generations():
    measured = kernel_time(Gemm(4096, 4096, 4096), "a100-pcie-40gb")
    assert measured.detail["efficiency_from"] == "device:a100-pcie-40gb"
    new = kernel_time(Gemm(4096, 4096, 4096), "a100-80gb")  # SXM: never measured
    assert new.detail["efficiency_from"] == "architecture:ampere"
    t4 = kernel_time(Gemm(4096, 4096, 4096), "t4")  # measured and power-capped: its own figure
    l40s = kernel_time(Gemm(4096, 4096, 4096), "l40s")  # never measured, 350 W for 91.6 TFLOP/s fp32
    assert t4.detail["efficiency_from"] == "device:t4"
    assert "power cap" in l40s.detail["efficiency_from"]
