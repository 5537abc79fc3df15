"""Plug-ins for what one kind of host adds beyond the GPU model (measured, chosen by the bundle): what a
calibrated host measured beyond the hardware graph (per-call latencies, cores
shared between ranks, ...). `host_model_for` picks the one a bundle's contents call for; None: the plain
GPU model (routes' alpha-beta latencies, times as the workload gives them).
"""

from __future__ import annotations

from trainsim.formats.provenance import rank_step_of
from trainsim.formats.workload import Workload
from trainsim.sim.core.devices import DeviceSpec

from .call_latency import Latency, TimerTick
from .gloo_vm import GlooVmHost

__all__ = ["GlooVmHost", "RunMeasurements", "host_model_for"]


def __getattr__(name: str):
    # the bundle's file models are imported when asked for: a run without a bundle does not need them
    if name == "RunMeasurements":
        from trainsim.formats.bundle import RunMeasurements

        return RunMeasurements
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def host_model_for(calls: dict[str, Latency], workload: Workload, devices: dict[str, DeviceSpec], *,
                   tick: TimerTick | None = None) -> GlooVmHost | None:
    """The host plug-in for a bundle: gloo CPU ranks on a small VM where the bundle measured gloo calls
    (``calls``, `trainsim.sim.simulation.bundle_call_latencies`), its measured device is a CPU, or the
    workload carries a CPU rank's step (``provenance.rank_step``); None otherwise."""
    cpu_box = any(d.kind == "cpu" for d in devices.values())
    if calls or cpu_box or rank_step_of(workload.provenance) is not None:
        return GlooVmHost(workload, calls, tick)
    return None
