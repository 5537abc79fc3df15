"""The alpha-beta cost model of a transfer or collective, and its fit to measured points.

A message of S bytes takes ``t(S) = alpha + S / beta``: alpha is the fixed cost (latency: launch,
synchronisation, the first byte's trip) and beta the asymptotic bandwidth. Measured sweeps span six orders of
magnitude of time, so an ordinary least-squares fit would be decided by the largest sizes alone and put alpha
anywhere. We fit on *relative* error instead, minimising sum(((alpha + S/beta) / t - 1)^2), which weighs every
size equally. The model is linear in (alpha, 1/beta), so this is a bounded linear least-squares problem
(scipy's ``lsq_linear``) with alpha >= 0 and 1/beta >= 0: no starting guess, no local minima.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import lsq_linear

from trainsim.errors import TrainsimError

# Below this inverse bandwidth (1e18 B/s) the data show no size dependence at all; keep beta finite for JSON.
_MIN_INV_BETA = 1e-18


@dataclass(frozen=True)
class AlphaBeta:
    """A fitted ``t = alpha + bytes / beta`` (seconds, bytes/second) and how well it fits."""

    alpha_s: float
    beta_bytes_per_s: float
    rel_rms: float  # root-mean-square relative error of the fit over its points
    points: int

    def time(self, nbytes: float) -> float:
        """Predicted seconds for a message of ``nbytes``."""
        return self.alpha_s + nbytes / self.beta_bytes_per_s

    @property
    def latency_us(self) -> float:
        return self.alpha_s * 1e6

    @property
    def bandwidth_gbps(self) -> float:
        return self.beta_bytes_per_s / 1e9

    def to_json(self) -> dict:
        return {
            "model": "alpha_beta",
            "alpha_s": self.alpha_s,
            "beta_bytes_per_s": self.beta_bytes_per_s,
            "latency_us": self.latency_us,
            "bandwidth_gbps": self.bandwidth_gbps,
            "rel_rms": self.rel_rms,
            "points": self.points,
        }

    @classmethod
    def from_json(cls, data: dict) -> AlphaBeta:
        return cls(
            alpha_s=float(data["alpha_s"]),
            beta_bytes_per_s=float(data["beta_bytes_per_s"]),
            rel_rms=float(data.get("rel_rms", 0.0)),
            points=int(data.get("points", 0)),
        )


def fit_alpha_beta(sizes: Sequence[float], times: Sequence[float]) -> AlphaBeta:
    """Fit ``t = alpha + S / beta`` to measured (size, time) points, minimising relative error.

    Needs at least two distinct positive sizes and positive times; raises ``TrainsimError`` otherwise.
    """
    s = np.asarray(sizes, dtype=float)
    t = np.asarray(times, dtype=float)
    if s.shape != t.shape or s.ndim != 1:
        raise TrainsimError("sizes and times must be two lists of the same length", field="points")
    if len(np.unique(s)) < 2:
        raise TrainsimError("an alpha-beta fit needs at least two distinct message sizes", field="points")
    if np.any(s < 0) or np.any(~np.isfinite(t)) or np.any(t <= 0):
        raise TrainsimError("message sizes must be >= 0 and times > 0", field="points")
    # Rows: (alpha + g*S)/t = 1 with g = 1/beta. Scale the columns to unit norm so the solver sees a
    # well-conditioned problem although alpha ~ 1e-6 and g ~ 1e-10.
    design = np.column_stack([1.0 / t, s / t])
    scale = np.linalg.norm(design, axis=0)
    scale[scale == 0] = 1.0
    solution = lsq_linear(design / scale, np.ones_like(t), bounds=(0.0, np.inf), method="bvls")
    alpha, inv_beta = solution.x / scale
    inv_beta = max(inv_beta, _MIN_INV_BETA)
    predicted = alpha + s * inv_beta
    rel_rms = float(math.sqrt(np.mean((predicted / t - 1.0) ** 2)))
    return AlphaBeta(
        alpha_s=float(alpha), beta_bytes_per_s=float(1.0 / inv_beta), rel_rms=rel_rms, points=len(s)
    )


def log_sizes(lo: int, hi: int, factor: int = 4) -> list[int]:
    """Message sizes lo, lo*factor, ... up to and including hi (bytes), for a log-spaced sweep."""
    if lo <= 0 or hi < lo or factor < 2:
        raise TrainsimError(f"bad size sweep {lo}..{hi} x{factor}", field="sizes")
    out, size = [], lo
    while size <= hi:
        out.append(int(size))
        size *= factor
    if out[-1] != hi:
        out.append(int(hi))
    return out
