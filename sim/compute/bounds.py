"""What bounds each layer pass on a GPU: the shares of its time its arithmetic and its memory traffic take.

A layer pass's `Load` ``(sm, hbm)`` (`trainsim.sim.core.interference`) is its roofline split: the FLOPs at
the precision's peak x ``Efficiency.compute`` and the bytes at the HBM bandwidth x ``Efficiency.memory``,
each over the roofline's time of the pass (the larger of the two plus the launch overhead of its kernels),
so a GEMM-heavy convolution is near (1, 0.2), an elementwise layer near (0, 1), and a tiny layer whose time
is mostly launches near (0, 0). The split is the roofline's whatever model timed the layer (a measured time
keeps the roofline's make-up); it only decides how the layer shares its GPU with communication kernels.
"""

from __future__ import annotations

from trainsim.formats.workload import Layer, Workload
from trainsim.sim.core.devices import DeviceSpec

from .roofline import DEFAULT_EFFICIENCY, KERNELS, _storage_scale

Load = tuple[float, float]


def pass_loads(layer: Layer, device: DeviceSpec, batch: int, precision: str, dtype: str) -> tuple[Load, Load]:
    """(forward, backward) `Load` of ``layer`` at ``batch`` on ``device`` (module doc)."""
    eff = DEFAULT_EFFICIENCY
    scale = _storage_scale(dtype, precision)
    params = (layer.param_bytes + layer.shared_param_bytes) * scale
    kernels = KERNELS.get(layer.kind, (1, 1))
    peak = device.peak_flops.get(precision, device.peak("fp32")) * eff.compute
    bandwidth = device.memory_bandwidth * eff.memory
    loads = []
    for flops_per_sample, bytes_per_sample, param_passes, n_kernels in (
            (layer.flops_forward_per_sample, layer.memory_bytes_forward_per_sample, 1, kernels[0]),
            (layer.flops_backward_per_sample, layer.memory_bytes_backward_per_sample, 2, kernels[1])):
        arithmetic = flops_per_sample * batch / peak
        traffic = (bytes_per_sample * batch * scale + params * param_passes) / bandwidth
        total = max(arithmetic, traffic) + n_kernels * eff.launch_overhead_s
        loads.append((arithmetic / total, traffic / total) if total > 0 else (0.0, 0.0))
    return loads[0], loads[1]


def workload_loads(workload: Workload, device: DeviceSpec, batch: int,
                   precision: str) -> tuple[list[Load], list[Load]]:
    """Every layer's forward and backward `Load`; empty lists off a GPU (a CPU rank shares nothing)."""
    if device.kind != "gpu":
        return [], []
    pairs = [pass_loads(layer, device, batch, precision, workload.dtype) for layer in workload.layers]
    return [f for f, _ in pairs], [b for _, b in pairs]
