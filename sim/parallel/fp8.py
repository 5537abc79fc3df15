"""FP8 matrix work as Transformer Engine runs it (``strategy.mesh.fp8``): the linear layers' GEMMs in fp8 with
per-tensor delayed scaling, everything else as the scenario's precision has it.

For each linear layer of a transformer block (kinds ``linear`` and ``expert_linear``; the embedding and the
LM head stay in 16 bit, as Transformer Engine's recipes keep them):

- its GEMMs (forward; backward's dX and dW) run at the device's fp8 peak: the layer's time times the
  roofline's fp8 over its 16-bit estimate (`roofline.kernel_seconds` on the layer's FLOPs and its traffic at
  one byte an element instead of two), so a measured or kernel-modelled time scales as its roofline does;
- the casts it adds, memory-bound passes at HBM bandwidth (`roofline.streaming_seconds`), one kernel each:
  forward, the input X and the weight W cast to fp8, each read in 16 bit (2 B an element) and written as fp8
  and its transpose (1 + 1 B: Hopper's fp8 GEMMs take only the "TN" layout, so dW's X^T and dX's W^T are
  cast copies); backward, the output gradient dY alike (dX and dW both need it). The amax of each tensor
  is taken by its cast kernel from what it reads (no extra bytes); delayed scaling reduces the amax
  histories across the ranks once per step, a few bytes per layer, which is not counted;
- memory: the saved input is the fp8 copy (1 B an element instead of 2). The weights stay 16-bit with the
  fp32 master copy and moments in the optimizer; the fp8 weight copies are transient (made per pass) and
  not counted.

Attention, norms, activations and the MoE dispatch and combine stay in the scenario's precision.
"""

from __future__ import annotations

import dataclasses

from trainsim.errors import TrainsimError
from trainsim.sim.core.devices import DEVICES, DeviceSpec

__all__ = ["FP8_KINDS", "check_fp8", "fp8_costs", "gpus_with_fp8"]

FP8_KINDS = ("linear", "expert_linear")
#: layers Transformer Engine's recipes keep in 16 bit
KEEP_16_BIT = ("lm_head",)
#: bytes a cast moves per element: read 16-bit, write the fp8 copy and its transpose
CAST_BYTES = 2 + 1 + 1


def gpus_with_fp8() -> list[str]:
    """The library's GPUs whose matrix units run fp8 (Ada, Hopper, Blackwell)."""
    return [name for name, spec in DEVICES.items() if spec.kind == "gpu" and "fp8" in spec.peak_flops]


def check_fp8(device: DeviceSpec, *, file=None, field: str = "strategy.mesh.fp8") -> None:
    """One line when ``device`` has no fp8 matrix units, naming the GPUs that have them."""
    if device.kind == "gpu" and "fp8" in device.peak_flops:
        return
    raise TrainsimError(f"fp8 matrix work needs fp8 tensor cores, which {device.name} lacks; GPUs with them: "
                        f"{', '.join(gpus_with_fp8())}", file=file, field=field)


def _fp8_layer(layer) -> bool:
    return layer.kind in FP8_KINDS and not layer.name.endswith(KEEP_16_BIT)


def _ratios(layer, device: DeviceSpec, batch: int, itemsize: int) -> tuple[float, float]:
    """(forward, backward) roofline seconds at fp8 over those at 16 bit, the layer's traffic at 1 B an element
    instead of 2."""
    from trainsim.sim.compute import roofline

    params = layer.param_bytes / itemsize
    out = []
    for flops, nbytes, passes in (
            (layer.flops_forward_per_sample, layer.memory_bytes_forward_per_sample, 1),
            (layer.flops_backward_per_sample, layer.memory_bytes_backward_per_sample, 2)):
        elements = nbytes * batch / itemsize + params * passes
        wide = roofline.kernel_seconds(device, flops * batch, 2 * elements, "bf16")
        narrow = roofline.kernel_seconds(device, flops * batch, elements, "fp8")
        out.append(narrow / wide if wide > 0 else 1.0)
    return out[0], out[1]


def fp8_costs(costs, workload, device: DeviceSpec, batch: int, act: float):
    """``costs`` (`compute.costs.RankCosts` of ``workload``'s layers at ``batch``, activations of ``act``
    bytes an element) with the linear layers in fp8 (see the module)."""
    from trainsim.sim.compute import roofline

    launch = roofline.DEFAULT_EFFICIENCY.launch_overhead_s
    forward, backward = list(costs.forward_s), list(costs.backward_s)
    saved = list(costs.saved_bytes_per_layer)
    for i, layer in enumerate(workload.layers):
        if not _fp8_layer(layer):
            continue
        f, b = _ratios(layer, device, batch, workload.itemsize)
        x = saved[i] / act  # a linear layer saves its input
        w = layer.param_bytes / workload.itemsize
        y = costs.output_bytes_per_layer[i] / act
        forward[i] = forward[i] * f + roofline.streaming_seconds(device, CAST_BYTES * (x + w)) + 2 * launch
        backward[i] = backward[i] * b + roofline.streaming_seconds(device, CAST_BYTES * y) + launch
        saved[i] = x * 1.0  # the fp8 copy of X
    return dataclasses.replace(costs, forward_s=forward, backward_s=backward, saved_bytes_per_layer=saved)
