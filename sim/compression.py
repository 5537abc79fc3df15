"""Parameter/gradient compression (ScaleDNN's ``param_compression``): fewer bytes on the wire, paid for with
encode/decode kernels on the GPU.

Bytes on the wire, as a fraction of the uncompressed tensor at the run's precision (``elem`` bytes/value):

- ``fp16`` / ``bf16``: 2 / elem (0.5 from fp32); ``int8``: 1 / elem (0.25 from fp32);
- ``topk`` (ratio r): the r largest values plus a 4-byte int32 index each: r (elem + 4) / elem (2r from fp32);
- ``powersgd`` (rank r): each layer's gradient reshaped to an m x n matrix (PyTorch's ``powerSGD_hook``:
  ``(shape[0], -1)``; a convolution's m = out channels, n = in channels x kernel; a layer without a
  recorded shape is taken as square) is sent as P (m x r) and Q (n x r): (m + n) r / (m n), never above 1.

Encode and decode are GPU kernels on the compute stream (DDP comm hooks and DataParallel's copies run their
tensor ops there, so they delay the pass that follows): the casts, int8 quantisation and top-k selection are
memory-bound (read the full tensor, write the compressed one, and the reverse to decode) at the device's
memory bandwidth; PowerSGD is compute-bound: P = M Q and Q = M^T P (2 m n r FLOPs each) to encode, M = P Q^T
(2 m n r) to decode, at the device's fp32 peak.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .costs import WEIGHT_BYTES

INDEX_BYTES = 4  # top-k: one int32 index per value sent


class CompressionSpec(BaseModel):
    """``param_compression:`` a method name (``fp16``) or ``{method: topk, ratio: 0.01}`` /
    ``{method: powersgd, rank: 4}``."""

    model_config = ConfigDict(extra="forbid")

    method: Literal["fp16", "bf16", "int8", "topk", "powersgd"]
    ratio: float | None = Field(default=None, gt=0, le=1, description="topk: fraction of values sent")
    rank: int | None = Field(default=None, ge=1, description="powersgd: rank of the low-rank factors")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data):
        return {"method": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _parameters(self):
        if self.method == "topk" and self.ratio is None:
            raise ValueError("param_compression topk needs ratio (fraction of values sent, e.g. 0.01)")
        if self.method == "powersgd" and self.rank is None:
            raise ValueError("param_compression powersgd needs rank (e.g. 4)")
        if self.method != "topk" and self.ratio is not None:
            raise ValueError(f"param_compression ratio applies to method topk, not {self.method}")
        if self.method != "powersgd" and self.rank is not None:
            raise ValueError(f"param_compression rank applies to method powersgd, not {self.method}")
        return self

    def label(self) -> str:
        if self.method == "topk":
            return f"topk:{self.ratio:g}"
        if self.method == "powersgd":
            return f"powersgd:{self.rank}"
        return self.method


class Codec:
    """What compression does to one rank's per-layer gradient (or parameter) tensors."""

    def __init__(self, spec: CompressionSpec, precision: str, layer_matrices: list[tuple[int, int] | None],
                 device):
        self.spec = spec
        self.elem = WEIGHT_BYTES[precision]
        self.matrices = layer_matrices  # (m, n) per layer, None: no parameters
        self.device = device

    def layer_ratio(self, i: int) -> float:
        m = self.spec.method
        if m in ("fp16", "bf16"):
            return 2 / self.elem
        if m == "int8":
            return 1 / self.elem
        if m == "topk":
            return min(1.0, self.spec.ratio * (self.elem + INDEX_BYTES) / self.elem)
        shape = self.matrices[i]
        if shape is None:
            return 1.0
        rows, cols = shape
        return min(1.0, (rows + cols) * self.spec.rank / (rows * cols))

    def wire_bytes(self, grad_bytes_per_layer: list[float], layers: list[int]) -> float:
        return sum(grad_bytes_per_layer[i] * self.layer_ratio(i) for i in layers)

    def _pass_s(self, grad_bytes_per_layer: list[float], layers: list[int], matmuls: int) -> float:
        if self.spec.method != "powersgd":
            full = sum(grad_bytes_per_layer[i] for i in layers)
            return (full + self.wire_bytes(grad_bytes_per_layer, layers)) / self.device.memory_bandwidth
        flops = 0.0
        for i in layers:
            if self.matrices[i] is not None and self.layer_ratio(i) < 1.0:
                rows, cols = self.matrices[i]
                flops += matmuls * 2 * rows * cols * self.spec.rank
        return flops / self.device.peak_flops["fp32"]

    def encode_s(self, grad_bytes_per_layer: list[float], layers: list[int]) -> float:
        return self._pass_s(grad_bytes_per_layer, layers, 2)

    def decode_s(self, grad_bytes_per_layer: list[float], layers: list[int]) -> float:
        return self._pass_s(grad_bytes_per_layer, layers, 1)


def layer_matrices(workload) -> list[tuple[int, int] | None]:
    """Each layer's parameters as PowerSGD's m x n matrix (see the module docstring)."""
    out: list[tuple[int, int] | None] = []
    for layer in workload.layers:
        values = layer.param_bytes / workload.itemsize
        if values <= 0:
            out.append(None)
        elif layer.spatial is not None:
            s = layer.spatial
            out.append((s.out_c, max(1, s.in_c // s.groups * s.kernel_h * s.kernel_w)))
        else:
            side = max(1, round(math.sqrt(values)))
            out.append((side, side))
    return out


def make_codec(ctx) -> Codec | None:
    """The run's codec, or None without ``param_compression``."""
    spec = getattr(ctx.optimizations, "param_compression", None)
    if spec is None:
        return None
    device = ctx.machine.gpus[ctx.ranks[0]].device
    return Codec(spec, ctx.precision, layer_matrices(ctx.workload), device)
