"""What one gloo call costs before its bytes move, as a calibrated CPU box measured it: one draw per call.

A rank waiting in gloo sleeps; on a virtual machine its idle vCPU halts, and waking it is bimodal (a few
hundred microseconds, or the host's next tick, milliseconds). The calibration (`trainsim.calibrate.collbench`)
meets each call as training does (one rank late, the others asleep) and keeps every sample. A constant, the
samples' mean, would charge each call a cost it almost never has: a median step sees the fast call when slow
ones are rarer than one in two, and the slow one when they are commoner. So each call draws one of the
measured latencies instead, and the step-to-step spread comes out as the runs show it.

A latency given as a plain number (a what-if, an old bundle: only the fit's alpha) is charged as it is.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MeasuredLatency:
    """Seconds before a call's bytes move, one per measured call (its bandwidth term taken out), per measured
    size: the slow wake-ups grow commoner with the size (a 4 KB all-reduce here was slow one time in ten, a
    1 MB one every other time), so a call draws from the sizes around its own."""

    sizes: tuple[float, ...]  # bytes of each measured point, ascending
    samples: tuple[tuple[float, ...], ...]  # per point

    def __post_init__(self):
        if not self.sizes or len(self.sizes) != len(self.samples) or not all(self.samples):
            raise ValueError("a measured latency needs samples at every size it names")

    def at(self, nbytes: float) -> tuple[float, ...]:
        """The samples of the measured sizes around ``nbytes``: both neighbours' between two measured sizes
        (each has a few samples only, and which mode most of them are in can differ by chance), that size's
        at a measured one, the end's beyond the measured range."""
        i = bisect.bisect_left(self.sizes, nbytes)
        if i == len(self.sizes):
            return self.samples[-1]
        if i == 0 or self.sizes[i] == nbytes:
            return self.samples[i]
        return self.samples[i - 1] + self.samples[i]

    def mean(self, nbytes: float) -> float:
        return float(np.mean(self.at(nbytes)))

    def draw(self, rng: np.random.Generator, nbytes: float) -> float:
        samples = self.at(nbytes)
        return samples[int(rng.integers(len(samples)))]


Latency = float | MeasuredLatency


def draw(latency: Latency, rng: np.random.Generator, nbytes: float) -> float:
    """One call's latency for ``nbytes``: a draw from the measured ones, or the number itself."""
    return latency.draw(rng, nbytes) if isinstance(latency, MeasuredLatency) else float(latency)


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
    return MeasuredLatency(sizes, tuple(kept[b] for b in sizes))
