"""The kernel-level compute model: time per kernel class, GPU generation and precision (issue 42).

``kernel_time(kernel, device)`` (`model`) times a `specs` kernel (Gemm, Conv2d, Attention, Streaming) on a
`DeviceSpec` from figures fitted on measured kernels (`params.json`: `fit` on the public per-kernel rows
`dataset` reads, `layer_fit` on calibrated layers measured on a GPU). `layers` turns a workload's layers
into kernels; the simulator uses it under ``compute_model: kernels`` (`trainsim.sim.compute.roofline`).
"""

from .model import kernel_time
from .params import KernelParams, load_params
from .specs import Attention, Conv2d, Gemm, KernelEstimate, KernelSpec, Streaming

__all__ = ["Attention", "Conv2d", "Gemm", "KernelEstimate", "KernelParams", "KernelSpec", "Streaming",
           "kernel_time", "load_params"]
