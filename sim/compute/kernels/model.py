"""The kernel model's one call: ``kernel_time(kernel, device) -> KernelEstimate``.

It picks the class's module (`matmul` for GEMMs and convolutions, `attention`, `memory_bound`), adds the
host's dispatch from `launch`, and marks a kernel whose dispatch outlasts its GPU time as launch-bound. The
figures come from the shipped `params.json` unless ``params`` gives others (a refit, a test's own).
"""

from __future__ import annotations

import dataclasses

from trainsim.sim.core.devices import DeviceSpec, get_device

from .attention import attention_time
from .launch import dispatch
from .matmul import conv_time, gemm_time
from .memory_bound import streaming_time
from .params import KernelParams, load_params
from .specs import Attention, Conv2d, Gemm, KernelEstimate, Streaming

_CLASSES = ((Gemm, gemm_time), (Conv2d, conv_time), (Attention, attention_time), (Streaming, streaming_time))


def kernel_time(kernel, device: DeviceSpec | str, params: KernelParams | None = None) -> KernelEstimate:
    """Seconds ``kernel`` (a `specs` class) takes on ``device``, what bounds it and its range."""
    device = get_device(device)
    params = params or load_params()
    for cls, timer in _CLASSES:
        if isinstance(kernel, cls):
            estimate = timer(kernel, device, params)
            break
    else:
        raise TypeError(f"not a kernel spec: {kernel!r}; valid: Gemm, Conv2d, Attention, Streaming")
    dispatch_s, _ = dispatch(kernel, device, params)
    bound = "launch" if dispatch_s > estimate.seconds else estimate.bound
    detail = {**estimate.detail, "gpu_bound": estimate.bound}  # what bounds it on the GPU, dispatch aside
    return dataclasses.replace(estimate, dispatch_s=dispatch_s, bound=bound, detail=detail)
