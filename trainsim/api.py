"""The library's front door: one function per command of the `trainsim` CLI, which only parses options,
calls one of these and prints what it returns.

    from trainsim import api
    result = api.simulate("ddp-resnet50-dgx-a100", overrides=["batch_size=512"])
    result = api.simulate("validate-cpu", calibration="bundle-dir", variant="ddp-2")
    run = api.resolve("ddp-resnet50-dgx-a100")      # the resolved Run: scenario, topology, workload, ranks
    report = api.replay(["rank-0.json.gz", "rank-1.json.gz"], sets=["compression=fp16"])
    plan = api.plan(scenario="dryden-resnet50")

Reading a user's files is `trainsim.resolve`'s (scenarios, topologies, workloads, bundles) and
`trainsim.traces`'s (traces); the simulator (`trainsim.sim.simulation.Simulation`) takes a resolved `Run`.
Functions that write files take their paths (``trace=``, ``out=``...) and write them completely or not at
all; ``progress`` callbacks report long work. Every bad input is a one-line `TrainsimError`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trainsim.formats.scenario import Scenario
from trainsim.formats.scenario_loader import load_scenario
from trainsim.formats.scenario_options import DEFAULT_COMPUTE_MODEL
from trainsim.resolve import Run, load_bundle, resolve, resolve_scenario
from trainsim.sim.core.result import Result
from trainsim.sim.core.window import StopFlag
from trainsim.sim.simulation import Simulation

if TYPE_CHECKING:
    from trainsim.formats.bundle import Bundle, RunMeasurements

__all__ = ["Bundle", "Run", "RunMeasurements", "Scenario", "StopFlag", "bench_collectives", "calibrate",
           "describe_model", "describe_topology", "device", "devices", "execute", "generate_workload",
           "load_bundle", "load_scenario", "max_batch", "measure_profiler", "papers", "plan",
           "profile_layers",
           "quickstart", "replay", "reproduce", "resolve", "resolve_scenario", "route", "scenario",
           "scenarios", "search", "simulate", "simulation", "sweep", "topologies", "topology", "validate",
           "version", "workload", "workload_times", "workloads"]

Progress = Callable[..., None]


def __getattr__(name: str):
    # the bundle's file models are imported when first used: a run without a bundle does not need them
    if name in ("Bundle", "RunMeasurements"):
        from trainsim.formats import bundle

        return getattr(bundle, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def version() -> str:
    """trainsim's version."""
    import trainsim

    return trainsim.__version__


# ---- simulate, max-batch, scenarios ------------------------------------------------------------------------


def simulation(
    scenario: str | os.PathLike | dict | Scenario | Run,
    *,
    calibration: str | os.PathLike | Bundle | None = None,
    overrides: Sequence[str] = (),
    variant: str | None = None,
    measurements: RunMeasurements | None = None,
    **options,
) -> Simulation:
    """A `Simulation` of ``scenario`` (a resolved Run, or what `resolve` takes: a shipped name, a YAML path,
    a mapping or a Scenario, with ``overrides``, ``variant``, ``calibration`` and ``measurements``);
    ``options`` are Simulation's keyword arguments."""
    run = scenario if isinstance(scenario, Run) else resolve(
        scenario, overrides=overrides, variant=variant, calibration=calibration, measurements=measurements)
    return Simulation(run, **options)


def simulate(
    scenario: str | os.PathLike | dict | Scenario | Run,
    *,
    calibration: str | os.PathLike | Bundle | None = None,
    overrides: Sequence[str] = (),
    variant: str | None = None,
    record: bool = True,
    stop: StopFlag | None = None,
    trace: str | None = None,
    records: str | None = None,
    chakra: str | None = None,
    provenance: dict | None = None,
) -> Result:
    """Resolve ``scenario`` (and the calibration bundle), simulate it, return the Result.

    ``record``: keep every op, flow, link-rate change and memory change (what records and traces are
    written from; on whenever a file is asked for); False keeps one record per stretch of back-to-back
    layers, enough for the Result, which is far cheaper in time and memory at scale. ``stop``: once
    requested (e.g. from a signal handler), the run ends when the next iteration has finished on every
    rank, and the Result covers the iterations done (``stopped_early``). ``trace`` (a Kineto folder or a
    Chrome file), ``records`` (CSV) and ``chakra`` (a folder of Chakra ETs) are written with
    ``provenance``."""
    record = record or bool(trace or records or chakra)
    result = simulation(scenario, calibration=calibration, overrides=overrides, variant=variant,
                        record=record, stop=stop).run()
    if trace:
        from trainsim.sim.output.kineto_ranks import write_trace

        write_trace(result, trace, provenance=provenance)
    if records:
        from trainsim.sim.output.records import write_records

        write_records(result, records)
    if chakra:
        from trainsim.traces import write_simulation_et

        write_simulation_et(result, chakra, provenance=provenance)
    return result


def max_batch(scenario: str | os.PathLike | dict | Scenario, *, overrides: Sequence[str] = (),
              variant: str | None = None, policy: str | list[str] = "all") -> dict:
    """The largest per-GPU batch of ``scenario`` that fits in GPU memory without and with activation offload
    (``policy`` where the scenario offloads nothing: all, conv or layer names), and the samples/s at each
    (`trainsim.sim.planning.max_batch`)."""
    from trainsim.sim.planning.max_batch import max_batch as search

    return search(resolve(scenario, overrides=overrides, variant=variant), policy=policy)


def scenarios() -> dict[str, str]:
    """The shipped scenarios: name -> description."""
    from trainsim.formats.scenario_loader import list_scenarios

    return list_scenarios()


def scenario(source: str | os.PathLike | dict, *, overrides: Sequence[str] = (),
             variant: str | None = None) -> Scenario:
    """The validated scenario ``source`` names, with ``overrides`` and ``variant`` applied."""
    return resolve_scenario(source, overrides, variant=variant)


# ---- sweep -------------------------------------------------------------------------------------------------


@dataclass
class SweepOutcome:
    """A sweep's report, its results file, and the Pareto front of its plot (when one was drawn)."""

    report: Any  # trainsim.sweeps.report.SweepReport
    out: str
    front: list[dict] | None = None


def sweep(spec: str | os.PathLike, *, out: str | None = None, workers: int | None = None,
          ray: str | None = None, retry_failed: bool = False, plot: str | None = None,
          axis: str = "gpu_seconds_per_sample", started: Callable[[str, str, int], None] | None = None,
          progress: Progress | None = None) -> SweepOutcome:
    """Run every point of the sweep ``spec`` not yet in its results CSV (``out``, default ``NAME.csv``),
    locally on ``workers`` processes or on Ray; with ``plot`` draw throughput against ``axis``.
    ``started(name, out, points)`` is called once the spec is read, ``progress(done, total, row)`` as points
    finish (row None: points the file already held)."""
    from trainsim.sweeps import load_spec, run_sweep
    from trainsim.sweeps.plot import check_axis, plot_sweep

    loaded = load_spec(spec)
    check_axis(axis)
    out = f"{loaded.spec.name}.csv" if out is None else out
    if started is not None:
        started(loaded.spec.name, out, len(loaded.points))
    report = run_sweep(loaded, out, workers=workers, ray=ray, retry_failed=retry_failed, progress=progress)
    front = plot_sweep(report.rows, axis, plot, title=loaded.spec.name) if plot else None
    return SweepOutcome(report, out, front)


def sweep_results_file(spec: str | os.PathLike, out: str | None) -> str:
    """The results CSV a sweep writes: ``out``, else ``NAME.csv`` for the sweep's name."""
    if out is not None:
        return out
    from trainsim.sweeps import load_spec

    return f"{load_spec(spec).spec.name}.csv"


# ---- replay ------------------------------------------------------------------------------------------------


def replay(traces: Sequence[str | os.PathLike], *, topology: str | None = None, gpu: str | None = None,
           sets: Sequence[str] = (), trace: str | None = None, chakra: str | None = None,
           provenance: dict | None = None, progress: Callable[[str], None] | None = None):
    """Replay one run's per-rank traces (Kineto, Chakra ET, or PyTorch execution traces with their Kineto
    traces) against their measured steps, and the what-if the options describe (``topology``, ``gpu``,
    ``sets``: `trainsim.sim.replay.whatif.WhatIf.from_options`); ``trace`` and ``chakra`` write the replay
    (the what-if, if any). Returns the `ReplayReport`."""
    from trainsim.sim.replay.whatif import WhatIf
    from trainsim.traces import replay_traces

    whatif = WhatIf.from_options(topology=topology, gpu=gpu, sets=sets)
    report = replay_traces(traces, whatif=whatif, progress=progress)
    if trace:
        from trainsim.sim.replay.kineto_ranks import write_trace

        write_trace(report, trace, provenance=provenance)
    if chakra:
        from trainsim.sim.replay.chakra_graph import write_replay_et

        write_replay_et(report, chakra, provenance=provenance)
    return report


# ---- topologies, workloads, devices ------------------------------------------------------------------------


def topologies() -> list[dict]:
    """The built-in topologies: name, GPU count and kind, description."""
    from trainsim.topologies.analysis import preset_rows

    return preset_rows()


def topology(source: str | os.PathLike | dict):
    """The topology ``source`` names (a preset, a YAML file, a generator mapping), loaded and every GPU's
    spec known to the device library."""
    from trainsim.sim.core.devices import check_topology_devices
    from trainsim.topologies import load_topology

    loaded = load_topology(source)
    check_topology_devices(loaded)
    return loaded


def describe_topology(source, *, png: str | None = None,
                      progress: Callable[[str], None] | None = None) -> dict:
    """Nodes, links, per-GPU injection and bisection bandwidth, the kinds of path between GPUs; with
    ``png`` the topology is drawn there too."""
    from trainsim.errors import TrainsimError
    from trainsim.topologies.analysis import describe, draw_png

    loaded = topology(source)
    desc = describe(loaded, progress=progress)
    if png:
        try:
            draw_png(loaded, png)
        except OSError as exc:
            raise TrainsimError(f"cannot write the drawing: {exc.strerror or exc}", file=png) from None
    return desc


def route(source, src: str, dst: str) -> dict:
    """The links a transfer from ``src`` to ``dst`` uses on the topology ``source`` names."""
    from trainsim.topologies.analysis import route_report

    return route_report(topology(source), src, dst)


@dataclass
class BenchOutcome:
    rows: list[dict]
    title: str


def bench_collectives(source, collective: str = "allreduce", *, algo: str = "auto", proto: str = "auto",
                      sizes: str = "1K:1G", gpus: str | None = None, method: str = "both",
                      progress: Callable[[int], None] | None = None) -> BenchOutcome:
    """nccl-tests-style rows of ``collective`` on the topology ``source`` names: per size (``sizes``:
    ``MIN:MAX[:FACTOR]`` or a comma list) and method (flow, analytic or both), time, algbw and busbw.
    ``progress(total)`` is called once with the number of rows, then with no argument after each."""
    from trainsim.errors import TrainsimError
    from trainsim.sim.collectives import ops as coll

    methods = coll.METHODS if method == "both" else (method,)
    if method != "both" and method not in coll.METHODS:
        raise TrainsimError(f"unknown method {method!r}; valid choices: both, flow, analytic", field="method")
    topo = topology(source)
    size_list = coll.parse_sizes(sizes)
    group = [g.strip() for g in gpus.split(",") if g.strip()] if gpus else None
    if progress is not None:
        progress(len(size_list) * len(methods))
    rows = coll.bench(topo, collective, size_list, algo=algo, proto=proto, gpus=group, methods=methods,
                      progress=(lambda: progress()) if progress is not None else None)
    n = len(coll.resolve_gpus(topo, group))
    title = (f"{collective} on {topo.name}, {n} GPUs, algo {algo}, proto {proto}; "
             f"busbw = algbw x {coll.bus_factor(collective, n):.3f}")
    return BenchOutcome(rows, title)


def workloads() -> list[dict]:
    """The built-in workloads' summaries."""
    from trainsim.formats.workload import list_workloads, load_workload

    return [load_workload(name).summary() for name in list_workloads()]


def workload(source: str | os.PathLike):
    """The workload ``source`` names: a built-in or a JSON file."""
    from trainsim.formats.workload import load_workload

    return load_workload(source)


def generate_workload(model: str, options: Sequence[str] = (), *, out: str | None = None):
    """An analytic workload (shapes, bytes, FLOPs; no torch) of ``model`` with ``options`` (``key=value``);
    written to ``out`` when given."""
    from trainsim.formats.workload import save_workload
    from trainsim.sim.compute.analytic_models import build_analytic, parse_options

    built = build_analytic(model, **parse_options(list(options)))
    if out:
        save_workload(built, out)
    return built


def workload_times(source: str | os.PathLike, device_name: str, batch: int = 32,
                   precision: str = "fp32", compute_model: str = DEFAULT_COMPUTE_MODEL) -> dict:
    """Per-layer forward/backward time of a workload on a device (measured, retargeted or estimated by
    ``compute_model``: roofline or kernels), with each pass's kernel class, bound, achieved rate and range. A
    precision the device has no peak for is refused as a scenario's is (TF32 or bf16 on a V100)."""
    from trainsim.sim.compute.roofline import times_report
    from trainsim.sim.core.devices import get_device

    get_device(device_name).peak(precision)
    return times_report(workload(source), device_name, batch, precision, model=compute_model)


def devices() -> list:
    """The built-in device specs."""
    from trainsim.sim.core.devices import DEVICES

    return list(DEVICES.values())


def device(name: str):
    """One device spec by name or alias."""
    from trainsim.sim.core.devices import get_device

    return get_device(name)


# ---- calibration (torch) -----------------------------------------------------------------------------------


def calibrate(model: str, *, out: str = "calibration", device: str = "auto", ranks: int | None = None,
              quick: bool = False, resume: bool = False, batch_sizes: str = "8,16,32",
              precisions: str = "fp32", progress: Callable[[str, int, int], None] | None = None) -> dict:
    """Calibrate this box into the bundle ``out`` and return its summary (`runner.summarize`).
    ``progress(text, done, total)`` follows the steps. Ctrl-C raises `CalibrationInterrupted` with a usable
    partial bundle; ``resume`` continues it."""
    from trainsim.calibrate.measure import runner

    config = runner.CalibrationConfig(model=model, out=out, device=device, ranks=ranks, quick=quick,
                                      resume=resume, batch_sizes=runner.parse_batch_sizes(batch_sizes),
                                      precisions=tuple(p.strip() for p in precisions.split(",") if p.strip()))
    runner.validate(config)  # bad input fails here, before any step
    total, done = len(config.steps), 0

    def report(step: str, detail: str) -> None:
        nonlocal done
        if detail in ("done", "done earlier (resumed)"):
            done += 1
        if progress is not None:
            progress(f"{step}: {detail}", done, total)

    if progress is not None:
        progress("calibrate", 0, total)
    return runner.summarize(runner.run_calibration(config, progress=report))


def describe_model(model: str, settings: Sequence[str] = (), *, out: str | None = None):
    """(workload, written path): per-layer shapes, bytes and FLOPs of a zoo model read off torch."""
    from trainsim.calibrate.measure.describe import describe, parse_overrides
    from trainsim.formats.workload import save_workload

    described = describe(model, **parse_overrides(list(settings or [])))
    return described, save_workload(described, out) if out else None


def profile_layers(model: str, *, device: str = "auto", batch_sizes: str = "8,16,32", repeats: int = 10,
                   warmup: int = 3, optimizer: str = "sgd", threads: int | None = None,
                   precision: str = "fp32", timing: str = "clock", settings: Sequence[str] = (),
                   out: str | None = None, progress: Callable[[str], None] | None = None):
    """(workload, written path): a zoo model's per-layer forward/backward times measured at each batch."""
    from trainsim.calibrate.measure.describe import parse_overrides
    from trainsim.calibrate.measure.layer_profile import AUTOCAST, TIMINGS
    from trainsim.calibrate.measure.layer_profile import profile_layers as measure
    from trainsim.calibrate.measure.runner import parse_batch_sizes
    from trainsim.errors import unknown_name
    from trainsim.formats.workload import save_workload

    if precision not in AUTOCAST:
        raise unknown_name("precision", precision, AUTOCAST, field="--precision")
    if timing not in TIMINGS:
        raise unknown_name("layer timing", timing, TIMINGS, field="--layer-timing")
    measured = measure(model, device, parse_batch_sizes(batch_sizes), repeats=repeats, warmup=warmup,
                       optimizer=optimizer, threads=threads, precision=precision, timing=timing,
                       progress=progress, **parse_overrides(list(settings or [])))
    return measured, save_workload(measured, out) if out else None


def measure_profiler(model: str, *, device: str = "auto", batch: int = 8, repeats: int = 20, warmup: int = 5,
                     precision: str = "fp32", optimizer: str = "sgd", settings: Sequence[str] = (),
                     progress: Callable[[str], None] | None = None):
    """What torch.profiler costs this box's host per recorded event (`profiler_cost.ProfilerCost`)."""
    from trainsim.calibrate.measure.describe import parse_overrides
    from trainsim.calibrate.measure.profiler_cost import measure_profiler_cost

    return measure_profiler_cost(model, device, batch, repeats, warmup, optimizer=optimizer,
                                 precision=precision, progress=progress,
                                 **parse_overrides(list(settings or [])))


def sweep_kernels(out: str, *, device: str = "auto", dtypes: str = "fp32,tf32,bf16,fp8",
                  classes: str = "matmul,conv,attention,memory", quick: bool = False, budget_s: float = 540.0,
                  gemm_samples: int = 0, seed: int = 0, conv_batch: int = 64, cudnn_benchmark: bool = False,
                  timing: str = "graph", progress: Callable[[str, int, int], None] | None = None) -> dict:
    """Time single kernels of every class on this box (`kernel_sweep`) into ``out``/kernels.csv (a
    trainsim.kernels/1 table) and ``out``/provenance.json; the summary. On the CPU only fp32 is timed."""
    from trainsim.calibrate.measure.kernel_cases import CLASSES, SWEEP_DTYPES, parse_list
    from trainsim.calibrate.measure.kernel_sweep import run_sweep
    from trainsim.calibrate.measure.kernel_timing import TIMINGS
    from trainsim.calibrate.measure.runner import resolve_device
    from trainsim.errors import TrainsimError, unknown_name

    names = parse_list(dtypes, SWEEP_DTYPES, "--dtypes")
    if timing not in TIMINGS:
        raise unknown_name("timing", timing, TIMINGS, field="--timing")
    kinds = parse_list(classes, tuple(CLASSES), "--classes")
    resolved = resolve_device(device)
    if resolved == "cpu":
        names = [n for n in names if n == "fp32"] or ["fp32"]
    for option, value in (("--gemm-samples", gemm_samples), ("--conv-batch", conv_batch - 1)):
        if value < 0:
            raise TrainsimError(f"must be {'>= 0' if option == '--gemm-samples' else '>= 1'}", field=option)
    return run_sweep(out, device=resolved, dtypes=names, classes=kinds, quick=quick, budget_s=budget_s,
                     gemm_samples=gemm_samples, seed=seed, conv_batch=conv_batch,
                     cudnn_benchmark=cudnn_benchmark, timing=timing, progress=progress)


# ---- execute, validate, quickstart (torch) -----------------------------------------------------------------


@dataclass
class Execution:
    """What `execute` measured: each variant's outcome and the versioned document."""

    outcomes: list
    doc: dict

    @property
    def failed(self) -> bool:
        return any(o.failed for o in self.outcomes)


def execute(scenario_source: str, *, variants: Sequence[str] = (), iterations: int | None = None,
            warmup: int | None = None, out: str | None = None, profile: str | None = None,
            provenance: dict | None = None, progress: Callable[[str], None] | None = None) -> Execution:
    """Run a scenario's variants (default all, or the scenario itself) for real with PyTorch on this box;
    variants it cannot run are skipped with the reason. ``out``: the measurements as JSON; ``profile``: a
    torch.profiler trace of each variant's last warm-up iteration in that folder."""
    from trainsim.calibrate.execute.config import load_scenario_dict
    from trainsim.calibrate.execute.executor import execution_report, run_scenario, write_measurements

    overrides = {k: v for k, v in (("iterations", iterations), ("warmup", warmup)) if v is not None}
    outcomes = run_scenario(load_scenario_dict(scenario_source), list(variants) or None, file=scenario_source,
                            progress=progress, profile_dir=profile, **overrides)
    doc = execution_report(outcomes, provenance=provenance)
    if out:
        write_measurements(doc, out)
    return Execution(outcomes, doc)


def variant_count(scenario_source: str) -> int:
    """How many runs a scenario makes (its variants, or one)."""
    from trainsim.calibrate.execute.config import load_scenario_dict, scenario_variants

    return len(scenario_variants(load_scenario_dict(scenario_source))) or 1


@dataclass
class Validation:
    """Predicted vs measured (`ValidationResult`) and the files written (name -> path)."""

    result: Any
    files: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)


def validate(scenario_source: str, calibration: str, *, variants: Sequence[str] | None = None,
             baseline: str | None = None, iterations: int | None = None, warmup: int | None = None,
             report: str | None = None, rounds: int = 1, force: bool = False,
             progress: Callable[..., None] | None = None) -> Validation:
    """Simulate each variant from the calibration bundle and execute it for real: predicted vs measured
    iteration time and speedups over ``baseline``. ``report``: a folder for report.md, a chart,
    validation.json and both traces of each variant."""
    from trainsim.calibrate.validate import report as reports
    from trainsim.calibrate.validate.run import validate as run_validation

    overrides = {k: v for k, v in (("iterations", iterations), ("warmup", warmup)) if v is not None}
    result = run_validation(scenario_source, calibration, list(variants) if variants else None, force=force,
                            report_dir=report, baseline=baseline, progress=progress, rounds=rounds,
                            **overrides)
    files = reports.write_report(result, report) if report else {}
    return Validation(result, files or {})


def quickstart_variant_count(device_name: str = "auto", variants: Sequence[str] | None = None) -> int:
    """How many variants quickstart runs on this box (for a progress bar)."""
    if variants:
        return len(variants)
    from trainsim.calibrate.measure.runner import resolve_device
    from trainsim.calibrate.validate import quickstart as qs

    return variant_count(qs.SCENARIOS[resolve_device(device_name)])


def quickstart(out: str = "trainsim-quickstart", *, device: str = "auto",
               variants: Sequence[str] | None = None, iterations: int | None = None,
               warmup: int | None = None,
               resume: bool = False, progress: Callable[..., None] | None = None) -> Validation:
    """Calibrate this box quickly, simulate the validation scenario from that bundle, execute it for real
    and write the report under ``out`` (CUDA when present, else the CPU)."""
    from trainsim.calibrate.validate import quickstart as qs

    overrides = {k: v for k, v in (("iterations", iterations), ("warmup", warmup)) if v is not None}

    def calibrating(step: str, detail: str) -> None:
        if progress is not None:
            progress(f"calibrating this box (quick): {step}: {detail}", advance=False)

    done = qs.quickstart(out, device=device, variants=list(variants) if variants else None, resume=resume,
                         progress=progress, calibration_progress=calibrating, **overrides)
    return Validation(done.validation, {**done.files, "bundle": done.calibration},
                      {"scenario_run": done.scenario})


# ---- plan, reproduce ---------------------------------------------------------------------------------------


def plan(scenario_source: str | None = None, *, workload_source: str | None = None,
         topology_source: str | None = None, batch: int | None = None, gpus: int | None = None,
         precision: str | None = None, overrides: Sequence[str] = (), simulate_plan: bool = True):
    """Each layer's spatial/hybrid decomposition for a model, machine and batch (`spatial_plan`): from a
    scenario (with ``overrides``, ``gpus``, ``precision``), or from ``workload_source``, ``topology_source``
    and ``batch``; with ``simulate_plan`` the plan and pure data parallelism are simulated too."""
    from trainsim.errors import TrainsimError
    from trainsim.sim.planning import spatial_plan

    if precision is not None and precision not in ("fp32", "tf32", "fp16", "bf16"):
        raise TrainsimError(f"unknown precision {precision!r}; valid choices: bf16, fp16, fp32, tf32",
                            field="--precision")
    if scenario_source is not None:
        if workload_source or topology_source or batch:
            raise TrainsimError("give SCENARIO or --workload/--topology/--batch, not both", field="SCENARIO")
        sets = [*overrides, *([f"gpus={gpus}"] if gpus is not None else []),
                *([f"precision={precision}"] if precision is not None else [])]
        return spatial_plan.plan_scenario(resolve(scenario_source, overrides=sets), simulate=simulate_plan)
    given = (("--workload", workload_source), ("--topology", topology_source), ("--batch", batch))
    missing = [name for name, value in given if value is None]
    if missing:
        raise TrainsimError(f"without SCENARIO, give {', '.join(missing)}", field=missing[0])
    if overrides:
        raise TrainsimError("overrides a scenario's fields, and none is given: give SCENARIO, or say it "
                            "with --workload, --topology, --batch, --gpus and --precision", field="--set")
    return spatial_plan.plan(workload(workload_source), topology(topology_source), batch, gpus,
                             precision or "fp32", simulate=simulate_plan,
                             base={"topology": topology_source, "workload": workload_source})


def papers() -> dict[str, str]:
    """The papers `reproduce` knows: key -> title."""
    from trainsim.scenarios.papers.reproduce import list_papers

    return list_papers()


def reproduce(paper: str, *, progress: Callable[[int, int, str], None] | None = None):
    """Run a paper's scenarios and set our figures beside the published ones (`Reproduction`)."""
    from trainsim.scenarios.papers.reproduce import reproduce as run

    return run(paper, progress=progress)


# ---- search ------------------------------------------------------------------------------------------------


def search(scenario_source: str | os.PathLike | None = None, *, model: str | dict | None = None,
           topology_source: str | dict | None = None, gpus: int | Sequence[int] | None = None,
           batch: int | None = None, tokens_per_step: int | None = None, precision: str | None = None,
           optimizer: str | None = None, compute_model: str | None = None, overrides: Sequence[str] = (),
           objective: str = "throughput",
           tokens: float | None = None, price: float | None = None, top: int = 10,
           collectives: str = "analytic", space=None, headroom: float = 0.0,
           progress: Callable[[str, int, int], None] | None = None, out: str | None = None,
           plot: str | None = None, plot_x: str = "memory", provenance: dict | None = None):
    """The best parallel layouts (strategy ``mesh``) of a transformer on a machine (`SearchReport`):
    every layout of ``space`` (`SearchSpace`; tp x cp x pp x ep x zero and HSDP shards x micro-batch x
    recompute x schedule x virtual stages x sequence parallelism) that the model, ``gpus`` (one count or
    several) and the global batch admit, kept where its closed-form memory peak fits the GPU
    (`trainsim.sim.parallel.memory`; ``headroom``: a fraction kept free), ranked by ``objective`` on the
    closed-form step (`trainsim.sim.parallel.analytic`); then the best ``top`` are simulated in full
    (``collectives``: analytic or flow) and ordered by the simulated figure.

    The model, machine and batch come from a scenario (``scenario_source`` with ``overrides``) or from
    ``model`` (a workload name, file or mapping such as ``{name: llama3-70b, seq_len: 8192}``),
    ``topology_source`` (a preset, file, or generator mapping) and ``batch`` (sequences) or
    ``tokens_per_step``; ``precision``, ``optimizer`` and ``compute_model`` (roofline or kernels) set the
    scenario's fields of those names. ``out`` (JSON) and ``plot`` (PNG: throughput against ``plot_x``) are
    written whole or not at all."""
    import time as _time

    from trainsim.errors import TrainsimError
    from trainsim.sim.core.devices import get_device
    from trainsim.sim.parallel import search as ps
    from trainsim.sim.parallel.analytic import LayoutTimer
    from trainsim.sim.parallel.stage_costs import ModelCosts

    def tell(phase: str, done: int, total: int) -> None:
        if progress is not None:
            progress(phase, done, total)

    counts = [gpus] if isinstance(gpus, int) else list(gpus or [])
    if any(n < 1 for n in counts):
        raise TrainsimError("a GPU count must be at least 1", field="--gpus")
    if collectives not in ("analytic", "flow"):
        raise TrainsimError(f"unknown collectives {collectives!r}; valid choices: analytic, flow",
                            field="--collectives")
    if top < 0:
        raise TrainsimError("--top must be >= 0", field="--top")
    if not 0 <= headroom < 1:
        raise TrainsimError(f"headroom is a fraction of the GPU's memory in [0, 1), got {headroom}",
                            field="--headroom")
    if scenario_source is not None:
        if model is not None or topology_source is not None:
            raise TrainsimError("give SCENARIO or --model/--topology, not both", field="SCENARIO")
        sets = [*overrides, *([f"precision={precision}"] if precision else []),
                *([f"optimizer.name={optimizer}"] if optimizer else []),
                *([f"compute_model={compute_model}"] if compute_model else [])]
        if batch is not None:
            sets.append(f"batch_size={batch}")
        base = resolve(scenario_source, overrides=sets)
    else:
        given = (("--model", model), ("--topology", topology_source))
        missing = [name for name, value in given if value is None]
        if missing:
            raise TrainsimError(f"without SCENARIO, give {' and '.join(missing)}", field=missing[0])
        if overrides:
            raise TrainsimError("overrides a scenario's fields, and none is given", field="--set")
        doc = {"name": "search", "topology": _mapping_or_name(topology_source, "--topology", "topology"),
               "workload": _mapping_or_name(model, "--model", "workload"),
               "strategy": {"name": "mesh"}, "batch_size": batch or 1,
               "precision": precision or "bf16", "optimizer": {"name": optimizer or "adam"},
               **({"compute_model": compute_model} if compute_model else {})}
        base = resolve(doc)
    cfg = ps.transformer_config_of(base.workload)
    seq = cfg["seq_len"]
    if tokens_per_step is not None:
        if batch is not None:
            raise TrainsimError("give --batch or --tokens-per-step, not both", field="--tokens-per-step")
        if tokens_per_step % seq:
            raise TrainsimError(f"{tokens_per_step} tokens per step is not a whole number of {seq}-token "
                                "sequences", field="--tokens-per-step")
        batch = tokens_per_step // seq
    elif batch is None:
        if scenario_source is None:
            raise TrainsimError("give --batch (sequences per step) or --tokens-per-step", field="--batch")
        batch = base.scenario.batch_size
    available = len(base.topology.gpus)
    counts = counts or [len(base.ranks)]
    for n in counts:
        if n > available:
            raise TrainsimError(f"{n} GPUs asked for; the topology has {available}", field="--gpus")
    device = get_device(base.topology.gpu_spec(base.topology.gpus[0]))
    if base.devices:
        device = base.devices.get(device.name, device)
    objective_ = ps.Objective(objective, tokens=tokens, price=price, tdp_watts=device.tdp_watts)
    sc = base.scenario
    costs = ModelCosts(base.workload, device, sc.precision, sc.optimizer.name, sc.mixed_precision,
                       sc.compute_model)
    per_machine = ps.gpus_per_machine(base.topology)
    space = space or ps.SearchSpace()
    targets, runs = [], {}
    for n in counts:
        scenario = sc.model_copy(update={"gpus": n, "batch_size": batch, "batch_per_gpu": None})
        runs[n] = base.with_scenario(scenario)
        timer = LayoutTimer(costs, base.topology, runs[n].ranks, batch, algo=sc.strategy.collective_algo,
                            interference=sc.comm_interference)
        targets.append((n, costs, timer, base.topology.gpu_memory(runs[n].ranks[0])))
    ranking = ps.rank_layouts(targets, batch, batch * seq, space, objective_, gpus_per_machine=per_machine,
                              headroom=headroom, progress=lambda d, t: tell("ranking", d, t))
    if not ranking.enumerated:
        raise TrainsimError(ps.no_layout_reason(costs, counts, batch, space, per_machine), field="--gpus")
    notes = []
    start = _time.perf_counter()
    chosen = ranking.candidates[:top]
    for i, cand in enumerate(chosen):
        tell("simulating", i, len(chosen))
        strategy = sc.strategy.model_validate(
            {"name": "mesh", "collectives": collectives, "mesh": cand.layout.mesh_options()})
        scenario = sc.model_copy(update={"gpus": cand.gpus, "batch_size": batch, "batch_per_gpu": None,
                                         "strategy": strategy, "iterations": 1, "warmup_iterations": 0})
        result = simulate(runs[cand.gpus].with_scenario(scenario), record=False)
        cand.simulated_step_s = result.iteration_time_s
        cand.simulated_memory = max(g.memory_peak_bytes for g in result.gpus)
        cand.simulated_oom = bool(result.oom)
        cand.simulated_figures = objective_.figures(cand.gpus, batch * seq, result.iteration_time_s)
    tell("simulating", len(chosen), len(chosen))
    chosen.sort(key=lambda c: (bool(c.simulated_oom), objective_.score(c.simulated_figures or c.figures)))
    if objective_.tdp_watts and objective_.tokens:
        notes.append(f"energy is an upper bound: {len(counts) > 1 and 'each' or 'the'} GPU count x "
                     f"{objective_.tdp_watts:g} W rated board power ({device.name}) x time; GPUs seldom draw "
                     "their rated power throughout")
    report = ps.SearchReport(model=base.workload.name, device=device.name, gpus=counts, batch=batch,
                             seq_len=seq, objective=objective_, ranking=ranking, top=chosen,
                             simulate_seconds=_time.perf_counter() - start, collectives=collectives,
                             notes=notes)
    if out:
        ps.write_report({**report.to_dict(), "provenance": provenance or {}}, out)
    if plot and ranking.candidates:
        ps.plot_search(report, plot, plot_x)
    return report


def _mapping_or_name(value, option: str, what: str):
    """A name, a file, or (text starting with ``{``) an inline YAML mapping."""
    if isinstance(value, dict) or not str(value).lstrip().startswith("{"):
        return value
    from trainsim.yamlio import parse_yaml_mapping

    return parse_yaml_mapping(str(value), option, what)
