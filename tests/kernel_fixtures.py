"""Hand-made kernel-model parameters and devices for the kernel tests: every efficiency 1, no tile penalty,
no fixed costs, so that times can be computed by hand."""

import copy

from trainsim.sim.compute.kernels.launch import OPS
from trainsim.sim.compute.kernels.params import SCHEMA, KernelParams
from trainsim.sim.core.devices import DeviceSpec

#: 4 SMs of 1 TFLOP/s fp32 each (2 PFLOP/s bf16 in all), 100 GB/s
GPU4 = DeviceSpec("gpu4", {"fp32": 4e12, "bf16": 8e12}, 1e11, 2**30, sm_count=4, architecture="ampere")

FIGURES = {
    "matmul": {"efficiency": 1.0, "memory_efficiency": 1.0, "tile_a": 0.0, "k0": 0.0},
    "conv": {"efficiency": 1.0, "winograd_efficiency": 1.0, "fused_winograd_efficiency": 1.0, "kernel_s": 0.0},
    "elementwise": {"efficiency": 1.0},
    "layernorm": {"long_row_passes": 2.0, "flops_per_element": 0.0},
    "softmax": {"long_row_passes": 2.0, "flops_per_element": 0.0},
    "strided": {"efficiency_fp32": 1.0, "efficiency_16bit": 1.0},
    "batchnorm": {"passes": 1.0, "row_bytes_per_s": 1e18, "rows_per_sm": 1.0},  # rows never bound
    "batchnorm_backward": {"passes": 1.0, "row_bytes_per_s": 1e18, "rows_per_sm": 1.0},
    "dispatch": {op: {"dispatch_s": 10e-6, "overlap_s": 4e-6} for op in OPS},
}
TILES = {"batched": [[128, 128]], "single": [[128, 128]], "conv": [[128, 128]]}


def data(**default) -> dict:
    """A parameter file's data whose default figures are `FIGURES` updated by ``default`` ({class: {...}})."""
    figures = copy.deepcopy(FIGURES)
    for cls, values in default.items():
        figures[cls].update(values)
    return {"schema": SCHEMA, "evidence": {}, "fit": {}, "tiles": {"default": copy.deepcopy(TILES)},
            "devices": {}, "architectures": {}, "default": figures,
            "held_out": {"matmul": {"p10": -0.1, "p90": 0.2}, "elementwise": {"p10": -0.05, "p90": 0.05}}}


def params(**default) -> KernelParams:
    return KernelParams(data(**default), file="test-params.json")
