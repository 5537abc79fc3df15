"""What one gloo call costs before its bytes move, as a calibrated CPU box measured it: one draw per call.

On a 2-vCPU virtual machine a gloo call is bimodal: a few hundred microseconds, or a 4-5 ms stall. The
calibration (`trainsim.calibrate.collbench`) meets each call after a training step (one rank late, the others
waiting) and keeps every sample. A constant, the samples' mean, charges each call a cost it almost never has:
a median step sees the fast call when stalls are rarer than one in two, and the stall when they are commoner.
So each call draws one of the measured latencies, and the step-to-step spread comes out as the runs show it.

The catch: near one stall in two, which mode the median step lands in is chance, in the calibration as in the
runs, and the prediction flips with it (the same 2-rank all-reduce rows read -27 % in one benchmark repeat and
+4 % in the next). Charging the mean instead left those rows mostly 10-13 % short, and the benchmark's
median error was no better (5.7-9.5 % over five repeats, against 5.1-6.1 % over three), so the draws stay.

A latency given as a plain number (a what-if, an old bundle: only the fit's alpha) is charged as it is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MeasuredLatency:
    """Seconds before a call's bytes move, one per measured call (its bandwidth term taken out), per measured
    size: the slow wake-ups grow commoner with the size (a 4 KB all-reduce here was slow one time in ten, a
    1 MB one every other time), so a call draws from the size nearest its own."""

    sizes: tuple[float, ...]  # bytes of each measured point, ascending
    samples: tuple[tuple[float, ...], ...]  # per point

    def __post_init__(self):
        if not self.sizes or len(self.sizes) != len(self.samples) or not all(self.samples):
            raise ValueError("a measured latency needs samples at every size it names")

    def at(self, nbytes: float) -> tuple[float, ...]:
        """The samples of the measured size nearest ``nbytes`` (on a log scale)."""
        wanted = math.log(max(nbytes, 1.0))
        nearest = min(range(len(self.sizes)), key=lambda i: abs(math.log(max(self.sizes[i], 1.0)) - wanted))
        return self.samples[nearest]

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
