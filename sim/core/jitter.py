"""Jitter: multiplicative noise on compute times, reproducible from a seed.

Real kernels do not take the same time twice (clocks, other tenants, data-dependent work); asynchronous
schedules pay off exactly because of that. A `Jitter` draws a factor for each piece of compute from a
distribution with mean 1, keyed by *what* the work is (GPU, iteration, micro-batch, pass), not by the order
in which the simulation asks: two schedules of the same work see the same durations, so comparing them
isolates the schedule.

- ``lognormal``: factor = exp(N(-sigma^2/2, sigma)) (mean 1, right-skewed: the occasional slow kernel);
  with ``centre: median``, exp(N(0, sigma)) (median 1: for times that are medians, as calibrated ones are);
- ``uniform``: factor ~ U(1 - sigma, 1 + sigma).

``common_sigma`` (lognormal) adds a factor that every rank shares for the same piece of work: ranks that are
cores of one host speed up and slow down together (a 2-rank loop of steps and all-reduces here met each call
0-10 us apart after steps of about 10 ms), so only ``sigma`` makes one rank wait for another.
"""

from __future__ import annotations

import numpy as np

from trainsim.formats.scenario_options import JitterSpec

__all__ = ["Jitter", "JitterSpec"]


class Jitter:
    """Draws the factor of one piece of work; ``None`` spec: always 1."""

    def __init__(self, spec: JitterSpec | None):
        self.spec = spec

    def factor(self, rank: int, *work: int) -> float:
        """The factor of rank ``rank``'s piece of work ``work`` (iteration, micro-batch, pass, ...)."""
        spec = self.spec
        if spec is None or spec.sigma == spec.common_sigma == 0:
            return 1.0
        if spec.distribution == "uniform":
            rng = np.random.default_rng([spec.seed, int(rank), *(int(k) for k in work)])
            return float(rng.uniform(1 - spec.sigma, 1 + spec.sigma))
        own = self._lognormal(spec.sigma, [spec.seed, int(rank), *work])
        # keyed without the rank (and one entry shorter than any rank's key): the same for every rank
        return own * self._lognormal(spec.common_sigma, [spec.seed, *work]) if spec.common_sigma else own

    def _lognormal(self, sigma: float, key: list) -> float:
        if sigma == 0:
            return 1.0
        mu = 0.0 if self.spec.centre == "median" else -(sigma**2) / 2
        return float(np.exp(np.random.default_rng([int(k) for k in key]).normal(mu, sigma)))
