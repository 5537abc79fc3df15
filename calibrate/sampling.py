"""Turning repeated timings into one figure: the median, and the interquartile range as its spread."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def median_spread(samples: Sequence[float]) -> tuple[float, float]:
    """(median, interquartile range) of repeated timings; robust to the odd preempted repeat."""
    values = np.asarray(samples, dtype=float)
    q1, med, q3 = np.percentile(values, [25, 50, 75])
    return float(med), float(q3 - q1)


def iterations_for(one_s: float, target_s: float, cap: int = 10_000) -> int:
    """How many back-to-back operations to time together so one timing lasts about ``target_s``.

    A single 1 KiB copy takes about a microsecond, far below the clock's useful resolution and the cost of
    reading it, so small operations are timed in batches.
    """
    if one_s <= 0:
        return cap
    return int(max(1, min(cap, round(target_s / one_s))))
