"""Launch and dispatch: what issuing a kernel costs, so that a step of small kernels stays host-bound.

Eager PyTorch spends host time on every op before its kernel starts (Python, the dispatcher, the launch
call) and some after (returning, recording the next event): ``dispatch_s`` in all, of which ``overlap_s``
comes after the kernel has started and so overlaps it. Timed with CUDA events around one call on an idle
GPU, as the evidence was, an op shows ``dispatch_s - overlap_s + max(gpu seconds, overlap_s)``
(`observed_seconds`): a kernel shorter than the overlap is hidden, a longer one adds to the dispatch.

The figures are fitted per device and eager op (`params.json` ``dispatch``) on the evidence's smallest
calls. They belong to the host that measured them as much as to the GPU: a GPU never measured gets the
median of the measured ones, and a calibrated box's own dispatch (``calibrate``'s per-layer host times,
`trainsim.sim.compute.dispatch`) replaces them.
"""

from __future__ import annotations

from trainsim.sim.core.devices import DeviceSpec

from .params import KernelParams
from .specs import Attention, Conv2d, Gemm, Streaming

#: the eager ops whose dispatch the evidence measured
OPS = ("bmm", "linear", "conv", "elementwise", "layernorm", "softmax")


def op_of(kernel) -> str:
    """The eager op whose dispatch a kernel spec is charged: ``bmm`` for a batched GEMM, ``linear`` for one
    product, ``conv``, and a memory-bound kind's own (elementwise for kinds not measured). Fused attention
    is one op, charged as a ``bmm``."""
    if isinstance(kernel, Gemm):
        return "bmm" if kernel.batch > 1 and not kernel.shared_b else "linear"
    if isinstance(kernel, Conv2d):
        return "conv"
    if isinstance(kernel, Streaming):
        return kernel.kind if kernel.kind in OPS else "elementwise"
    if isinstance(kernel, Attention):
        return "bmm"
    raise TypeError(f"not a kernel spec: {kernel!r}")


def dispatch(kernel, device: DeviceSpec, params: KernelParams) -> tuple[float, float]:
    """(dispatch_s, overlap_s) of the eager op that launches ``kernel`` on ``device``."""
    dispatch_s, overlap_s, _ = params.dispatch(device, op_of(kernel))
    return dispatch_s, overlap_s


def observed_seconds(gpu_seconds, dispatch_s, overlap_s):
    """What CUDA events around one eager call on an idle GPU show (arrays or scalars)."""
    import numpy as np

    return dispatch_s - overlap_s + np.maximum(gpu_seconds, overlap_s)
