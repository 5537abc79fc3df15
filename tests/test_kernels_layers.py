"""A workload's layers as kernels: shapes inferred from the recorded figures, the precision PyTorch runs."""

import pytest

from trainsim.sim.compute.analytic_models import build_analytic
from trainsim.sim.compute.kernels.layers import (
    LayerUnknown,
    layer_estimate,
    layer_kernels,
    op_kernels,
    runs_as,
)
from trainsim.sim.compute.kernels.specs import Attention, Conv2d, Gemm, Streaming
from trainsim.sim.core.devices import get_device


def _layer(workload, name):
    return next(layer for layer in workload.layers if layer.name == name)


def test_a_linear_layer_is_its_gemm_with_both_gradients():
    gpt = build_analytic("gpt2-small", block_size=512)
    forward, backward = layer_kernels(_layer(gpt, "h.0.mlp.c_fc"), 8, "bf16", gpt.dtype)
    assert forward == [Gemm(m=8 * 512, n=3072, k=768, dtype="bf16", shared_b=True)]
    assert backward[0] == Gemm(m=8 * 512, n=768, k=3072, dtype="bf16", shared_b=True)  # dX
    assert backward[1] == Gemm(m=3072, n=768, k=8 * 512, dtype="bf16")  # dW
    assert isinstance(backward[2], Streaming) and backward[2].kind == "reduction"  # the bias gradient
    per_sample = _layer(gpt, "h.0.mlp.c_fc").flops_forward_per_sample
    assert sum(k.flops for k in forward) == pytest.approx(8 * per_sample)


def test_a_tied_head_without_bias():
    gpt = build_analytic("gpt2-small", block_size=256)
    forward, backward = layer_kernels(_layer(gpt, "lm_head"), 2, "fp32", gpt.dtype)
    assert forward == [Gemm(m=512, n=50257, k=768, shared_b=True)]
    assert len(backward) == 2  # no bias reduction


def test_a_convolution_from_its_spatial_shape_and_no_data_gradient_for_the_first():
    resnet = build_analytic("resnet50")
    forward, backward = layer_kernels(_layer(resnet, "conv1"), 4, "fp32", resnet.dtype)
    assert forward == [Conv2d(batch=4, in_channels=3, out_channels=64, height=224, width=224, kernel=(7, 7),
                              stride=2, padding=3)]
    assert [k.pass_ for k in backward] == ["backward_weight"]  # the image needs no gradient
    _, backward = layer_kernels(_layer(resnet, "layer1.0.conv2"), 4, "fp32", resnet.dtype)
    assert [k.pass_ for k in backward] == ["backward_data", "backward_weight"]


def test_attention_from_the_config_and_streaming_layers_from_their_bytes():
    gpt = build_analytic("gpt2-small", block_size=512)
    forward, _ = layer_kernels(_layer(gpt, "h.0.attn.core"), 2, "fp32", gpt.dtype,
                               config={"n_head": 12, "n_embd": 768, "block_size": 512})
    assert forward[0] == Attention(batch=2, heads=12, q_len=512, kv_len=512, head_dim=64, causal=True,
                                   fused=False, dtype="fp32")
    # q, k, v and the output copied out of transposed views: unvectorised, strided kernels
    assert [(k.kind, k.elements) for k in forward[1:]] == [("strided", 2 * 3 * 512 * 768),
                                                           ("strided", 2 * 512 * 768)]
    # without the config: the sequence from FLOPs over output, 64-wide heads
    assert layer_kernels(_layer(gpt, "h.0.attn.core"), 2, "fp32", gpt.dtype)[0][0] == forward[0]
    norm = _layer(gpt, "h.0.ln_1")
    forward, backward = layer_kernels(norm, 2, "fp32", gpt.dtype, config={"n_embd": 768})
    assert forward[0].kind == "layernorm" and forward[0].row == 768
    assert forward[0].bytes == pytest.approx(2 * norm.memory_bytes_forward_per_sample, rel=1e-3)
    half, _ = layer_kernels(norm, 2, "bf16", gpt.dtype, config={"n_embd": 768})
    assert half[0].bytes == pytest.approx(forward[0].bytes / 2, rel=1e-3)


def test_flash_attention_of_a_transformer_preset():
    llama = build_analytic("llama3-8b", seq_len=1024, num_hidden_layers=1)
    config = llama.provenance.config
    core = next(layer for layer in llama.layers if layer.kind == "flash_attention")
    forward, backward = layer_kernels(core, 1, "bf16", llama.dtype, config=config)
    assert forward == [Attention(batch=1, heads=32, q_len=1024, kv_len=1024, head_dim=128, causal=True,
                                 fused=True, dtype="bf16")]
    assert backward[0].backward


def test_a_layer_whose_shape_cannot_be_told():
    gpt = build_analytic("gpt2-small", block_size=64)
    odd = _layer(gpt, "h.0.mlp.c_fc").model_copy(update={"param_bytes": 7})
    with pytest.raises(LayerUnknown):
        layer_kernels(odd, 1, "fp32", gpt.dtype)


def test_pytorch_runs_fp32_convolutions_as_tf32_and_a_missing_precision_as_fp32():
    a100, v100 = get_device("a100-80gb"), get_device("v100")
    conv = Conv2d(batch=1, in_channels=8, out_channels=8, height=8, width=8)
    assert runs_as(conv, a100).dtype == "tf32"
    assert runs_as(conv, a100, tf32_conv=False).dtype == "fp32"
    assert runs_as(Gemm(8, 8, 8), a100).dtype == "fp32"  # torch.backends.cuda.matmul.allow_tf32 is off
    assert runs_as(Gemm(8, 8, 8), a100, tf32_matmul=True).dtype == "tf32"
    assert runs_as(Gemm(8, 8, 8, dtype="tf32"), v100).dtype == "fp32"  # a V100 has no TF32
    assert runs_as(Gemm(8, 8, 8, dtype="bf16"), v100).dtype == "fp32"
    assert runs_as(conv, v100).dtype == "fp32"


def test_a_layer_estimate_sums_its_kernels():
    resnet = build_analytic("resnet50")
    forward, backward = layer_kernels(_layer(resnet, "layer1.0.conv2"), 32, "fp32", resnet.dtype)
    one = layer_estimate(forward, "h100-sxm")
    both = layer_estimate(forward + backward, "h100-sxm")
    assert both.seconds > one.seconds > 0 and one.low <= one.seconds <= one.high
    assert one.kernel_class == "conv" and one.kernels == 1


def test_a_profiled_ops_shape_is_its_kernels():
    assert op_kernels(("gemm", 2, 64, 32, 16), "bf16") == [Gemm(m=64, n=32, k=16, batch=2, dtype="bf16")]
    convs = op_kernels(["conv", 4, 3, 8, 32, 32, 3, 3, 1, 1, 1, "backward_data+backward_weight"], "fp32")
    assert [c.pass_ for c in convs] == ["backward_data", "backward_weight"]
    assert op_kernels((), "fp32") == []


def test_a_split_attention_is_timed_as_its_rank_s_share_of_heads_and_queries():
    # tensor parallelism splits the heads, context parallelism the queries (sim/parallel/split.py scales the
    # layer's output and FLOPs); the kernel model times the rank's share, not the whole layer
    from trainsim.sim.parallel.stage_costs import Layout, ModelCosts

    workload = build_analytic("llama3-8b", seq_len=8192, num_hidden_layers=2)  # whole waves
    costs = ModelCosts(workload, get_device("h100-sxm"), "bf16", "adam", compute_model="kernels")
    whole = costs.blocks(Layout.of({"tp": 1})).core[1]
    assert costs.blocks(Layout.of({"tp": 4})).core[1] == pytest.approx(whole / 4, rel=0.05)
    assert costs.blocks(Layout.of({"cp": 2})).core[1] == pytest.approx(whole / 2, rel=0.05)
    # 4 heads x 1,024 queries: 32 blocks, one wave on 132 SMs where the whole layer takes 16: a 64th of the
    # work in a 16th of the time (the rank's SMs mostly idle)
    assert costs.blocks(Layout.of({"tp": 8, "cp": 8})).core[1] == pytest.approx(whole / 16, rel=0.05)
