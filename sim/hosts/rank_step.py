"""A calibrated CPU rank's whole step and batch preparation, as `trainsim.calibrate.execute.rank_step`
measured them (the workload's ``provenance.rank_step``): how much the in-process profile's layer times
scale, how long the default input pipeline takes in the loop, how much slower both get beside the host's
other ranks, and how much the step scatters. Every function gives the neutral value (1, 0) without the record.
"""

from __future__ import annotations

import math

import numpy as np

from trainsim.formats.provenance import RankStepPoint, rank_step_of
from trainsim.formats.workload import Workload
from trainsim.sim.compute.costs import measured_here
from trainsim.sim.core.devices import DeviceSpec


def _shared_excess(ratio: float, sharing: int, measured_ranks: int) -> float:
    """A together/alone ratio measured with ``measured_ranks`` ranks, for ``sharing`` ranks: each other rank
    adds the same share of the excess; never under 1 (ranks cannot speed each other up: under 1 is noise)."""
    return max(1.0, 1.0 + (ratio - 1.0) * (sharing - 1) / (measured_ranks - 1))


def _record(workload: Workload) -> tuple[list[RankStepPoint], int]:
    record = rank_step_of(workload.provenance)
    return (list(record.points), record.ranks) if record is not None else ([], 1)


def measured_cpu(workload: Workload, device: DeviceSpec) -> bool:
    """``device`` is a CPU rank of the box ``workload`` was calibrated on."""
    return device.kind == "cpu" and measured_here(workload, device)


def measured_scale(workload: Workload, device: DeviceSpec, batch: int, sharing: int = 1) -> float:
    """The factor on a workload's measured times on ``device``: a calibrated CPU rank's `rank_step_scale`
    (the step as a pinned rank runs it, alone or beside the host's other ranks); 1 otherwise."""
    return rank_step_scale(workload, batch, sharing) if measured_cpu(workload, device) else 1.0


def rank_step_scale(workload: Workload, batch: int, sharing: int = 1) -> float:
    """What a calibrated CPU rank's measured layer times are multiplied by (1 without the record).

    The layers come from the in-process profile; the calibration also timed the whole step the way the runs
    run it: one pinned rank alone, and every rank of the box computing at once, which share the socket's
    cache and DRAM. The scale is alone / the profile's plain step at the same batch size, times together /
    alone when ``sharing`` ranks compute on this host: linear in the batch between the measured sizes, the
    nearest one beyond them. For another number of ranks than measured, the excess scales with the other
    ranks, (s - 1)(sharing - 1)/(measured - 1): each extra rank takes about the same share of cache and
    memory bandwidth. Never faster together than alone: a ratio under 1 is noise."""
    iteration = workload.provenance.iteration
    plain = {p.batch: p.s for p in (iteration.plain if iteration else [])}
    record, measured_ranks = _record(workload)
    points = sorted((p.batch, p.alone_s, p.together_s) for p in record
                    if p.batch in plain and plain[p.batch] > 0 and p.alone_s > 0)
    if not points:
        return 1.0
    batches = [b for b, _, _ in points]
    scale = float(np.interp(batch, batches, [alone / plain[b] for b, alone, _ in points]))
    shared = [(b, together / alone) for b, alone, together in points if together]
    if sharing > 1 and measured_ranks > 1 and shared:
        ratio = float(np.interp(batch, [b for b, _ in shared], [r for _, r in shared]))
        scale *= _shared_excess(ratio, sharing, measured_ranks)
    return scale


def _data_rows(workload: Workload) -> tuple[list[RankStepPoint], int]:
    record, ranks = _record(workload)
    return sorted((p for p in record if p.data_alone_s and p.data_together_s), key=lambda p: p.batch), ranks


def _per_batch(points: list[tuple[float, float]], batch: int) -> float:
    """Seconds per batch at ``batch``: linear between the measured sizes, proportional beyond the largest,
    the smallest's per-sample cost below it."""
    if batch >= points[-1][0]:
        return points[-1][1] * batch / points[-1][0]
    if batch <= points[0][0]:
        return points[0][1] * batch / points[0][0]
    return float(np.interp(batch, [b for b, _ in points], [c for _, c in points]))


def rank_data_in_loop_s(workload: Workload, batch: int) -> float:
    """Seconds a calibrated CPU rank takes to prepare a batch of ``batch`` with the executor's default input
    pipeline in its training loop, alone on the host (between two steps, cold caches included)."""
    rows, _ = _data_rows(workload)
    points = [(float(p.batch), p.data_alone_s) for p in rows]
    return _per_batch(points, batch) if points else 0.0


def rank_data_cold_s(workload: Workload, batch: int) -> float:
    """Seconds a calibrated CPU rank's batch preparation takes longer in the training loop than back to back:
    a training step leaves nothing of the pipeline's in the caches, so each batch starts by fetching its
    stored samples again. A cost per batch, whatever the per-sample work; linear in the batch between the
    measured sizes, proportional beyond."""
    rows, _ = _data_rows(workload)
    points = [(float(p.batch), max(0.0, p.data_alone_s - p.data_warm_s)) for p in rows if p.data_warm_s]
    return _per_batch(points, batch) if points else 0.0


def rank_data_slowdown(workload: Workload, batch: int, sharing: int) -> float:
    """How much slower a calibrated CPU rank prepares its batch when ``sharing`` ranks of the host train in
    step (preparation together / alone): the shared cache and DRAM, and the cold start after waiting in a
    collective. 1 for one rank; linear in the batch, the nearest measured size beyond; the excess scales
    with the other ranks as in `rank_step_scale`; never under 1."""
    rows, measured_ranks = _data_rows(workload)
    if sharing <= 1 or measured_ranks <= 1 or not rows:
        return 1.0
    ratios = [p.data_together_s / p.data_alone_s for p in rows]
    ratio = float(np.interp(batch, [p.batch for p in rows], ratios))
    return _shared_excess(ratio, sharing, measured_ranks)


def rank_step_sigma(workload: Workload, batch: int) -> tuple[float, float]:
    """The measured step-to-step spread of a calibrated CPU rank's step, sigma of its log (from the
    interquartile range of the steps with every rank computing), split into each rank's own part and the
    part the ranks share (a slower host slows them all at once): (own, shared). (0, 0) without it; all its
    own where the record does not split it. Linear in the batch between the measured sizes, the nearest one
    beyond them."""
    record, _ = _record(workload)
    points = sorted((p.batch, p.sigma_log, p.sigma_rank_log if p.sigma_rank_log is not None else p.sigma_log)
                    for p in record if p.sigma_log)
    if not points:
        return 0.0, 0.0
    sizes = [b for b, _, _ in points]
    whole = float(np.interp(batch, sizes, [s for _, s, _ in points]))
    own = min(whole, float(np.interp(batch, sizes, [r for _, _, r in points])))
    return own, math.sqrt(whole**2 - own**2)
