"""The result of a simulation: iteration time, throughput, where the time goes, memory and links.

**Breakdown (adds up to the iteration time).** Each measured iteration spans from the end of the previous
one (the moment its last rank finished) to its own end. Every instant of that span on the *critical GPU*
(the rank that finished the last iteration last; the lowest index on a tie) is put in exactly one class,
by precedence: **compute** (its compute stream busy) > **exposed communication** (a collective or a peer
copy it takes part in, or waiting for a parameter server's update, while it is not computing) >
**exposed host-device transfer** (its input/output copies, while neither of the above) > **data
preparation** (waiting for its data loader) > **idle** (waiting for other ranks, or nothing to do).
The per-iteration means are reported, so the five add up to the mean iteration time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from trainsim.errors import TrainsimError

from .machine import COMM, COMPUTE, DATA, TRANSFER, Op
from .memory import GIB

CATEGORIES = (COMPUTE, COMM, TRANSFER, DATA)
BREAKDOWN_KEYS = {
    COMPUTE: "compute",
    COMM: "exposed_communication",
    TRANSFER: "exposed_transfer",
    DATA: "data_preparation",
}


def classify(
    intervals: list[tuple[float, float, int]], start: float, end: float, n_classes: int
) -> list[float]:
    """Seconds of [start, end] in each class; ``intervals`` are (a, b, class) with a lower class winning
    where they overlap; the last slot is the time no interval covers."""
    totals = [0.0] * (n_classes + 1)
    if end <= start:
        return totals
    points: list[tuple[float, int, int]] = []
    for a, b, cls in intervals:
        a, b = max(a, start), min(b, end)
        if b > a:
            points.append((a, 1, cls))
            points.append((b, -1, cls))
    points.sort()
    active = [0] * n_classes
    t = start
    for time, delta, cls in points:
        if time > t:
            winner = next((c for c in range(n_classes) if active[c] > 0), n_classes)
            totals[winner] += time - t
            t = time
        active[cls] += delta
    totals[n_classes] += end - t
    return totals


def busy_time(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """Length of the union of intervals inside [start, end]."""
    total, reach = 0.0, start
    for a, b in sorted(intervals):
        a, b = max(a, reach), min(b, end)
        if b > a:
            total += b - a
            reach = b
    return total


@dataclass
class GpuResult:
    name: str
    index: int
    device: str
    utilisation: float  # compute stream busy / measured time
    memory_peak_bytes: float
    memory_capacity_bytes: float
    memory_at_peak: dict[str, float]
    memory_average_bytes: float | None = None  # held on average over the measured iterations

    @property
    def oom(self) -> bool:
        return self.memory_peak_bytes > self.memory_capacity_bytes

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "index": self.index,
            "device": self.device,
            "utilisation": round(self.utilisation, 6),
            "memory_peak_gib": round(self.memory_peak_bytes / GIB, 4),
            "memory_capacity_gib": round(self.memory_capacity_bytes / GIB, 4),
            "memory_peak_bytes": int(round(self.memory_peak_bytes)),
            "memory_at_peak_bytes": {k: int(round(v)) for k, v in sorted(self.memory_at_peak.items())},
            "oom": self.oom,
        }


@dataclass
class LinkResult:
    src: str
    dst: str
    kind: str
    bandwidth: float  # bytes/s
    bytes: float
    utilisation: float

    @property
    def name(self) -> str:
        return f"{self.src}->{self.dst}"

    def to_dict(self) -> dict:
        return {
            "link": self.name,
            "kind": self.kind,
            "bandwidth_gbps": round(self.bandwidth / 1e9, 4),
            "bytes": int(round(self.bytes)),
            "utilisation": round(self.utilisation, 6),
        }


@dataclass
class Result:
    """One simulated scenario. ``to_dict()`` is the JSON form (schema ``trainsim.simulation/1``)."""

    scenario: str
    strategy: str
    topology: str
    workload: str
    gpus: list[GpuResult]
    batch_size: int
    precision: str
    iterations: int
    warmup_iterations: int
    iteration_times_s: list[float]
    breakdown_s: dict[str, float]  # per iteration, adds up to iteration_time_s
    critical_gpu: str
    links: list[LinkResult]
    measured_window_s: tuple[float, float]
    iteration_ends_s: list[float] = field(default_factory=list)  # every iteration, warm-up included
    stats: dict[str, Any] = field(default_factory=dict)
    machine: Any = field(default=None, repr=False, compare=False)  # for the trace and the records
    # strategy-specific figures (e.g. easgd's "staleness", pipeline's "stages"); in to_dict when present
    extra: dict[str, Any] = field(default_factory=dict)
    # asked to stop (Simulation.request_stop): covers the iterations finished by then, not all asked for
    stopped_early: bool = False

    def __post_init__(self):
        # a time that is inf or nan is no result (it printed "iteration nan ms"): the inputs are bounded
        # (trainsim.units), so this is a figure no bound foresaw, refused rather than reported
        times = {"iteration_times_s": self.iteration_times_s, **{f"breakdown_s.{k}": [v]
                                                                for k, v in self.breakdown_s.items()}}
        for name, values in times.items():
            bad = next((v for v in values if not math.isfinite(v)), None)
            if bad is not None:
                raise TrainsimError(f"the simulation of {self.scenario!r} gave a time of {bad} s, not a "
                                    "finite number: a figure of its topology, workload or device is out of "
                                    "range", field=name)

    @property
    def iteration_time_s(self) -> float:
        return sum(self.iteration_times_s) / len(self.iteration_times_s)

    @property
    def samples_per_s(self) -> float:
        return self.batch_size / self.iteration_time_s if self.iteration_time_s > 0 else float("inf")

    @property
    def oom(self) -> list[str]:
        """One line per GPU that runs out of memory: "gpu0 needs X GiB, has Y GiB"."""
        return [
            f"{g.name} needs {g.memory_peak_bytes / GIB:.2f} GiB, has {g.memory_capacity_bytes / GIB:.2f} GiB"
            for g in self.gpus
            if g.oom
        ]

    def busiest_links(self, n: int = 5) -> list[LinkResult]:
        return sorted(self.links, key=lambda link: (-link.utilisation, link.name))[:n]

    def to_dict(self, *, provenance: dict | None = None) -> dict:
        total = self.iteration_time_s
        return {
            "schema": "trainsim.simulation/1",
            "scenario": self.scenario,
            "strategy": self.strategy,
            "topology": self.topology,
            "workload": self.workload,
            "precision": self.precision,
            "batch_size": self.batch_size,
            "num_gpus": len(self.gpus),
            "iterations": self.iterations,
            "warmup_iterations": self.warmup_iterations,
            "iteration_time_s": _r(total),
            "iteration_times_s": [_r(t) for t in self.iteration_times_s],
            "samples_per_s": _r(self.samples_per_s),
            "critical_gpu": self.critical_gpu,
            "breakdown_s": {k: _r(v) for k, v in self.breakdown_s.items()},
            "breakdown_pct": {
                k: round(100 * v / total, 3) if total > 0 else 0.0 for k, v in self.breakdown_s.items()
            },
            "gpus": [g.to_dict() for g in self.gpus],
            "oom": self.oom,
            "busiest_links": [link.to_dict() for link in self.busiest_links()],
            "links": [link.to_dict() for link in self.links],
            "stats": self.stats,
            **({"extra": self.extra} if self.extra else {}),
            **({"stopped_early": True} if self.stopped_early else {}),
            "provenance": provenance or {},
        }


def _r(x: float) -> float:
    return float(f"{x:.9g}")


def breakdown(ops: list[Op], gpu: str, windows: list[tuple[float, float]]) -> dict[str, float]:
    """Total seconds per class over ``windows`` on ``gpu`` (see the module docstring)."""
    rank = {cat: i for i, cat in enumerate(CATEGORIES)}
    intervals = [
        (op.start, op.end, rank[op.category])
        for op in ops
        if op.category in rank and (op.resource == gpu or op.peer == gpu)
    ]
    totals = [0.0] * (len(CATEGORIES) + 1)
    for start, end in windows:
        for i, value in enumerate(classify(intervals, start, end, len(CATEGORIES))):
            totals[i] += value
    out = {BREAKDOWN_KEYS[cat]: totals[i] for i, cat in enumerate(CATEGORIES)}
    out["idle"] = totals[-1]
    return out
