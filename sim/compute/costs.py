"""What one rank's share of an iteration costs: layer times, optimizer step time and the bytes involved.

Times come from `roofline.layer_times` (measured where the workload was measured on this device spec, a
roofline estimate elsewhere). Bytes follow the precision:

- fp32/tf32: weights 4 B/param, gradients 4 B/param, optimizer state: momentum 4, Adam 8 (m and v);
- fp16/bf16 (mixed precision, REFERENCE "Memory accounting"): weights 2, gradients 2, and the optimizer
  keeps an fp32 master copy (4) plus its moments, so Adam totals 2 + 2 + 12 = 16 B/param.
- Activations are recorded at the workload's dtype and scale with the precision's element size (autocast
  keeps most saved tensors in 16 bit); the input batch crosses PCIe as the workload's input says.

The optimizer step, when not measured on this device, is memory-bound: it reads the gradients, reads and
writes the (master) weights and the state, and writes the 16-bit weights back under mixed precision, at the
device's memory bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from trainsim.errors import TrainsimError
from trainsim.sim.core.devices import DeviceSpec

from .workload import Workload

WEIGHT_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2}
#: optimizer moments per parameter (bytes, fp32)
STATE_BYTES = {"sgd": 0, "momentum": 4, "adam": 8}
MASTER_BYTES = 4  # fp32 master weights under mixed precision


def mixed(precision: str) -> bool:
    return WEIGHT_BYTES[precision] < 4


@dataclass(frozen=True)
class RankCosts:
    """One rank's work for one iteration at its per-device batch."""

    batch: int
    layer_names: list[str]
    forward_s: list[float]
    backward_s: list[float]
    step_s: float
    param_bytes: float  # weights as the GPU holds them
    grad_bytes_per_layer: list[float]  # gradient bytes each layer's backward produces
    state_bytes: float  # optimizer state incl. fp32 master weights under mixed precision
    saved_bytes_per_layer: list[float]  # saved for backward, at this batch
    input_bytes: float  # the input batch as it crosses PCIe
    output_bytes: float  # the last layer's output at this batch (what DataParallel gathers)

    @property
    def grad_bytes(self) -> float:
        return sum(self.grad_bytes_per_layer)

    @property
    def saved_bytes(self) -> float:
        return sum(self.saved_bytes_per_layer)

    @property
    def compute_s(self) -> float:
        return sum(self.forward_s) + sum(self.backward_s)


def optimizer_traffic(num_params: float, precision: str, optimizer: str) -> float:
    """Bytes an optimizer step moves through memory (see the module docstring)."""
    grad = WEIGHT_BYTES[precision]
    master = MASTER_BYTES if mixed(precision) else WEIGHT_BYTES[precision]
    state = STATE_BYTES[optimizer]
    low_precision_copy = WEIGHT_BYTES[precision] if mixed(precision) else 0
    return num_params * (grad + 2 * master + 2 * state + low_precision_copy)


def state_bytes(num_params: float, precision: str, optimizer: str) -> float:
    return num_params * (STATE_BYTES[optimizer] + (MASTER_BYTES if mixed(precision) else 0))


def rank_costs(
    workload: Workload,
    device: DeviceSpec,
    batch: int,
    precision: str,
    optimizer: str,
    *,
    measured_on: DeviceSpec | None = None,
    sharing: int = 1,
) -> RankCosts:
    """The costs of one rank running ``batch`` samples of ``workload`` on ``device`` (``measured_on``: the
    device a measured workload ran on when the built-in library lacks it, e.g. a calibrated CPU).
    ``sharing``: how many ranks of the run compute at once on the cores of this rank's host (CPU ranks)."""
    from . import roofline  # the roofline module owns "measured or estimated"

    if batch < 1:
        raise TrainsimError(f"per-GPU batch must be >= 1, got {batch}", field="batch_size")
    times = roofline.layer_times(workload, device, batch, precision, measured_on=measured_on)
    if len(times) != len(workload.layers):
        raise TrainsimError(
            f"got {len(times)} layer times for {len(workload.layers)} layers", field="workload.layers"
        )
    itemsize = workload.itemsize
    weight = WEIGHT_BYTES[precision]
    act_scale = weight / itemsize  # saved tensors follow the compute precision (masks/indices approximated)
    params_per_layer = [layer.param_bytes / itemsize for layer in workload.layers]
    num_params = sum(params_per_layer)
    if workload.optimizer_step is not None and _measured_here(workload, device):
        try:
            step = workload.optimizer_step.at(batch)
        except TrainsimError as exc:
            raise TrainsimError(exc.reason, file=workload.source,
                                field=f"optimizer_step.{exc.field}") from None
    else:
        step = optimizer_traffic(num_params, precision, optimizer) / device.memory_bandwidth
    last = workload.layers[-1]
    forward = [float(f) for f, _ in times]
    backward = [float(b) for _, b in times]
    if _measured_here(workload, device):
        # the measured iteration's glue outside every layer (loss, zero_grad, the autograd engine): real work
        # on the rank, charged where the loss is computed, after the last layer's forward
        forward[-1] += unattributed_s(workload, batch)
        scale = measured_scale(workload, device, batch, sharing)
        forward, backward, step = [f * scale for f in forward], [b * scale for b in backward], step * scale
    return RankCosts(
        batch=batch,
        layer_names=[layer.name for layer in workload.layers],
        forward_s=forward,
        backward_s=backward,
        step_s=float(step),
        param_bytes=num_params * weight,
        grad_bytes_per_layer=[p * weight for p in params_per_layer],
        state_bytes=state_bytes(num_params, precision, optimizer),
        saved_bytes_per_layer=[
            (batch * layer.saved_activation_bytes_per_sample + layer.saved_activation_bytes_fixed) * act_scale
            for layer in workload.layers
        ],
        input_bytes=float(batch * workload.input.bytes_per_sample),
        output_bytes=float(batch * last.output_bytes_per_sample * act_scale),
    )


def unattributed_s(workload: Workload, batch: int) -> float:
    """Seconds of a calibrated iteration outside every layer and the optimizer step at ``batch`` (the
    calibration's ``provenance.iteration.unattributed``): linear between its batch sizes, proportional to
    the batch beyond them, 0 without it; never negative (a negative figure is the hooks' own cost)."""
    iteration = (workload.provenance.model_extra or {}).get("iteration") or {}
    points = sorted((float(b), float(t)) for b, t, *_ in iteration.get("unattributed") or [])
    if not points:
        return 0.0
    if batch <= points[0][0]:
        value = points[0][1] * batch / points[0][0]
    elif batch >= points[-1][0]:
        value = points[-1][1] * batch / points[-1][0]
    else:
        value = next(t0 + (t1 - t0) * (batch - b0) / (b1 - b0)
                     for (b0, t0), (b1, t1) in zip(points, points[1:], strict=False) if b0 <= batch <= b1)
    return max(0.0, value)


def _shared_excess(ratio: float, sharing: int, measured_ranks: int) -> float:
    """A together/alone ratio measured with ``measured_ranks`` ranks, for ``sharing`` ranks: each other rank
    adds the same share of the excess; never under 1 (ranks cannot speed each other up: under 1 is noise)."""
    return max(1.0, 1.0 + (ratio - 1.0) * (sharing - 1) / (measured_ranks - 1))


def measured_cpu(workload: Workload, device: DeviceSpec) -> bool:
    """``device`` is a CPU rank of the box ``workload`` was calibrated on."""
    return device.kind == "cpu" and _measured_here(workload, device)


def measured_scale(workload: Workload, device: DeviceSpec, batch: int, sharing: int = 1) -> float:
    """The factor on a workload's measured times on ``device``: a calibrated CPU rank's `rank_step_scale`
    (the step as a pinned rank runs it, alone or beside the host's other ranks); 1 otherwise."""
    return rank_step_scale(workload, batch, sharing) if measured_cpu(workload, device) else 1.0


def rank_step_scale(workload: Workload, batch: int, sharing: int = 1) -> float:
    """What a calibrated CPU rank's measured layer times are multiplied by (1 without the record).

    The layers come from the in-process profile; the calibration also timed the whole step the way the runs
    run it (``provenance.rank_step``, calibrate/execute/rank_step.py): one pinned rank alone, and every rank of the
    box computing at once, which share the socket's cache and DRAM. The scale is alone / the profile's plain
    step at the same batch size, times together / alone when ``sharing`` ranks compute on this host:
    linear in the batch between the measured sizes, the nearest one beyond them. For another number of ranks
    than measured, the excess scales with the other ranks, (s - 1)(sharing - 1)/(measured - 1): each extra
    rank takes about the same share of cache and memory bandwidth. Never faster together than alone: a
    ratio under 1 is noise."""
    extra = workload.provenance.model_extra or {}
    record = extra.get("rank_step") or {}
    plain = {int(b): float(t) for b, t, *_ in (extra.get("iteration") or {}).get("plain") or []}
    points = sorted((int(b), float(alone), together) for b, alone, together, *_ in record.get("points") or []
                    if int(b) in plain and plain[int(b)] > 0 and alone > 0)
    if not points:
        return 1.0
    batches = [b for b, _, _ in points]
    scale = float(np.interp(batch, batches, [alone / plain[b] for b, alone, _ in points]))
    measured_ranks = int(record.get("ranks") or 1)
    shared = [(b, float(together) / alone) for b, alone, together in points if together]
    if sharing > 1 and measured_ranks > 1 and shared:
        ratio = float(np.interp(batch, [b for b, _ in shared], [r for _, r in shared]))
        scale *= _shared_excess(ratio, sharing, measured_ranks)
    return scale


def _data_rows(workload: Workload) -> tuple[list, int]:
    record = (workload.provenance.model_extra or {}).get("rank_step") or {}
    rows = sorted(p for p in record.get("points") or [] if len(p) > 5 and p[4] and p[5])
    return rows, int(record.get("ranks") or 1)


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
    pipeline in its training loop, alone on the host (``provenance.rank_step``: between two steps, cold
    caches included); 0 without the record."""
    rows, _ = _data_rows(workload)
    points = [(float(p[0]), float(p[4])) for p in rows]
    return _per_batch(points, batch) if points else 0.0


def rank_data_cold_s(workload: Workload, batch: int) -> float:
    """Seconds a calibrated CPU rank's batch preparation takes longer in the training loop than back to back
    (``provenance.rank_step``): a training step leaves nothing of the pipeline's in the caches, so each
    batch starts by fetching its stored samples again. A cost per batch, whatever the per-sample work;
    linear in the batch between the measured sizes, proportional beyond; 0 without the record."""
    rows, _ = _data_rows(workload)
    points = [(float(p[0]), max(0.0, float(p[4]) - float(p[6]))) for p in rows if len(p) > 6 and p[6]]
    return _per_batch(points, batch) if points else 0.0


def rank_data_slowdown(workload: Workload, batch: int, sharing: int) -> float:
    """How much slower a calibrated CPU rank prepares its batch when ``sharing`` ranks of the host train in
    step (``provenance.rank_step``: preparation together / alone): the shared cache and DRAM, and the cold
    start after waiting in a collective. 1 for one rank or without the record; linear in the batch, the
    nearest measured size beyond; the excess scales with the other ranks as in `rank_step_scale`; never
    under 1."""
    rows, measured_ranks = _data_rows(workload)
    if sharing <= 1 or measured_ranks <= 1 or not rows:
        return 1.0
    ratio = float(np.interp(batch, [int(p[0]) for p in rows], [float(p[5]) / float(p[4]) for p in rows]))
    return _shared_excess(ratio, sharing, measured_ranks)


def rank_step_sigma(workload: Workload, batch: int) -> tuple[float, float]:
    """The measured step-to-step spread of a calibrated CPU rank's step, sigma of its log (from the
    interquartile range of ``provenance.rank_step``'s steps with every rank computing), split into each
    rank's own part and the part the ranks share (a slower host slows them all at once): (own, shared).
    (0, 0) without it; all its own where the record does not split it. Linear in the batch between the
    measured sizes, the nearest one beyond them."""
    record = (workload.provenance.model_extra or {}).get("rank_step") or {}
    points = sorted((int(p[0]), float(p[3]), float(p[7]) if len(p) > 7 and p[7] is not None else float(p[3]))
                    for p in record.get("points") or [] if len(p) > 3 and p[3])
    if not points:
        return 0.0, 0.0
    sizes = [b for b, _, _ in points]
    whole = float(np.interp(batch, sizes, [s for _, s, _ in points]))
    own = min(whole, float(np.interp(batch, sizes, [r for _, _, r in points])))
    return own, math.sqrt(whole**2 - own**2)


def _measured_here(workload: Workload, device: DeviceSpec) -> bool:
    spec = workload.provenance.device_spec
    return spec is not None and spec.lower() in {device.name.lower(), *(a.lower() for a in device.aliases)}
