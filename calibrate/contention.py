"""How much CPU ranks slow each other down when they compute at once: the socket's shared cache and DRAM.

The per-layer profile times one rank while the rest of the box is idle. In a multi-rank run on a CPU box every
rank computes at the same moment, each on its own core, and the cores share the socket's last-level cache and
memory bandwidth. GEMM-bound work hardly notices (each core has its own FMA units); memory-bound work does (a
large copy on this kind of box drops from about 23 to 16 GB/s per core when both cores stream). How much a
given model slows down is a property of the model's memory traffic and of the box, so it is measured rather
than guessed:

the ranks are launched and pinned exactly as the executor launches them; each builds the model and runs plain
training steps (forward, loss, backward, optimizer step) on a synthetic batch of the per-rank size. Windows of
"rank 0 alone" (the other ranks wait at a barrier, their cores idle) alternate with windows of "every rank at
once", so a slow spell of the host (other tenants, frequency changes) falls on both kinds. The slowdown at a
batch size is the median step time together (averaged over the ranks) over the median step time alone.

The result goes into the workload file (``provenance.contention``); the simulator multiplies a CPU rank's
compute by it when that many ranks of the run share the host (`trainsim.sim.costs.contention_slowdown`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

from trainsim.calibrate.launch import RankContext, launch


@dataclass(frozen=True)
class ContentionPoint:
    """One batch size: the median step alone and together, and how many steps each median is over."""

    batch: int
    alone_s: float
    together_s: float
    steps_alone: int
    steps_together: int

    @property
    def slowdown(self) -> float:
        return self.together_s / self.alone_s

    def to_json(self) -> list:
        return [self.batch, self.alone_s, self.together_s, round(self.slowdown, 4)]


def _timed_steps(step, seconds: float) -> list[float]:
    """Step times of back-to-back training steps for about ``seconds`` (at least two steps)."""
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(times) < 2 or time.perf_counter() < deadline:
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times


def contention_rank(ctx: RankContext, model_name: str, batch_sizes: Sequence[int], windows: int,
                    window_s: float, options: dict) -> list[dict]:
    """What every rank runs (via ``launch``): per batch size, its step times alone (rank 0) and together."""
    import torch
    import torch.distributed as dist

    from trainsim.calibrate import zoo

    torch.manual_seed(0)
    model = zoo.build_model(model_name, **options)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)  # the profile's optimizer
    out = []
    for batch in batch_sizes:
        generator = torch.Generator().manual_seed(batch)
        inputs, targets = zoo.example_batch(model_name, batch, "cpu", generator=generator, **options)

        def step(inputs=inputs, targets=targets):
            optimizer.zero_grad(set_to_none=True)
            zoo.loss_fn(model_name, model(inputs), targets).backward()
            optimizer.step()

        step()  # warm-up: first-touch allocations, oneDNN primitive creation
        step()
        alone: list[float] = []
        together: list[float] = []
        for _ in range(windows):
            dist.barrier()
            if ctx.rank == 0:
                alone += _timed_steps(step, window_s)
            dist.barrier()
            together += _timed_steps(step, window_s)
        out.append({"batch": batch, "alone": alone, "together": together})
    return out


def measure_contention(model_name: str, batch_sizes: Sequence[int], ranks: int, *, windows: int = 3,
                       window_s: float = 0.3, threads_per_rank: int = 1, options: dict | None = None,
                       timeout_s: float = 600.0) -> list[ContentionPoint]:
    """Launch ``ranks`` pinned CPU ranks and measure the slowdown at each batch size (see the module doc)."""
    reports = launch(contention_rank, ranks, args=(model_name, list(batch_sizes), windows, window_s,
                                                   dict(options or {})),
                     device="cpu", cores_per_rank=threads_per_rank, threads_per_rank=threads_per_rank,
                     timeout_s=timeout_s)
    points = []
    for i, batch in enumerate(batch_sizes):
        alone = reports[0][i]["alone"]
        together_per_rank = [report[i]["together"] for report in reports]
        together = statistics.fmean(statistics.median(times) for times in together_per_rank)
        points.append(ContentionPoint(batch, statistics.median(alone), together, len(alone),
                                      sum(len(t) for t in together_per_rank)))
    return points


def contention_record(points: Sequence[ContentionPoint], ranks: int) -> dict:
    """The workload file's ``provenance.contention``."""
    return {
        "ranks": ranks,
        "points": [p.to_json() for p in points],
        "note": "[batch, median step alone s, median step with every rank computing s, slowdown]",
    }
