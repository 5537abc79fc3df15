"""Scaled dot-product attention: the fused kernels (flash / memory-efficient) and the unfused path.

Fused: one kernel per (sample, head, block of ``BLOCK_Q`` queries) that loops over the keys, computing the
scores, their softmax and the product with V in on-chip memory, so it reads Q, K, V and writes the output
once and never writes the scores. Its blocks run in waves over the SMs like a GEMM's tiles, each doing
``4·BLOCK_Q·keys·head_dim`` FLOPs (Q·Kᵀ and P·V; a causal mask skips the keys it hides, so ``keys`` is the
mean kept per query); the backward pass recomputes the scores and makes four more products (2.5x the
forward FLOPs), as PyTorch's FLOP counter has it.

Where the parameters hold fused-attention figures for the GPU (class ``attention``: fitted on published
kernel measurements, `attention_fit`), or for the newest older generation that has them
(`params.KernelParams.lineage_figure`: PyTorch's flash kernels are FlashAttention-2's, built for sm80 on
``mma.sync``, and a later GPU runs those same kernels, as an H100 does), a block costs ``keys +
block_keys`` keys' worth of work (its
prologue and epilogue: loading the queries, the final rescale and the output's write; under a causal mask
``causal_block_keys`` more for the diagonal block's masking) at ``<pass>_efficiency`` of the 16-bit
tensor-core peak. Elsewhere (no rows for that generation or an older one, or fp32/TF32 inputs, which
PyTorch's flash kernels do not take) the block runs at the matrix units' fitted GEMM efficiency (`matmul`)
with no per-block cost, a composition whose range is the matmul class's held-out error.

Unfused (``fused=False``, the math path): Q·Kᵀ as a batched GEMM writing the whole ``q_len x kv_len`` score
matrix, the scale as an elementwise kernel over it (and the causal mask as a ``strided`` one: one mask
broadcast over every head, which PyTorch's ``masked_fill`` runs unvectorised, forward and backward alike),
the softmax over rows of ``kv_len``, then P·V: each part timed by its own class and summed; backward: twice
each GEMM's work (data and weight gradients) and a softmax backward reading two score-sized tensors and
writing one.
"""

from __future__ import annotations

import math

from trainsim.errors import TrainsimError
from trainsim.sim.core.devices import DeviceSpec

from .hardware import matrix_peak, require
from .matmul import gemm_time, tensor_efficiency
from .memory_bound import streaming_time
from .params import KernelParams
from .specs import Attention, Gemm, KernelEstimate, Streaming

BLOCK_Q = 128  # queries per thread block of the flash kernels (FlashAttention-2's forward tile for d <= 128)


def attention_time(spec: Attention, device: DeviceSpec, params: KernelParams) -> KernelEstimate:
    """The kernel model's time for one attention call (fused kernel, or the unfused kernels summed)."""
    return _fused(spec, device, params) if spec.fused else _unfused(spec, device, params)


def fused_seconds(spec: Attention, sms: int, peak: float, efficiency: float, block_keys: float = 0.0,
                  causal_block_keys: float = 0.0) -> tuple[float, int]:
    """(compute seconds, waves) of a fused attention call: its blocks in waves over ``sms`` SMs, each
    ``keys + block_keys`` (``+ causal_block_keys`` under a causal mask) keys' worth of products at
    ``efficiency`` of ``peak`` (FLOP/s). The one formula the model times with and `attention_fit` fits."""
    blocks = spec.batch * spec.heads * math.ceil(spec.q_len / BLOCK_Q)
    waves = math.ceil(blocks / sms)
    keys = spec.pairs / spec.q_len + block_keys + (causal_block_keys if spec.causal else 0.0)
    per_block = 4.0 * BLOCK_Q * keys * spec.head_dim * (2.5 if spec.backward else 1.0)
    return waves * per_block / (peak / sms * efficiency), waves


def fused_figures(device: DeviceSpec, params: KernelParams, spec: Attention
                  ) -> tuple[float, float, float, str, bool]:
    """(efficiency, block_keys, causal_block_keys, where, fitted) for a fused call on ``device``: the
    ``attention`` class's fitted figures for 16-bit inputs where the parameters have them for the GPU, its
    generation or an older one (`params.KernelParams.lineage_figure`; ``fitted``), else the GEMM
    efficiency and no per-block cost."""
    if spec.dtype in ("fp16", "bf16"):
        direction = "backward" if spec.backward else "forward"
        try:
            efficiency, where = params.lineage_figure(device, "attention", f"{direction}_efficiency")
            block_keys, _ = params.lineage_figure(device, "attention", f"{direction}_block_keys")
            causal_keys, _ = params.lineage_figure(device, "attention", "causal_block_keys")
            return efficiency, block_keys, causal_keys, where, True
        except TrainsimError:
            pass
    if spec.dtype == "fp32":
        efficiency, where = params.figure(device, "matmul", "efficiency")
    else:
        efficiency, where = tensor_efficiency(device, params, "matmul", spec.dtype)
    return efficiency, 0.0, 0.0, f"{where} (the GEMM figure: no attention rows)", False


def _fused(spec: Attention, device: DeviceSpec, params: KernelParams) -> KernelEstimate:
    peak = matrix_peak(device, spec.dtype)
    sms = int(require(device, "sm_count", "attention"))
    efficiency, block_keys, causal_keys, where, fitted = fused_figures(device, params, spec)
    memory_eff, _ = params.figure(device, "matmul", "memory_efficiency")
    compute, waves = fused_seconds(spec, sms, peak, efficiency, block_keys, causal_keys)
    memory = spec.bytes / (device.memory_bandwidth * memory_eff)
    seconds = max(compute, memory)
    low, high = params.held_out("attention" if fitted else "matmul")
    bound = "compute" if compute >= memory else "memory"
    achieved = (spec.flops if bound == "compute" else spec.bytes) / seconds
    return KernelEstimate(seconds=seconds, bound=bound, achieved=achieved, low=seconds * (1 + low),
                          high=seconds * (1 + high), kernel_class="attention",
                          detail={"path": "fused", "waves": waves, "efficiency": efficiency,
                                  "efficiency_from": where})


def _unfused(spec: Attention, device: DeviceSpec, params: KernelParams) -> KernelEstimate:
    heads = spec.batch * spec.heads
    scores = heads * spec.q_len * spec.kv_len
    twice = 2 if spec.backward else 1
    parts = [
        (gemm_time(Gemm(m=spec.q_len, n=spec.kv_len, k=spec.head_dim, batch=heads, dtype=spec.dtype),
                   device, params), twice),
        (gemm_time(Gemm(m=spec.q_len, n=spec.head_dim, k=spec.kv_len, batch=heads, dtype=spec.dtype),
                   device, params), twice),
        (streaming_time(Streaming("elementwise", scores, dtype=_storage(spec.dtype)), device, params), 1),
        (streaming_time(Streaming("strided", scores, dtype=_storage(spec.dtype)), device, params),
         1 if spec.causal else 0),
        (streaming_time(Streaming("softmax", scores, reads=2 if spec.backward else 1,
                                  dtype=_storage(spec.dtype), row=spec.kv_len), device, params), 1),
    ]
    seconds = sum(part.seconds * count for part, count in parts)
    low = sum(part.low * count for part, count in parts)
    high = sum(part.high * count for part, count in parts)
    matrix = sum(part.seconds * count for part, count in parts[:2])
    bound = "compute" if matrix >= seconds - matrix else "memory"
    achieved = (spec.flops if bound == "compute" else spec.bytes) / seconds
    return KernelEstimate(seconds=seconds, bound=bound, achieved=achieved, low=low, high=high,
                          kernel_class="attention",
                          detail={"path": "unfused", "kernels": sum(count for _, count in parts)})


def _storage(dtype: str) -> str:
    return "fp32" if dtype == "tf32" else dtype
