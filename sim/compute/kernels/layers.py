"""A workload's layers as the kernels they launch, and a layer's time as the sum of its kernels' times.

``layer_kernels(layer, batch, precision, dtype)`` -> (forward kernels, backward kernels), `specs` objects:

- **conv2d** (its ``spatial`` shape): the forward convolution; backward its weight gradient and, where the
  layer's backward FLOPs say so (twice the forward: not the first layer, whose input needs no gradient), its
  data gradient.
- **linear** (and ``router``, ``expert_linear``): the GEMM ``(rows x in) @ (in x out)`` whose shape follows
  from the recorded figures: ``in`` = forward FLOPs / (2 x output elements), ``out`` = parameters / ``in``
  (``in + 1`` with a bias), ``rows`` = output elements / ``out``; backward: the data gradient (where the
  backward FLOPs are twice the forward) and the weight gradient, and the bias gradient's reduction. An
  ``expert_linear`` is one grouped GEMM per expert (the workload's ``num_local_experts``); the router's GEMM
  is ``hidden_size`` by the expert count, its softmax and top-k stream its recorded bytes.
- **attention** (the unfused math path: the GPT zoo's ``attn.core`` and ``attention: unfused`` transformers)
  and **flash_attention**: `specs.Attention` from the workload's config (heads, sequence, head size, causal),
  else from the FLOPs and output (64-wide heads, causal); the math path also copies q, k and v into batches
  and the output back (``contiguous`` of transposed views: ``strided`` kernels).
- everything else streams its recorded bytes (`specs.Streaming`): norms (batchnorm over whole channels, a
  row per channel, as cuDNN's own forward and backward kernels; layer norm and RMSNorm over the hidden
  size), activations, pooling, dropout, RoPE, SwiGLU, embeddings (backward also writes the whole weight
  gradient) and the MoE permutations.

A layer whose shape cannot be inferred gives None (`LayerUnknown`'s reason): its time stays the roofline's.

Which precision the matrix kernels run in is what PyTorch runs (`runs_as`): a ``precision: fp32`` run keeps
cuDNN's TF32 convolutions on a GPU that has TF32 (``torch.backends.cudnn.allow_tf32`` is on by default, its
matmuls' ``allow_tf32`` off), and a precision the GPU lacks runs as the one PyTorch falls back to: TF32 as
FP32 on a V100 or T4, BF16 as FP32 on the SIMT cores of a GPU without BF16 tensor cores.

``layer_estimate(kernels, device)`` sums the kernels' GPU seconds (`model.kernel_time`) with their low/high
range; the class, bound and achieved rate of the layer are those of its longest kernel. The host's dispatch is
not in it: a calibrated box's is `trainsim.sim.compute.dispatch`'s.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from trainsim.sim.core.devices import DeviceSpec, get_device

from .hardware import precisions
from .model import kernel_time
from .params import KernelParams
from .specs import Attention, Conv2d, Gemm, KernelEstimate, Streaming

#: bytes per element of the dtypes a workload records its bytes at
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
#: the storage dtype of a compute precision (tf32 keeps fp32 tensors)
STORAGE = {"fp32": "fp32", "tf32": "fp32", "fp16": "fp16", "bf16": "bf16"}
#: layer kinds that stream their bytes, and the `Streaming` kind each is
STREAMING = {
    "batchnorm": "batchnorm", "layernorm": "layernorm", "rmsnorm": "layernorm",
    "relu": "elementwise", "gelu": "elementwise", "dropout": "elementwise", "rope": "elementwise",
    "swiglu": "elementwise", "maxpool": "elementwise", "avgpool": "elementwise", "add": "elementwise",
    "embedding": "embedding", "moe_dispatch": "copy", "moe_combine": "copy",
}
#: the layer kinds CUDA's autocast runs in fp32 (layer norm, RMSNorm as HF computes it, batch norm's cuDNN
#: kernels read and write the fp32 activations around them)
FP32_UNDER_AUTOCAST = ("layernorm", "rmsnorm", "batchnorm")
MATRIX_KINDS = ("conv2d", "linear", "router", "expert_linear", "attention", "flash_attention")
DEFAULT_HEAD_DIM = 64


class LayerUnknown(ValueError):
    """A layer whose kernels cannot be told from its record (the reason says what is missing)."""


def _cfg(config: dict | None, *names, default=None):
    for name in names:
        value = (config or {}).get(name)
        if value is not None:
            return value
    return default


def _whole(value: float, what: str) -> int:
    rounded = round(value)
    if rounded < 1 or abs(value - rounded) > 1e-6 * max(1.0, abs(value)):
        raise LayerUnknown(f"{what} is not a whole number ({value:g})")
    return int(rounded)


def _streaming(kind: str, traffic: float, elements: float, dtype: str, row: int | None = None) -> list:
    """One memory-bound kernel moving ``traffic`` bytes over tensors of ``elements`` values (its passes are
    the whole tensors the traffic makes, at least one)."""
    if traffic <= 0:
        return []
    size = {"fp32": 4, "fp16": 2, "bf16": 2}[dtype]
    passes = max(1, round(traffic / (max(elements, 1.0) * size)))
    count = max(1, round(traffic / (size * passes)))
    return [Streaming(kind, count, reads=max(passes - 1, 0) if passes > 1 else 1,
                      writes=1 if passes > 1 else 0, dtype=dtype, row=row)]


def _linear_shape(layer, itemsize: int, experts: int = 1) -> tuple[int, int, int, bool]:
    """(rows per sample, in, out, bias) of a linear layer from its FLOPs, output bytes and parameters."""
    out_elements = layer.output_bytes_per_sample / itemsize
    if layer.flops_forward_per_sample <= 0 or out_elements <= 0:
        raise LayerUnknown("a linear layer without FLOPs or output")
    k = _whole(layer.flops_forward_per_sample / (2 * out_elements), "its input features")
    weights = (layer.param_bytes + layer.shared_param_bytes) / itemsize / experts
    for bias in (False, True):
        n = weights / (k + bias)
        if n >= 1 and abs(n - round(n)) < 1e-6 * n:
            n = round(n)
            rows = out_elements / n
            if rows >= 1 and abs(rows - round(rows)) < 1e-6 * rows:
                return round(rows), k, n, bias
    raise LayerUnknown(f"parameters ({weights:g} per expert) that are not {k} input features times whole "
                       "output features")


def _gemm_passes(m: int, n: int, k: int, dtype: str, *, data_grad: bool, bias: bool, batch: int = 1,
                 storage: str = "fp32") -> tuple[list, list]:
    forward = [Gemm(m=m, n=n, k=k, batch=batch, dtype=dtype, shared_b=batch == 1)]
    backward = []
    if data_grad:  # dX = dY @ W^T: (m x n) @ (n x k)
        backward.append(Gemm(m=m, n=k, k=n, batch=batch, dtype=dtype, shared_b=batch == 1))
    backward.append(Gemm(m=n, n=k, k=m, batch=batch, dtype=dtype))  # dW = dY^T @ X
    if bias:
        backward.append(Streaming("reduction", batch * m * n, reads=1, writes=0, dtype=storage))
    return forward, backward


def layer_kernels(layer, batch: int, precision: str = "fp32", dtype: str = "float32", *,
                  config: dict | None = None, autocast: bool = False) -> tuple[list, list]:
    """The (forward, backward) kernels of ``layer`` at ``batch`` (see the module doc); ``dtype``: the
    workload's, which its bytes were recorded at; ``config``: the workload's ``provenance.config``;
    ``autocast``: a 16-bit ``precision`` under torch.autocast, which keeps norms and softmax in fp32 (their
    bytes stay fp32). Raises `LayerUnknown` where the layer's shape cannot be inferred."""
    itemsize = _ITEMSIZE[dtype]
    storage = STORAGE[precision]
    if autocast and layer.kind in FP32_UNDER_AUTOCAST:
        storage = "fp32"
    scale = {"fp32": 4, "fp16": 2, "bf16": 2}[storage] / itemsize
    kind = layer.kind
    data_grad = layer.flops_backward_per_sample >= 1.5 * layer.flops_forward_per_sample
    if kind == "conv2d":
        s = layer.spatial
        if s is None:
            raise LayerUnknown("a convolution without its spatial shape")
        if s.dilation != 1:
            raise LayerUnknown("a dilated convolution")
        common = dict(batch=batch, in_channels=s.in_c, out_channels=s.out_c, height=s.in_h, width=s.in_w,
                      kernel=(s.kernel_h, s.kernel_w), stride=s.stride, padding=s.padding, groups=s.groups,
                      dtype=precision)
        backward = [Conv2d(**common, pass_="backward_data")] if data_grad else []
        return [Conv2d(**common)], backward + [Conv2d(**common, pass_="backward_weight")]
    if kind in ("linear", "expert_linear"):
        experts = int(_cfg(config, "num_local_experts", default=0) or 0) if kind == "expert_linear" else 1
        if kind == "expert_linear" and experts < 1:
            raise LayerUnknown("an expert layer without num_local_experts in the workload's config")
        rows, k, n, bias = _linear_shape(layer, itemsize, experts)
        if experts > 1:
            per_expert = max(1, math.ceil(rows * batch / experts))
            return _gemm_passes(per_expert, n, k, precision, data_grad=data_grad, bias=bias, batch=experts,
                                storage=storage)
        return _gemm_passes(rows * batch, n, k, precision, data_grad=data_grad, bias=bias, storage=storage)
    if kind == "router":
        hidden = _cfg(config, "hidden_size")
        experts = _cfg(config, "num_local_experts")
        seq = _cfg(config, "seq_len")
        if not (hidden and experts and seq):
            raise LayerUnknown("a router without hidden_size, num_local_experts and seq_len in the config")
        forward, backward = _gemm_passes(seq * batch, experts, hidden, precision, data_grad=True, bias=False,
                                         storage=storage)
        elements = batch * seq * experts
        forward += _streaming("softmax", layer.memory_bytes_forward_per_sample * batch * scale, elements,
                              storage, row=experts)
        backward += _streaming("softmax", layer.memory_bytes_backward_per_sample * batch * scale, elements,
                               storage, row=experts)
        return forward, backward
    if kind in ("attention", "flash_attention"):
        return _attention(layer, batch, precision, storage, itemsize, config, autocast)
    streaming = STREAMING.get(kind, "elementwise")
    out_elements = batch * layer.output_bytes_per_sample / itemsize
    row = None
    if kind == "batchnorm":  # statistics over N x H x W per channel: a long row
        row = max(1, round(batch * (layer.output_bytes_per_sample / itemsize)
                           / max(1.0, layer.param_bytes / itemsize / 2)))
    elif kind in ("layernorm", "rmsnorm"):
        row = _cfg(config, "hidden_size", "n_embd")
        row = int(row) if row else max(1, round(layer.param_bytes / itemsize / (2 if kind == "layernorm"
                                                                                 else 1)))
    fwd_bytes = layer.memory_bytes_forward_per_sample * batch * scale
    bwd_bytes = layer.memory_bytes_backward_per_sample * batch * scale
    if kind == "embedding":  # backward zero-fills and accumulates the whole weight gradient
        bwd_bytes += (layer.param_bytes + layer.shared_param_bytes) * scale
    elements = out_elements or fwd_bytes / 4 or 1.0
    backward = "batchnorm_backward" if streaming == "batchnorm" else streaming  # cuDNN's own kernel
    return (_streaming(streaming, fwd_bytes, elements, storage, row),
            _streaming(backward, bwd_bytes, elements, storage, row))


def _attention(layer, batch, precision, storage, itemsize, config, autocast=False) -> tuple[list, list]:
    out_elements = layer.output_bytes_per_sample / itemsize
    flops = layer.flops_forward_per_sample
    if flops <= 0 or out_elements <= 0:
        raise LayerUnknown("an attention without FLOPs or output")
    fused = layer.kind == "flash_attention"
    causal = bool(_cfg(config, "causal", default=True))
    heads = _cfg(config, "num_attention_heads", "n_head")
    seq = _cfg(config, "seq_len", "block_size")
    head_dim = _cfg(config, "qk_head_dim", "head_dim")
    if head_dim is None and heads and _cfg(config, "hidden_size", "n_embd"):
        head_dim = _cfg(config, "hidden_size", "n_embd") // heads
    if seq is None:  # from the FLOPs: 4 x pairs x features, pairs S^2 (math) or S(S+1)/2 (causal flash)
        ratio = flops / out_elements
        seq = round(ratio / 2 - 1) if fused and causal else round(ratio / 4)
    head_dim = int(head_dim or DEFAULT_HEAD_DIM)
    heads = int(heads or max(1, round(out_elements / seq / head_dim)))
    seq = int(seq)
    if seq < 1:
        raise LayerUnknown("an attention whose sequence length cannot be told")
    q_len, kv_len = seq, seq
    # a rank's share of the layer (tensor parallelism splits the heads, context parallelism the queries:
    # sim/parallel/split.py scales the output and FLOPs): its query rows of all heads, as whole heads of
    # every query where they divide, else as one head of its rows against the mean keys a query sees
    rows = out_elements / (seq * head_dim)
    if abs(rows - heads) > 1e-6 * heads:
        if rows >= 1 and abs(rows - round(rows)) < 1e-6:
            heads = round(rows)
        else:
            q_len = max(1, round(rows * seq))
            kv_len = (seq + 1) // 2 if causal else seq
            heads, causal = 1, False
    common = dict(batch=batch, heads=heads, q_len=q_len, kv_len=kv_len, head_dim=head_dim, causal=causal,
                  fused=fused, dtype=precision)
    forward, backward = [Attention(**common)], [Attention(**common, backward=True)]
    if not fused:  # q, k, v made contiguous for the batched GEMMs; the output transposed back: copies
        qkv = batch * 3 * q_len * heads * head_dim  # of transposed views, which PyTorch runs unvectorised
        out = batch * q_len * heads * head_dim
        forward += [Streaming("strided", qkv, dtype=STORAGE[precision]),
                    Streaming("strided", out, dtype=STORAGE[precision])]
        backward += [Streaming("strided", qkv, dtype=STORAGE[precision]),
                     Streaming("strided", out, dtype=STORAGE[precision])]
        if autocast and STORAGE[precision] != "fp32":  # the softmax runs in fp32: its 16-bit scores are
            scores = batch * heads * q_len * kv_len  # read as fp32-sized values and cast back for P·V
            forward += [Streaming("softmax", scores, reads=1, writes=1, dtype=STORAGE[precision], row=kv_len)]
            backward += [Streaming("softmax", scores, reads=2, writes=1, dtype=STORAGE[precision], row=kv_len)]
    return forward, backward


def runs_as(kernel, device: DeviceSpec, *, tf32_conv: bool = True, tf32_matmul: bool = False):
    """``kernel`` in the precision PyTorch runs it in on ``device`` (see the module doc): fp32 convolutions
    as tf32 where the GPU has it and ``tf32_conv`` (cuDNN's default), fp32 GEMMs as tf32 only with
    ``tf32_matmul``; a precision the GPU lacks as fp32 (fp8 as fp16)."""
    dtype = getattr(kernel, "dtype", None)
    if isinstance(kernel, Streaming) or dtype is None:
        return kernel
    have = precisions(device)
    want = dtype
    if dtype == "fp32" and "tf32" in have and (tf32_conv if isinstance(kernel, Conv2d) else tf32_matmul
                                                and isinstance(kernel, Gemm)):
        want = "tf32"
    if want not in have:
        want = "fp16" if want == "fp8" and "fp16" in have else "fp32"
    return kernel if want == dtype else dataclasses.replace(kernel, dtype=want)


@dataclass(frozen=True)
class LayerEstimate:
    """A layer pass on one device: its kernels' GPU seconds summed, with their range, and the class, bound
    on the GPU (compute or memory: the host's dispatch is not in these times) and achieved rate (FLOP/s or
    bytes/s) of the kernel that takes longest."""

    seconds: float
    low: float
    high: float
    kernel_class: str
    bound: str
    achieved: float
    kernels: int

    @classmethod
    def empty(cls) -> LayerEstimate:
        return cls(0.0, 0.0, 0.0, "none", "none", 0.0, 0)


def kernel_estimates(kernels, device: DeviceSpec | str, params: KernelParams | None = None,
                     **flags) -> list[KernelEstimate]:
    """Each kernel's estimate on ``device`` in the precision it runs in there (`runs_as`; ``flags``:
    ``tf32_conv``, ``tf32_matmul``)."""
    device = get_device(device)
    return [kernel_time(runs_as(k, device, **flags), device, params) for k in kernels]


def layer_estimate(kernels, device: DeviceSpec | str, params: KernelParams | None = None,
                   **flags) -> LayerEstimate:
    """The sum of ``kernels``' GPU times on ``device`` (see `LayerEstimate`)."""
    estimates = kernel_estimates(kernels, device, params, **flags)
    if not estimates:
        return LayerEstimate.empty()
    top = max(estimates, key=lambda e: e.seconds)
    return LayerEstimate(seconds=sum(e.seconds for e in estimates), low=sum(e.low for e in estimates),
                         high=sum(e.high for e in estimates), kernel_class=top.kernel_class,
                         bound=top.detail.get("gpu_bound", top.bound), achieved=top.achieved,
                         kernels=len(estimates))


def op_kernels(shape, dtype: str) -> list:
    """The kernel specs of a profiled op's geometry (`trainsim.sim.replay.op_work.OpWork.shape`, read back
    from JSON as lists too) in ``dtype``; empty where it has none."""
    if not shape:
        return []
    kind, *values = shape
    if kind == "gemm":
        batch, m, n, k = values
        return [Gemm(m=m, n=n, k=k, batch=batch, dtype=dtype)]
    if kind == "conv":
        batch, in_c, out_c, h, w, kh, kw, stride, padding, groups, passes = values
        return [Conv2d(batch=batch, in_channels=in_c, out_channels=out_c, height=h, width=w, kernel=(kh, kw),
                       stride=stride, padding=padding, groups=groups, dtype=dtype, pass_=p)
                for p in passes.split("+")]
    if kind == "attention":
        batch, heads, q_len, kv_len, head_dim, causal, backward = values
        return [Attention(batch=batch, heads=heads, q_len=q_len, kv_len=kv_len, head_dim=head_dim,
                          causal=bool(causal), fused=True, dtype=dtype, backward=bool(backward))]
    return []
