"""Jitter: multiplicative noise on compute times, reproducible from a seed.

Real kernels do not take the same time twice (clocks, other tenants, data-dependent work); asynchronous
schedules pay off exactly because of that. A `Jitter` draws a factor for each piece of compute from a
distribution with mean 1, keyed by *what* the work is (GPU, iteration, micro-batch, pass), not by the order
in which the simulation asks: two schedules of the same work see the same durations, so comparing them
isolates the schedule.

- ``lognormal``: factor = exp(N(-sigma^2/2, sigma)) (mean 1, right-skewed: the occasional slow kernel);
  with ``centre: median``, exp(N(0, sigma)) (median 1: for times that are medians, as calibrated ones are);
- ``uniform``: factor ~ U(1 - sigma, 1 + sigma).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator


class JitterSpec(BaseModel):
    """``strategy.jitter``: noise on compute times (strategies pipeline and easgd; on a calibrated CPU box
    every strategy gets the spread the calibration measured, see `trainsim.sim.costs.rank_step_sigma`)."""

    model_config = ConfigDict(extra="forbid")

    distribution: Literal["lognormal", "uniform"] = "lognormal"
    sigma: float = Field(default=0.1, ge=0, description="lognormal: sigma of log; uniform: half-width")
    centre: Literal["mean", "median"] = Field(default="mean", description="lognormal: which is 1")
    seed: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _uniform_positive(self):
        if self.distribution == "uniform" and self.sigma >= 1:
            raise ValueError("uniform jitter needs sigma < 1 (durations must stay positive)")
        return self


class Jitter:
    """Draws the factor of one piece of work; ``None`` spec: always 1."""

    def __init__(self, spec: JitterSpec | None):
        self.spec = spec

    def factor(self, *key: int) -> float:
        spec = self.spec
        if spec is None or spec.sigma == 0:
            return 1.0
        rng = np.random.default_rng([spec.seed, *(int(k) for k in key)])
        if spec.distribution == "lognormal":
            mu = 0.0 if spec.centre == "median" else -(spec.sigma**2) / 2
            return float(np.exp(rng.normal(mu, spec.sigma)))
        return float(rng.uniform(1 - spec.sigma, 1 + spec.sigma))
