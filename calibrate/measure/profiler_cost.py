"""What the PyTorch profiler costs the host: seconds per host event it records, on this box.

A training step recorded with ``torch.profiler`` is slower on the host than the same step without it: every
op, runtime call and annotation the profiler records costs the recording thread its bookkeeping (and on
CUDA, CUPTI's callback on every runtime call). Where a step is bound by the host, the trace's step is longer
than the untraced one by about that cost times the events recorded, so a replay of the trace answers its
what-ifs for a slower host than the one that trains. ``trainsim replay --set untraced=true --set
profiler_event_us=X`` takes it out with the figure measured here.

One measurement: ``repeats`` steps of a zoo model without the profiler, then ``repeats`` steps under it
(CPU activity, and CUDA's on a GPU), each step's host time taken with ``time.perf_counter`` from
``zero_grad`` to the return of ``optimizer.step()``, before the synchronise (on CUDA, the time to enqueue the
step; on the CPU, the step). The events are the host events the profiler kept (ops, runtime and driver
calls, annotations), per step. The cost per event is the difference of the two medians over the events per
step. Medians keep out the rare CUPTI buffer requests, which stall a thread for milliseconds; a replay takes
those out where the trace records them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from trainsim.calibrate import zoo
from trainsim.calibrate.measure.layer_profile import AUTOCAST, make_optimizer, resolve_device
from trainsim.calibrate.sampling import median_spread
from trainsim.errors import TrainsimError, unknown_name


@dataclass(frozen=True)
class ProfilerCost:
    """Host seconds per step with and without the profiler, and what it costs per recorded event."""

    model: str
    device: str
    batch: int
    precision: str
    repeats: int
    untraced_host_s: float      # median host time of a step without the profiler
    untraced_iqr_s: float       # its interquartile range
    traced_host_s: float        # median host time of a step under the profiler
    traced_iqr_s: float
    events_per_step: float      # host events the profiler recorded per step
    per_event_s: float          # (traced - untraced) / events: the profiler's cost per recorded event

    def to_dict(self) -> dict:
        return asdict(self)


def _host_events(prof) -> int:
    """Host events the profiler kept: ops, runtime/driver calls and annotations (not GPU activity)."""
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU)


def measure_profiler_cost(name: str, device: str | torch.device = "cpu", batch: int = 32, repeats: int = 20,
                          warmup: int = 5, *, optimizer: str = "sgd", precision: str = "fp32",
                          progress: Callable[[str], None] | None = None, **model_cfg) -> ProfilerCost:
    """Measure what the profiler costs the host per recorded event, on zoo model ``name`` (see the module
    doc). ``precision`` bf16/fp16 runs the forward under autocast, as the executor trains."""
    progress = progress or (lambda text: None)
    if batch < 1:
        raise TrainsimError(f"batch must be >= 1, got {batch}", field="batch")
    if repeats < 3:
        raise TrainsimError(f"repeats must be >= 3 (medians of steps), got {repeats}", field="repeats")
    if warmup < 0:
        raise TrainsimError(f"warmup must be >= 0, got {warmup}", field="warmup")
    if precision not in AUTOCAST:
        raise unknown_name("precision", precision, AUTOCAST, field="precision")
    canonical = zoo.canonical_name(name)
    cfg = zoo.model_config(canonical, **model_cfg)
    dev = resolve_device(device)
    progress(f"building {canonical}")
    model = zoo.build_model(canonical, **cfg).to(dev)
    opt = make_optimizer(optimizer, model.parameters())
    inputs, targets = zoo.example_batch(canonical, batch, dev, generator=torch.Generator().manual_seed(0),
                                        **cfg)
    dtype = AUTOCAST[precision]

    def step() -> float:
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=dtype) if dtype else contextlib.nullcontext():
            output = model(inputs)
        zoo.loss_fn(canonical, output.float(), targets).backward()
        opt.step()
        host = time.perf_counter() - start
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return host

    progress(f"warm-up ({warmup} steps)")
    for _ in range(warmup):
        step()
    progress(f"{repeats} steps without the profiler")
    untraced = [step() for _ in range(repeats)]
    activities = [torch.profiler.ProfilerActivity.CPU]
    if dev.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    progress(f"{repeats} steps under the profiler")
    with torch.profiler.profile(activities=activities) as prof:
        step()                                    # the profiler's first step sets it up: not measured
        traced = [step() for _ in range(repeats)]
    events = _host_events(prof) / (repeats + 1)
    (untraced_s, untraced_iqr), (traced_s, traced_iqr) = median_spread(untraced), median_spread(traced)
    return ProfilerCost(model=canonical, device=str(dev), batch=batch, precision=precision, repeats=repeats,
                        untraced_host_s=untraced_s, untraced_iqr_s=untraced_iqr, traced_host_s=traced_s,
                        traced_iqr_s=traced_iqr, events_per_step=events,
                        per_event_s=(traced_s - untraced_s) / events if events else 0.0)
