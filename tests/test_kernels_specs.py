"""Kernel specs: FLOPs and bytes by hand, the implicit GEMM of each convolution pass, bad fields named."""

import pytest

from trainsim.errors import TrainsimError
from trainsim.sim.compute.kernels.specs import Attention, Conv2d, Gemm, KernelEstimate, Streaming


def test_gemm_flops_and_least_traffic():
    g = Gemm(m=64, n=32, k=16, batch=3, dtype="bf16")
    assert g.flops == 2 * 3 * 64 * 32 * 16
    assert g.bytes == 2 * (3 * 64 * 16 + 3 * 16 * 32 + 3 * 64 * 32)
    shared = Gemm(m=64, n=32, k=16, batch=3, shared_b=True)  # one weight for the batch: read once
    assert shared.bytes == 4 * (3 * 64 * 16 + 16 * 32 + 3 * 64 * 32)


def test_conv_output_flops_and_implicit_gemms():
    c = Conv2d(batch=2, in_channels=8, out_channels=16, height=10, width=10, kernel=(3, 3), stride=1,
               padding=1)
    assert (c.out_h, c.out_w) == (10, 10)
    assert c.flops == 2 * 2 * 10 * 10 * 16 * 8 * 9
    fwd = c.as_gemm()
    assert (fwd.m, fwd.n, fwd.k) == (2 * 100, 16, 8 * 9)
    data = Conv2d(2, 8, 16, 10, 10, (3, 3), 1, 1, pass_="backward_data").as_gemm()
    assert (data.m, data.n, data.k) == (2 * 100, 8, 16 * 9)
    weight = Conv2d(2, 8, 16, 10, 10, (3, 3), 1, 1, pass_="backward_weight").as_gemm()
    assert (weight.m, weight.n, weight.k) == (16, 8 * 9, 2 * 100)
    assert fwd.flops == data.flops == weight.flops == c.flops
    assert c.winograd_eligible and not Conv2d(2, 8, 16, 10, 10, (3, 3), stride=2).winograd_eligible
    assert Conv2d(1, 3, 8, 7, 7, (3, 3), stride=2).out_h == 3


def test_a_strided_data_gradient_does_the_forward_s_products_not_one_per_input_tap():
    # stride 2: an input position meets 9/4 of the 3x3 taps on average; cuDNN's strided data-gradient
    # kernels skip the others, so the implicit GEMM runs over the output positions, as the forward does
    strided = Conv2d(2, 8, 16, 10, 10, (3, 3), stride=2, padding=1, pass_="backward_data")
    data = strided.as_gemm()
    assert (data.m, data.n, data.k) == (2 * 5 * 5, 8, 16 * 9)
    assert data.flops == strided.flops
    one = Conv2d(2, 8, 16, 10, 10, (1, 1), stride=2, pass_="backward_data").as_gemm()
    assert (one.m, one.n, one.k) == (2 * 5 * 5, 8, 16)


def test_causal_attention_counts_the_pairs_it_keeps():
    full = Attention(batch=1, heads=2, q_len=4, kv_len=4, head_dim=8)
    causal = Attention(batch=1, heads=2, q_len=4, kv_len=4, head_dim=8, causal=True)
    assert full.pairs == 16 and causal.pairs == 1 + 2 + 3 + 4
    assert causal.flops == 2 * 4 * 8 * 10  # heads x (QK and PV: 2 x 2 x head_dim) x pairs
    assert Attention(1, 1, 4, 4, 8, backward=True).flops == 2.5 * Attention(1, 1, 4, 4, 8).flops


def test_streaming_bytes_are_reads_and_writes():
    s = Streaming("elementwise", elements=1000, reads=2, writes=1, dtype="fp16")
    assert s.bytes == 2 * 1000 * 3 and s.flops == 0


@pytest.mark.parametrize("make, field", [
    (lambda: Gemm(m=0, n=1, k=1), "gemm.m"),
    (lambda: Gemm(m=1, n=1, k=1, dtype="fp64"), "gemm.dtype"),
    (lambda: Conv2d(1, 3, 8, 2, 2, (5, 5)), "conv.kernel"),
    (lambda: Conv2d(1, 3, 8, 8, 8, groups=2), "conv.groups"),
    (lambda: Conv2d(1, 4, 8, 8, 8, pass_="sideways"), "conv.pass_"),
    (lambda: Attention(1, 1, 0, 4, 8), "attention.q_len"),
    (lambda: Streaming("shuffle", 10), "streaming.kind"),
    (lambda: Streaming("elementwise", 10, reads=0, writes=0), "streaming.reads"),
])
def test_bad_fields_are_named(make, field):
    with pytest.raises(TrainsimError) as info:
        make()
    assert info.value.field == field


def test_estimate_checks_its_bound():
    with pytest.raises(TrainsimError, match="valid choices: compute, launch, memory"):
        KernelEstimate(seconds=1.0, bound="network", achieved=0, low=1, high=1)
