"""The device figures each kernel class needs, read from a `DeviceSpec` with one clear error where missing.

A matrix kernel needs the peak of its precision (a precision the device's architecture lacks, TF32 or FP8 on
a V100, is refused with the ones it has) and the SM count its tiles are spread over; a memory-bound kernel
needs the memory bandwidth (every spec has it); the fitted figures are looked up by the device's name, then
its ``architecture``.
"""

from __future__ import annotations

from trainsim.errors import TrainsimError
from trainsim.sim.core.devices import ARCHITECTURE_PRECISIONS, DeviceSpec

#: what each figure is for, in the error that says it is missing
_NEEDED_FOR = {"sm_count": "its tiles run in waves over the SMs",
               "architecture": "its precisions and fitted figures depend on the GPU generation"}


def require(device: DeviceSpec, figure: str, kernel_class: str):
    """``device``'s ``figure`` (an attribute of `DeviceSpec`), or a TrainsimError naming the field and why the
    ``kernel_class`` model needs it."""
    value = getattr(device, figure, None)
    if value is None:
        why = _NEEDED_FOR.get(figure, "the kernel model uses it")
        raise TrainsimError(f"device {device.name!r} has no {figure}, which the {kernel_class} kernel model "
                            f"needs ({why}); give it in the device's spec", field=f"device.{figure}")
    return value


def precisions(device: DeviceSpec) -> tuple[str, ...]:
    """The precisions ``device`` runs matrix products in: those with a peak, within its architecture's."""
    runs = ARCHITECTURE_PRECISIONS.get(device.architecture or "", None)
    return tuple(p for p in device.peak_flops if runs is None or p in runs)


def matrix_peak(device: DeviceSpec, dtype: str) -> float:
    """Peak FLOP/s of ``device``'s matrix units at ``dtype`` (fp32: its SIMT cores); a precision it has not
    got names the ones it has (TF32 needs Ampere or later, FP8 Ada or Hopper or later)."""
    have = precisions(device)
    if dtype not in have:
        arch = f"a {device.architecture} GPU" if device.architecture else "it"
        raise TrainsimError(f"device {device.name!r} has no {dtype} matrix units ({arch}); valid choices: "
                            f"{', '.join(sorted(have))}", field="dtype")
    return device.peak_flops[dtype]
