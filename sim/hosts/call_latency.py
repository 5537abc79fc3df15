"""What one gloo call costs before its bytes move, as a calibrated CPU box measured it.

The calibration (`trainsim.calibrate.measure.collbench`) keeps every gloo call it timed, and its timer tick
probe (`trainsim.calibrate.measure.timer_tick`) finds whether stalled calls return on a tick of the host's
timer: its period, the offset of the returns and the dead time, the shortest wait after the ranks arrived
that a tick wakes. Where the bundle has the tick, each call is fast (the mean of the fast samples around its
size) or, with the share of stalled samples there as its chance, stalled: it ends on the first tick past
both its dead time and its fast end, so what a stall costs depends on where in the tick the call falls.

Where a strategy knows how far apart its ranks arrived (DDP's buckets, synchronous EASGD), an all-reduce
stalls with the probe's share for that way of meeting, scaled by how often the calibration's calls of its
size stalled against those of the probe's size (`TimerTick.met_chance`). One gloo call is one draw: every
rank's part of it (each push of the parameter server's reduce) stalls or not together (`GlooCallLatency`).

Without a tick (an older bundle, or none found) a call is charged the mean of the samples at the sizes
around its own, its expected cost; a latency given as a plain number (a what-if, a bundle with only the
fit's alpha) is charged as it is. The measurements behind this are in docs/gloo-on-a-small-vm.md.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from trainsim.sim.core.latency import CallLatencyModel, CallSite

STALL_OVER_S = 0.001  # a call this much slower than the fastest at its size has stalled


@dataclass(frozen=True)
class MeasuredLatency:
    """Seconds before a call's bytes move, one per measured call (its bandwidth term taken out), per measured
    size: the stalls grow commoner with the size (a 16 KB all-reduce here stalled one time in fifteen, a 256
    KB one every other time), so a call is charged from the sizes around its own."""

    sizes: tuple[float, ...]  # bytes of each measured point, ascending
    samples: tuple[tuple[float, ...], ...]  # per point
    beta_bytes_per_s: float = math.inf  # the fitted bandwidth the samples' bytes were taken out at

    def __post_init__(self):
        if not self.sizes or len(self.sizes) != len(self.samples) or not all(self.samples):
            raise ValueError("a measured latency needs samples at every size it names")

    def _around(self, nbytes: float) -> tuple[int, ...]:
        """The measured sizes around ``nbytes``: both neighbours between two measured sizes (each has a few
        samples only), that size at a measured one, the end beyond the measured range."""
        i = bisect.bisect_left(self.sizes, nbytes)
        if i == len(self.sizes):
            return (i - 1,)
        if i == 0 or self.sizes[i] == nbytes:
            return (i,)
        return (i - 1, i)

    def at(self, nbytes: float) -> tuple[float, ...]:
        """The samples of the measured sizes around ``nbytes``."""
        return tuple(t for i in self._around(nbytes) for t in self.samples[i])

    @cached_property
    def _totals(self) -> tuple[tuple[float, int], ...]:
        return tuple((float(np.sum(s)), len(s)) for s in self.samples)

    def mean(self, nbytes: float) -> float:
        """The mean of the samples around ``nbytes`` (asked once per simulated call: sums kept per size)."""
        picked = [self._totals[i] for i in self._around(nbytes)]
        return sum(total for total, _ in picked) / sum(count for _, count in picked)

    @cached_property
    def _splits(self) -> tuple[tuple[float, int, int], ...]:
        """Per size: (sum of the fast samples, how many, how many stalled)."""
        out = []
        for s in self.samples:
            floor = min(s)
            fast = [t for t in s if t - floor <= STALL_OVER_S]
            out.append((float(np.sum(fast)), len(fast), len(s) - len(fast)))
        return tuple(out)

    def fast_and_stall_chance(self, nbytes: float) -> tuple[float, float]:
        """The mean of the fast samples around ``nbytes`` and the share of them that stalled."""
        picked = [self._splits[i] for i in self._around(nbytes)]
        fast_total, fast, stalled = (sum(x) for x in zip(*picked, strict=True))
        return fast_total / fast, stalled / (fast + stalled)

    def wire_s(self, nbytes: float) -> float:
        """What the samples' bytes were taken out at: the call's bytes at the fitted bandwidth."""
        return nbytes / self.beta_bytes_per_s


@dataclass(frozen=True)
class TimerTick:
    """The timer tick stalled calls return on: ``offset_s`` after every multiple of ``period_s`` on the
    host's clock (the simulated clock starts on one), the first at least ``dead_time_s`` after the call
    began. Where the probe measured them, ``stall_together`` and ``stall_apart``: the shares of its
    all-reduces (of ``probe_bytes``) that stalled with the ranks arriving within ``together_s`` of each other
    and further apart."""

    period_s: float
    offset_s: float = 0.0
    dead_time_s: float = 0.0
    together_s: float = 0.0
    stall_together: float | None = None
    stall_apart: float | None = None
    probe_bytes: float = 0.0

    def __post_init__(self):
        if not self.period_s > 0 or not 0 <= self.offset_s < self.period_s or not 0 <= self.dead_time_s:
            raise ValueError("a timer tick needs a period > 0, an offset within it and a dead time >= 0")
        if not all(0 <= x <= 1 for x in (self.stall_together, self.stall_apart) if x is not None):
            raise ValueError("a share of stalled calls must be within 0-1")

    def first_after(self, t: float) -> float:
        """The first tick return at or after ``t``."""
        return self.offset_s + math.ceil((t - self.offset_s) / self.period_s - 1e-9) * self.period_s

    def stalled_end(self, start: float, fast_end: float) -> float:
        """When a call that began at ``start`` and would have ended at ``fast_end`` ends, stalled."""
        return self.first_after(max(start + self.dead_time_s, fast_end))

    def met_chance(self, skew_s: float, at_size: float, at_probe: float) -> float | None:
        """The chance that an all-reduce whose ranks arrived ``skew_s`` apart stalls: the probe's share for
        ranks meeting that way, scaled by how much more (or less) often the calibration's calls of this size
        stalled than those of the probe's size (``at_size`` / ``at_probe``, equal at the probe's size). None
        where the probe did not measure it."""
        share = self.stall_together if skew_s < self.together_s else self.stall_apart
        if share is None:
            return None
        return share if at_probe <= 0 else min(1.0, share * at_size / at_probe)


Latency = float | MeasuredLatency


def cost(latency: Latency, nbytes: float) -> float:
    """Seconds one call on ``nbytes`` pays before its bytes move: the measured mean, or the number itself."""
    return latency.mean(nbytes) if isinstance(latency, MeasuredLatency) else float(latency)


def from_points(points: Sequence[dict], beta_bytes_per_s: float) -> MeasuredLatency | None:
    """The latencies of a gloo call from its benchmark points (``bytes``, ``samples_s``): each sample less
    the time its bytes take at the fitted bandwidth (never below zero). None without samples."""
    kept = {}
    for p in points:
        samples = p.get("samples_s") if isinstance(p, dict) else None
        nbytes = p.get("bytes") if isinstance(p, dict) else None
        if not isinstance(samples, list) or not isinstance(nbytes, int | float) or nbytes < 0:
            continue
        wire = nbytes / beta_bytes_per_s if beta_bytes_per_s > 0 else 0.0
        values = tuple(max(0.0, float(t) - wire) for t in samples if isinstance(t, int | float))
        if values:
            kept[float(nbytes)] = values
    if not kept:
        return None
    sizes = tuple(sorted(kept))
    return MeasuredLatency(sizes, tuple(kept[b] for b in sizes),
                           beta_bytes_per_s if beta_bytes_per_s > 0 else math.inf)


class GlooCallLatency(CallLatencyModel):
    """The machine's latency model on a calibrated gloo host: per op (``p2p``: one send/recv message) the
    measured `Latency`; ops it does not name pay their route's. With ``tick``, stalls wait for the timer
    tick, drawn from a generator seeded 0 in simulated order, so a run is reproducible."""

    def __init__(self, calls: dict[str, Latency], tick: TimerTick | None = None):
        self.calls = dict(calls)
        self.tick = tick
        self.blocking_calls = bool(self.calls)  # every gloo call blocks its caller
        self._stalls = np.random.default_rng(0)  # which calls stall
        self._drawn: dict = {}  # per call key: whether that call stalled, for every rank's part of it

    def cost(self, call: CallSite, nbytes: float, *, now: float) -> float | None:
        latency = self.calls.get(call.op)
        if latency is None:
            return None
        skew = call.skew_s if call.op == "allreduce" else None
        return self._charge(latency, nbytes, now, skew, call.key)

    def _charge(self, latency: Latency, nbytes: float, now: float, skew_s: float | None = None,
                key=None) -> float:
        """A call starting at ``now``: its measured mean; where stalls wait for the timer tick, fast or
        stalled as its samples (and, given ``skew_s``, the probe's calls met the same way) say, a stalled one
        ending on the first tick past its dead time and its fast end. The parts of one call with the same
        ``key`` (each rank's push of one gloo reduce) are drawn once: it is one call that stalls, and each
        part then ends on the tick after its own start."""
        tick = self.tick
        if tick is None or not isinstance(latency, MeasuredLatency):
            return cost(latency, nbytes)
        fast, chance = latency.fast_and_stall_chance(nbytes)
        if skew_s is not None:
            met = tick.met_chance(skew_s, chance, latency.fast_and_stall_chance(tick.probe_bytes)[1])
            chance = chance if met is None else met
        stalled = self._drawn.get(key) if key is not None else None
        if stalled is None:
            stalled = bool(self._stalls.random() < chance)
            if key is not None:
                self._drawn[key] = stalled
        if not stalled:
            return fast
        wire = latency.wire_s(nbytes)
        return tick.stalled_end(now, now + fast + wire) - now - wire
