"""The measured quirks of gloo CPU ranks on a small virtual machine, as one host plug-in.

A calibrated CPU box (`trainsim calibrate` on the CPU, gloo) differs from the GPU model in what its
calibration measured, not in its hardware graph:

- every gloo call costs a measured latency before its bytes move, fast or stalled until the guest's timer
  tick (`GlooCallLatency`, installed as the machine's latency model);
- a rank's measured layer times scale to the step a pinned rank runs, alone or beside the host's other
  ranks sharing its cache and DRAM (`rank_step.measured_scale`);
- the default input pipeline costs what the rank's loop measured, cold caches and sharing included;
- the step scatters from step to step as measured (a jitter spec);
- a preload thread in the rank's own process shares the GIL with the step (``loader_overlap``).

Where a CPU rank moves gloo's bytes with its own core (its compute stream held meanwhile) stays in the
machine (`Machine.rank_transfer`): it follows from the device being a CPU, not from this host's
measurements, and holds for any CPU rank.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from trainsim.formats.workload import Workload
from trainsim.sim.core.devices import DeviceSpec
from trainsim.sim.core.jitter import JitterSpec

from . import rank_step
from .call_latency import GlooCallLatency, Latency, TimerTick

if TYPE_CHECKING:
    from trainsim.formats.bundle import LoaderOverlap


class GlooVmHost:
    """The plug-in: what a calibrated gloo CPU box measured, applied to one simulation."""

    def __init__(self, workload: Workload, calls: dict[str, Latency], tick: TimerTick | None = None):
        self.workload = workload
        self.latency = GlooCallLatency(calls, tick)

    def step_scale(self, device: DeviceSpec, batch: int, sharing: int) -> float:
        """The factor on ``device``'s measured layer and step times at ``batch`` with ``sharing`` ranks on
        its host (1 on a device the workload was not measured on)."""
        return rank_step.measured_scale(self.workload, device, batch, sharing)

    def prep_s_per_sample(self, given: float | None, devices: list[DeviceSpec], loaded: int,
                          sharing: int) -> float:
        """The input pipeline's cost per sample for ranks on ``devices`` each preparing ``loaded`` samples at
        once: ``given`` (another pipeline than the default, measured back to back) plus the loop's cold start,
        else as a calibrated CPU rank's loop prepared the default pipeline, else the workload's; slower
        beside the host's other ranks."""
        workload = self.workload
        calibrated_cpu = all(rank_step.measured_cpu(workload, d) for d in devices)
        in_loop = rank_step.rank_data_in_loop_s(workload, loaded) if calibrated_cpu else 0.0
        if given is not None:  # in the loop a batch starts cold
            prep = given + (rank_step.rank_data_cold_s(workload, loaded) / max(1, loaded)
                            if calibrated_cpu and given > 0 else 0.0)
        elif in_loop > 0:
            prep = in_loop / max(1, loaded)
        else:
            prep = workload.input.prep_s_per_sample or 0.0
        if prep > 0 and calibrated_cpu:  # beside the host's other ranks a batch takes longer
            prep *= rank_step.rank_data_slowdown(workload, loaded, sharing)
        return prep

    def jitter(self, devices: list[DeviceSpec], batch: int) -> JitterSpec | None:
        """With several CPU ranks: each rank's passes scatter as the calibration measured (median-centred,
        since the calibrated times are medians), by a part of their own, so a step that synchronises the
        ranks waits for the slowest as it does for real, and a part the ranks share (the host's speed),
        which moves them together. One rank has nobody to wait for: None."""
        if len(devices) < 2 or any(d.kind != "cpu" for d in devices):
            return None
        own, shared = rank_step.rank_step_sigma(self.workload, batch)
        if own == shared == 0:
            return None
        return JitterSpec(distribution="lognormal", sigma=own, common_sigma=shared, centre="median")

    @staticmethod
    def share_process_with_loader(prep_s_per_sample: float, costs: dict, devices: dict[str, DeviceSpec],
                                  overlap: LoaderOverlap) -> tuple[float, dict]:
        """(prep, costs) of CPU ranks whose batches a thread of their own process prepares ahead: it shares
        the interpreter's GIL and the socket's cache with the step, so while both run the step takes
        ``overlap.step`` times longer and a batch ``overlap.prep`` times longer
        (calibrate.execute.rank_step.measure_loader_overlap). ``costs`` and ``devices`` are by rank."""
        step = overlap.step
        shared = dict(costs)
        for gpu, c in costs.items():
            if devices[gpu].kind == "cpu":
                shared[gpu] = dataclasses.replace(c, forward_s=[f * step for f in c.forward_s],
                                                  backward_s=[b * step for b in c.backward_s],
                                                  step_s=c.step_s * step)
        return prep_s_per_sample * overlap.prep, shared
