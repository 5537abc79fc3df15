"""sim/optimizations/compression.py by hand: PowerSGD's per-bucket phases (uncompressed, P and Q bytes,
matmuls, error
feedback) and the weight matrices read from a workload."""

from types import SimpleNamespace

import pytest
from simtools import tiny_workload

from trainsim.formats.workload import Workload
from trainsim.sim.compute.roofline import DEFAULT_EFFICIENCY
from trainsim.sim.optimizations.compression import Codec, CompressionSpec, WeightMatrix, layer_matrices

FP32 = 4
DEVICE = SimpleNamespace(peak_flops={"fp32": 10e12}, memory_bandwidth=1e12, kind="gpu")
STREAMING = 1e12 * DEFAULT_EFFICIENCY.memory  # bytes/s an elementwise pass reaches on DEVICE


def small_cnn() -> Workload:
    """conv 3->16 3x3 (432 weights + 16 bias), batchnorm over 16 channels (32 values), relu, linear
    2048->10 (20480 weights + 10 bias; 2 x 2048 x 10 FLOPs and 10 outputs per sample)."""
    data = tiny_workload(
        [
            {"name": "conv", "fwd": 0.001, "bwd": 0.002, "params": (432 + 16) * FP32},
            {"name": "bn", "fwd": 0.001, "bwd": 0.001, "params": 32 * FP32},
            {"name": "relu", "fwd": 0.001, "bwd": 0.001},
            {"name": "fc", "fwd": 0.001, "bwd": 0.002, "params": (20480 + 10) * FP32, "output": 10 * FP32},
        ],
        batch=8,
    )
    conv, bn, _, fc = data["layers"]
    conv["kind"] = "conv2d"
    conv["spatial"] = {"in_h": 32, "in_w": 32, "in_c": 3, "out_c": 16, "kernel_h": 3, "kernel_w": 3,
                       "padding": 1, "out_h": 32, "out_w": 32}
    bn["kind"] = "batchnorm"
    fc["flops_forward_per_sample"] = 2.0 * 2048 * 10
    return Workload.model_validate(data)


def grads(workload: Workload) -> list[float]:
    return [float(layer.param_bytes) for layer in workload.layers]  # fp32 run of an fp32 workload


def powersgd(rank: int, workload: Workload) -> Codec:
    return Codec(CompressionSpec(method="powersgd", rank=rank), "fp32", layer_matrices(workload), DEVICE)


def test_weight_matrices_come_from_the_recorded_shapes():
    matrices = layer_matrices(small_cnn())
    assert matrices[0] == WeightMatrix(16, 27, 432 / 448)  # out channels x (in channels x kernel); bias aside
    assert matrices[1] is None  # a norm layer's parameters are 1-D
    assert matrices[2] is None  # no parameters
    assert matrices[3] == WeightMatrix(10, 2048, 20480 / 20490)  # (out, in) from FLOPs and outputs


def test_linear_without_consistent_figures_is_one_square_matrix():
    wl = Workload.model_validate(tiny_workload([{"name": "fc", "fwd": 0.001, "bwd": 0.001,
                                                 "params": 1_000_000 * FP32}], batch=8))
    assert layer_matrices(wl) == [WeightMatrix(1000, 1000, 1.0)]


def test_powersgd_phases_by_hand():
    wl = small_cnn()
    g = grads(wl)
    phases = powersgd(2, wl).powersgd_phases(g, [0, 1, 2, 3])
    # biases (16 + 10) and the batchnorm (32) go uncompressed; conv 16x27 and fc 10x2048 as rank-2 factors
    assert phases.uncompressed_bytes == pytest.approx((16 + 32 + 10) * FP32)
    assert phases.p_bytes == (16 * 2 + 10 * 2) * FP32
    assert phases.q_bytes == (27 * 2 + 2048 * 2) * FP32
    assert phases.wire_bytes == pytest.approx(phases.uncompressed_bytes + phases.p_bytes + phases.q_bytes)
    assert phases.matmul_s == pytest.approx((2 * 16 * 27 * 2 + 2 * 10 * 2048 * 2) / 10e12)
    assert phases.error_feedback_s == pytest.approx(2 * sum(g) / STREAMING)  # read + write the bucket


def test_matrices_not_worth_compressing_go_uncompressed():
    wl = small_cnn()
    g = grads(wl)
    # rank 9: conv (16 + 27) x 9 = 387 < 432 values and fc (10 + 2048) x 9 < 20480: both compressed
    assert powersgd(9, wl).powersgd_phases(g, [0, 3]).uncompressed_bytes == pytest.approx((16 + 10) * FP32)
    # rank 11: conv (16 + 27) x 11 = 473 >= 432; fc's rank is clipped to min(m, n) = 10: 2058 x 10 >= 20480
    phases = powersgd(11, wl).powersgd_phases(g, [0, 3])
    assert phases.uncompressed_bytes == g[0] + g[3]
    assert (phases.p_bytes, phases.q_bytes, phases.matmul_s) == (0, 0, 0)


def test_codec_wire_and_passes_agree_with_the_phases():
    wl = small_cnn()
    g = grads(wl)
    codec = powersgd(2, wl)
    phases = codec.powersgd_phases(g, [0, 3])
    assert codec.wire_bytes(g, [0, 3]) == phases.wire_bytes
    assert codec.encode_s(g, [0, 3]) == pytest.approx(phases.error_feedback_s + 2 * phases.matmul_s)
    assert codec.decode_s(g, [0, 3]) == pytest.approx(phases.matmul_s + phases.error_feedback_s)


def test_elementwise_methods_keep_their_ratio():
    wl = small_cnn()
    g = grads(wl)
    for spec, ratio in (("fp16", 0.5), ("int8", 0.25), ({"method": "topk", "ratio": 0.1}, 0.2)):
        codec = Codec(CompressionSpec.model_validate(spec), "fp32", layer_matrices(wl), DEVICE)
        assert codec.wire_bytes(g, [0, 1, 3]) == pytest.approx(ratio * (g[0] + g[1] + g[3]))
        assert codec.encode_s(g, [0]) == pytest.approx((1 + ratio) * g[0] / STREAMING)


def test_a_measured_hook_cost_scales_every_pass_and_keeps_their_shares():
    wl = small_cnn()
    g = grads(wl)
    every = [i for i, b in enumerate(g) if b > 0]
    for spec in ({"method": "powersgd", "rank": 2}, "fp16"):
        codec = Codec(CompressionSpec.model_validate(spec), "fp32", layer_matrices(wl), DEVICE)
        encode, decode = codec.encode_s(g, [0]), codec.decode_s(g, [0])
        codec.fit_to(0.002, g)
        assert codec.encode_s(g, every) + codec.decode_s(g, every) == pytest.approx(0.002)  # one iteration
        assert codec.encode_s(g, [0]) / codec.decode_s(g, [0]) == pytest.approx(encode / decode)
        assert codec.wire_bytes(g, every) == Codec(CompressionSpec.model_validate(spec), "fp32",
                                                   layer_matrices(wl), DEVICE).wire_bytes(g, every)
        codec.fit_to(-1.0, g)  # noise under 0: nothing
        assert codec.encode_s(g, every) == 0
