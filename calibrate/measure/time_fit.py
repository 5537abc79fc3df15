"""Choosing the time-vs-batch model of a measured layer.

The default is affine, t = a + b·batch: a fixed cost (kernel launches, reading the weights) plus a cost per
sample. On a GPU, small batches leave the device under-used and time grows slower than linearly at first;
there a power law t = a + b·batch^c describes the points better. We fit both (scipy, on relative error, via
:func:`trainsim.formats.workload.fit_time`) and keep the power law only when the data demand it: at least
four
batch sizes, affine off by more than 5 % RMS, and the power law at least halving that error. The fit dict
records its own relative RMS error (``rel_rms``) so a reader can judge it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from trainsim.errors import TrainsimError
from trainsim.formats.workload import FIT_MODELS, TimeModel, fit_time

AFFINE_GOOD_ENOUGH = 0.05
MIN_POINTS_FOR_POWER = 4


def rel_rms(fit: dict, points: Sequence[tuple[int, float, float]]) -> float:
    """Root-mean-square relative error of ``fit`` over measured ``(batch, seconds, spread)`` points."""
    func = FIT_MODELS[fit["model"]][1]
    errors = [(func(fit, b) - t) / t for b, t, _ in points]
    return math.sqrt(sum(e * e for e in errors) / len(errors))


def choose_fit(points: Sequence[tuple[int, float, float]]) -> dict:
    """The fit for ``points``: affine unless a power law is clearly better (see the module docstring)."""
    if not points:
        raise TrainsimError("cannot fit a time model to no points", field="points")
    points = sorted((int(b), float(t), float(s)) for b, t, s in points)
    affine = fit_time(points, "affine")
    affine["rel_rms"] = rel_rms(affine, points)
    if len(points) < MIN_POINTS_FOR_POWER or affine["rel_rms"] <= AFFINE_GOOD_ENOUGH:
        return affine
    power = fit_time(points, "power")
    power["rel_rms"] = rel_rms(power, points)
    return power if power["rel_rms"] <= affine["rel_rms"] / 2 else affine


def time_model(points: Sequence[tuple[int, float, float]]) -> TimeModel:
    """Measured points plus the chosen fit."""
    points = sorted((int(b), float(t), float(s)) for b, t, s in points)
    return TimeModel(points=points, fit=choose_fit(points))
