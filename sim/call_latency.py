"""What one gloo call costs before its bytes move, as a calibrated CPU box measured it: its samples' mean.

On a 2-vCPU virtual machine a gloo call is bimodal: a few hundred microseconds, or a 4-5 ms stall. The
calibration (`trainsim.calibrate.collbench`) keeps every call it timed, and each call is charged the mean of
the samples at the sizes around its own: its expected cost.

Why not draw one sample per call, so that the simulated steps spread as the real ones do: how often a call
stalls is not a property of the call. Timed inside the runs, the same 100 KB all-reduce stalled 57 % of the
time in one launch and 94 % in another; calibrations minutes apart read 7-80 % around that size. Near one in
two, the median step sits in one mode or the other by chance, and drawing made the prediction flip with it:
the same all-reduce rows read -27 % in one benchmark repeat and +4 % in the next. The mean lands between the
modes.

A latency given as a plain number (a what-if, an old bundle: only the fit's alpha) is charged as it is.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np


@dataclass(frozen=True)
class MeasuredLatency:
    """Seconds before a call's bytes move, one per measured call (its bandwidth term taken out), per measured
    size: the stalls grow commoner with the size (a 16 KB all-reduce here stalled one time in fifteen, a 256
    KB one every other time), so a call is charged from the sizes around its own."""

    sizes: tuple[float, ...]  # bytes of each measured point, ascending
    samples: tuple[tuple[float, ...], ...]  # per point

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
    return MeasuredLatency(sizes, tuple(kept[b] for b in sizes))
