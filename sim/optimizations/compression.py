"""Parameter/gradient compression (ScaleDNN's ``param_compression``): fewer bytes on the wire, paid for with
encode/decode kernels on the GPU.

Bytes on the wire, as a fraction of the uncompressed tensor at the run's precision (``elem`` bytes/value):

- ``fp16`` / ``bf16``: 2 / elem (0.5 from fp32); ``int8``: 1 / elem (0.25 from fp32);
- ``topk`` (ratio r): the r largest values plus a 4-byte int32 index each: r (elem + 4) / elem (2r from fp32).

These are one all-reduce of the compressed bytes between an encode and a decode pass, both memory-bound
GPU kernels on the compute stream (DDP comm hooks and DataParallel's copies run their tensor ops there, so
they delay the pass that follows): read the full tensor, write the compressed one, and the reverse to
decode, at the device's memory bandwidth.

``powersgd`` (rank r) is not one all-reduce but three chained ones per bucket, as PyTorch's
``powerSGD_hook`` does it (each waits for the previous one's future, so a latency-bound fabric pays three
collective latencies per bucket, not one):

1. error feedback: the previous iteration's error is added to the bucket; P = M Q (2 m n r FLOPs) for every
   compressed matrix;
2. all-reduce the *uncompressed* tensors (1-D ones such as biases and norms, and matrices too small to be
   worth it), skipped when there are none (gloo's empty all-reduce costs ~20 us, not a round trip);
3. all-reduce the Ps (m r values each);
4. Q = M^T P (2 m n r FLOPs), all-reduce the Qs (n r values each);
5. decompress M = P Q^T (2 m n r FLOPs) and keep the new error (input minus decompressed).

A weight is viewed as PyTorch does, ``(shape[0], -1)``: a convolution's m = out channels, n = in channels /
groups x kernel (its bias is 1-D); a linear layer's (out, in) is read from its recorded FLOPs and output
(2 in out FLOPs per output row), else its parameters are taken as one square matrix; norm layers are 1-D.
With r' = min(m, n, r), a matrix is compressed when (m + n) r' x ``MIN_COMPRESSION_RATE`` < m n.
The matmuls run at the device's fp32 peak (Gram-Schmidt on the m x r / n x r factors is O(m r^2): left
out). The error feedback is kept simple: one read + write of the bucket before encoding and one after
decoding at the device's memory bandwidth (the hook's add, clone and subtract move somewhat more).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from trainsim.formats.scenario_options import CompressionSpec
from trainsim.sim.compute.costs import weight_bytes
from trainsim.sim.compute.roofline import streaming_seconds

__all__ = ["CompressionSpec", "Codec", "make_codec", "layer_matrices"]

INDEX_BYTES = 4  # top-k: one int32 index per value sent
# PowerSGD compresses a matrix only if it saves this factor: the executor's PowerSGDState setting
# (calibrate/execute/strategies.py); PyTorch's default is 2
MIN_COMPRESSION_RATE = 1.0


class WeightMatrix(NamedTuple):
    """A layer's weight as PowerSGD's m x n matrix."""

    rows: int
    cols: int
    share: float  # fraction of the layer's parameters in this matrix; the rest (a bias) is 1-D, uncompressed


@dataclass(frozen=True)
class PowerSGDPhases:
    """One bucket under PowerSGD, on one rank: the three all-reduces' bytes and the compute between them."""

    uncompressed_bytes: float  # all-reduce #1: 1-D tensors and matrices not worth compressing
    p_bytes: float  # all-reduce #2: sum of m r' x elem over the compressed matrices
    q_bytes: float  # all-reduce #3: sum of n r' x elem
    matmul_s: float  # each of P = M Q, Q = M^T P and M = P Q^T (2 m n r' FLOPs per matrix)
    error_feedback_s: float  # each of the two passes over the bucket (before encoding, after decoding)

    @property
    def wire_bytes(self) -> float:
        return self.uncompressed_bytes + self.p_bytes + self.q_bytes


class Codec:
    """What compression does to one rank's per-layer gradient (or parameter) tensors."""

    def __init__(self, spec: CompressionSpec, precision: str, matrices: list[WeightMatrix | None], device,
                 mixed_precision: str = "master"):
        self.spec = spec
        self.elem = weight_bytes(precision, mixed_precision)  # a gradient's bytes per value
        self.matrices = matrices  # per layer; None: no weight matrix (no parameters, or only 1-D ones)
        self.device = device
        self.scale = 1.0  # on the roofline times of the codec's passes (`fit_to`)

    def fit_to(self, measured_s: float, grad_bytes_per_layer: list[float]) -> None:
        """Scale every pass so that one rank's codec work per iteration takes ``measured_s``, as measured on
        the box (calibrate/execute/codec_cost.py): on a CPU rank a hook's small tensor ops cost their
        dispatch, not
        their FLOPs or bytes, which the roofline would charge in microseconds. Passes keep their shares."""
        layers = [i for i, g in enumerate(grad_bytes_per_layer) if g > 0]
        self.scale = 1.0
        modelled = self.encode_s(grad_bytes_per_layer, layers) + self.decode_s(grad_bytes_per_layer, layers)
        if modelled > 0:
            self.scale = max(0.0, measured_s) / modelled

    def _elementwise_ratio(self) -> float:
        m = self.spec.method
        if m in ("fp16", "bf16"):
            return 2 / self.elem
        if m == "int8":
            return 1 / self.elem
        return min(1.0, self.spec.ratio * (self.elem + INDEX_BYTES) / self.elem)  # topk

    def compressed_matrix(self, i: int) -> tuple[WeightMatrix, int] | None:
        """PowerSGD: layer ``i``'s matrix and rank r' when it is worth compressing, else None."""
        matrix = self.matrices[i]
        if matrix is None:
            return None
        rank = min(matrix.rows, matrix.cols, self.spec.rank)
        if (matrix.rows + matrix.cols) * rank * MIN_COMPRESSION_RATE < matrix.rows * matrix.cols:
            return matrix, rank
        return None

    def powersgd_phases(self, grad_bytes_per_layer: list[float], layers: list[int]) -> PowerSGDPhases:
        uncompressed = p_bytes = q_bytes = flops = 0.0
        for i in layers:
            found = self.compressed_matrix(i)
            if found is None:
                uncompressed += grad_bytes_per_layer[i]
                continue
            matrix, rank = found
            uncompressed += grad_bytes_per_layer[i] * (1.0 - matrix.share)
            p_bytes += matrix.rows * rank * self.elem
            q_bytes += matrix.cols * rank * self.elem
            flops += 2 * matrix.rows * matrix.cols * rank
        bucket = sum(grad_bytes_per_layer[i] for i in layers)
        return PowerSGDPhases(
            uncompressed_bytes=uncompressed,
            p_bytes=p_bytes,
            q_bytes=q_bytes,
            matmul_s=self.scale * flops / self.device.peak_flops["fp32"],
            error_feedback_s=self.scale * streaming_seconds(self.device, 2 * bucket),  # read + write
        )

    def wire_bytes(self, grad_bytes_per_layer: list[float], layers: list[int]) -> float:
        if self.spec.method == "powersgd":
            return self.powersgd_phases(grad_bytes_per_layer, layers).wire_bytes
        return sum(grad_bytes_per_layer[i] for i in layers) * self._elementwise_ratio()

    def encode_s(self, grad_bytes_per_layer: list[float], layers: list[int]) -> float:
        """Everything before the wire: PowerSGD's error feedback, P = M Q and Q = M^T P."""
        if self.spec.method == "powersgd":
            phases = self.powersgd_phases(grad_bytes_per_layer, layers)
            return phases.error_feedback_s + 2 * phases.matmul_s
        return self._memory_pass_s(grad_bytes_per_layer, layers)

    def decode_s(self, grad_bytes_per_layer: list[float], layers: list[int]) -> float:
        """Everything after the wire: PowerSGD's M = P Q^T and the new error."""
        if self.spec.method == "powersgd":
            phases = self.powersgd_phases(grad_bytes_per_layer, layers)
            return phases.matmul_s + phases.error_feedback_s
        return self._memory_pass_s(grad_bytes_per_layer, layers)

    def _memory_pass_s(self, grad_bytes_per_layer: list[float], layers: list[int]) -> float:
        moved = sum(grad_bytes_per_layer[i] for i in layers) + self.wire_bytes(grad_bytes_per_layer, layers)
        return self.scale * streaming_seconds(self.device, moved)


def _linear_shape(layer, values: int, itemsize: int) -> WeightMatrix | None:
    """A linear layer's (out, in) weight from its recorded FLOPs (2 in out per output row) and output bytes,
    when they account for its parameters exactly (with or without a bias); else None."""
    outputs = layer.output_bytes_per_sample / itemsize
    if outputs <= 0:
        return None
    fan_in = layer.flops_forward_per_sample / (2 * outputs)
    if fan_in < 1 or fan_in != int(fan_in):
        return None
    fan_in = int(fan_in)
    for bias in (1, 0):
        fan_out, rest = divmod(values, fan_in + bias)
        if rest == 0 and fan_out >= 1 and outputs % fan_out == 0:
            return WeightMatrix(fan_out, fan_in, fan_out * fan_in / values)
    return None


def layer_matrices(workload) -> list[WeightMatrix | None]:
    """Each layer's weight as PowerSGD's m x n matrix (see the module docstring)."""
    out: list[WeightMatrix | None] = []
    for layer in workload.layers:
        values = layer.param_bytes // workload.itemsize
        if values <= 0 or "norm" in layer.kind:  # batchnorm/layernorm/groupnorm: 1-D weight and bias
            out.append(None)
        elif layer.spatial is not None:
            s = layer.spatial
            rows, cols = s.out_c, max(1, s.in_c // s.groups * s.kernel_h * s.kernel_w)
            out.append(WeightMatrix(rows, cols, min(1.0, rows * cols / values)))
        else:
            shape = _linear_shape(layer, values, workload.itemsize) if layer.kind == "linear" else None
            if shape is None:  # unknown shape: one square matrix holding all the parameters
                side = max(1, round(math.sqrt(values)))
                shape = WeightMatrix(side, side, 1.0)
            out.append(shape)
    return out


def make_codec(ctx) -> Codec | None:
    """The run's codec, or None without ``param_compression``."""
    spec = getattr(ctx.settings.optimizations, "param_compression", None)
    if spec is None:
        return None
    device = ctx.machine.gpus[ctx.ranks[0]].device
    settings = ctx.settings
    return Codec(spec, settings.precision, layer_matrices(ctx.workload), device, settings.mixed_precision)
