"""Matrix kernels on hand-computed cases: tiles in waves over the SMs, split-K, the memory floor, Winograd."""

import dataclasses

import pytest
from kernel_fixtures import GPU4, params

from trainsim.errors import TrainsimError
from trainsim.sim.compute.kernels.matmul import (
    ROOFLINE_FRACTION,
    conv_time,
    gemm_core,
    gemm_time,
    layout_bytes,
    tile_factor,
)
from trainsim.sim.compute.kernels.specs import Conv2d, Gemm
from trainsim.sim.core.devices import DeviceSpec, get_device

PER_SM = 1e12  # GPU4: 4 SMs sharing 4 TFLOP/s
TILE_S = 2 * 128 * 128 / PER_SM  # one 128 x 128 tile, per step of K


def _core(m, n, k, batch=1, splits=(1,), bandwidth=1e18, **kw):
    args = {"rate_per_sm": PER_SM, "sms": 4, "efficiency": 1.0, "tile_a": 0.0, "k0": 0.0,
            "tiles": [(128, 128)], "bandwidth": bandwidth, "splits": splits, **kw}
    return gemm_core(m, n, k, batch, 0.0, **args)


def test_four_tiles_fill_four_sms_in_one_wave():
    seconds, compute, memory, tile, split = _core(256, 256, 1024)
    assert seconds == pytest.approx(TILE_S * 1024)
    assert (int(tile), int(split)) == (0, 1)


def test_a_partial_last_wave_costs_a_whole_wave():
    # 6 tiles on 4 SMs: 2 waves, the second half empty
    assert _core(384, 256, 1024)[0] == pytest.approx(2 * TILE_S * 1024)
    # a 129-row output needs a second row of tiles
    assert _core(129, 128, 1024)[0] == pytest.approx(TILE_S * 1024)
    assert _core(129, 128, 1024, batch=3)[0] == pytest.approx(2 * TILE_S * 1024)  # 6 tiles


def test_split_k_fills_the_gpu_when_tiles_are_few():
    # one 128 x 128 output tile, K = 4096, 4 SMs: split 4 ways (one wave of K/4) plus summing 4 fp32 partial
    # 128 x 128 products through memory (written and read: 2 x 4 x 128 x 128 x 4 bytes at 100 GB/s)
    seconds, _, _, _, split = _core(128, 128, 4096, splits=(1, 2, 4, 8, 16), bandwidth=1e11)
    assert int(split) == 4
    assert seconds == pytest.approx(TILE_S * 1024 + 2 * 4 * 128 * 128 * 4 / 1e11)


def test_smaller_tiles_lose_efficiency_by_the_tile_factor():
    assert tile_factor(128, 128, 10.0) == pytest.approx(1.0)
    assert tile_factor(64, 64, 10.0) == pytest.approx((1 + 10 / 64) / (1 + 10 * 2 / 64))
    assert tile_factor(32, 32, 0.0) == 1.0


def test_gemm_time_with_hand_parameters():
    estimate = gemm_time(Gemm(m=256, n=256, k=1024), GPU4, params())
    assert estimate.seconds == pytest.approx(TILE_S * 1024)
    assert estimate.bound == "compute" and estimate.kernel_class == "matmul"
    assert estimate.achieved == pytest.approx(2 * 256 * 256 * 1024 / estimate.seconds)
    assert (estimate.low, estimate.high) == pytest.approx((0.9 * estimate.seconds, 1.2 * estimate.seconds))
    assert estimate.detail["tile"] == "128x128" and estimate.detail["waves"] == 1


def test_a_matrix_vector_product_is_memory_bound():
    fast = dataclasses.replace(GPU4, peak_flops={"fp32": 4e16})
    gemv = Gemm(m=1, n=8192, k=8192)
    estimate = gemm_time(gemv, fast, params())
    assert estimate.bound == "memory"
    assert estimate.seconds == pytest.approx(gemv.bytes / 1e11)


def test_tensor_cores_run_at_their_precisions_peak():
    fp32 = gemm_time(Gemm(m=256, n=256, k=1024), GPU4, params())
    bf16 = gemm_time(Gemm(m=256, n=256, k=1024, dtype="bf16"), GPU4, params())
    # no tensor-core figure: the roofline's fraction of the 8 TFLOP/s bf16 peak (fp32: all of 4 TFLOP/s)
    assert bf16.seconds == pytest.approx(fp32.seconds / 2 / ROOFLINE_FRACTION)
    assert "roofline fraction" in bf16.detail["efficiency_from"]
    fitted = params(matmul={"tensor_efficiency_bf16": 0.5})
    assert gemm_time(Gemm(m=256, n=256, k=1024, dtype="bf16"), GPU4, fitted).seconds == pytest.approx(
        fp32.seconds)  # half of twice the peak


def test_a_precision_without_a_figure_takes_its_stand_in():
    tf32 = params(matmul={"tensor_efficiency_tf32": 0.25})
    bf16 = gemm_time(Gemm(m=256, n=256, k=1024, dtype="bf16"), GPU4, tf32)
    assert bf16.detail["efficiency"] == 0.25 and "tf32 figure: no bf16 rows" in bf16.detail["efficiency_from"]


def test_a_misaligned_tensor_core_gemm_runs_at_its_share():
    fitted = params(matmul={"tensor_efficiency_bf16": 0.5, "misaligned": 0.25})
    aligned = gemm_time(Gemm(m=256, n=256, k=1024, dtype="bf16"), GPU4, fitted)
    odd = gemm_time(Gemm(m=256, n=257, k=1024, dtype="bf16"), GPU4, fitted)  # 257 x 2 B: not 16 B multiples
    assert odd.detail["efficiency"] == pytest.approx(aligned.detail["efficiency"] * 0.25)
    fp32 = params(matmul={"misaligned": 0.25})
    assert gemm_time(Gemm(m=256, n=257, k=1024), GPU4, fp32).detail["efficiency"] == 1.0  # SIMT: no rule


def test_tf32_on_a_v100_is_refused():
    with pytest.raises(TrainsimError, match="has no tf32 matrix units"):
        gemm_time(Gemm(m=256, n=256, k=256, dtype="tf32"), get_device("v100"), params())


def test_a_device_without_sms_is_named():
    bare = DeviceSpec("bare", {"fp32": 1e12}, 1e11, 2**30, architecture="ampere")
    with pytest.raises(TrainsimError) as info:
        gemm_time(Gemm(m=8, n=8, k=8), bare, params())
    assert info.value.field == "device.sm_count"


def test_winograd_when_its_transforms_are_cheap_enough():
    conv = Conv2d(batch=1, in_channels=256, out_channels=256, height=32, width=32, kernel=(3, 3), padding=1)
    # implicit GEMM: 1024 x 256 output, K = 2304: 16 tiles, 4 waves
    implicit = 4 * TILE_S * 2304
    # Winograd F(4x4, 3x3): 8 x 8 = 64 input tiles, 36 GEMMs of 64 x 256 by K = 256: 72 tiles, 18 waves; its
    # transforms move 4 x 4,653,056 bytes
    winograd = 18 * TILE_S * 256
    transforms = 4 * 4_653_056
    unfused = params(conv={"fused_winograd_efficiency": 0.01})  # the fused algorithm out of the running
    slow = conv_time(conv, GPU4, unfused)  # 100 GB/s: the transforms cost more than they save
    assert slow.detail["algorithm"] == "implicit_gemm"
    assert slow.seconds == pytest.approx(implicit)
    fast = conv_time(conv, dataclasses.replace(GPU4, memory_bandwidth=1e12), unfused)
    assert fast.detail["algorithm"] == "winograd"
    assert fast.seconds == pytest.approx(winograd + transforms / 1e12)
    strided = conv_time(dataclasses.replace(conv, stride=2), dataclasses.replace(GPU4, memory_bandwidth=1e12),
                        unfused)
    assert strided.detail["algorithm"] == "implicit_gemm"  # Winograd takes stride 1 only


def test_fused_winograd_keeps_its_transforms_on_chip():
    conv = Conv2d(batch=1, in_channels=256, out_channels=256, height=32, width=32, kernel=(3, 3), padding=1)
    # F(2x2, 3x3): 16 x 16 = 256 output tiles, 16 GEMMs of 256 x 256 by K = 256: 64 tiles, 16 waves; HBM sees
    # the input, the 4x4 filters and the output once (6,291,456 bytes, under the GEMM's time at 100 GB/s),
    # and the filter transform reads 3x3 and writes 4x4 filters (4 x 25 x 65,536 bytes)
    fused = 16 * TILE_S * 256 + 4 * 25 * 65_536 / 1e11
    estimate = conv_time(conv, GPU4, params())
    assert estimate.detail["algorithm"] == "fused_winograd"
    assert estimate.seconds == pytest.approx(fused)
    assert fused < 4 * TILE_S * 2304  # the implicit GEMM's time
    slower = conv_time(conv, GPU4, params(conv={"fused_winograd_efficiency": 0.75}))
    assert slower.detail["algorithm"] == "fused_winograd"
    assert slower.seconds == pytest.approx(16 * TILE_S * 256 / 0.75 + 4 * 25 * 65_536 / 1e11)


def test_conv_kernels_add_their_fixed_gpu_time():
    conv = Conv2d(batch=1, in_channels=256, out_channels=256, height=32, width=32, kernel=(3, 3), padding=1)
    base = conv_time(conv, GPU4, params()).seconds
    assert conv_time(conv, GPU4, params(conv={"kernel_s": 1e-6})).seconds == pytest.approx(base + 2e-6)


def test_a_tensor_core_convolution_turns_its_tensors_to_nhwc_and_back():
    conv = Conv2d(batch=2, in_channels=8, out_channels=16, height=8, width=8, kernel=(3, 3), padding=1,
                  dtype="bf16")
    # input 2x8x8x8 and output 2x16x8x8 elements, each read and written once at 2 bytes
    assert layout_bytes(conv) == 2 * 2 * (2 * 8 * 64 + 2 * 16 * 64)
    assert layout_bytes(dataclasses.replace(conv, dtype="fp32")) == 0  # SIMT kernels read NCHW
    one = dataclasses.replace(conv, kernel=(1, 1), padding=0)
    assert layout_bytes(one) > 0  # on small maps cuDNN runs 1x1 as an implicit GEMM between transforms
    large = dataclasses.replace(one, height=28, width=28)
    assert layout_bytes(large) == 0  # on large ones a GEMM per image over the NCHW tensors
    with_call = params(conv={"tensor_call_s": 1e-3})
    assert conv_time(conv, GPU4, with_call).seconds == pytest.approx(conv_time(conv, GPU4, params()).seconds
                                                                      + 1e-3)


def test_a_large_1x1_tensor_core_convolution_is_timed_as_the_gemm_cublas_runs():
    from trainsim.sim.compute.kernels.matmul import plain_gemm, runs_as_gemm

    shipped, h200 = load_params(), get_device("h200")
    conv = Conv2d(batch=64, in_channels=256, out_channels=64, height=56, width=56, kernel=(1, 1),
                  dtype="bf16")
    assert runs_as_gemm(conv) and not runs_as_gemm(dataclasses.replace(conv, height=14, width=14))
    assert not runs_as_gemm(dataclasses.replace(conv, stride=2))
    gemm = plain_gemm(conv)  # per image: the 64 x 256 filter times the image's 256 x 3136 positions
    assert (gemm.m, gemm.n, gemm.k, gemm.batch) == (64, 56 * 56, 256, 64) and gemm.flops == conv.flops
    assert plain_gemm(dataclasses.replace(conv, pass_="backward_weight")).flops == conv.flops
    estimate = conv_time(conv, h200, shipped)
    assert estimate.detail["algorithm"] == "gemm"
    # the same GEMM, but its memory floor reads the filter once (the convolution's bytes), not per image
    assert estimate.seconds == pytest.approx(gemm_time(gemm, h200, shipped).seconds, rel=0.05)
    assert estimate.seconds < conv_time(dataclasses.replace(conv, height=14, width=14, batch=1024), h200,
                                        shipped).seconds  # the same FLOPs on small maps: transforms too


# ---- per-precision figures and their fit on trace rows (gemm_fit) --------------------------------------

from trainsim.sim.compute.kernels import gemm_fit  # noqa: E402
from trainsim.sim.compute.kernels.matmul import gemm_k0, misaligned_factor  # noqa: E402
from trainsim.sim.compute.kernels.params import load_params  # noqa: E402
from trainsim.sim.core.devices import get_device  # noqa: E402


def test_a_precision_s_own_misaligned_and_k0_figures_come_before_the_shared_ones():
    shipped, a100, h100 = load_params(), get_device("a100-80gb"), get_device("h100-sxm")
    assert misaligned_factor(a100, shipped, "tf32") == shipped.figure(a100, "matmul", "misaligned_tf32")[0]
    assert misaligned_factor(h100, shipped, "tf32") == shipped.figure(h100, "matmul", "misaligned")[0]
    assert gemm_k0(a100, shipped, "tf32") == shipped.figure(a100, "matmul", "k0_tf32")[0]
    assert gemm_k0(a100, shipped, "fp32") == shipped.figure(a100, "matmul", "k0")[0]


def test_a_kernel_named_misaligned_is_timed_as_misaligned_whatever_its_shape():
    shipped, a100 = load_params(), get_device("a100-80gb")
    spec = Gemm(8192, 8192, 512, dtype="tf32")  # aligned by shape; the trace ran it as align1
    assert gemm_time(spec, a100, shipped, misaligned=True).seconds > 1.2 * gemm_time(spec, a100, shipped).seconds


def test_the_gemm_fit_recovers_figures_from_rows_they_generate():
    a100, shipped = get_device("a100-40gb"), load_params()
    truth = {"tensor_efficiency_tf32": 0.6, "k0_tf32": 30.0, "misaligned_tf32": 0.5}
    known = gemm_fit.with_figures(shipped, a100, "tf32", truth)
    shapes = [(2048, 8192, 512, False), (512, 8192, 8192, False), (4096, 4096, 4096, False),
              (2048, 3906, 512, True), (2048, 1953, 1024, True), (8192, 8192, 512, True), (1024, 2048, 256, False)]
    rows = [gemm_fit.GemmRow("synthetic", "a100-40gb", "tf32", 1, m, n, k, bad, 1.0) for m, n, k, bad in shapes]
    rows = [gemm_fit.GemmRow(r.source, r.device, r.dtype, r.batch, r.m, r.n, r.k, r.misaligned,
                             gemm_fit.predict(r, a100, known)) for r in rows]
    fitted = gemm_fit.fit_tensor_gemm(rows, a100, shipped)
    for name, value in truth.items():
        assert fitted[name] == pytest.approx(value, rel=0.03), name


# ---- tensor-core GEMM figures of their own: tiles, a call's fixed time, the small-tile penalty -----------

from kernel_fixtures import data as kernel_data  # noqa: E402

from trainsim.sim.compute.kernels.params import KernelParams  # noqa: E402


def _with_tensor(tiles=None, **matmul) -> KernelParams:
    raw = kernel_data(matmul=matmul)
    if tiles is not None:
        raw["tiles"]["ampere"] = {"tensor": tiles}
    return KernelParams(raw, file="test-params.json")


def test_a_tensor_gemm_adds_its_call_time_and_an_fp32_one_does_not():
    fitted = _with_tensor(tensor_efficiency_bf16=0.5, call_s_bf16=5e-6)
    bare = _with_tensor(tensor_efficiency_bf16=0.5)
    spec = Gemm(m=256, n=256, k=1024, dtype="bf16")
    assert gemm_time(spec, GPU4, fitted).seconds == pytest.approx(gemm_time(spec, GPU4, bare).seconds + 5e-6)
    fp32 = Gemm(m=256, n=256, k=1024)
    assert gemm_time(fp32, GPU4, fitted).seconds == gemm_time(fp32, GPU4, bare).seconds


def test_a_tensor_gemm_takes_its_architecture_s_tensor_tiles():
    # 512 x 512 output as four 256 x 256 tiles on the 4 SMs: one wave of 4x the 128 x 128 tile's time
    wide = _with_tensor(tiles=[[256, 256]], tensor_efficiency_bf16=1.0)
    estimate = gemm_time(Gemm(m=512, n=512, k=1024, dtype="bf16"), GPU4, wide)
    assert estimate.detail["tile"] == "256x256"
    assert estimate.seconds == pytest.approx(4 * (TILE_S / 2) * 1024)  # bf16 peak is twice fp32's
    # fp32 (SIMT) keeps the single-GEMM tiles; an architecture without tensor tiles falls back to them too
    assert gemm_time(Gemm(m=256, n=256, k=1024), GPU4, wide).detail["tile"] == "128x128"
    plain = _with_tensor(tensor_efficiency_bf16=1.0)
    assert gemm_time(Gemm(m=256, n=256, k=1024, dtype="bf16"), GPU4, plain).detail["tile"] == "128x128"


def test_a_tensor_gemm_takes_its_own_small_tile_penalty():
    tiles = [[64, 64]]
    own = _with_tensor(tiles=tiles, tensor_efficiency_bf16=1.0, tile_a_bf16=32.0)
    shared = _with_tensor(tiles=tiles, tensor_efficiency_bf16=1.0)  # tile_a 0 in the fixture
    spec = Gemm(m=256, n=256, k=4096, dtype="bf16")  # 16 tiles in 4 waves, compute-bound
    ratio = gemm_time(spec, GPU4, own).seconds / gemm_time(spec, GPU4, shared).seconds
    assert ratio == pytest.approx(1 / tile_factor(64, 64, 32.0))


def test_the_gemm_fit_recovers_a_call_time_and_tile_penalty_it_generated():
    h100, shipped = get_device("h100-sxm"), load_params()
    truth = {"tensor_efficiency_bf16": 0.8, "k0_bf16": 200.0, "call_s_bf16": 5e-6, "tile_a_bf16": 40.0}
    known = gemm_fit.with_figures(shipped, h100, "bf16", truth)
    sizes = (256, 1024, 4096)
    rows = [gemm_fit.GemmRow("synthetic", "h100-sxm", "bf16", b, m, n, k, False, 1.0)
            for b in (1, 4) for m in sizes for n in sizes for k in sizes]
    rows = [dataclasses.replace(r, seconds=gemm_fit.predict(r, h100, known)) for r in rows]
    fitted = gemm_fit.fit_tensor_gemm(rows, h100, shipped, ("call_s", "tile_a"))
    for name, value in truth.items():
        assert fitted[name] == pytest.approx(value, rel=0.05), name


def test_shipped_hopper_and_blackwell_gemm_figures_reproduce_xla_s_measured_table():
    from pathlib import Path

    from trainsim.sim.compute.kernels.dataset import read_rows

    table = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "xla-gemm-table.csv"
    shipped = load_params()
    by_series: dict = {}
    for r in read_rows(table):
        by_series.setdefault((r.device, r.dtype), []).append(r)
    assert {key: len(rows) for key, rows in by_series.items()} == {
        ("b200", "bf16"): 375, ("b200", "fp8"): 375, ("b200", "tf32"): 375, ("h100-sxm", "bf16"): 375,
        ("h100-sxm", "tf32"): 375}
    for (device, dtype), rows in by_series.items():
        spec = get_device(device)
        errors = sorted(abs(gemm_time(r.spec, spec, shipped).seconds / r.latency_s - 1) for r in rows)
        assert errors[len(errors) // 2] < 0.12, (device, dtype)  # the fit's medians are 2.5 ... 9.3 %


def test_no_tensor_gemm_runs_above_its_measured_ceiling():
    fast = _with_tensor(tensor_efficiency_bf16=1.0)
    capped = _with_tensor(tensor_efficiency_bf16=1.0, ceiling_bf16=0.5)
    spec = Gemm(m=512, n=512, k=4096, dtype="bf16")
    assert gemm_time(spec, GPU4, fast).achieved == pytest.approx(8e12)  # the whole bf16 peak
    assert gemm_time(spec, GPU4, capped).achieved == pytest.approx(4e12)
    assert gemm_time(spec, GPU4, capped).detail["ceiling"] == 0.5


def test_fp16_takes_bf16s_whole_set_of_figures_and_bf16_its_own_precision_before_tf32():
    gpu = dataclasses.replace(GPU4, peak_flops={"fp32": 4e12, "bf16": 8e12, "fp16": 8e12, "tf32": 4e12})
    raw = kernel_data(matmul={"tensor_efficiency_bf16": 0.5, "call_s_bf16": 5e-6, "ceiling_bf16": 0.4})
    raw["architectures"]["ampere"] = {"matmul": {"tensor_efficiency_tf32": 0.25}}
    fitted = KernelParams(raw, file="test-params.json")
    spec = Gemm(m=512, n=512, k=4096, dtype="bf16")
    bf16 = gemm_time(spec, gpu, fitted)
    fp16 = gemm_time(dataclasses.replace(spec, dtype="fp16"), gpu, fitted)
    assert fp16.seconds == bf16.seconds and fp16.detail["call_s"] == 5e-6 and fp16.detail["ceiling"] == 0.4
    # the default's bf16 figure (measured on other generations) before this architecture's TF32 one
    assert bf16.detail["efficiency"] == 0.5 and bf16.detail["efficiency_from"] == "default"


def test_a_layer_fit_ties_a_figure_it_has_too_few_rows_for_to_the_one_fitted_elsewhere():
    from types import SimpleNamespace

    from trainsim.sim.compute.kernels.layer_fit import _elsewhere

    shipped = load_params()
    hopper = shipped.figure(get_device("h200"), "matmul", "tensor_efficiency_bf16")
    assert hopper[1] == "device:h200"  # the H200's kernel sweeps, not its layers
    h200_rows = [SimpleNamespace(device="h200")]
    assert _elsewhere(shipped, h200_rows, "matmul", "tensor_efficiency_bf16", 0.7) == hopper[0]
    # the default's median is a guess for other generations, not evidence about this GPU's rows
    a100_rows = [SimpleNamespace(device="a100-40gb")]
    assert _elsewhere(shipped, a100_rows, "matmul", "tensor_efficiency_bf16", 0.7) == 0.7


def test_tensor_core_gemms_stream_at_their_own_memory_figure_where_given():
    # 4096 x 4096 x 8 in bf16: 34 MB of operands and output at 100 GB/s outlast its 0.27 GFLOP
    wide = Gemm(4096, 4096, 8, dtype="bf16")
    nbytes = 2 * (4096 * 8 + 8 * 4096 + 4096 * 4096)
    simt_only = params(matmul={"memory_efficiency": 0.5})
    assert gemm_time(wide, GPU4, simt_only).seconds == pytest.approx(nbytes / (1e11 * 0.5))
    own = params(matmul={"memory_efficiency": 0.5, "tensor_memory_efficiency": 0.8})
    estimate = gemm_time(wide, GPU4, own)
    assert estimate.seconds == pytest.approx(nbytes / (1e11 * 0.8))
    assert estimate.bound == "memory"
    # fp32 runs on the SIMT cores: their figure, whatever the tensor cores' is
    simt = Gemm(4096, 4096, 8, dtype="fp32")
    assert gemm_time(simt, GPU4, own).seconds == pytest.approx(2 * nbytes / (1e11 * 0.5))
