"""A CPU rank's whole training step as the runs see it: in its own pinned process, alone and with every rank
computing at once.

The per-layer profile (`layer_profile`) runs in the calibrating process, hooked iterations interleaved with
plain ones, one batch size after the other. It says how a step splits over the layers; how long the whole
step takes in the executor's set-up is measured here, in that set-up: the ranks are launched and pinned as
the executor launches them (one process per rank on its own cores, the same torch threads), each builds the
model and runs plain training steps (forward, loss, backward, optimizer step) on a synthetic batch.

Two things are measured at each batch size:

- ``alone``: rank 0 computing while the others wait at a barrier (their cores idle) — a one-rank run;
- ``together``: every rank computing at once. The cores share the socket's last-level cache and DRAM
  bandwidth: GEMM-bound work hardly notices (each core has its own FMA units), memory-bound work does (a large
  copy on this kind of box drops from about 23 to 16 GB/s per core when both cores stream).

On a shared (virtual) machine the speed of a core drifts by 10-15 % from one half-second to the next, so the
windows alternate — alone, together, over every batch size, round after round — and each figure is the
median of steps spread over the whole measurement rather than of one burst.

The record goes into the workload file (``provenance.rank_step``); the simulator scales a CPU rank's
measured layers so that the step takes ``alone`` (one rank) or ``together`` (every rank of the host
computing), see `trainsim.sim.costs.rank_step_scale`, and draws each rank's passes with the measured
step-to-step spread, so a synchronous step waits for the slowest rank as it does for real.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from trainsim.calibrate.launch import RankContext, launch

INPUT_POOL = 4  # distinct input batches a rank cycles through


@dataclass(frozen=True)
class RankStepPoint:
    """One batch size: the median step alone and with every rank at once (``together`` None for one rank),
    and how many steps each median is over."""

    batch: int
    alone_s: float
    together_s: float | None
    steps_alone: int
    steps_together: int
    sigma_log: float = 0.0  # spread of one rank's step from step to step: IQR of log(step) / 1.349

    @property
    def slowdown(self) -> float | None:
        return self.together_s / self.alone_s if self.together_s is not None else None

    def to_json(self) -> list:
        return [self.batch, self.alone_s, self.together_s, self.sigma_log]


def _timed_steps(step, seconds: float) -> list[float]:
    """Step times of back-to-back training steps for about ``seconds`` (at least two steps)."""
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(times) < 2 or time.perf_counter() < deadline:
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times


def rank_step_rank(ctx: RankContext, model_name: str, batch_sizes: Sequence[int], rounds: int,
                   window_s: float, options: dict) -> list[dict]:
    """What every rank runs (via ``launch``): per batch size, its step times alone (rank 0) and together."""
    import torch
    import torch.distributed as dist

    from trainsim.calibrate import zoo

    torch.manual_seed(0)
    model = zoo.build_model(model_name, **options)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)  # the profile's optimizer
    steps = {}
    for batch in batch_sizes:
        generator = torch.Generator().manual_seed(batch)
        # a few batches in turn: a training loop's batch is freshly written memory, not one left in cache
        pool = [zoo.example_batch(model_name, batch, "cpu", generator=generator, **options)
                for _ in range(INPUT_POOL)]
        turn = itertools.count()

        def step(pool=pool, turn=turn):
            inputs, targets = pool[next(turn) % len(pool)]
            optimizer.zero_grad(set_to_none=True)
            zoo.loss_fn(model_name, model(inputs), targets).backward()
            optimizer.step()

        step()  # warm-up: first-touch allocations, oneDNN primitive creation
        step()
        steps[batch] = step
    alone: dict[int, list[float]] = {b: [] for b in batch_sizes}
    together: dict[int, list[float]] = {b: [] for b in batch_sizes}
    for _ in range(rounds):
        for batch in batch_sizes:
            dist.barrier()
            if ctx.rank == 0:
                alone[batch] += _timed_steps(steps[batch], window_s)
            if ctx.world_size > 1:
                dist.barrier()
                together[batch] += _timed_steps(steps[batch], window_s)
    return [{"batch": b, "alone": alone[b], "together": together[b]} for b in batch_sizes]


def measure_rank_step(model_name: str, batch_sizes: Sequence[int], ranks: int, *, rounds: int = 6,
                      window_s: float = 0.25, threads_per_rank: int = 1, options: dict | None = None,
                      timeout_s: float = 600.0) -> list[RankStepPoint]:
    """Launch ``ranks`` pinned CPU ranks and measure the step alone and together (see the module doc)."""
    reports = launch(rank_step_rank, ranks, args=(model_name, list(batch_sizes), rounds, window_s,
                                                  dict(options or {})),
                     device="cpu", cores_per_rank=threads_per_rank, threads_per_rank=threads_per_rank,
                     timeout_s=timeout_s)
    points = []
    for i, batch in enumerate(batch_sizes):
        alone = reports[0][i]["alone"]
        per_rank = [report[i]["together"] for report in reports if report[i]["together"]]
        together = statistics.fmean(statistics.median(t) for t in per_rank) if per_rank else None
        points.append(RankStepPoint(batch, statistics.median(alone), together, len(alone),
                                    sum(len(t) for t in per_rank), log_spread(per_rank or [alone])))
    return points


def log_spread(per_rank: Sequence[Sequence[float]]) -> float:
    """sigma of log(step time), robustly: the interquartile range of every rank's log-deviations from its
    own median, / 1.349 (the IQR of a unit normal). A rank whose steps scatter this much arrives at the next
    synchronisation late by chance: the simulator draws each rank's passes from it (stragglers)."""
    deviations = []
    for times in per_rank:
        logs = np.log(np.asarray(times, dtype=float))
        deviations.extend(logs - np.median(logs))
    q1, q3 = np.percentile(deviations, [25, 75])
    return float((q3 - q1) / 1.349)


def rank_step_record(points: Sequence[RankStepPoint], ranks: int, threads_per_rank: int) -> dict:
    """The workload file's ``provenance.rank_step``."""
    return {
        "ranks": ranks,
        "threads_per_rank": threads_per_rank,
        "points": [p.to_json() for p in points],
        "note": "[batch, median step of one pinned rank alone s, median step with every rank at once s, "
                "sigma of log(step) from step to step]",
    }
