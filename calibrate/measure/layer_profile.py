"""Per-layer forward and backward times of a zoo model at several batch sizes, on CUDA or on the CPU.

One code path; only the clock differs. On the CPU a mark is ``time.perf_counter()``; on CUDA it is a CUDA
event recorded on the current stream (the autograd engine sets the stream of the node it runs), and
durations are read after a synchronise, so they are GPU time between the marks.

Where the marks go (see :mod:`trainsim.calibrate.measure.layer_hooks` for why not full backward hooks):

- forward: a forward pre-hook and a forward hook on every leaf module;
- backward: a pre-hook and a post-hook on every autograd node the layer created in forward (found by walking
  the graph from its outputs to its inputs), including the AccumulateGrad nodes of its weights; a layer's
  backward time is the sum over its nodes;
- the optimizer step: marks around ``optimizer.step()`` (SGD with momentum unless told otherwise).

Each batch size runs ``warmup`` unmeasured iterations, then ``repeats`` hooked iterations interleaved with
``repeats`` plain ones (no hooks at all; the whole iteration timed with the same clock). A layer's time is the
median over the hooked repeats, its spread the interquartile range.

The host's side, recorded beside the clock's (``provenance["iteration"]``'s ``plain_host`` and
``layers_host_sum``, each layer's in ``provenance["layer_host_s"]``): ``time.perf_counter()`` at the same
marks, the mark's own cost left out. On CUDA the host only enqueues work, so this is the time the Python
thread (forward) and autograd's (backward) took to dispatch it; a step whose host time exceeds its GPU time
is bound by the host, and a faster GPU does not shorten it. Once the launch queue is full the host waits
for the GPU, so in a GPU-bound step the host time approaches the GPU's. On the CPU both clocks are one.

Unattributed time. The loss, ``zero_grad``, functional ops between modules (residual adds, flatten, concat)
and the autograd engine's own work between nodes belong to no layer. We keep them visible rather than
smearing them over layers: per batch, ``unattributed = plain iteration - sum(layer forward + backward) -
optimizer step`` (medians), recorded with the plain and hooked iteration times in
``provenance["iteration"]``. By construction layers + optimizer + unattributed = the measured iteration;
the hook overhead (hooked - plain) is recorded too. If hooks inflate layer times more than the glue costs,
unattributed comes out negative (it is then the hooks' error, stated rather than hidden).

Batch sizes are tried in increasing order. One that does not fit (CUDA out-of-memory, ``MemoryError``, or on
the CPU an estimate above the memory available, to stay clear of the kernel's OOM killer) is reported with
the largest that fits, and larger ones are skipped.

It stays one module: the hooks, the interleaved plain iterations and the fits are one measurement.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import platform
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from trainsim.calibrate import zoo
from trainsim.calibrate.execute import data_prep
from trainsim.calibrate.measure.describe import autocast_bytes, describe_layers, input_spec
from trainsim.calibrate.measure.layer_hooks import LayerHooks
from trainsim.calibrate.measure.time_fit import time_model
from trainsim.calibrate.sampling import median_spread
from trainsim.errors import TrainsimError, unknown_name
from trainsim.formats.provenance import BatchTime, IterationRecord
from trainsim.formats.workload import Layer, Provenance, Workload
from trainsim.provenance import provenance

DEVICE_CHOICES = ("auto", "cpu", "cuda")
OPTIMIZERS = ("sgd", "adam", "adamw")
#: a layer with no work at all (dropout p=0's backward) still needs a positive time in the format
MIN_TIME_S = 1e-9
#: fraction of the memory available that a CPU run may plan to use
CPU_MEMORY_FRACTION = 0.8

Progress = Callable[[str], None]


# ---------------------------------------------------------------- devices and clocks


def resolve_device(device: str | torch.device) -> torch.device:
    """``cpu``, ``cuda``, ``cuda:N`` or ``auto``; CUDA without a GPU -> TrainsimError."""
    text = str(device).strip().lower()
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if text == "cpu":
        return torch.device("cpu")
    if text == "cuda" or text.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise TrainsimError("cuda requested but torch sees no CUDA GPU (torch.cuda.is_available() is "
                                "False); use --device cpu", field="device")
        try:
            dev = torch.device(text)
        except RuntimeError:
            raise TrainsimError(f"bad CUDA device {device!r}", field="device") from None
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise TrainsimError(f"no CUDA device {dev.index}: this machine has {torch.cuda.device_count()}",
                                field="device")
        return dev
    raise unknown_name("device", str(device), DEVICE_CHOICES, field="device")


class CpuClock:
    """Wall-clock marks; the CPU runs ops synchronously, so a difference is the work done in between."""

    method = "time.perf_counter around module forward hooks and autograd-node hooks"

    def mark(self) -> float:
        return time.perf_counter()

    def sync(self) -> None:
        pass

    def seconds(self, start: float, end: float) -> float:
        return end - start


class CudaClock:
    """CUDA events on the current stream; read after ``sync``."""

    method = "CUDA events (current stream) at module forward hooks and autograd-node hooks"

    def __init__(self, device: torch.device):
        self.device = device

    def mark(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def sync(self) -> None:
        torch.cuda.synchronize(self.device)

    def seconds(self, start, end) -> float:
        return start.elapsed_time(end) / 1e3


def clock_for(device: torch.device):
    return CudaClock(device) if device.type == "cuda" else CpuClock()


#: how a layer's time is read: between clock marks at its hooks, or as the work its hooks bracket
TIMINGS = ("clock", "kernels")
KERNEL_TIMING = {"cuda": "CUDA kernel time (torch.profiler / CUPTI) of the kernels launched inside module "
                         "forward hooks and autograd-node hooks",
                 "cpu": "CPU time (torch.profiler) of the ops run inside module forward hooks and "
                        "autograd-node hooks"}
RANGE = "trainsim::"  # the prefix of the profiler ranges the kernel timing opens


class _KernelSpans:
    """LayerHooks observer for ``timing="kernels"``: a profiler range around every layer's forward and
    backward work (``trainsim::phase::layer``), to be read after the profiler stops: on CUDA the time of the
    kernels launched inside a range, wherever the GPU ran them, so a host-bound iteration's launch gaps are
    not counted as the layer's (on the CPU, the ops' own time). The host's ``perf_counter`` is kept as in
    `_Spans`."""

    def __init__(self):
        self._open: dict[tuple[str, str], tuple[torch.profiler.record_function, float]] = {}
        self.host: dict[tuple[str, str], float] = defaultdict(float)

    def start(self, phase: str, layer: str) -> None:
        scope = torch.profiler.record_function(f"{RANGE}{phase}::{layer}")
        scope.__enter__()
        self._open[(phase, layer)] = (scope, time.perf_counter())

    def end(self, phase: str, layer: str) -> None:
        host_end = time.perf_counter()
        opened = self._open.pop((phase, layer), None)
        if opened is not None:
            scope, host_start = opened
            scope.__exit__(None, None, None)
            self.host[(phase, layer)] += host_end - host_start

    def output(self, layer, inputs, outputs) -> None:
        pass


def range_totals(events, device_type: str) -> dict[tuple[str, str], float]:
    """Seconds per (phase, layer) of the ``trainsim::phase::layer`` ranges among profiler ``events``: their
    kernels' time on CUDA (``device_time_total``, which sums the kernels of the ops inside), their ops' CPU
    time on the CPU."""
    out: dict[tuple[str, str], float] = defaultdict(float)
    for event in events:
        if not event.name.startswith(RANGE):
            continue
        phase, layer = event.name[len(RANGE):].split("::", 1)
        micros = event.device_time_total if device_type == "cuda" else event.cpu_time_total
        out[(phase, layer)] += micros * 1e-6
    return out


class _Spans:
    """LayerHooks observer: clock marks at the start and end of every layer's forward and backward work, and
    the host's ``perf_counter`` between them (the marks' own cost left out)."""

    def __init__(self, clock):
        self.clock = clock
        self._open: dict[tuple[str, str], tuple[object, float]] = {}
        self.spans: list[tuple[str, str, object, object]] = []
        self.host: dict[tuple[str, str], float] = defaultdict(float)

    def start(self, phase: str, layer: str) -> None:
        mark = self.clock.mark()
        self._open[(phase, layer)] = (mark, time.perf_counter())

    def end(self, phase: str, layer: str) -> None:
        host_end = time.perf_counter()
        mark = self.clock.mark()
        opened = self._open.pop((phase, layer), None)
        if opened is not None:
            start, host_start = opened
            self.spans.append((phase, layer, start, mark))
            self.host[(phase, layer)] += host_end - host_start

    def output(self, layer, inputs, outputs) -> None:
        pass

    def totals(self) -> dict[tuple[str, str], float]:
        """Seconds per (phase, layer), summed over spans; call after the clock is synchronised."""
        out: dict[tuple[str, str], float] = defaultdict(float)
        for phase, layer, start, end in self.spans:
            out[(phase, layer)] += self.clock.seconds(start, end)
        return out


# ---------------------------------------------------------------- optimizer and memory


def make_optimizer(name: str, params, lr: float | None = None) -> torch.optim.Optimizer:
    """SGD with momentum 0.9 (lr 0.01), Adam or AdamW (lr 1e-3)."""
    key = name.strip().lower()
    if key == "sgd":
        return torch.optim.SGD(params, lr=lr or 0.01, momentum=0.9)
    if key == "adam":
        return torch.optim.Adam(params, lr=lr or 1e-3)
    if key == "adamw":
        return torch.optim.AdamW(params, lr=lr or 1e-3)
    raise unknown_name("optimizer", name, OPTIMIZERS, field="optimizer")


_OPTIMIZER_STATE_COPIES = {"sgd": 1, "adam": 2, "adamw": 2}


def training_bytes(layers: Sequence[Layer], batch: int, optimizer: str = "sgd") -> int:
    """A planning estimate of the memory one training step at ``batch`` needs: weights, gradients and
    optimizer state, what autograd saves, and the largest output and its gradient alive at once."""
    params = sum(layer.param_bytes for layer in layers)
    saved = sum(layer.saved_activation_bytes_per_sample for layer in layers) * batch
    saved += sum(layer.saved_activation_bytes_fixed for layer in layers)
    transient = 2 * max(layer.output_bytes_per_sample for layer in layers) * batch
    return params * (2 + _OPTIMIZER_STATE_COPIES.get(optimizer, 2)) + saved + transient


def memory_available_bytes() -> int | None:
    """Linux's MemAvailable (what can be allocated without swapping), or None where unknown."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError | torch.cuda.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


# ---------------------------------------------------------------- measuring one batch size


@dataclass
class BatchTimes:
    """Medians and spreads (seconds) of one batch size."""

    batch: int
    layers: dict[tuple[str, str], tuple[float, float]]  # (phase, layer) -> (median, spread)
    optimizer: tuple[float, float]
    iteration: tuple[float, float]  # plain iterations, no hooks
    iteration_hooked: tuple[float, float]
    peak_memory_bytes: int | None
    # the host's side (perf_counter): each layer's dispatch in the hooked iterations, the plain iteration's
    layers_host: dict[tuple[str, str], tuple[float, float]]
    iteration_host: tuple[float, float]

    @property
    def unattributed_s(self) -> float:
        return self.iteration[0] - sum(m for m, _ in self.layers.values()) - self.optimizer[0]


#: autocast dtype of each precision the layers can be measured in (fp32: none)
AUTOCAST = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def _measure_batch(model, optimizer, name: str, batch: int, device: torch.device, clock, repeats: int,
                   warmup: int, cfg: dict, progress: Progress, precision: str = "fp32",
                   timing: str = "clock") -> BatchTimes:
    generator = torch.Generator().manual_seed(batch)
    inputs, targets = zoo.example_batch(name, batch, device, generator=generator, **cfg)
    dtype = AUTOCAST[precision]

    def loss():
        # as the executor runs it: the forward under autocast, the loss on the fp32 output
        with torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext():
            output = model(inputs)
        return zoo.loss_fn(name, output.float(), targets)

    def plain() -> tuple[float, float]:
        start = clock.mark()
        host_start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss().backward()
        optimizer.step()
        host_end = time.perf_counter()
        end = clock.mark()
        clock.sync()
        return clock.seconds(start, end), host_end - host_start

    def hooked():
        if timing == "kernels":
            return hooked_kernels()
        spans = _Spans(clock)
        with LayerHooks(model, [spans]):
            start = clock.mark()
            optimizer.zero_grad(set_to_none=True)
            loss().backward()
            before_step = clock.mark()
            optimizer.step()
            end = clock.mark()
        clock.sync()
        return spans.totals(), spans.host, clock.seconds(before_step, end), clock.seconds(start, end)

    def hooked_kernels():
        # the optimizer step is read as a range too; the whole hooked iteration stays the clock's
        spans = _KernelSpans()
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            with LayerHooks(model, [spans]):
                start = clock.mark()
                optimizer.zero_grad(set_to_none=True)
                loss().backward()
                with torch.profiler.record_function(f"{RANGE}optimizer::step"):
                    optimizer.step()
                end = clock.mark()
            clock.sync()
        totals = range_totals(prof.events(), device.type)
        step = totals.pop(("optimizer", "step"), 0.0)
        return totals, spans.host, step, clock.seconds(start, end)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    progress(f"batch {batch}: warm-up ({warmup})")
    for _ in range(warmup):
        hooked()
        plain()
    per_layer: dict[tuple[str, str], list[float]] = defaultdict(list)
    per_layer_host: dict[tuple[str, str], list[float]] = defaultdict(list)
    step_s, plain_s, plain_host_s, hooked_s = [], [], [], []
    for i in range(repeats):
        progress(f"batch {batch}: repeat {i + 1}/{repeats}")
        totals, host, step, whole = hooked()
        for key, seconds in totals.items():
            per_layer[key].append(seconds)
            per_layer_host[key].append(host[key])
        step_s.append(step)
        hooked_s.append(whole)
        seconds, host_seconds = plain()
        plain_s.append(seconds)
        plain_host_s.append(host_seconds)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None

    def medians(samples: dict[tuple[str, str], list[float]]) -> dict[tuple[str, str], tuple[float, float]]:
        # a repeat where the layer did no work counts as 0
        return {key: median_spread(values + [0.0] * (repeats - len(values)))
                for key, values in samples.items()}

    return BatchTimes(batch, medians(per_layer), median_spread(step_s), median_spread(plain_s),
                      median_spread(hooked_s), peak, medians(per_layer_host), median_spread(plain_host_s))


# ---------------------------------------------------------------- the profile


def _device_names(device: torch.device) -> tuple[str, str | None]:
    """(human name, device-spec name) of the measured device."""
    if device.type == "cuda":
        from trainsim.sim.core.devices import match_cuda_name

        props = torch.cuda.get_device_properties(device)
        spec = match_cuda_name(props.name, props.total_memory)
        return props.name, spec.name if spec is not None else None
    name = platform.processor() or "cpu"
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return name, "cpu"


def _check_batches(batch_sizes: Sequence[int]) -> list[int]:
    if not batch_sizes:
        raise TrainsimError("give at least one batch size", field="batch_sizes")
    for b in batch_sizes:
        if not isinstance(b, int) or isinstance(b, bool) or b < 1:
            raise TrainsimError(f"batch sizes must be positive integers, got {b!r}", field="batch_sizes")
    return sorted(set(batch_sizes))


def profile_layers(name: str, device: str | torch.device = "cpu", batch_sizes: Sequence[int] = (8, 16, 32),
                   repeats: int = 10, warmup: int = 3, *, optimizer: str = "sgd", threads: int | None = None,
                   prep_samples: int = 64, progress: Progress | None = None, precision: str = "fp32",
                   timing: str = "clock", **model_cfg) -> Workload:
    """Measure zoo model ``name`` on ``device`` at each batch size and return a measured workload.

    Static per-layer figures (bytes, FLOPs, shapes) come from :func:`describe`; this adds forward/backward
    :class:`TimeModel`s per layer, the optimizer step, the input preparation time, and in
    ``provenance["iteration"]`` the whole-iteration and unattributed times. ``threads`` sets
    ``torch.set_num_threads`` for the run (default: torch's choice); the value used is recorded.
    ``precision`` bf16/fp16: the forward runs under autocast to it, as the executor runs it (no loss scaling);
    byte counts stay fp32's, each layer's ``autocast`` holds its activation bytes under CUDA's autocast
    (measured on ``device``; on a CPU with CUDA's fp32 ops emulated, since a 16-bit what-if is a GPU's), and
    ``provenance.precision`` says what the times were measured in.
    ``timing`` "clock" (the default) reads a layer's time between clock marks at its hooks; "kernels" runs
    each hooked iteration under torch.profiler and takes the time of the kernels launched inside the layer's
    hooks (on the CPU, its ops' time), so the launch gaps of a host-bound iteration (the host slower than the
    GPU, as hooks make a bf16 GPT-2 step) stay unattributed instead of inflating the layers.
    """
    progress = progress or (lambda text: None)
    canonical = zoo.canonical_name(name)
    cfg = zoo.model_config(canonical, **model_cfg)
    dev = resolve_device(device)
    batches = _check_batches(batch_sizes)
    if repeats < 1:
        raise TrainsimError(f"repeats must be >= 1, got {repeats}", field="repeats")
    if warmup < 0:
        raise TrainsimError(f"warmup must be >= 0, got {warmup}", field="warmup")
    if optimizer.strip().lower() not in OPTIMIZERS:
        raise unknown_name("optimizer", optimizer, OPTIMIZERS, field="optimizer")
    if threads is not None and threads < 1:
        raise TrainsimError(f"threads must be >= 1, got {threads}", field="threads")
    if precision not in AUTOCAST:
        raise unknown_name("precision", precision, AUTOCAST, field="precision")
    if timing not in TIMINGS:
        raise unknown_name("timing", timing, TIMINGS, field="timing")

    progress("describing layers")
    static = describe_layers(canonical, **cfg)
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        model = zoo.build_model(canonical, **cfg).to(dev)
        opt = make_optimizer(optimizer, model.parameters())
        clock = clock_for(dev)
        measured: list[BatchTimes] = []
        skipped: list[dict] = []
        available = memory_available_bytes() if dev.type == "cpu" else None
        for batch in batches:
            if skipped:
                skipped.append({"batch": batch, "reason": "a smaller batch size already did not fit"})
                continue
            need = training_bytes(static, batch, optimizer)
            if available is not None and need > CPU_MEMORY_FRACTION * available:
                skipped.append({"batch": batch, "reason": f"needs about {need / 2**30:.1f} GiB, "
                                                          f"{available / 2**30:.1f} GiB available"})
                progress(f"batch {batch} does not fit in memory; skipping it and larger ones")
                continue
            oom = None
            try:
                measured.append(_measure_batch(model, opt, canonical, batch, dev, clock, repeats, warmup, cfg,
                                               progress, precision, timing))
            except Exception as exc:
                if not _is_oom(exc):
                    raise
                oom = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            if oom is not None:
                # outside the except block, so the failed step's frames (and tensors) are already released
                skipped.append({"batch": batch, "reason": f"out of memory: {oom}"})
                progress(f"batch {batch} does not fit in memory; skipping it and larger ones")
                opt.zero_grad(set_to_none=True)
                gc.collect()
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
        threads_used = torch.get_num_threads()
    finally:
        torch.set_num_threads(previous_threads)
    if not measured:
        raise TrainsimError(f"no batch size fits in memory on {dev} (smallest tried: {batches[0]}; "
                            f"{skipped[0]['reason']})", field="batch_sizes")

    autocast = [None] * len(static)
    if precision != "fp32":
        progress("activation bytes under autocast")
        del model, opt
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        autocast = autocast_bytes(canonical, dev, precision, cuda_policy=True, **cfg)
    layers = []
    for layer, under_autocast in zip(static, autocast, strict=True):
        times = {}
        for phase in ("forward", "backward"):
            points = [(bt.batch, max(bt.layers.get((phase, layer.name), (0.0, 0.0))[0], MIN_TIME_S),
                       bt.layers.get((phase, layer.name), (0.0, 0.0))[1]) for bt in measured]
            times[phase] = time_model(points)
        layers.append(layer.model_copy(update={**times, "autocast": under_autocast}))

    prep = data_prep.measure_prep(canonical, prep_samples, **cfg) if prep_samples > 0 else None
    device_name, device_spec = _device_names(dev)
    iteration = IterationRecord(
        plain=[BatchTime(batch=bt.batch, s=bt.iteration[0], iqr_s=bt.iteration[1]) for bt in measured],
        hooked=[BatchTime(batch=bt.batch, s=bt.iteration_hooked[0], iqr_s=bt.iteration_hooked[1])
                for bt in measured],
        layers_sum=[BatchTime(batch=bt.batch, s=sum(m for m, _ in bt.layers.values())) for bt in measured],
        optimizer=[BatchTime(batch=bt.batch, s=bt.optimizer[0]) for bt in measured],
        unattributed=[BatchTime(batch=bt.batch, s=bt.unattributed_s) for bt in measured],
        plain_host=[BatchTime(batch=bt.batch, s=bt.iteration_host[0], iqr_s=bt.iteration_host[1])
                    for bt in measured],
        layers_host_sum=[BatchTime(batch=bt.batch, s=sum(m for m, _ in bt.layers_host.values()))
                         for bt in measured],
    )
    layer_host_s = {phase: {layer.name: [[bt.batch, *bt.layers_host.get((phase, layer.name), (0.0, 0.0))]
                                         for bt in measured] for layer in static}
                    for phase in ("forward", "backward")}
    extra = {
        "device": device_name, "device_spec": device_spec, "torch_device": str(dev),
        "generator": "trainsim.calibrate.measure.layer_profile", "config": cfg,
        "timing": clock.method if timing == "clock" else KERNEL_TIMING[dev.type], "repeats": repeats,
        "warmup": warmup,
        "optimizer": {"name": optimizer.lower(), "state_copies": _OPTIMIZER_STATE_COPIES[optimizer.lower()]},
        "threads": threads_used, "cores_available": data_prep.cores_available(),
        "batch_sizes_requested": batches, "batch_sizes_measured": [bt.batch for bt in measured],
        "largest_batch_that_fits": measured[-1].batch if measured else None,
        "skipped": skipped, "iteration": iteration, "layer_host_s": layer_host_s, "precision": precision,
    }
    if dev.type == "cuda":
        extra.update(cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(),
                     cublas_workspace_config=os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
                     tf32_matmul=torch.backends.cuda.matmul.allow_tf32,
                     tf32_cudnn=torch.backends.cudnn.allow_tf32,
                     peak_memory_bytes=[[bt.batch, bt.peak_memory_bytes] for bt in measured])
    return Workload(
        name=canonical, dtype="float32", input=input_spec(canonical, prep, **cfg), layers=layers,
        optimizer_step=time_model([(bt.batch, max(bt.optimizer[0], MIN_TIME_S), bt.optimizer[1])
                                   for bt in measured]),
        provenance=Provenance(**provenance(timestamp=True, **extra)),
    )


def total_time(workload: Workload, batch: int) -> float:
    """Sum of the layers' forward + backward times and the optimizer step at ``batch`` (seconds)."""
    total = sum(layer.forward.at(batch) + layer.backward.at(batch) for layer in workload.layers
                if layer.forward is not None and layer.backward is not None)
    if workload.optimizer_step is not None:
        total += workload.optimizer_step.at(batch)
    return total if math.isfinite(total) else float("nan")
