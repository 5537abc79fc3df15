"""Predicted vs measured: simulate a scenario's variants from a calibration bundle and execute them for real.

    from trainsim.calibrate.validate.run import validate
    result = validate("validate-cpu", "calibration/", report_dir="report/")
    for row in result.rows: print(row.variant, row.predicted_s, row.measured_s, row.error_pct)

Per variant: the simulator predicts the iteration time on the bundle's topology with the bundle's measured
workload (its per-layer times on this box) and the per-sample cost of the variant's own input pipeline
(measured here, the transforms the executor runs); the executor (`executor.run`) trains it for real. The
row then carries the error of the prediction and the speedup over the baseline variant, both ways.

A variant the box cannot run is *skipped* (the executor's reason); one the simulator cannot model is
*not simulated* (its one-line reason) but still measured; a run that crashed is *failed*. A bundle made on
another machine (device names or cores in its meta/machine files differ from this box's) is refused unless
``force``. With ``report_dir``, the rows so far are written after every variant (``validation.json``), so an
interrupted run keeps them.

It stays one module: per variant it measures, predicts, compares and writes the partial result, and
the bundle checks that gate the loop belong to it.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from trainsim.calibrate.validate.results import (
    RESULT_FILE,
    TRACES,
    Progress,
    ValidationInterrupted,
    ValidationResult,
    ValidationRow,
    compare,
    percent_error,
)
from trainsim.errors import TrainsimError, unknown_name
from trainsim.sim.hosts.rank_step import rank_data_in_loop_s

#: measured peaks the simulated per-GPU peak is compared with (a CPU rank's resident-set growth is not: it
#: counts the interpreter and allocator caches, and reads low when a process is reused)
COMPARABLE_MEMORY = ("cuda.max_memory_allocated", "cpu.allocator_peak")

# ---------------------------------------------------------------- is the bundle from this machine?


def this_machine(device: str) -> dict:
    """This box as a bundle records it: device names (CPU model or GPU names) and, on CPU, the cores."""
    if device == "cuda":
        import torch

        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        return {"devices": names}
    from trainsim.calibrate.measure.topo_probe import host_probe

    host = host_probe()
    return {"devices": [host.get("cpu_model") or "cpu"], "cores": host["cores"]}


def machine_mismatch(bundle, here: dict) -> str | None:
    """Why ``bundle`` was not calibrated on the machine ``here`` describes (None: it was)."""
    recorded = bundle.meta.provenance.get("devices")
    if recorded is not None and list(recorded) != list(here["devices"]):
        return (f"it was calibrated on {', '.join(map(str, recorded))}; this machine has "
                f"{', '.join(here['devices'])}")
    cores = bundle.machine.cpu.cores if bundle.machine is not None else None
    if bundle.meta.config.get("device") == "cpu" and cores and here.get("cores") and cores != here["cores"]:
        return f"it was calibrated with {cores} CPU cores; this machine gives {here['cores']}"
    return None


def check_bundle(calibration_dir: str | os.PathLike, *, force: bool = False, here: dict | None = None):
    """Load the bundle (one-line error if corrupt or incomplete for simulation) and check it is this box's.

    Returns (bundle, notes); a bundle from another machine raises TrainsimError unless ``force``."""
    from trainsim.resolve import load_bundle

    bundle = load_bundle(calibration_dir)
    missing = [what for what, part in (("topology.yaml", bundle.topology), ("a workload", bundle.workload))
               if part is None]
    if missing:
        raise TrainsimError(f"the bundle has no {' and no '.join(missing)} (status {bundle.meta.status}); "
                            "finish it with `trainsim calibrate --resume`", file=str(calibration_dir))
    device = bundle.meta.config.get("device", "cpu")
    notes = []
    why = machine_mismatch(bundle, here if here is not None else this_machine(device))
    if why:
        if not force:
            raise TrainsimError(f"calibration bundle from another machine: {why}; calibrate this one, or "
                                "give --force to compare anyway", file=str(calibration_dir))
        notes.append(f"--force: bundle from another machine ({why})")
    if bundle.meta.status != "complete":
        notes.append(f"the bundle is {bundle.meta.status}: steps done {', '.join(bundle.meta.steps_done)}")
    return bundle, notes


# ---------------------------------------------------------------- the two sides


def workload_mismatch(bundle, cfg) -> str | None:
    """Why the bundle's measured workload is not the model ``cfg`` trains (None: it is): another model, or
    the same model with other options (image size, classes, ...), would be predicted from the wrong layers."""
    from trainsim.calibrate.zoo import model_config

    workload = bundle.workload
    if workload.name != cfg.model:
        return (f"the bundle measured {workload.name}, not {cfg.model}; calibrate {cfg.model} into its own "
                "bundle to validate this variant")
    measured = getattr(workload.provenance, "config", None)
    wanted = model_config(cfg.model, **cfg.model_cfg)
    if isinstance(measured, dict) and any(measured.get(k) != v for k, v in wanted.items() if k in measured):
        diff = ", ".join(f"{k} {measured.get(k)} (runs {v})" for k, v in wanted.items()
                         if k in measured and measured.get(k) != v)
        return f"the bundle measured {cfg.model} with {diff}"
    return None


def input_prep_seconds(cfg, batches: int = 6) -> float:
    """CPU seconds to prepare one input sample exactly as the executor's pipeline does for ``cfg`` (decode,
    ``augment_repeats`` crop/flip/normalise passes, the batch stacked), on this core: what the simulator's
    data workers cost. Whole batches of the per-rank size are timed, as the training loop asks for them, with
    the torch threads a rank has (normalising is a torch op: two threads would halve it), and the median
    batch is divided by its size."""
    import torch

    from trainsim.calibrate.execute.datapipe import SyntheticSource

    source = SyntheticSource(cfg.model, cfg.model_cfg, cfg.data, seed=cfg.seed)
    size = max(1, cfg.local_batch)
    threads = torch.get_num_threads()
    if cfg.device == "cpu" and cfg.cores_per_rank:
        torch.set_num_threads(cfg.cores_per_rank)  # a rank's torch ops get its cores' threads, no more
    elif cfg.device == "cuda" and cfg.data.workers and not cfg.optimizations.preload:
        torch.set_num_threads(1)  # a DataLoader worker process runs torch with one thread
    try:
        source.batch(0, range(size), size)  # first-touch warm-up
        times = []
        for it in range(1, batches + 1):
            start = time.perf_counter()
            source.batch(it, range(size), size)
            times.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return statistics.median(times) / size


def predict(scenario: str, variant: str | None, calibration: str, *, prep_s_per_sample: float | None = None,
            loader_overlap: dict | None = None, codec_s: float | None = None,
            trace_path: Path | None = None, provenance: dict | None = None):
    """Simulate ``variant`` from the bundle, which carries what was measured for this variant here (its input
    pipeline, the preload thread's interference, the hook's cost); returns the Result (TrainsimError if it
    cannot be modelled)."""
    from trainsim.formats.bundle import RunMeasurements
    from trainsim.resolve import resolve
    from trainsim.sim.simulation import Simulation

    # the bundle measured the default pipeline; this variant's executor data config may cost more
    measured = RunMeasurements(prep_s_per_sample=prep_s_per_sample, loader_overlap=loader_overlap,
                               codec_s=codec_s)
    result = Simulation(resolve(scenario, variant=variant, calibration=calibration,
                                measurements=measured)).run()
    if trace_path is not None:
        from trainsim.sim.output.chrome_trace import write_chrome_trace

        write_chrome_trace(result, trace_path, provenance=provenance)
    return result


# ---------------------------------------------------------------- the loop


def _write(result: ValidationResult, report_dir: Path | None, provenance: dict | None) -> None:
    if report_dir is None:
        return
    import json

    from trainsim.calibrate.measure.bundle import write_atomic

    write_atomic(report_dir / RESULT_FILE,
                 json.dumps(result.to_dict(provenance=provenance), indent=1, default=str) + "\n")


def _scenario_label(scenario: str) -> str:
    return Path(scenario).stem if scenario.endswith((".yaml", ".yml")) else scenario


def validate(scenario: str, calibration_dir: str | os.PathLike, variants: list[str] | None = None, *,
             force: bool = False, report_dir: str | os.PathLike | None = None,
             progress: Progress | None = None, baseline: str | None = None, execute: bool = True,
             here: dict | None = None, rounds: int = 1, **overrides) -> ValidationResult:
    """Simulate and execute ``variants`` (default: all) of ``scenario``; compare them.

    ``rounds``: execute every variant that many times, round-robin (all variants, then all again, ...), and
    take the mean over the pooled iterations: on a shared box a core's speed drifts over seconds and
    minutes, and spreading each variant's runs over the whole session keeps a slow spell from
    landing on one variant only. On a CPU box each round after the first measures the bundle's rank step
    and gloo calls (`refresh_bundle`), the variants' other input pipelines and the preload thread's
    interference again and predicts that round from them, so the prediction sees the box the round runs on;
    predictions are pooled like measurements.

    ``overrides`` are ExecConfig fields for the real runs (e.g. ``iterations=3, warmup=2``); ``baseline``
    defaults to the first variant; ``execute=False`` predicts only. With ``report_dir`` the rows are written
    there as they finish, with the simulated trace and a torch.profiler trace of one real iteration per
    variant (the markdown report and chart come from `report.write_report`)."""
    from trainsim.calibrate.execute.config import (
        exec_config_from_scenario,
        infeasible_reason,
        load_scenario_dict,
        scenario_variants,
    )
    from trainsim.calibrate.execute.executor import run as execute_config
    from trainsim.provenance import provenance as make_provenance

    progress = progress or (lambda text: None)
    if not isinstance(rounds, int) or rounds < 1:
        raise TrainsimError(f"must be a positive integer, got {rounds!r}", field="rounds")
    calibration = str(calibration_dir)
    bundle, notes = check_bundle(calibration, force=force, here=here)
    data = load_scenario_dict(scenario)
    known = scenario_variants(data)
    names = list(variants) if variants else known
    if not names:
        raise TrainsimError("the scenario has no variants to compare", file=scenario, field="variants")
    for name in names:
        if name not in known:
            raise unknown_name("variant", name, known, file=scenario, field="variants")
    if baseline is None:
        baseline = names[0]
    elif baseline not in names:
        raise unknown_name("baseline variant", baseline, names, file=scenario, field="baseline")
    if bundle.meta.config.get("device", "cpu") == "cpu" and bundle.machine is not None:
        # every rank gets the cores one calibrated device had (a single rank too, not the whole box): the
        # simulator's devices are those; free cores are the host's, where background data workers run
        overrides = {"cores_per_rank": bundle.machine.cpu.threads_per_rank, **overrides}
    configs = {name: exec_config_from_scenario(data, name, file=scenario, **overrides) for name in names}
    mismatched = {name: workload_mismatch(bundle, cfg) for name, cfg in configs.items()}
    bundle_device = bundle.meta.config.get("device", "cpu")
    for name, cfg in configs.items():
        if cfg.device != bundle_device:
            raise TrainsimError(f"variant {name} executes on {cfg.device} but the bundle calibrated "
                                f"{bundle_device}; use the scenario for {bundle_device} boxes", file=scenario,
                                field=f"variants.{name}")
    out = Path(report_dir) if report_dir is not None else None
    if out is not None:
        try:
            (out / TRACES).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TrainsimError(f"cannot create the report folder: {exc.strerror}", file=str(out)) from None
    prov = make_provenance(timestamp=True, scenario=scenario, calibration=calibration, variants=names,
                           overrides=overrides, devices=bundle.meta.provenance.get("devices"))
    result = ValidationResult(scenario=_scenario_label(scenario), calibration=calibration, baseline=baseline,
                              device=bundle_device, status="running", notes=notes,
                              rows=[ValidationRow(n, c.strategy, c.ranks) for n, c in configs.items()])
    # before any real run, so no rank exiting skews them
    _measured_costs(result.rows, configs, mismatched, in_loop=rank_data_in_loop_s(bundle.workload, 1) > 0)
    _write(result, out, prov)
    scratch = tempfile.TemporaryDirectory(prefix="trainsim-rounds-") if rounds > 1 and execute else None
    work = Path(scratch.name) if scratch is not None else None
    try:
        for row in result.rows:
            row.not_simulated = mismatched[row.variant]
            _one_variant(row, scenario, calibration, configs[row.variant], out, progress, execute,
                         infeasible_reason, execute_config)
            compare(result.rows, baseline)
            _write(result, out, prov)
        for k in range(1, rounds if execute else 1):
            progress(f"rank step and gloo calls (round {k + 1} of {rounds}): measuring this box again")
            fresh = refresh_bundle(calibration, work / f"round-{k + 1}") if work is not None else None
            if fresh is not None:  # the other pipelines and the preload thread's interference too
                _measured_costs(result.rows, configs, mismatched, in_loop=True)
            for row in result.rows:
                if row.measured_rounds == k:  # measured in every round so far
                    progress(f"{row.variant} (round {k + 1} of {rounds}): executing again")
                    if fresh is not None and row.predicted_iterations_s:
                        _predict_again(row, scenario, fresh)
                    _measure(row, configs[row.variant], execute_config)
                    compare(result.rows, baseline)
                    _write(result, out, prov)
    except KeyboardInterrupt:
        result.status = "interrupted"
        compare(result.rows, baseline)
        _write(result, out, prov)
        if out is not None:  # the report of what finished, too
            from trainsim.calibrate.validate.report import write_report

            write_report(result, out)
        raise ValidationInterrupted(result, str(out / RESULT_FILE) if out else None) from None
    finally:
        if scratch is not None:
            scratch.cleanup()
    result.status = "complete"
    compare(result.rows, baseline)
    _write(result, out, prov)
    return result


def _measured_costs(rows: list[ValidationRow], configs: dict, mismatched: dict, in_loop: bool) -> None:
    """What each row's run costs on this box beyond the bundle, measured once per distinct config. The input
    pipeline's cost per sample, per data config and batch size: the median batch, as the executor's median
    iteration sees it. ``in_loop``: the bundle's rank step
    measured the default pipeline inside the training loop, spread over its rounds; rows on that pipeline
    leave it to the simulator (None) rather than time a few batches back to back here, which on a shared
    box read anywhere in 1-2x of each other seconds apart. For CPU preload: how the loader thread and the
    step slow each other; for a DDP comm hook on CPU ranks: what it costs per step (`codec_cost`)."""
    from trainsim.calibrate.execute.config import DataConfig

    cache: dict = {}
    for row in rows:
        cfg = configs[row.variant]
        if mismatched[row.variant]:
            continue
        key = (cfg.model, tuple(sorted(cfg.model_cfg.items())), cfg.data, cfg.seed, cfg.local_batch)
        if not (in_loop and dataclasses.replace(cfg.data, workers=DataConfig.workers) == DataConfig()):
            if key not in cache:
                cache[key] = input_prep_seconds(cfg)
            row.prep_s_per_sample = cache[key]
        if cfg.device == "cpu" and cfg.optimizations.preload and cfg.data.workers:
            # the executor's CPU preload is a thread of the rank's own process: measure how they interfere
            from trainsim.calibrate.execute.rank_step import measure_loader_overlap

            if ("loader",) + key not in cache:
                cache[("loader",) + key] = measure_loader_overlap(
                    cfg.model, cfg.local_batch, cfg.data, options=cfg.model_cfg,
                    threads_per_rank=cfg.cores_per_rank or 1)
            row.loader_overlap = cache[("loader",) + key]
        if cfg.device == "cpu" and cfg.optimizations.param_compression != "none":
            # a comm hook's small tensor ops cost their dispatch on a CPU rank, not their FLOPs: measure it
            from trainsim.calibrate.execute.codec_cost import measure_hook_cost

            if ("codec",) + key + (cfg.optimizations,) not in cache:
                cache[("codec",) + key + (cfg.optimizations,)] = measure_hook_cost(cfg)
            row.codec_s = cache[("codec",) + key + (cfg.optimizations,)]


def refresh_bundle(calibration: str, into: Path) -> str | None:
    """A copy of the bundle (in ``into``) whose CPU rank step (`rank_step`) and gloo calls (collectives and
    timer tick, where it has them) are measured again now; None when the bundle has no rank step record
    (GPUs, an older bundle). On a shared machine a core's speed drifts by 15-30 % over minutes, and how
    often gloo calls stall with it: a round of real runs is predicted from the box as it is at that round."""
    import shutil

    from trainsim.calibrate.execute.rank_step import measure_rank_step, rank_step_record
    from trainsim.formats.workload import load_workload, save_workload

    files = sorted(Path(calibration).glob("workload-*.json"))
    if len(files) != 1:
        return None
    workload = load_workload(files[0])
    record = workload.provenance.rank_step
    if not record or not record.points:
        return None
    batches = [p.batch for p in record.points]
    ranks, threads = record.ranks, record.threads_per_rank
    points = measure_rank_step(workload.name, batches, ranks, threads_per_rank=threads,
                               options=dict(workload.provenance.config or {}))
    shutil.copytree(calibration, into)
    record = rank_step_record(points, ranks, threads)
    provenance = workload.provenance.model_copy(update={"rank_step": record})
    save_workload(workload.model_copy(update={"provenance": provenance}), into / files[0].name)
    _refresh_gloo_calls(into)
    return str(into)


def _refresh_gloo_calls(bundle: Path) -> None:
    """Measure the bundle's gloo collectives and timer tick again, in place (how often a call stalls drifts
    with the box)."""
    from trainsim.calibrate.measure import bundle as bf
    from trainsim.calibrate.measure.runner import measure_collectives_doc

    if not (bundle / bf.COLLECTIVES).is_file() or not (bundle / bf.META).is_file():
        return
    old = bf.read_file(bundle / bf.COLLECTIVES, bf.CollectivesFile)
    config = bf.read_file(bundle / bf.META, bf.MetaFile).config
    if old.backend != "gloo" or old.world_size < 2 or not old.results or not config.get("model"):
        return
    doc, _ = measure_collectives_doc("cpu", old.world_size, model=config["model"],
                                     batch_sizes=config.get("batch_sizes") or [32],
                                     quick=bool(config.get("quick")),
                                     model_options=config.get("model_options"))
    bf.write_json(bundle / bf.COLLECTIVES, doc.model_dump(by_alias=True, mode="json"))


def _predict_again(row: ValidationRow, scenario: str, calibration: str) -> None:
    """Pool another round's prediction (from the re-measured bundle) with the earlier ones."""
    try:
        predicted = predict(scenario, row.variant, calibration, prep_s_per_sample=row.prep_s_per_sample,
                            loader_overlap=row.loader_overlap, codec_s=row.codec_s)
    except TrainsimError:
        return  # it was simulated in round 1; keep that
    row.predicted_iterations_s += list(predicted.iteration_times_s)
    row.predicted_s = float(np.mean(row.predicted_iterations_s))


def _measure(row: ValidationRow, cfg, execute_config) -> None:
    """One more real run of ``row``'s variant, pooled with the earlier rounds (a crash marks it failed)."""
    try:
        measured = execute_config(cfg)
    except TrainsimError as exc:  # one variant's crash does not lose the others
        row.failed = str(exc)
        return
    k = row.measured_rounds
    row.measured_iterations_s += list(measured.iteration_s)
    row.measured_round_means_s.append(float(np.mean(measured.iteration_s)))
    q1, q3 = np.percentile(row.measured_iterations_s, [25, 75])
    row.measured_s, row.measured_iqr_s = float(np.mean(row.measured_iterations_s)), float(q3 - q1)
    row.measured_breakdown_s = {phase: (row.measured_breakdown_s.get(phase, 0.0) * k + seconds) / (k + 1)
                                for phase, seconds in measured.breakdown_s.items()}
    row.measured_rounds = k + 1
    peak = max(measured.peak_memory_bytes, default=None)
    if peak is not None and (row.measured_peak_memory_bytes is None or peak > row.measured_peak_memory_bytes):
        row.measured_peak_memory_bytes = int(peak)
    row.memory_measure = measured.memory_measure
    if measured.memory_measure in COMPARABLE_MEMORY:
        row.memory_error_pct = percent_error(row.predicted_peak_memory_bytes, row.measured_peak_memory_bytes)


def _one_variant(row: ValidationRow, scenario: str, calibration: str, cfg, out: Path | None,
                 progress: Progress, execute: bool, infeasible_reason, execute_config) -> None:
    name = row.variant
    row.skipped = infeasible_reason(cfg)
    progress(f"{name}: simulating")
    try:
        if row.not_simulated:
            raise TrainsimError(row.not_simulated)
        sim_trace = (Path(TRACES) / f"{name}.sim.json.gz") if out is not None else None
        predicted = predict(scenario, name, calibration, prep_s_per_sample=row.prep_s_per_sample,
                            loader_overlap=row.loader_overlap, codec_s=row.codec_s,
                            trace_path=out / sim_trace if sim_trace else None)
        row.predicted_iterations_s = list(predicted.iteration_times_s)
        row.predicted_s = float(np.mean(predicted.iteration_times_s))
        row.predicted_breakdown_s = dict(predicted.breakdown_s)
        row.predicted_peak_memory_bytes = int(max((g.memory_peak_bytes for g in predicted.gpus), default=0))
        row.sim_trace = str(sim_trace) if sim_trace else None
    except TrainsimError as exc:
        row.not_simulated = str(exc)
    if row.skipped or not execute:
        return
    progress(f"{name}: executing ({cfg.strategy}, {cfg.ranks} rank(s), {cfg.device})")
    real_trace = (Path(TRACES) / f"{name}.torch") if out is not None else None
    if real_trace is not None:
        cfg = dataclasses.replace(cfg, profile_trace=str(out / real_trace))
    _measure(row, cfg, execute_config)
    if real_trace is not None:
        rank0 = out / f"{real_trace}.rank0.json"
        row.real_trace = str(rank0.relative_to(out)) if rank0.is_file() else None
