"""The real executor: train a zoo model for a few iterations exactly as an `ExecConfig` says, and measure it.

`run(cfg) -> Measurement` launches ``cfg.ranks`` processes with `launch.launch` (gloo CPU ranks pinned to
their own cores, or one GPU per rank with NCCL), runs ``warmup + iterations`` training steps of
``cfg.strategy`` on data from the real CPU pipeline (`datapipe`), and returns per-iteration times (the
slowest rank's, since an iteration is over when every rank is), their median and interquartile range,
samples/s, peak memory per rank and a per-phase breakdown.

`run_variant(scenario, variant)` is what ``trainsim execute`` and ``trainsim validate`` call: it maps a
scenario variant onto an ExecConfig and either runs it or, when this box cannot (CUDA missing, more ranks
than cores or GPUs, a compression the backend lacks), returns the outcome marked skipped with the reason.

Memory: on CUDA, ``torch.cuda.max_memory_allocated`` over the measured iterations (reset after warm-up).
On the CPU, torch's allocator is invisible to tracemalloc, so it is the peak resident set (``VmHWM``, reset
through ``/proc/self/clear_refs`` after the model is built) minus the resident set at that moment: the
memory training added (activations, gradients, optimizer state, batches) as the OS saw it. Strategy mesh
on CPU ranks: the rank's persistent tensors plus the peak of torch's CPU allocator over the last warm-up
iteration (``cpu.allocator_peak``, `mesh.AllocatorPeak`), comparable with the simulator's per-GPU peak.

It stays one module: a rank's training loop, the launch of every rank and the summary of their
timings are one run, and the variants' table is its output.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

from trainsim.calibrate.execute.config import (
    ExecConfig,
    exec_config_from_scenario,
    infeasible_reason,
    scenario_variants,
)
from trainsim.errors import TrainsimError

SCHEMA = "trainsim.measurement/1"
#: strategy mesh's CPU peak: persistent tensors + torch's CPU allocator peak over one iteration (`mesh`)
CPU_ALLOCATOR_PEAK = "cpu.allocator_peak"


@dataclass
class RankResult:
    """What one rank measured (iteration times are end-to-end, synchronised, warm-up excluded)."""

    rank: int
    iteration_s: list[float]
    phases: list[dict[str, float]]  # per measured iteration: data, forward, backward, comm, optimizer
    losses: list[float]
    peak_memory_bytes: int
    memory_measure: str
    notes: list[str] = field(default_factory=list)
    params: object = None  # numpy flat parameters after the run (capture_params)
    extra: dict = field(default_factory=dict)


@dataclass
class Measurement:
    """One executed run."""

    config: dict
    iteration_s: list[float]  # per measured iteration, the slowest rank
    median_s: float
    iqr_s: float
    samples_per_s: float
    peak_memory_bytes: list[int]  # per rank
    memory_measure: str
    breakdown_s: dict[str, float]  # median per phase over measured iterations, averaged over ranks
    losses: list[float]  # rank 0's loss per measured iteration (its shard; dp-gpu0: the whole batch)
    ran: dict  # what really ran: strategy, ranks, device, threads, optimizations applied, notes
    wall_s: float  # the whole launch, start-up included
    ranks: list[RankResult] = field(default_factory=list, repr=False)

    def to_dict(self, *, provenance: dict | None = None) -> dict:
        out = {"schema": SCHEMA}
        body = asdict(self)
        body.pop("ranks")
        out.update(body)
        if provenance is not None:
            out["provenance"] = provenance
        return out


@dataclass
class VariantOutcome:
    """One scenario variant: measured, or skipped with the reason."""

    variant: str | None
    config: ExecConfig | None
    measurement: Measurement | None = None
    skipped: str | None = None  # this box cannot run it: why
    failed: str | None = None  # it ran and a rank failed: the one-line error

    def to_dict(self) -> dict:
        return {"variant": self.variant, "skipped": self.skipped, "failed": self.failed,
                "measurement": self.measurement.to_dict() if self.measurement else None}


# ---------------------------------------------------------------- one rank


def _rss_bytes(key: str) -> int:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


class DeviceFeeder:
    """Batches for the training loop, per iteration, on the rank's device.

    No preload: on CUDA with ``loader_processes`` > 0, a torch DataLoader's worker processes prepare batches
    ahead (two each, in pageable memory; its pin thread pins them when ``pinned``) and the training loop
    copies each on its own stream when it asks, as a PyTorch script with ``num_workers`` does; otherwise the
    batch is prepared when asked for and copied (from pageable memory unless ``pinned``).
    preload: `datapipe.Prefetcher` threads prepare batches ``depth`` ahead in host memory. On CUDA the same
    threads copy each prepared batch from pinned memory on their own side stream and record an event, so
    preparation and H2D copy both overlap the training loop's compute (double buffering and more); the
    consumer's stream waits on that batch's event only.
    """

    def __init__(self, make_host: Callable[[int, bool], object], total: int, device, *, preload: int,
                 workers: int, pinned: bool, loader_cores: tuple[int, ...] = ()):
        import torch

        from trainsim.calibrate.execute.datapipe import Prefetcher, loader_batches

        self.torch = torch
        self.device = device
        self.cuda = device.type == "cuda"
        self.make_host = lambda it: make_host(it, pinned)
        self._streams: dict[int, object] = {}
        self._lock = threading.Lock()
        self.prefetcher = None
        self.loader = None
        if preload:
            make = self._prepare_on_device if self.cuda else self.make_host
            self.prefetcher = Prefetcher(make, total, depth=preload, workers=workers, cores=loader_cores)
        elif self.cuda and workers > 0:  # worker processes never touch CUDA: they make pageable batches
            self.loader = loader_batches(lambda it: make_host(it, False), total, workers=workers, pin=pinned)

    def _prepare_on_device(self, it: int):
        """In a prefetch thread: prepare batch ``it``, start its H2D copy on this thread's side stream."""
        torch = self.torch
        host = self.make_host(it)
        if host is None:
            return None
        with torch.cuda.device(self.device):  # the current CUDA device is per thread
            stream = self._thread_stream()
            with torch.cuda.stream(stream):
                on_dev = tuple(None if t is None else t.to(self.device, non_blocking=True) for t in host)
                event = torch.cuda.Event()
                event.record(stream)
        return on_dev, event

    def _thread_stream(self):
        key = threading.get_ident()
        with self._lock:
            if key not in self._streams:
                self._streams[key] = self.torch.cuda.Stream(device=self.device)
            return self._streams[key]

    def get(self, it: int):
        if self.prefetcher is None:
            host = next(self.loader) if self.loader is not None else self.make_host(it)
            if host is None or not self.cuda:
                return host
            return tuple(None if t is None else t.to(self.device, non_blocking=t.is_pinned()) for t in host)
        item = self.prefetcher.get(it)
        if not self.cuda or item is None:
            return item
        on_dev, event = item
        current = self.torch.cuda.current_stream(self.device)
        current.wait_event(event)
        for t in on_dev:
            if t is not None:
                t.record_stream(current)  # allocated on the side stream, used on this one
        return on_dev

    def close(self) -> None:
        if self.prefetcher:
            self.prefetcher.close()
        self.loader = None  # the DataLoader's iterator shuts its workers down when collected


def _free_cores(ctx, cfg: ExecConfig) -> tuple[int, ...]:
    """The cores no rank computes on (left free by ``cores_per_rank``): the host cores where a CPU box's
    background data workers run, as the simulator's data loader runs on host cores beside the devices."""
    if ctx.device != "cpu" or not cfg.cores_per_rank:
        return ()

    from trainsim.calibrate.launch import plan_cores

    try:
        parent = sorted(os.sched_getaffinity(os.getppid()))
    except OSError:
        return ()
    used = {c for cores in plan_cores(ctx.world_size, parent, per_rank=cfg.cores_per_rank) for c in cores}
    return tuple(c for c in parent if c not in used)


def _start_profiler(cfg: ExecConfig, it: int, cuda: bool):
    """A started torch.profiler for iteration ``it`` when it is the one to trace (the last warm-up
    iteration, so the measured ones carry no profiler overhead; the first iteration when there is no
    warm-up), else None. Strategy mesh on CPU ranks: an `AllocatorPeak` (a profiler with memory events,
    which also writes the trace), started at the last warm-up iteration."""
    if it != max(cfg.warmup - 1, 0):
        return None
    from trainsim.calibrate.execute.mesh import AllocatorPeak, allocator_peak_wanted

    if allocator_peak_wanted(cfg, cuda):
        probe = AllocatorPeak()
        probe.start()
        return probe
    if not cfg.profile_trace:
        return None
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profiler = torch.profiler.profile(activities=activities, record_shapes=False)
    profiler.start()
    return profiler


def rank_main(ctx, cfg: ExecConfig) -> RankResult:
    """The body of one rank (launched by `launch.launch`)."""
    import torch

    from trainsim.calibrate import zoo
    from trainsim.calibrate.execute.datapipe import SyntheticSource
    from trainsim.calibrate.execute.mesh import AllocatorPeak
    from trainsim.calibrate.execute.strategies import Clock

    device = torch.device(ctx.device)
    torch.manual_seed(cfg.seed)
    model = zoo.build_model(cfg.model, **cfg.model_cfg)
    if cfg.strategy != "pipeline":  # a pipeline stage moves only its own layers
        model = model.to(device)
    strategy = make_strategy(ctx, cfg, model, device)
    source = SyntheticSource(cfg.model, cfg.model_cfg, cfg.data, seed=cfg.seed)
    pin = device.type == "cuda" and (cfg.pinned or cfg.optimizations.preload > 0)
    total = cfg.warmup + cfg.iterations

    def make_host(it: int, pin: bool):
        return strategy.host_batch(source, it, pin)

    feeder = DeviceFeeder(make_host, total, device, preload=cfg.optimizations.preload,
                          workers=cfg.data.workers, pinned=pin, loader_cores=_free_cores(ctx, cfg))
    cuda = device.type == "cuda"
    rss_base = _rss_bytes("VmRSS")
    rss_reset = _reset_peak_rss() if not cuda else False
    clock = Clock(device)
    times, phases, losses = [], [], []
    allocator_peak = None
    try:
        for it in range(total):
            if it == cfg.warmup:
                if cuda:
                    torch.cuda.synchronize(device)
                    torch.cuda.reset_peak_memory_stats(device)
                torch.distributed.barrier()  # measured iterations start together
            profiler = _start_profiler(cfg, it, cuda)
            persistent = _persistent(strategy) if isinstance(profiler, AllocatorPeak) else 0
            # the traced iteration is a ProfilerStep#N span, as torch.profiler's schedule marks each step
            span = (torch.profiler.record_function(f"ProfilerStep#{it}") if profiler is not None
                    else contextlib.nullcontext())
            t0 = time.perf_counter()
            with span:
                clock.start()
                batch = feeder.get(it)
                data_s = time.perf_counter() - t0
                clock.lap("data")
                loss = strategy.step(batch, clock)
                if cuda:
                    torch.cuda.synchronize(device)
            elapsed = time.perf_counter() - t0
            trace = f"{cfg.profile_trace}.rank{ctx.rank}.json" if cfg.profile_trace else None
            if isinstance(profiler, AllocatorPeak):
                profiler.stop(persistent, trace)
                allocator_peak = profiler.peak
            elif profiler is not None:
                profiler.stop()
                profiler.export_chrome_trace(trace)
            if it >= cfg.warmup:
                times.append(elapsed)
                ph = clock.phases()
                ph["data"] = data_s  # host-side wait for the batch, on CUDA too
                phases.append(ph)
                losses.append(float(loss))
    finally:
        feeder.close()
    if cuda:
        peak, measure = int(torch.cuda.max_memory_allocated(device)), "cuda.max_memory_allocated"
    elif allocator_peak is not None:
        peak, measure = allocator_peak, CPU_ALLOCATOR_PEAK
    else:
        peak = max(0, _rss_bytes("VmHWM") - rss_base)
        measure = "cpu.peak_rss_delta" if rss_reset else "cpu.peak_rss_delta (peak since process start)"
    notes = list(strategy.notes)
    if cfg.optimizations.offload_activations != "none" and not cuda:
        notes.append("activation offload on CPU ranks: host-to-host copies only (no second memory)")
    if strategy.offloader is not None:
        st = strategy.offloader.stats
        notes.append(f"offload: {st.offloaded_bytes // max(1, total)} bytes/iteration offloaded, "
                     f"{st.prefetched} unpacks prefetched, {st.on_demand} on demand, "
                     f"{st.shared} saves shared an earlier copy")
    params = strategy.final_params().numpy() if cfg.capture_params else None
    extra = dict(strategy.extra)
    if cfg.strategy == "easgd":
        extra["exchanges"] = strategy.exchanges
    return RankResult(rank=ctx.rank, iteration_s=times, phases=phases, losses=losses, peak_memory_bytes=peak,
                      memory_measure=measure, notes=notes, params=params, extra=extra)


def _persistent(strategy) -> int:
    """Bytes a rank holds between iterations (parameters, optimizer state): what `AllocatorPeak` adds."""
    from trainsim.calibrate.execute.mesh import persistent_bytes

    optimizer = getattr(strategy, "optimizer", None)
    return persistent_bytes(strategy.model, optimizer) if optimizer is not None else 0


# ---------------------------------------------------------------- the parent


def _summarise(cfg: ExecConfig, results: list[RankResult], wall_s: float, threads: int) -> Measurement:
    from trainsim.calibrate.sampling import median_spread

    per_iter = [max(r.iteration_s[i] for r in results) for i in range(cfg.iterations)]
    median, iqr = median_spread(per_iter)
    names = sorted({k for r in results for ph in r.phases for k in ph})
    breakdown = {}
    for name in names:
        per_rank = [median_spread([ph.get(name, 0.0) for ph in r.phases])[0] for r in results]
        breakdown[name] = sum(per_rank) / len(per_rank)
    opts = cfg.optimizations
    applied = {k: v for k, v in asdict(opts).items() if v not in (0, False, "none")}
    if opts.param_compression != "powersgd":
        applied.pop("powersgd_rank", None)
    if opts.offload_activations != "prefetch":
        applied.pop("prefetch_distance", None)
    if not opts.offload_optimizer_state:
        applied.pop("offload_chunk_mb", None)
    notes = sorted({n for r in results for n in r.notes})
    ran = {"strategy": cfg.strategy, "ranks": cfg.ranks, "device": cfg.device, "model": cfg.model,
           "threads_per_rank": threads, "global_batch": cfg.batch_size, "optimizations": applied,
           "notes": notes}
    if cfg.strategy == "pipeline":
        ran["pipeline"] = {**asdict(cfg.pipeline), "stages": cfg.pipeline.stages or cfg.ranks,
                           "parts_per_stage": results[0].extra.get("stage_parts")}
    if cfg.strategy == "easgd":
        ran["easgd"] = {**asdict(cfg.easgd), "alpha": cfg.easgd_alpha,
                        "exchanges": results[0].extra.get("exchanges")}
    return Measurement(config=cfg.to_dict(), iteration_s=per_iter, median_s=median, iqr_s=iqr,
                       samples_per_s=cfg.batch_size / median if median > 0 else 0.0,
                       peak_memory_bytes=[r.peak_memory_bytes for r in results],
                       memory_measure=results[0].memory_measure, breakdown_s=breakdown,
                       losses=results[_loss_rank(cfg)].losses, ran=ran, wall_s=wall_s, ranks=results)


def _loss_rank(cfg: ExecConfig) -> int:
    """The rank whose loss is reported: rank 0, or a pipeline's last stage (where the loss is computed)."""
    if cfg.strategy == "pipeline":
        return (cfg.pipeline.stages or cfg.ranks) - 1
    return 0


def rank_main_many(ctx, cfgs: list[ExecConfig]) -> list[RankResult]:
    """Several runs one after the other in the same rank processes (one start-up for all)."""
    import torch.distributed as dist

    results = []
    for cfg in cfgs:
        dist.barrier()
        result = rank_main(ctx, cfg)
        if cfg.device == "cpu" and len(cfgs) > 1 and result.memory_measure != CPU_ALLOCATOR_PEAK:
            result.memory_measure += " (process reused: freed memory is reused, so later runs read low)"
        results.append(result)
    return results


def _threads(cfg: ExecConfig) -> int:
    from trainsim.calibrate.launch import plan_cores

    return len(plan_cores(cfg.ranks, per_rank=cfg.cores_per_rank)[0]) if cfg.device == "cpu" else 1


def run(cfg: ExecConfig) -> Measurement:
    """Execute ``cfg`` on this box and measure it. Raises TrainsimError when the box cannot run it."""
    return run_many([cfg])[0]


def run_many(cfgs: list[ExecConfig]) -> list[Measurement]:
    """Execute several configs with the same ranks and device in one launch (start-up paid once; for tests
    and quick checks: the peak-memory figure of CPU runs after the first reads low). Raises TrainsimError
    when the box cannot run one of them."""
    from trainsim.calibrate.launch import launch

    if not cfgs:
        return []
    first = cfgs[0]
    for cfg in cfgs:
        reason = infeasible_reason(cfg)
        if reason:
            raise TrainsimError(f"cannot run here: {reason}")
        if (cfg.ranks, cfg.device) != (first.ranks, first.device):
            raise TrainsimError("run_many needs the same ranks and device for every config", field="ranks")
    start = time.perf_counter()
    per_rank = launch(rank_main_many, first.ranks, args=(list(cfgs),), device=first.device,
                      cores_per_rank=first.cores_per_rank if first.device == "cpu" else None,
                      timeout_s=sum(c.timeout_s for c in cfgs))
    wall = time.perf_counter() - start
    return [_summarise(cfg, [results[i] for results in per_rank], wall, _threads(cfg))
            for i, cfg in enumerate(cfgs)]


def run_variant(scenario: dict, variant: str | None = None, *, file: str | None = None,
                **overrides) -> VariantOutcome:
    """Map ``variant`` of ``scenario`` onto an ExecConfig and run it, or return it skipped with the reason.
    A bad scenario raises TrainsimError; a box that cannot run it is a skip, not an error."""
    cfg = exec_config_from_scenario(scenario, variant, file=file, **overrides)
    reason = infeasible_reason(cfg)
    if reason:
        return VariantOutcome(variant, cfg, skipped=reason)
    return VariantOutcome(variant, cfg, measurement=run(cfg))


def run_scenario(scenario: dict, variants: list[str] | None = None, *, file: str | None = None,
                 progress: Callable[[str], None] | None = None, profile_dir: str | None = None,
                 **overrides) -> list[VariantOutcome]:
    """Every variant (or the base scenario when it has none), in order, each in its own launch; variants this
    box cannot run are marked skipped, variants whose run failed are marked failed, the rest measured.

    ``profile_dir``: each variant also writes a torch.profiler trace of its last warm-up iteration there,
    ``<variant>.rank<R>.json`` (the base scenario's is ``scenario.rank<R>.json``)."""
    names: list[str | None] = list(variants) if variants else (scenario_variants(scenario) or [None])
    configs = [(name, exec_config_from_scenario(scenario, name, file=file, **overrides)) for name in names]
    if profile_dir:
        os.makedirs(profile_dir, exist_ok=True)
        configs = [(name, replace(cfg, profile_trace=os.path.join(profile_dir,
                                                                              name or "scenario")))
                   for name, cfg in configs]
    outcomes = []
    for name, cfg in configs:  # every config validated before anything runs
        if progress:
            progress(f"running {name or 'scenario'} ({cfg.strategy}, {cfg.ranks} rank(s), {cfg.device})")
        reason = infeasible_reason(cfg)
        if reason:
            outcomes.append(VariantOutcome(name, cfg, skipped=reason))
            continue
        try:
            outcomes.append(VariantOutcome(name, cfg, measurement=run(cfg)))
        except TrainsimError as exc:  # one variant's crash does not lose the others' measurements
            outcomes.append(VariantOutcome(name, cfg, failed=str(exc)))
    return outcomes


# ---------------------------------------------------------------- reporting


def execution_report(outcomes: list[VariantOutcome], *, provenance: dict | None = None) -> dict:
    """The versioned document ``trainsim execute --json`` prints: one entry per variant, skipped marked."""
    doc: dict = {"schema": "trainsim.execution/1", "variants": [o.to_dict() for o in outcomes]}
    if provenance is not None:
        doc["provenance"] = provenance
    return doc


def write_measurements(doc: dict, path: str) -> None:
    """Write ``doc`` as JSON atomically (a temporary file in the same folder, then rename)."""
    import json

    from trainsim.files import write_atomic

    write_atomic(path, json.dumps(doc, indent=2, default=str))


def outcomes_table(outcomes: list[VariantOutcome]):
    """A rich table, one row per variant (why a variant did not run is in `outcome_lines`)."""
    from rich import box
    from rich.table import Table

    table = Table(title="measured here: iteration median and IQR (ms), samples/s, data wait and explicit "
                  "communication (ms), peak memory per rank (MiB)", box=box.SIMPLE_HEAD, padding=(0, 1))
    for col in ("variant", "ranks", "ms", "IQR", "samples/s", "data", "comm", "MiB"):
        table.add_column(col, justify="left" if col == "variant" else "right", no_wrap=col != "variant",
                         overflow="fold")
    for o in outcomes:
        cfg = o.config
        if o.measurement is None:
            table.add_row(o.variant or "-", str(cfg.ranks), "skipped" if o.skipped else "failed", *[""] * 5)
            continue
        m, bd = o.measurement, o.measurement.breakdown_s
        comm = "in bwd" if cfg.strategy == "ddp" else "-"
        if "comm" in bd:
            comm = f"{bd['comm'] * 1e3:.1f}"
        table.add_row(o.variant or "-", str(cfg.ranks), f"{m.median_s * 1e3:.1f}", f"{m.iqr_s * 1e3:.1f}",
                      f"{m.samples_per_s:.0f}", f"{bd.get('data', 0.0) * 1e3:.1f}", comm,
                      "/".join(f"{b / 2**20:.0f}" for b in m.peak_memory_bytes))
    return table


def outcome_lines(outcomes: list[VariantOutcome]) -> list[str]:
    """One line per variant that did not run, saying why (skipped: this box cannot; failed: a rank failed)."""
    lines = []
    for o in outcomes:
        if o.skipped:
            lines.append(f"skipped {o.variant or 'scenario'}: {o.skipped}")
        elif o.failed:
            lines.append(f"failed {o.variant or 'scenario'}: {o.failed}")
    return lines


def make_strategy(ctx, cfg: ExecConfig, model, device):
    """The strategy object of this rank. ``model`` is on ``device``, except for pipeline (on the CPU: each
    stage moves its own part)."""
    from trainsim.calibrate.execute.pipeline import Pipeline
    from trainsim.calibrate.execute.spatial import Spatial
    from trainsim.calibrate.execute.strategies import STRATEGIES

    if cfg.strategy == "pipeline":
        return Pipeline(ctx, cfg, model, device)
    if cfg.strategy == "spatial":
        return Spatial(ctx, cfg, model, device)  # every rank built the same model from the same seed
    if cfg.strategy == "mesh":
        from trainsim.calibrate.execute.mesh import Mesh

        return Mesh(ctx, cfg, model, device)  # every rank built the same model from the same seed
    strategy = STRATEGIES[cfg.strategy](ctx, cfg, model, device)
    if cfg.strategy != "ddp":  # DDP broadcasts rank 0's parameters itself
        strategy.broadcast_initial()
    return strategy
