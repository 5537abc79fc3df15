"""Fitting: figures recovered from rows made with known ones, tiles read from kernel names, the power cap,
and leave-one-GPU-out taking a held-out GPU's figures from the others."""

import numpy as np
import pytest

from trainsim.sim.compute.kernels import fit
from trainsim.sim.compute.kernels.dataset import KernelRow
from trainsim.sim.compute.kernels.specs import Conv2d, Gemm, Streaming
from trainsim.sim.core.devices import get_device

TILES = {"batched": [[128, 128]], "single": [[128, 128], [64, 64]], "conv": [[128, 128]]}


def _rows(device, cls, specs, op="x"):
    return [KernelRow(source="synthetic.csv", line=i + 2, op=op, kernel_class=cls, gpu=device, device=device,
                      spec=spec, latency_s=1.0) for i, spec in enumerate(specs)]


def _measured(rows, fig, dispatch, shared=None):
    """The same rows with the latency the model gives under ``fig`` and ``dispatch``."""
    pack = fit.Pack(rows, get_device(rows[0].device), rows[0].kernel_class)
    times = fit.observed(pack, fig, dispatch, TILES, shared)
    return [KernelRow(**{**r.__dict__, "latency_s": float(t)}) for r, t in zip(rows, times, strict=True)]


def _elementwise(device, efficiency, dispatch=(30e-6, 10e-6)):
    specs = [Streaming("elementwise", int(n), reads=2) for n in np.geomspace(1e3, 1e8, 60)]
    return _measured(_rows(device, "elementwise", specs, "add"), {"efficiency": efficiency},
                     {"elementwise": dispatch})


def test_elementwise_figures_and_dispatch_are_recovered():
    rows = _elementwise("t4", 0.8)
    pack = fit.Pack(rows, get_device("t4"), "elementwise")
    assert fit.identifiable_ops(pack) == ["elementwise"]
    fig, dispatch, error = fit.fit_pack(pack, TILES)
    assert fig["efficiency"] == pytest.approx(0.8, rel=1e-3)
    assert dispatch["elementwise"]["dispatch_s"] == pytest.approx(30e-6, rel=1e-3)
    assert dispatch["elementwise"]["overlap_s"] == pytest.approx(10e-6, rel=1e-2)
    assert error < 1e-3


def test_a_matmul_efficiency_is_recovered_with_the_shape_held():
    shapes = [(m, n, k) for m in (64, 500, 3000) for n in (96, 1024, 4000) for k in (64, 700, 5000)]
    rows = _rows("v100-pcie-32gb", "matmul", [Gemm(m, n, k, shared_b=True) for m, n, k in shapes], "linear")
    shape = {"tile_a": 10.0, "k0": 8.0}
    fig = {"efficiency": 0.7, "memory_efficiency": 0.6, **shape}
    rows = _measured(rows, fig, {"linear": (40e-6, 10e-6)})
    pack = fit.Pack(rows, get_device("v100-pcie-32gb"), "matmul")
    got, _, error = fit.fit_pack(pack, TILES, fixed=shape, dispatch_fixed={"linear": (40e-6, 10e-6)})
    assert got["efficiency"] == pytest.approx(0.7, rel=1e-2)
    assert error < 0.01


def test_a_conv_dispatch_that_drifts_over_the_collection_is_told_from_the_gpu_time():
    # shapes in random order, as NeuSight's conv files list them; each call's host time grows by 0.1 us per
    # row timed before it (the harness's drift), which the GPU figures must not absorb
    rng = np.random.default_rng(0)
    specs = [Conv2d(batch=int(b), in_channels=int(c), out_channels=int(o), height=int(h), width=int(h),
                    kernel=(3, 3), stride=int(s), padding=1)  # stride 2: the implicit GEMM alone
             for b, c, o, h, s in zip(rng.integers(1, 64, 300), rng.integers(3, 512, 300),
                                      rng.integers(8, 512, 300), rng.integers(5, 64, 300),
                                      rng.integers(1, 3, 300), strict=True)]
    rows = _rows("v100-pcie-32gb", "conv", specs, "conv")
    truth = {"efficiency": 0.8, "winograd_efficiency": 0.7, "fused_winograd_efficiency": 0.6,
             "kernel_s": 2e-6}
    shared = {"tile_a": 10.0, "k0": 8.0, "memory_efficiency": 0.6}
    rows = _measured(rows, truth, {"conv": (50e-6, 5e-6, 0.1e-6)}, shared)
    pack = fit.Pack(rows, get_device("v100-pcie-32gb"), "conv")
    fig, dispatch, error = fit.fit_pack(pack, TILES, shared)
    assert dispatch["conv"]["dispatch_s"] == pytest.approx(50e-6, rel=0.05)
    assert dispatch["conv"]["drift_s"] == pytest.approx(0.1e-6, rel=0.05)
    for name, value in truth.items():
        assert fig[name] == pytest.approx(value, rel=0.05, abs=1e-7), name
    assert error < 0.01
    still = fit.observed(pack, fig, {"conv": (50e-6, 5e-6)}, TILES, shared)  # no drift: the same GPU time
    assert np.all(still <= pack.measured * 1.01)


def test_a_convolution_is_fitted_as_the_algorithm_its_kernels_show():
    def row(*kernels):
        return KernelRow("f", 2, "conv", "conv", "g", "t4", Conv2d(1, 8, 8, 8, 8, (3, 3), padding=1), 1.0,
                         kernel=kernels[-1] if kernels else "", kernels=kernels)

    assert fit.conv_algorithm(row("void cask_cudnn_infer::computeOffsetsKernel",
                                  "cudnn_infer_volta_scudnn_128x64_relu_small_nn_v1")) == 0
    assert fit.conv_algorithm(row("void cudnn::winograd_nonfused::winogradForwardData4x4",
                                  "volta_sgemm_64x64_nn")) == 1
    fused = "cudnn_infer_volta_scudnn_winograd_128x128_ldg1_ldg4_relu_tile148t_nt_v1"
    assert fit.conv_algorithm(row("void cudnn::winograd::generateWinogradTilesKernel", fused)) == 2
    # FFT: not modelled
    assert fit.conv_algorithm(row("void fft2d_r2c_32x32", "ampere_gcgemm_64x64_nt")) == -1
    assert fit.conv_algorithm(row()) == -1
    assert fit.CONV_ALGORITHMS[2] == "fused_winograd"


def test_tiles_are_read_from_kernel_names_turned_round():
    def row(kernel):
        return KernelRow("f", 2, "bmm", "matmul", "g", "t4", Gemm(8, 8, 8, batch=2), 1.0, kernel=kernel)

    assert fit.row_tile(row("ampere_sgemm_128x64_nn")) == (64, 128)
    assert fit.row_tile(row("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x32x8_stage3")) == (32, 128)
    assert fit.row_tile(row("void at::native::vectorized_elementwise_kernel<4>")) is None
    tiles = fit.frequent_tiles([row("volta_sgemm_64x64_nn")] * 99 + [row("volta_sgemm_128x32_nn")])
    assert tiles == {"batched": [[64, 64]]}  # 1 % is below the share a tile needs


def test_the_power_cap_is_fitted_on_the_boards_it_limits():
    eta16, exponent = 47e9, 0.8
    devices = {}
    for name in ("t4", "p4", "l4", "v100-pcie-32gb", "a100-pcie-40gb", "p100-pcie"):
        spec = get_device(name)
        cap = eta16 * (16 / spec.process_nm) ** exponent * spec.tdp_watts / spec.peak("fp32")
        devices[name] = {"matmul": {"efficiency": min(0.9, cap)}}
    power = fit.fit_power(devices)
    assert power["flops_per_watt_16nm"] == pytest.approx(eta16, rel=1e-3)
    assert power["exponent"] == pytest.approx(exponent, rel=1e-3)
    assert sorted(power["capped"]) == ["l4", "p4", "t4"]


def test_leave_one_gpu_out_takes_the_held_out_gpus_figures_from_the_others():
    rows = _elementwise("t4", 0.8) + _elementwise("p4", 0.6, dispatch=(50e-6, 10e-6))
    fitter = fit.DeviceFitter(rows)
    devices = fitter.fit()
    assert devices["t4"]["elementwise"]["efficiency"] == pytest.approx(0.8, rel=1e-3)
    predicted = fit.leave_one_gpu_out(rows, fitter)
    measured = np.array([r.latency_s for r in rows])
    # the largest t4 call (1e8 values: GPU time dominates) predicted at p4's efficiency, and the reverse
    assert predicted[59] / measured[59] == pytest.approx(0.8 / 0.6, rel=0.01)
    assert predicted[119] / measured[119] == pytest.approx(0.6 / 0.8, rel=0.01)
    # with its own host's dispatch the smallest call is right again; without, it takes the other's
    own = fit.leave_one_gpu_out(rows, fitter, own_dispatch=True)
    assert own[0] == pytest.approx(measured[0], rel=0.01)
    assert predicted[0] == pytest.approx(50e-6, rel=0.01)
    quantiles = fit.error_quantiles(predicted, rows)
    assert set(quantiles) == {"elementwise"} and quantiles["elementwise"]["rows"] == 120


@pytest.mark.parametrize("device", ["a100-pcie-40gb", "h100-sxm", "l40s", "p100"])
def test_the_fit_predicts_rows_as_kernel_time_times_kernels(device):
    from trainsim.sim.compute.kernels import kernel_time, load_params
    from trainsim.sim.compute.kernels.launch import observed_seconds
    from trainsim.sim.compute.kernels.specs import Conv2d

    specs = [("matmul", Gemm(m=3000, n=1024, k=700, shared_b=True)),
             ("matmul", Gemm(96, 500, 64, batch=12)),
             ("conv", Conv2d(16, 64, 128, 28, 28, (3, 3), padding=1)),
             ("conv", Conv2d(16, 3, 64, 56, 56, (3, 3), stride=2, padding=1)),
             ("elementwise", Streaming("elementwise", 1 << 22, reads=2)),
             ("layernorm", Streaming("layernorm", 1 << 22, row=2048)),
             ("softmax", Streaming("softmax", 1 << 22, row=512))]
    params = load_params()
    rows = [_rows(device, cls, [spec])[0] for cls, spec in specs]
    predicted = fit.predict(params, rows)
    for row, value in zip(rows, predicted, strict=True):
        estimate = kernel_time(row.spec, device, params)
        _, overlap, _ = params.dispatch(get_device(device), fit.op_of(row.spec))
        expected = observed_seconds(estimate.seconds, estimate.dispatch_s, overlap)
        assert value == pytest.approx(expected, rel=1e-9)


def test_refitting_from_a_bad_file_says_one_line_and_writes_nothing(tmp_path, capsys):
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "bmm.csv").write_text("op,device,dtype,m,n,k,batch,latency\nbmm,x,fp32,1,1,1,1,5\n")
    out = tmp_path / "params.json"
    with pytest.raises(SystemExit) as info:
        fit.main([str(tmp_path), "--out", str(out)])
    assert info.value.code == 2 and not out.exists()
    assert capsys.readouterr().err == ("error: test/bmm.csv: latency: one latency column with its unit is "
                                       "required (got latency); valid choices: latency_s, latency_ms, "
                                       "latency_us\n")
