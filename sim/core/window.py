"""`MeasuredWindow`: what a run's figures are measured over, kept as the iterations end.

The figures cover the iterations after the warm-up. When the last warm-up iteration has ended on every rank
the window keeps the bytes each link has carried so far (so the result counts only the measured
iterations) and every simulated GPU's memory byte-seconds; at the window's end the byte-seconds again (their
difference over the window's length is the average memory held). A stop asked for while the run goes
(a `StopFlag`: Ctrl-C) ends the run when the next measured iteration has ended on every rank, and the
window then ends there. It observes a strategy context's iteration ends (`Context.on_iteration_end`).
"""

from __future__ import annotations

import numpy as np
import simpy

__all__ = ["MeasuredWindow", "StopFlag"]


class StopFlag:
    """A request to stop a run early (`MeasuredWindow`), set from outside it: a signal handler, another
    thread. Setting it only sets a flag."""

    def __init__(self):
        self.requested = False

    def request(self) -> None:
        self.requested = True


class MeasuredWindow:
    """The measured window of one run on ``machine``: ``warmup`` iterations first, ``total`` in all; the
    memory of the ``simulated`` GPUs is followed; ``stop``, when requested, ends the run early."""

    def __init__(self, machine, warmup: int, total: int, simulated: list[str], stop: StopFlag | None = None):
        self.machine = machine
        self.warmup = warmup
        self.last = total - 1  # the last iteration the result covers
        self.simulated = list(simulated)
        self.stop = stop if stop is not None else StopFlag()
        self.link_snapshot: np.ndarray | None = None  # link bytes at the end of the warm-up
        self.snapshot_credited: np.ndarray | None = None
        self.memory_area: dict[int, dict[str, float]] = {}  # iteration -> GPU -> byte-seconds at its end


    def __call__(self, iteration: int) -> None:
        """``iteration`` has ended on every rank."""
        self._stop_here(iteration)
        now = self.machine.env.now
        if iteration in (self.warmup - 1, self.last):
            self.memory_area[iteration] = {g: self.machine.gpus[g].memory.byte_seconds(now)
                                           for g in self.simulated}
        if iteration == self.warmup - 1:
            net = self.machine.net
            net.drain()
            self.link_snapshot = net.link_bytes.copy()
            self.snapshot_credited = net.credited.copy()

    def _stop_here(self, iteration: int) -> None:
        if self.stop.requested and self.warmup <= iteration < self.last:
            self.last = iteration
            stop = self.machine.env.event()  # processed by env.step, outside any process: ends env.run()
            stop.callbacks.append(simpy.core.StopSimulation.callback)
            stop.succeed()
