"""Attention: the fused kernel in waves of query blocks, the unfused path as the sum of its kernels."""

import dataclasses

import pytest
from kernel_fixtures import GPU4, params

from trainsim.sim.compute.kernels.attention import BLOCK_Q, attention_time
from trainsim.sim.compute.kernels.matmul import gemm_time
from trainsim.sim.compute.kernels.memory_bound import streaming_time
from trainsim.sim.compute.kernels.specs import Attention, Gemm, Streaming


def test_fused_attention_runs_its_query_blocks_in_waves():
    # 1 sample x 4 heads x 512 queries: 16 blocks of 128 queries on 4 SMs = 4 waves; each block does
    # 4 x 128 x 512 keys x 64 FLOPs on one SM's 1 TFLOP/s
    spec = Attention(batch=1, heads=4, q_len=512, kv_len=512, head_dim=64, dtype="fp32")
    estimate = attention_time(spec, GPU4, params())
    assert estimate.seconds == pytest.approx(4 * 4 * BLOCK_Q * 512 * 64 / 1e12)
    assert estimate.bound == "compute" and estimate.detail["path"] == "fused"


def test_a_causal_mask_halves_the_keys_and_backward_is_2_5_times():
    full = attention_time(Attention(1, 4, 512, 512, 64, dtype="fp32"), GPU4, params()).seconds
    causal = attention_time(Attention(1, 4, 512, 512, 64, causal=True, dtype="fp32"), GPU4, params()).seconds
    assert causal / full == pytest.approx((512 * 513 / 2) / (512 * 512))
    back = attention_time(Attention(1, 4, 512, 512, 64, backward=True, dtype="fp32"), GPU4, params()).seconds
    assert back == pytest.approx(2.5 * full)


def test_unfused_attention_is_its_gemms_scale_and_softmax():
    spec = Attention(1, 4, 512, 512, 64, fused=False, causal=True, dtype="fp32")
    fig = params(strided={"efficiency_fp32": 0.25, "efficiency_16bit": 0.1})
    scores = 4 * 512 * 512
    parts = [gemm_time(Gemm(512, 512, 64, batch=4), GPU4, fig).seconds,
             gemm_time(Gemm(512, 64, 512, batch=4), GPU4, fig).seconds,
             streaming_time(Streaming("elementwise", scores), GPU4, fig).seconds,  # the scale
             streaming_time(Streaming("softmax", scores, row=512), GPU4, fig).seconds]
    # the causal mask: the scores in and out, unvectorised, at a quarter of the bandwidth (fp32 values)
    mask = 8 * scores / (1e11 * 0.25)
    estimate = attention_time(spec, GPU4, fig)
    assert estimate.seconds == pytest.approx(sum(parts) + mask)
    assert estimate.detail == {"path": "unfused", "kernels": 5}
    plain = attention_time(dataclasses.replace(spec, causal=False), GPU4, fig)
    assert plain.seconds == pytest.approx(sum(parts))
    assert plain.detail == {"path": "unfused", "kernels": 4}


# ---- fused attention fitted on published kernel measurements (attention_fit) ---------------------------

import json  # noqa: E402
from pathlib import Path  # noqa: E402

from trainsim.sim.compute.kernels import attention_fit  # noqa: E402
from trainsim.sim.compute.kernels.attention import fused_figures  # noqa: E402
from trainsim.sim.compute.kernels.params import load_params  # noqa: E402
from trainsim.sim.core.devices import get_device  # noqa: E402

ROWS = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "attention-kernels.json"


def _rows():
    return attention_fit.rows_from(json.loads(ROWS.read_text()))


def test_the_shipped_hopper_figures_reproduce_the_flash_rows_they_were_fitted_on():
    h100, shipped = get_device("h100-sxm"), load_params()
    fitted = [r for r in _rows() if r.source == "fa3-paper"]
    for row in fitted:
        estimate = attention_time(row.spec(), h100, shipped)
        assert estimate.detail["efficiency_from"] == "architecture:hopper"
        assert abs(estimate.seconds / row.seconds() - 1) < 0.12, row
    # the GEMM efficiency the model used before runs these calls about twice as fast as measured
    assert all(r.tflops < 0.45 * 989 for r in fitted)


def test_attention_figures_apply_to_16_bit_inputs_of_the_fitted_generation_and_later_ones():
    shipped = load_params()
    spec = Attention(2, 16, 4096, 4096, 128, causal=True, dtype="bf16")
    assert fused_figures(get_device("h200"), shipped, spec)[4]          # hopper: fitted
    assert not fused_figures(get_device("a100-80gb"), shipped, spec)[4]  # ampere: no rows, GEMM figure
    assert not fused_figures(get_device("l40s"), shipped, spec)[4]       # ada is older than hopper
    # blackwell runs the same sm80 flash kernels: hopper's share of the peak, not its own GEMM figure
    efficiency, _, _, where, fitted = fused_figures(get_device("b200"), shipped, spec)
    assert fitted and where.startswith("architecture:hopper")
    assert efficiency == fused_figures(get_device("h100-sxm"), shipped, spec)[0]
    fp32 = Attention(2, 16, 4096, 4096, 128, dtype="fp32")
    assert not fused_figures(get_device("h100-sxm"), shipped, fp32)[4]  # flash kernels take 16-bit inputs


def test_the_fit_recovers_known_figures_from_rows_they_generate():
    h100 = get_device("h100-sxm")
    truth = {"forward_efficiency": 0.4, "forward_block_keys": 50.0, "backward_efficiency": 0.3,
             "backward_block_keys": 200.0, "causal_block_keys": 80.0}
    rows = []
    for r in _rows():
        seconds = attention_fit.predict(r, h100, truth)
        tflops = r.tflops * r.seconds() / seconds  # the TFLOP/s that makes the row take `seconds`
        rows.append(attention_fit.AttentionRow(r.source, r.device, r.backward, r.causal, r.head_dim,
                                               r.seq_len, r.batch, r.heads, tflops))
    fitted = attention_fit.fit_attention(rows, h100)
    for name, value in truth.items():
        assert fitted[name] == pytest.approx(value, rel=0.02), name


def test_held_out_errors_predict_rows_the_fit_did_not_see():
    h100 = get_device("h100-sxm")
    held = attention_fit.held_out_errors(_rows(), h100, "fa3-paper")
    assert len(held["head_dim"]) == 42 and len(held["other_sources"]) == 5
    assert max(abs(e) for e in held["head_dim"] + held["other_sources"]) < 0.25
