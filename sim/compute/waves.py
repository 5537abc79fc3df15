"""SM-wave quantisation: how much of a GPU a convolution's kernel keeps busy at a given batch.

A convolution runs as an implicit GEMM whose output (``batch x out_h x out_w`` rows by ``out_c`` columns)
is cut into thread-block tiles; the GPU runs ``sm_count`` tiles at a time (one large tile per SM), so the
kernel takes ``ceil(tiles / sm_count)`` waves and the last one leaves SMs idle. The fraction of the SM time
doing work, ``tiles / (waves x sm_count)``, is the kernel's wave efficiency: it is what a larger batch can
gain per sample once the launch and the weight reads are amortised (those the roofline already counts).

The tile is cuDNN/cuBLAS's common 128 x 128 for large fp32 convolutions; one resident tile per SM is the
conservative end (two would halve the idle share). This is a batch curve from the layers' geometry and the
device's SM count, not a measured one, and the roofline (`roofline.layer_time`) does not apply it.
"""

from __future__ import annotations

import math

from trainsim.errors import TrainsimError
from trainsim.sim.core.devices import DeviceSpec, get_device

TILE = (128, 128)  # output rows x output channels per thread block


def wave_efficiency(layer, batch: int, device: DeviceSpec | str, tile: tuple[int, int] = TILE) -> float:
    """The share of the SMs' time a convolution's forward kernel keeps busy at ``batch`` (1.0 for layers
    without a convolution's geometry)."""
    if layer.spatial is None:
        return 1.0
    device = get_device(device)
    if not device.sm_count:
        raise TrainsimError(f"device {device.name!r} has no SM count", field="sm_count")
    s = layer.spatial
    rows = batch * s.out_h * s.out_w
    tiles = math.ceil(rows / tile[0]) * math.ceil(s.out_c / tile[1])
    waves = math.ceil(tiles / device.sm_count)
    return tiles / (waves * device.sm_count)


def workload_wave_efficiency(workload, batch: int, device: DeviceSpec | str) -> float:
    """The FLOP-weighted wave efficiency of a workload's convolutions at ``batch`` (1.0 without any)."""
    convs = [layer for layer in workload.layers if layer.spatial is not None]
    flops = sum(layer.flops_forward_per_sample for layer in convs)
    if flops == 0:
        return 1.0
    return sum(layer.flops_forward_per_sample * wave_efficiency(layer, batch, device)
               for layer in convs) / flops
