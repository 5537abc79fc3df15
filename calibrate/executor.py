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
memory training added (activations, gradients, optimizer state, batches) as the OS saw it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from trainsim.calibrate.exec_config import (
    ExecConfig,
    exec_config_from_scenario,
    infeasible_reason,
    scenario_variants,
)
from trainsim.errors import TrainsimError

SCHEMA = "trainsim.measurement/1"


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
    skipped: str | None = None

    def to_dict(self) -> dict:
        return {"variant": self.variant, "skipped": self.skipped,
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

    No preload: the batch is prepared when asked for and copied (from pageable memory unless ``pinned``).
    preload: `datapipe.Prefetcher` threads prepare batches ``depth`` ahead in (pinned) host memory; on CUDA
    the next batch's H2D copy is issued on a side stream as soon as the current one is handed out, and the
    consumer's stream waits on that copy's event only (double buffering).
    """

    def __init__(self, make_host: Callable[[int], object], total: int, device, *, preload: int, workers: int):
        import torch

        from trainsim.calibrate.datapipe import Prefetcher

        self.torch = torch
        self.device = device
        self.cuda = device.type == "cuda"
        self.make_host = make_host
        self.prefetcher = Prefetcher(make_host, total, depth=preload, workers=workers) if preload else None
        self.side = torch.cuda.Stream(device=device) if (self.cuda and preload) else None
        self.total = total
        self._staged: dict[int, tuple] = {}

    def _host(self, it: int):
        return self.prefetcher.get(it) if self.prefetcher else self.make_host(it)

    def _stage(self, it: int) -> None:
        """Issue batch ``it``'s H2D copy on the side stream."""
        host = self._host(it)
        if host is None:
            self._staged[it] = (None, None)
            return
        with self.torch.cuda.stream(self.side):
            on_dev = tuple(t.to(self.device, non_blocking=True) for t in host)
            event = self.torch.cuda.Event()
            event.record(self.side)
        self._staged[it] = (on_dev, event)

    def get(self, it: int):
        if not self.cuda:
            return self._host(it)
        if self.side is None:
            host = self._host(it)
            return None if host is None else tuple(t.to(self.device) for t in host)
        if it not in self._staged:
            self._stage(it)
        on_dev, event = self._staged.pop(it)
        if it + 1 < self.total:
            self._stage(it + 1)  # double buffering: the next copy overlaps this iteration's compute
        if on_dev is None:
            return None
        current = self.torch.cuda.current_stream(self.device)
        current.wait_event(event)
        for t in on_dev:
            t.record_stream(current)
        return on_dev

    def close(self) -> None:
        if self.prefetcher:
            self.prefetcher.close()


def rank_main(ctx, cfg: ExecConfig) -> RankResult:
    """The body of one rank (launched by `launch.launch`)."""
    import torch

    from trainsim.calibrate import zoo
    from trainsim.calibrate.datapipe import SyntheticSource
    from trainsim.calibrate.exec_strategies import Clock, make_strategy

    device = torch.device(ctx.device)
    torch.manual_seed(cfg.seed)
    model = zoo.build_model(cfg.model, **cfg.model_cfg).to(device)
    strategy = make_strategy(ctx, cfg, model, device)
    source = SyntheticSource(cfg.model, cfg.model_cfg, cfg.data, seed=cfg.seed)
    positions = strategy.positions()
    pin = device.type == "cuda" and (cfg.pinned or cfg.optimizations.preload > 0)
    total = cfg.warmup + cfg.iterations

    def make_host(it: int):
        if positions is None:
            return None
        return source.batch(it, positions, cfg.batch_size, pin=pin)

    feeder = DeviceFeeder(make_host, total, device, preload=cfg.optimizations.preload,
                          workers=cfg.data.workers)
    cuda = device.type == "cuda"
    rss_base = _rss_bytes("VmRSS")
    rss_reset = _reset_peak_rss() if not cuda else False
    clock = Clock(device)
    times, phases, losses = [], [], []
    try:
        for it in range(total):
            if it == cfg.warmup:
                if cuda:
                    torch.cuda.synchronize(device)
                    torch.cuda.reset_peak_memory_stats(device)
                torch.distributed.barrier()  # measured iterations start together
            t0 = time.perf_counter()
            clock.start()
            batch = feeder.get(it)
            data_s = time.perf_counter() - t0
            clock.lap("data")
            loss = strategy.step(batch, clock)
            if cuda:
                torch.cuda.synchronize(device)
            elapsed = time.perf_counter() - t0
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
    else:
        peak = max(0, _rss_bytes("VmHWM") - rss_base)
        measure = "cpu.peak_rss_delta" if rss_reset else "cpu.peak_rss_delta (peak since process start)"
    notes = list(strategy.notes)
    if cfg.optimizations.offload_activations != "none" and not cuda:
        notes.append("activation offload on CPU ranks: host-to-host copies only (no second memory)")
    if strategy.offloader is not None:
        st = strategy.offloader.stats
        notes.append(f"offload: {st.offloaded_bytes // max(1, total)} bytes/iteration offloaded, "
                     f"{st.prefetched} unpacks prefetched, {st.on_demand} on demand")
    params = strategy.final_params().numpy() if cfg.capture_params else None
    extra = dict(strategy.extra)
    if cfg.strategy == "easgd":
        extra["exchanges"] = strategy.exchanges
    return RankResult(rank=ctx.rank, iteration_s=times, phases=phases, losses=losses, peak_memory_bytes=peak,
                      memory_measure=measure, notes=notes, params=params, extra=extra)


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
    notes = sorted({n for r in results for n in r.notes})
    ran = {"strategy": cfg.strategy, "ranks": cfg.ranks, "device": cfg.device, "model": cfg.model,
           "threads_per_rank": threads, "global_batch": cfg.batch_size, "optimizations": applied,
           "notes": notes}
    if cfg.strategy == "easgd":
        ran["easgd"] = {**asdict(cfg.easgd), "alpha": cfg.easgd_alpha,
                        "exchanges": results[0].extra.get("exchanges")}
    return Measurement(config=cfg.to_dict(), iteration_s=per_iter, median_s=median, iqr_s=iqr,
                       samples_per_s=cfg.batch_size / median if median > 0 else 0.0,
                       peak_memory_bytes=[r.peak_memory_bytes for r in results],
                       memory_measure=results[0].memory_measure, breakdown_s=breakdown,
                       losses=results[0].losses, ran=ran, wall_s=wall_s, ranks=results)


def rank_main_many(ctx, cfgs: list[ExecConfig]) -> list[RankResult]:
    """Several runs one after the other in the same rank processes (one start-up for all)."""
    import torch.distributed as dist

    results = []
    for cfg in cfgs:
        dist.barrier()
        result = rank_main(ctx, cfg)
        if cfg.device == "cpu" and len(cfgs) > 1:
            result.memory_measure += " (process reused: freed memory is reused, so later runs read low)"
        results.append(result)
    return results


def _threads(cfg: ExecConfig) -> int:
    from trainsim.calibrate.launch import plan_cores

    return len(plan_cores(cfg.ranks)[0]) if cfg.device == "cpu" else 1


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
                 progress: Callable[[str], None] | None = None, **overrides) -> list[VariantOutcome]:
    """Every variant (or the base scenario when it has none), in order; skipped rows marked."""
    names: list[str | None] = list(variants) if variants else (scenario_variants(scenario) or [None])
    configs = [(name, exec_config_from_scenario(scenario, name, file=file, **overrides)) for name in names]
    outcomes = []
    for name, cfg in configs:  # every config validated before anything runs
        if progress:
            progress(f"running {name or 'scenario'} ({cfg.strategy}, {cfg.ranks} rank(s), {cfg.device})")
        reason = infeasible_reason(cfg)
        outcomes.append(VariantOutcome(name, cfg, skipped=reason) if reason
                        else VariantOutcome(name, cfg, measurement=run(cfg)))
    return outcomes
