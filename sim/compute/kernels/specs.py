"""What a kernel is, for the kernel model: its class, shape and precision, and what the model says of it.

One small frozen dataclass per kernel class, each validated on creation (a bad field names itself):

- :class:`Gemm`: ``C[b] (m x n) = A[b] (m x k) @ B[b] (k x n)`` over ``batch`` products (``aten::bmm``; a
  ``linear`` is one product whose rows are every token, ``shared_b``: one weight for all of them);
- :class:`Conv2d`: a 2-D convolution (forward, or its data or weight gradient), run as an implicit GEMM or,
  for 3x3 stride-1 filters, as Winograd;
- :class:`Attention`: scaled dot-product attention, fused (flash / memory-efficient) or the unfused path
  (two batched GEMMs around a softmax that writes the whole score matrix);
- :class:`Streaming`: memory-bound work (elementwise, normalisation, softmax, optimizer steps, embeddings,
  copies) that streams its tensors through HBM.

FLOPs count a multiply-add as 2; bytes are the least traffic the kernel can make (every operand read once,
every result written once), which the class models scale by the passes each really makes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from trainsim.errors import TrainsimError, unknown_name

#: bytes per element a precision stores (tf32 is fp32 in memory, rounded inside the tensor cores)
DTYPE_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
DTYPES = tuple(DTYPE_BYTES)
#: what bounds a kernel's time in a :class:`KernelEstimate`
BOUNDS = ("compute", "memory", "launch")
#: the memory-bound kinds :class:`Streaming` knows (each has its own fitted passes and efficiency);
#: ``strided``: an elementwise kernel over an operand that is not contiguous (a causal mask broadcast over a
#: batch of score matrices, a transposed view copied into batches), which PyTorch cannot vectorise;
#: ``batchnorm`` and ``batchnorm_backward``: cuDNN's training batch norm over NCHW tensors, a row per channel
STREAMING_KINDS = ("elementwise", "layernorm", "softmax", "optimizer", "embedding", "copy", "reduction",
                   "strided", "batchnorm", "batchnorm_backward")
CONV_PASSES = ("forward", "backward_data", "backward_weight")


def _positive(owner: str, **values) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TrainsimError(f"must be a whole number >= 1, got {value!r}", field=f"{owner}.{name}")


def _dtype(owner: str, dtype: str) -> None:
    if dtype not in DTYPE_BYTES:
        raise unknown_name("dtype", dtype, DTYPES, field=f"{owner}.dtype")


@dataclass(frozen=True)
class Gemm:
    """``batch`` products of an ``m x k`` by a ``k x n`` matrix; ``shared_b``: one right-hand matrix for the
    whole batch (a linear layer's weight), read once."""

    m: int
    n: int
    k: int
    batch: int = 1
    dtype: str = "fp32"
    shared_b: bool = False

    kernel_class = "matmul"

    def __post_init__(self):
        _positive("gemm", m=self.m, n=self.n, k=self.k, batch=self.batch)
        _dtype("gemm", self.dtype)

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k

    @property
    def bytes(self) -> float:
        b_mats = 1 if self.shared_b else self.batch
        return float(DTYPE_BYTES[self.dtype] * (self.batch * self.m * self.k + b_mats * self.k * self.n
                                                + self.batch * self.m * self.n))


@dataclass(frozen=True)
class Conv2d:
    """A 2-D convolution of a ``batch x in_channels x height x width`` input with ``out_channels`` filters of
    ``kernel`` (h, w). ``pass_``: the forward, or the gradient of the input (``backward_data``) or of the
    weight (``backward_weight``): each is one implicit GEMM of the same FLOPs."""

    batch: int
    in_channels: int
    out_channels: int
    height: int
    width: int
    kernel: tuple[int, int] = (3, 3)
    stride: int = 1
    padding: int = 0
    groups: int = 1
    dtype: str = "fp32"
    pass_: str = "forward"

    kernel_class = "conv"

    def __post_init__(self):
        _positive("conv", batch=self.batch, in_channels=self.in_channels, out_channels=self.out_channels,
                  height=self.height, width=self.width, stride=self.stride, groups=self.groups,
                  kernel_h=self.kernel[0], kernel_w=self.kernel[1])
        if isinstance(self.padding, bool) or not isinstance(self.padding, int) or self.padding < 0:
            raise TrainsimError(f"must be a whole number >= 0, got {self.padding!r}", field="conv.padding")
        if self.in_channels % self.groups or self.out_channels % self.groups:
            raise TrainsimError(f"{self.groups} groups must divide in_channels ({self.in_channels}) and "
                                f"out_channels ({self.out_channels})", field="conv.groups")
        if self.out_h < 1 or self.out_w < 1:
            raise TrainsimError(f"a {self.kernel[0]}x{self.kernel[1]} filter leaves no output of a "
                                f"{self.height}x{self.width} input padded by {self.padding}",
                                field="conv.kernel")
        _dtype("conv", self.dtype)
        if self.pass_ not in CONV_PASSES:
            raise unknown_name("convolution pass", self.pass_, CONV_PASSES, field="conv.pass_")

    @property
    def out_h(self) -> int:
        return (self.height + 2 * self.padding - self.kernel[0]) // self.stride + 1

    @property
    def out_w(self) -> int:
        return (self.width + 2 * self.padding - self.kernel[1]) // self.stride + 1

    @property
    def flops(self) -> float:
        return (2.0 * self.batch * self.out_h * self.out_w * self.out_channels
                * (self.in_channels // self.groups) * self.kernel[0] * self.kernel[1])

    @property
    def bytes(self) -> float:
        size = DTYPE_BYTES[self.dtype]
        inputs = self.batch * self.in_channels * self.height * self.width
        weights = self.out_channels * (self.in_channels // self.groups) * self.kernel[0] * self.kernel[1]
        outputs = self.batch * self.out_channels * self.out_h * self.out_w
        return float(size * (inputs + weights + outputs))

    def as_gemm(self) -> Gemm:
        """The implicit GEMM this pass is (per group; ``batch`` carries the groups): forward ``(N·P) x K`` by
        ``K x OC`` with P output positions and K = IC·R·S; the data gradient ``(N·H·W) x (OC·R·S)`` by
        ``(OC·R·S) x IC`` at stride 1, and at stride s, where an input position meets only R·S/s² of the
        taps on average, ``(N·P) x (OC·R·S)``: the forward's products, as cuDNN's strided data-gradient
        kernels compute them (one implicit GEMM per phase of the stride, skipping the taps that meet no
        output); the weight gradient ``OC x (N·P)`` by ``(N·P) x (IC·R·S)``."""
        positions = self.batch * self.out_h * self.out_w
        taps = self.kernel[0] * self.kernel[1]
        ic, oc = self.in_channels // self.groups, self.out_channels // self.groups
        if self.pass_ == "forward":
            m, n, k = positions, oc, ic * taps
        elif self.pass_ == "backward_data":
            inputs = self.batch * self.height * self.width
            m, n, k = (inputs if self.stride == 1 else positions), ic, oc * taps
        else:
            m, n, k = oc, ic * taps, positions
        return Gemm(m=m, n=n, k=k, batch=self.groups, dtype=self.dtype, shared_b=False)

    @property
    def winograd_eligible(self) -> bool:
        """cuDNN's Winograd algorithms take 3x3 filters at stride 1 without groups."""
        return self.kernel == (3, 3) and self.stride == 1 and self.groups == 1


@dataclass(frozen=True)
class Attention:
    """Scaled dot-product attention: ``heads`` of ``q_len`` queries over ``kv_len`` keys of ``head_dim``, per
    sample. ``fused``: one flash / memory-efficient kernel that never writes the scores; else the unfused path
    (Q·Kᵀ, softmax over ``kv_len``, ·V). ``causal``: the kernels skip the masked half."""

    batch: int
    heads: int
    q_len: int
    kv_len: int
    head_dim: int
    causal: bool = False
    fused: bool = True
    dtype: str = "fp16"
    backward: bool = False

    kernel_class = "attention"

    def __post_init__(self):
        _positive("attention", batch=self.batch, heads=self.heads, q_len=self.q_len, kv_len=self.kv_len,
                  head_dim=self.head_dim)
        _dtype("attention", self.dtype)

    @property
    def pairs(self) -> float:
        """Query-key pairs per head that the kernels compute (a causal mask keeps ``min(i + 1, kv_len)``)."""
        if not self.causal:
            return float(self.q_len * self.kv_len)
        full = min(self.q_len, self.kv_len)
        return full * (full + 1) / 2 + max(0, self.q_len - self.kv_len) * self.kv_len

    @property
    def flops(self) -> float:
        per_pair = 2 * 2 * self.head_dim  # Q·Kᵀ and P·V
        if self.backward:  # scores recomputed, then dV, dP, dQ, dK: 5 products (PyTorch's FLOP counter: 2.5x)
            per_pair = 2 * 5 * self.head_dim
        return float(self.batch * self.heads * self.pairs * per_pair)

    @property
    def bytes(self) -> float:
        size = DTYPE_BYTES[self.dtype]
        q = self.batch * self.heads * self.q_len * self.head_dim
        kv = self.batch * self.heads * self.kv_len * self.head_dim
        tensors = (q + 2 * kv + q) * (2 if self.backward else 1)  # q, k, v, out (and their gradients)
        return float(size * tensors)


@dataclass(frozen=True)
class Streaming:
    """Memory-bound work on ``elements`` values: ``reads`` input tensors of that size read and ``writes``
    written (an add: 2 and 1; a layer norm: 1 and 1, with its per-row statistics), each ``dtype``. ``row``:
    the length of the rows a norm or softmax reduces over (their passes depend on it)."""

    kind: str
    elements: int
    reads: int = 1
    writes: int = 1
    dtype: str = "fp32"
    row: int | None = None

    kernel_class = "memory"

    def __post_init__(self):
        if self.kind not in STREAMING_KINDS:
            raise unknown_name("memory-bound kernel kind", self.kind, STREAMING_KINDS, field="streaming.kind")
        _positive("streaming", elements=self.elements)
        for name in ("reads", "writes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise TrainsimError(f"must be a whole number >= 0, got {value!r}", field=f"streaming.{name}")
        if self.reads + self.writes == 0:
            raise TrainsimError("a kernel that reads and writes nothing moves no bytes",
                                field="streaming.reads")
        if self.row is not None:
            _positive("streaming", row=self.row)
        _dtype("streaming", self.dtype)

    @property
    def flops(self) -> float:
        return 0.0

    @property
    def bytes(self) -> float:
        return float(DTYPE_BYTES[self.dtype] * self.elements * (self.reads + self.writes))


KernelSpec = Gemm | Conv2d | Attention | Streaming


@dataclass(frozen=True)
class KernelEstimate:
    """The kernel model's time for one kernel on one device.

    ``seconds``: on the GPU (what a profiler shows for its kernels); ``dispatch_s``: the host's cost to issue
    it from eager PyTorch (a GPU that is otherwise idle waits this long first). ``bound``: what limits it:
    ``compute`` (the matrix or vector units), ``memory`` (HBM bandwidth) or ``launch`` (issuing it costs more
    than running it). ``achieved``: FLOP/s for a compute-bound kernel, bytes/s for a memory-bound one (of
    the kernel's least traffic), over ``seconds``. ``low``/``high``: the range the held-out error of the
    kernel's class gives (`params.json` ``held_out``). ``detail``: the choices behind it (tile, waves,
    algorithm), for views and tests.
    """

    seconds: float
    bound: Literal["compute", "memory", "launch"]
    achieved: float
    low: float
    high: float
    kernel_class: str = ""
    dispatch_s: float = 0.0
    detail: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        if self.bound not in BOUNDS:
            raise unknown_name("bound", self.bound, BOUNDS, field="bound")
        if not (math.isfinite(self.seconds) and self.seconds >= 0):
            raise TrainsimError(f"must be >= 0, got {self.seconds}", field="seconds")
