"""Attention: the fused kernel in waves of query blocks, the unfused path as the sum of its kernels."""

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
    fig = params()
    scores = 4 * 512 * 512
    parts = [gemm_time(Gemm(512, 512, 64, batch=4), GPU4, fig).seconds,
             gemm_time(Gemm(512, 64, 512, batch=4), GPU4, fig).seconds,
             2 * streaming_time(Streaming("elementwise", scores), GPU4, fig).seconds,  # scale, causal mask
             streaming_time(Streaming("softmax", scores, row=512), GPU4, fig).seconds]
    estimate = attention_time(spec, GPU4, fig)
    assert estimate.seconds == pytest.approx(sum(parts))
    assert estimate.detail == {"path": "unfused", "kernels": 5}
