"""A CPU rank's whole training step as the runs see it: in its own pinned process, alone and with every rank
computing at once.

The per-layer profile (`layer_profile`) runs in the calibrating process, hooked iterations interleaved with
plain ones, one batch size after the other. It says how a step splits over the layers; how long the whole
step takes in the executor's set-up is measured here, in that set-up: the ranks are launched and pinned as
the executor launches them (one process per rank on its own cores, the same torch threads), each builds the
model and runs the executor's loop: prepare a batch with the default input pipeline (decode, crop, flip,
normalise: memory-bound numpy work), then a plain training step (forward, loss, backward, optimizer step).
Both parts are timed.

What is measured at each batch size:

- ``alone``: rank 0 computing while the others wait at a barrier (their cores idle): a one-rank run;
- the batch preparation in the loop, and the same preparation timed back to back (after a training step
  the pipeline's samples are out of the caches, so each batch in the loop starts cold);
- ``together``: every rank computing at once, meeting at a barrier after each step as synchronous training
  meets in its collective; the mean over the ranks of each one's median (a rank's lead over another does
  not persist between launches, so it is not carried into the prediction);
- the step-to-step spread, split into each rank's own part and the part the ranks share.

The windows alternate (alone, together, over every batch size, round after round) so that the host's drift
falls on every figure alike; each figure is the median of steps spread over the whole measurement.
The measurements behind these choices are in docs/gloo-on-a-small-vm.md.

The record goes into the workload file (``provenance.rank_step``); the simulator scales a CPU rank's
measured layers so that the step takes ``alone`` (one rank) or ``together`` (every rank of the host
computing), see `trainsim.sim.hosts.rank_step.rank_step_scale`, prepares the default pipeline's batches in the
measured in-loop time (`rank_data_in_loop_s`; another pipeline, timed back to back, gets the in-loop excess
added, `rank_data_cold_s`), slows them by the shared-host ratio (`rank_data_slowdown`), and draws
each rank's passes with the measured step-to-step spread, so a synchronous step waits for the slowest rank
as it does for real.

`measure_loader_overlap` is the same kind of measurement for the executor's CPU preload, whose loader is a
thread of the rank's own process on a free core: the step and the thread's batch preparation alone and at
once. They share the interpreter's GIL, so how much they slow each other depends on the pipeline's Python
work; `trainsim validate` measures it per preload variant with that variant's pipeline.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from trainsim.calibrate.launch import RankContext, launch
from trainsim.formats import provenance


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
    data_alone_s: float | None = None  # preparing the step's batch (the executor's default pipeline)
    data_together_s: float | None = None
    data_warm_s: float | None = None  # the same preparation back to back, with nothing in between
    sigma_rank_log: float | None = None  # the part of sigma_log that is one rank's own (`rank_spread`)

    @property
    def slowdown(self) -> float | None:
        return self.together_s / self.alone_s if self.together_s is not None else None

    def to_record(self) -> provenance.RankStepPoint:
        """The point as the workload file keeps it (``provenance.rank_step.points``)."""
        return provenance.RankStepPoint(
            batch=self.batch, alone_s=self.alone_s, together_s=self.together_s, sigma_log=self.sigma_log,
            data_alone_s=self.data_alone_s, data_together_s=self.data_together_s,
            data_warm_s=self.data_warm_s, sigma_rank_log=self.sigma_rank_log)


def rank_step_rank(ctx: RankContext, model_name: str, batch_sizes: Sequence[int], rounds: int,
                   window_s: float, options: dict) -> list[dict]:
    """What every rank runs (via ``launch``): per batch size, its steps alone (rank 0) and together, each
    step as (seconds preparing its batch, seconds computing)."""
    import torch
    import torch.distributed as dist

    from trainsim.calibrate import zoo
    from trainsim.calibrate.execute.config import DataConfig
    from trainsim.calibrate.execute.datapipe import SyntheticSource

    torch.manual_seed(0)
    model = zoo.build_model(model_name, **options)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)  # the profile's optimizer
    source = SyntheticSource(model_name, options, DataConfig(), seed=ctx.rank)  # the executor's pipeline
    turn = itertools.count()

    def step(batch: int) -> tuple[float, float]:
        start = time.perf_counter()
        inputs, targets = source.batch(next(turn), range(batch), batch)
        prepared = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        zoo.loss_fn(model_name, model(inputs), targets).backward()
        optimizer.step()
        return prepared - start, time.perf_counter() - prepared

    def back_to_back(batch: int, count: int) -> list[float]:
        """The same preparation with nothing in between, as a benchmark of the pipeline alone times it: the
        first batch after a step is cold and is not kept."""
        times = []
        for _ in range(count + 1):
            start = time.perf_counter()
            source.batch(next(turn), range(batch), batch)
            times.append(time.perf_counter() - start)
        return times[1:]

    counts = {}
    warm: dict[int, list] = {b: [] for b in batch_sizes}
    for batch in batch_sizes:
        step(batch)  # warm-up: first-touch allocations, oneDNN primitive creation
        # every rank runs the same number of steps per window (they meet at a barrier after each one)
        slowest = torch.tensor([sum(step(batch))], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        counts[batch] = max(2, int(window_s / max(float(slowest.item()), 1e-6)))
    alone: dict[int, list] = {b: [] for b in batch_sizes}
    together: dict[int, list] = {b: [] for b in batch_sizes}
    for _ in range(rounds):
        for batch in batch_sizes:
            dist.barrier()
            if ctx.rank == 0:
                alone[batch] += [step(batch) for _ in range(counts[batch])]
                # in every round, beside the in-loop batches: the box's speed drifts between rounds, and the
                # in-loop excess is the difference of the two
                warm[batch] += back_to_back(batch, max(2, counts[batch] // 2))
            if ctx.world_size > 1:
                # in step with each other, as synchronous training keeps them: they meet after each step
                dist.barrier()
                for _ in range(counts[batch]):
                    together[batch].append(step(batch))
                    dist.barrier()
    return [{"batch": b, "alone": alone[b], "together": together[b], "warm": warm[b]} for b in batch_sizes]


def loader_overlap_rank(ctx: RankContext, model_name: str, batch: int, rounds: int, window_s: float,
                        options: dict, data, loader_cores: tuple[int, ...]) -> dict:
    """One rank training while a loader thread of the same process prepares batches (pipeline ``data``) on a
    free core, as the executor's CPU preload does: windows of the step alone, of the thread preparing alone,
    and of both at once; the step and preparation times of each."""
    import os
    import threading

    import torch

    from trainsim.calibrate import zoo
    from trainsim.calibrate.execute.datapipe import SyntheticSource

    torch.manual_seed(0)
    model = zoo.build_model(model_name, **options)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    source = SyntheticSource(model_name, options, data, seed=0)
    inputs, targets = source.batch(0, range(batch), batch)
    turn = itertools.count(1)
    prepare, computing, stop = threading.Event(), threading.Event(), threading.Event()
    prep_times: list[tuple[bool, float]] = []  # (while the loop computes, seconds)

    def loader() -> None:
        if loader_cores:
            os.sched_setaffinity(0, loader_cores)  # this thread only, as the executor pins its prefetcher
        while not stop.is_set():
            if not prepare.wait(0.05):
                continue
            busy = computing.is_set()
            start = time.perf_counter()
            source.batch(next(turn), range(batch), batch)
            if computing.is_set() == busy:  # a batch straddling two windows belongs to neither
                prep_times.append((busy, time.perf_counter() - start))

    def step() -> float:
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        zoo.loss_fn(model_name, model(inputs), targets).backward()
        optimizer.step()
        return time.perf_counter() - start

    thread = threading.Thread(target=loader, daemon=True)
    thread.start()
    step()
    alone, beside = [], []
    try:
        for _ in range(rounds):
            deadline = time.perf_counter() + window_s
            while time.perf_counter() < deadline:
                alone.append(step())
            prepare.set()  # the loader alone: the loop sleeps
            time.sleep(window_s)
            computing.set()  # both at once
            deadline = time.perf_counter() + window_s
            while time.perf_counter() < deadline:
                beside.append(step())
            computing.clear()
            prepare.clear()
    finally:
        stop.set()
        thread.join()
    return {"step_alone": alone, "step_beside": beside,
            "prep_alone": [t for busy, t in prep_times if not busy],
            "prep_beside": [t for busy, t in prep_times if busy]}


def measure_loader_overlap(model_name: str, batch: int, data, *, options: dict | None = None,
                           rounds: int = 6, window_s: float = 0.3, threads_per_rank: int = 1,
                           timeout_s: float = 600.0) -> dict | None:
    """How a CPU rank's step and a loader thread of the same process, preparing pipeline ``data`` on a free
    core, slow each other: they share the interpreter's GIL (the pipeline's Python-level work, the step's
    Python glue) and the socket's cache. {"step": beside / alone, "prep": beside / alone}; None without a
    free core or without enough samples."""
    import os

    cores = sorted(os.sched_getaffinity(0))
    if len(cores) <= threads_per_rank:
        return None
    free = tuple(cores[threads_per_rank:threads_per_rank + 1])
    report = launch(loader_overlap_rank, 1, args=(model_name, batch, rounds, window_s, dict(options or {}),
                                                  data, free),
                    device="cpu", cores_per_rank=threads_per_rank, threads_per_rank=threads_per_rank,
                    timeout_s=timeout_s)[0]
    if min(len(v) for v in report.values()) < 2:
        return None
    beside_over_alone = {part: statistics.median(report[f"{part}_beside"]) / statistics.median(
        report[f"{part}_alone"]) for part in ("step", "prep")}
    return {part: max(1.0, ratio) for part, ratio in beside_over_alone.items()}  # under 1 is noise


def measure_rank_step(model_name: str, batch_sizes: Sequence[int], ranks: int, *, rounds: int = 6,
                      window_s: float = 0.25, threads_per_rank: int = 1, options: dict | None = None,
                      timeout_s: float = 600.0) -> list[RankStepPoint]:
    """Launch ``ranks`` pinned CPU ranks and measure the step alone and together (see the module doc)."""
    reports = launch(rank_step_rank, ranks, args=(model_name, list(batch_sizes), rounds, window_s,
                                                  dict(options or {})),
                     device="cpu", cores_per_rank=threads_per_rank, threads_per_rank=threads_per_rank,
                     timeout_s=timeout_s)
    return [summarise_point(batch, reports[0][i]["alone"],
                            [report[i]["together"] for report in reports if report[i]["together"]],
                            reports[0][i]["warm"])
            for i, batch in enumerate(batch_sizes)]


def summarise_point(batch: int, alone: list, per_rank: list[list], warm: list[float]) -> RankStepPoint:
    """One batch size's figures from its raw steps, each (seconds preparing, seconds computing): rank 0's
    alone, every rank's together (none for one rank), and rank 0's back-to-back preparations."""

    def median_of(steps, part):
        return statistics.median(s[part] for s in steps)

    def mean_over_ranks(part):  # what sharing the host costs a rank, not which core was slow this time
        return statistics.fmean(median_of(t, part) for t in per_rank) if per_rank else None

    computing = [[s[1] for s in t] for t in per_rank]
    spread = log_spread(computing or [[s[1] for s in alone]])
    return RankStepPoint(batch, median_of(alone, 1), mean_over_ranks(1), len(alone),
                         sum(len(t) for t in per_rank), spread, median_of(alone, 0), mean_over_ranks(0),
                         statistics.median(warm), rank_spread(computing) if len(computing) > 1 else None)


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


def rank_spread(per_rank: Sequence[Sequence[float]]) -> float:
    """The part of the step-to-step spread that is each rank's own, sigma of log: the ranks' steps of one
    window are in step (they meet after each one), so step k of every rank ran at the same time, and a
    slowdown of the host shows in all of them at once. Each rank's log-deviations from its own median (as in
    `log_spread`: a core slower for a whole launch is not a scatter), less the ranks' mean deviation at the
    same step; their interquartile range / 1.349, x sqrt(n / (n - 1)) (the mean takes a rank's own share
    with it)."""
    steps = min(len(t) for t in per_rank)
    logs = np.log(np.array([list(t)[:steps] for t in per_rank], dtype=float))
    logs -= np.median(logs, axis=1, keepdims=True)
    deviations = logs - logs.mean(axis=0)
    q1, q3 = np.percentile(deviations, [25, 75])
    return float((q3 - q1) / 1.349 * np.sqrt(len(per_rank) / (len(per_rank) - 1)))


def rank_step_record(points: Sequence[RankStepPoint], ranks: int,
                     threads_per_rank: int) -> provenance.RankStepRecord:
    """The workload file's ``provenance.rank_step``."""
    return provenance.RankStepRecord(ranks=ranks, threads_per_rank=threads_per_rank,
                                     points=[p.to_record() for p in points])
