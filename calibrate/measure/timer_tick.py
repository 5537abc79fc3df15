"""The timer tick that stalled gloo calls wait for: its period, where in it they return, and how soon after
the ranks arrive a tick can wake them.

On a host whose idle vCPUs lose wake-ups (docs/gloo-on-a-small-vm.md), a gloo call either returns within
its fast time or stalls until a tick of the guest's timer that comes at least a dead time after the last
rank arrived; how often it stalls depends on how far apart the ranks met it.

`probe_rank` times such calls on every rank (an all-reduce after a busy gap of random length, so that calls
fall everywhere in the tick; on every other call, one rank arrives `PROBE_LATE_S` late); `fit` finds the
period among the common kernel tick rates, the offset of the stalled returns, and the dead time: the shortest
wait after the last arrival that a tick wakes; and the share of the calls that stalled with the ranks
arriving together (within `TOGETHER_S`) and apart. The simulator ends a stalled call on the first tick after
that, and draws whether an all-reduce stalls from how far apart its ranks arrive
(`trainsim.sim.hosts.call_latency`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np

from trainsim.calibrate.launch import RankContext, launch
from trainsim.errors import TrainsimError
from trainsim.sim.hosts.call_latency import STALL_OVER_S

# CONFIG_HZ choices of Linux: 100, 250, 300, 1000 Hz; the longest period that fits wins (a call that lands on
# 4 ms multiples also lands on 1 ms ones)
CANDIDATE_PERIODS_S = (0.010, 0.004, 1 / 300, 0.001)
PROBE_CALLS = 300
PROBE_GAP_S = (0.003, 0.012)  # busy time before each call: a training step's compute, at every tick phase
PROBE_BYTES = 100_000  # a small model's gradients
PROBE_LATE_S = (0.0001, 0.001)  # how late one rank is on every other call: apart, whatever the delay
TOGETHER_S = 50e-6  # ranks arriving within this of each other meet a call "together" (see the module doc)
MIN_STALLS = 20  # fewer stalled calls than this say nothing about a period
MIN_RESULTANT = 0.6  # how tightly the returns must cluster in the period (1: all at one phase, ~0: uniform)


def probe_rank(ctx: RankContext, calls: int, seed: int) -> list[tuple[float, float]]:
    """What every rank runs: ``calls`` all-reduces, each after a busy gap (the same on every rank), every
    other one with one rank `PROBE_LATE_S` late; per call, this rank's arrival and return on the host's
    monotonic clock (``perf_counter``, shared by the ranks of one host)."""
    import torch
    import torch.distributed as dist

    buf = torch.ones(PROBE_BYTES // 4)
    dist.all_reduce(buf)  # connections up
    rng = np.random.default_rng(seed)  # the same draws on every rank: each knows who is late
    gaps = rng.uniform(*PROBE_GAP_S, size=calls)
    late_rank = rng.integers(0, ctx.world_size, size=calls)
    late_s = np.where(np.arange(calls) % 2 == 1, rng.uniform(*PROBE_LATE_S, size=calls), 0.0)
    stamps = []
    for gap, late, extra in zip(gaps, late_rank, late_s, strict=True):
        until = time.perf_counter() + gap + (extra if ctx.rank == late else 0.0)
        while time.perf_counter() < until:  # busy, as a rank computing its step is
            pass
        arrived = time.perf_counter()
        dist.all_reduce(buf)
        stamps.append((arrived, time.perf_counter()))
    return stamps


def _cluster(times: Sequence[float], period: float) -> tuple[float, float]:
    """(resultant length, mean phase in seconds) of ``times`` on a circle of ``period``."""
    angles = 2 * math.pi * np.asarray(times) / period
    c, s = float(np.mean(np.cos(angles))), float(np.mean(np.sin(angles)))
    return math.hypot(c, s), (math.atan2(s, c) / (2 * math.pi) % 1.0) * period


def _dead_time(arrivals: np.ndarray, returns: np.ndarray, period: float, offset: float) -> float:
    """The wait after the last arrival that best says which tick woke each stalled call: the call returns on
    the first tick at least that long after it arrived (the smallest such wait among equally good ones)."""
    woke = np.round((returns - offset) / period)
    best, best_hits = 0.0, -1
    for dead in np.arange(0.0, period, period / 80):
        hits = int(np.sum(np.ceil((arrivals + dead - offset) / period - 1e-9) == woke))
        if hits > best_hits:
            best, best_hits = float(dead), hits
    return best


def _share(stalled: np.ndarray) -> float | None:
    return round(float(stalled.mean()), 3) if len(stalled) else None


def fit(stamps: Sequence[Sequence[tuple[float, float]]]) -> dict:
    """Per-rank ``probe_rank`` stamps -> ``{"period_s", "offset_s", "dead_time_s", "resultant",
    "stalled_calls", "calls", "together_s", "stall_together", "stall_apart", "probe_bytes"}``; ``period_s``
    None (with a ``reason``) where stalled calls return on no tick."""
    each_arrival = np.array([[a for a, _ in rank] for rank in stamps])
    arrivals = each_arrival.max(axis=0)
    returns = np.max([[r for _, r in rank] for rank in stamps], axis=0)
    cost = returns - arrivals
    stalled = cost - cost.min() > STALL_OVER_S
    together = arrivals - each_arrival.min(axis=0) < TOGETHER_S
    found = {"period_s": None, "offset_s": None, "dead_time_s": None, "resultant": None,
             "stalled_calls": int(stalled.sum()), "calls": len(cost), "together_s": TOGETHER_S,
             "stall_together": _share(stalled[together]), "stall_apart": _share(stalled[~together]),
             "probe_bytes": PROBE_BYTES}
    if stalled.sum() < MIN_STALLS:
        return {**found,
                "reason": f"{int(stalled.sum())} of {len(cost)} calls stalled, fewer than {MIN_STALLS}"}
    best = 0.0
    for period in CANDIDATE_PERIODS_S:
        resultant, offset = _cluster(returns[stalled], period)
        best = max(best, resultant)
        if resultant >= MIN_RESULTANT:
            dead = _dead_time(arrivals[stalled], returns[stalled], period, offset)
            return {**found, "period_s": period, "offset_s": round(offset, 7), "dead_time_s": round(dead, 7),
                    "resultant": round(resultant, 3)}
    return {**found, "resultant": round(best, 3),
            "reason": f"stalled calls return on no tick (best clustering {best:.2f} < {MIN_RESULTANT})"}


def measure(nranks: int, *, calls: int = PROBE_CALLS, seed: int = 0, timeout_s: float = 300.0) -> dict:
    """Launch ``nranks`` gloo ranks, probe, and `fit` the tick."""
    if nranks < 2:
        raise TrainsimError(f"the timer tick probe needs at least 2 ranks, got {nranks}", field="ranks")
    return fit(launch(probe_rank, nranks, args=(calls, seed), device="cpu", timeout_s=timeout_s))
