"""``trainsim calibrate``: run the calibration steps in order and write the bundle as they finish.

Steps (each writes its files atomically, then records itself in meta.json):

    probe        machine.json (host, GPUs, GEMM FLOP/s per core), topology.yaml (the probed skeleton)
    links        links.json; topology.yaml calibrated with the fits; machine.json's memory bandwidth
    collectives  collectives.json (N ranks: NCCL on GPUs, gloo on CPU ranks)
    data         the host data path: seconds to prepare one sample, cores available (in meta.json)
    layers       workload-<model>.json (per-layer times at each batch size, bytes, FLOPs)
    rank_step    CPU ranks: the whole step in pinned rank processes, alone and all at once (into the workload)

``resume=True`` skips the steps meta.json lists as done (their files must still be there) provided the
bundle was made with the same options. Ctrl-C (KeyboardInterrupt) stops after writing meta.json with
status "partial": what finished is a usable bundle and ``--resume`` picks up from there.

It stays one module: the calibration steps share one run's state (the bundle folder, the steps done,
resume and Ctrl-C), and each step is a short function over its measuring module.
"""

from __future__ import annotations

import datetime as _dt
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trainsim.calibrate.measure import bundle as bf
from trainsim.errors import TrainsimError, unknown_name
from trainsim.formats.bundle import COLLECTIVES_SCHEMA, CollectiveRecord, CollectivesFile, TimerTick
from trainsim.provenance import provenance

STEPS = ("probe", "links", "collectives", "data", "layers", "rank_step")
DEVICES = ("auto", "cpu", "cuda")
# Options that change what a step measures: a resumed run must use the same ones.
_RESUME_KEYS = ("model", "device", "ranks", "quick", "batch_sizes")
#: precisions the layers can be measured in (the executor's autocast dtypes)
PRECISIONS = ("fp32", "bf16", "fp16")

Progress = Callable[[str, str], None]  # (step, detail)


class CalibrationInterrupted(Exception):
    """Ctrl-C during a run; the partial bundle is in ``path``."""

    def __init__(self, path: Path, steps_done: list[str]):
        self.path = path
        self.steps_done = steps_done
        super().__init__(
            f"interrupted; partial bundle in {path} (steps done: {', '.join(steps_done) or 'none'});"
            " rerun with --resume to continue"
        )


@dataclass
class CalibrationConfig:
    """What to calibrate and where to write it. Validated on construction; errors name the option."""

    model: str
    out: Path = Path("calibration")
    device: str = "auto"
    batch_sizes: tuple[int, ...] = (8, 16, 32)
    ranks: int | None = None
    quick: bool = False
    resume: bool = False
    steps: tuple[str, ...] = STEPS
    repeats: int | None = None  # per-layer timing repeats (None: the profiler's default for quick/full)
    model_options: dict = field(default_factory=dict)  # zoo options of the model, e.g. {"image_size": 128}
    # the layers are measured in each (fp32 always first; bf16/fp16 under autocast, a workload file each)
    precisions: tuple[str, ...] = ("fp32",)

    def __post_init__(self):
        self.out = Path(self.out)
        self.batch_sizes = tuple(int(b) for b in self.batch_sizes)
        if not self.batch_sizes or any(b < 1 for b in self.batch_sizes):
            raise TrainsimError(
                f"batch sizes must be positive integers, got {list(self.batch_sizes)}", field="--batch-sizes"
            )
        if self.device not in DEVICES:
            raise unknown_name("device", self.device, DEVICES, field="--device")
        if self.ranks is not None and self.ranks < 1:
            raise TrainsimError(f"must be >= 1, got {self.ranks}", field="--ranks")
        for step in self.steps:
            if step not in STEPS:
                raise unknown_name("step", step, STEPS, field="steps")
        for precision in self.precisions:
            if precision not in PRECISIONS:
                raise unknown_name("precision", precision, PRECISIONS, field="--precisions")
        self.precisions = ("fp32",) + tuple(p for p in dict.fromkeys(self.precisions) if p != "fp32")


def parse_batch_sizes(text: str) -> tuple[int, ...]:
    """``"8,16,32"`` -> (8, 16, 32); one line naming the option otherwise."""
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise TrainsimError(
            f"expected comma-separated integers such as 8,16,32, got {text!r}", field="--batch-sizes"
        ) from None
    if not sizes or any(b < 1 for b in sizes):
        raise TrainsimError(f"batch sizes must be positive integers, got {text!r}", field="--batch-sizes")
    return sizes


def resolve_device(requested: str) -> str:
    """ "auto" -> cuda when a GPU is visible, else cpu; "cuda" without a GPU is an error."""
    import torch

    if requested not in DEVICES:
        raise unknown_name("device", requested, DEVICES, field="--device")
    has_cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
    if requested == "cuda" and not has_cuda:
        raise TrainsimError(
            "cuda requested but no CUDA GPU is available to torch "
            f"(torch {torch.__version__}, built with CUDA {torch.version.cuda})",
            field="--device",
        )
    if requested == "auto":
        return "cuda" if has_cuda else "cpu"
    return requested


def default_ranks(device: str) -> int:
    """One rank per GPU; on the CPU one per core, at least 2 (collectives need two) and at most 8."""
    if device == "cuda":
        import torch

        return torch.cuda.device_count()
    return min(8, max(2, len(os.sched_getaffinity(0))))


def check_model(name: str) -> str:
    """The zoo's canonical name of ``name``; unknown names list the valid ones."""
    from trainsim.calibrate import zoo

    return zoo.canonical_name(name)


def check_writable(out: Path) -> None:
    """Create the output folder and prove a file can be written there (one line if not). A folder that
    holds files but no bundle (no meta.json) is refused: a calibration would scatter its files among them."""
    if out.is_dir() and not (out / bf.META).exists():
        others = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
        if others:
            shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
            raise TrainsimError(f"the folder holds files that are not a calibration bundle ({shown}); give a "
                                "new or empty folder",
                                file=str(out), field="--out")
    from trainsim.files import cannot_create_in

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TrainsimError(
            f"cannot write to the output folder: {exc.strerror or exc}", file=str(out), field="--out"
        ) from None
    why = cannot_create_in(out)
    if why:
        raise TrainsimError(f"cannot write to the output folder: {why}", file=str(out), field="--out")


@dataclass
class _Run:
    """The state a step sees: the configuration, the resolved device and what earlier steps found."""

    config: CalibrationConfig
    device: str
    ranks: int
    meta: dict
    progress: Progress

    @property
    def out(self) -> Path:
        return self.config.out

    def step_results(self, step: str) -> dict:
        return self.meta["steps_done"].get(step, {}).get("results", {})


def validate(config: CalibrationConfig) -> tuple[str, int]:
    """Check what can be checked before measuring anything; return the resolved (device, ranks).

    Unknown model, unknown device, cuda without a GPU, more ranks than GPUs (or, on the CPU, than cores), an
    unwritable output folder: each a TrainsimError naming the option. Normalises ``config.model`` to the
    zoo's name.
    """
    config.model = check_model(config.model)
    device = resolve_device(config.device)
    ranks = config.ranks or default_ranks(device)
    if device == "cuda":
        import torch

        if ranks > torch.cuda.device_count():
            raise TrainsimError(
                f"{ranks} ranks requested but only {torch.cuda.device_count()} GPUs are visible",
                field="--ranks",
            )
    elif config.ranks and config.ranks > len(os.sched_getaffinity(0)):
        raise TrainsimError(f"{config.ranks} CPU ranks on {len(os.sched_getaffinity(0))} cores: each rank is "
                            "pinned to its own core", field="--ranks")
    check_writable(config.out)
    return device, ranks


def run_calibration(config: CalibrationConfig, progress: Progress | None = None) -> Path:
    """Run the calibration described by ``config``; return the bundle folder.

    Raises TrainsimError for bad input and CalibrationInterrupted on Ctrl-C (after saving meta.json).
    """
    progress = progress or (lambda step, detail: None)
    device, ranks = validate(config)
    settings = {
        **asdict(config),
        "out": str(config.out),
        "device": device,
        "ranks": ranks,
        "batch_sizes": list(config.batch_sizes),
        "steps": list(config.steps),
    }
    if not config.resume:
        _clear_bundle(config.out)
    meta = _start_meta(config, settings)
    run = _Run(config=config, device=device, ranks=ranks, meta=meta, progress=progress)
    try:
        for step in config.steps:
            if step in meta["steps_done"]:
                progress(step, "done earlier (resumed)")
                continue
            progress(step, "starting")
            began = time.perf_counter()
            try:
                files, results, notes = _STEP_FUNCTIONS[step](run)
            except ImportError as exc:  # a measurement module this installation lacks
                raise TrainsimError(f"the {step} step cannot run: {exc}", field=step) from None
            meta["steps_done"][step] = {
                "files": files,
                "seconds": round(time.perf_counter() - began, 3),
                "finished": _now(),
                "results": results,
                "notes": notes,
            }
            _write_meta(config.out, meta)
            progress(step, "done")
    except KeyboardInterrupt:
        meta["status"] = "partial"
        _write_meta(config.out, meta)
        raise CalibrationInterrupted(config.out, list(meta["steps_done"])) from None
    except BaseException:
        meta["status"] = "partial"
        _write_meta(config.out, meta)
        raise
    meta["status"] = "complete" if all(s in meta["steps_done"] for s in config.steps) else "partial"
    _write_meta(config.out, meta)
    return config.out


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def _clear_bundle(out: Path) -> None:
    """A fresh run replaces the bundle in ``out``: the previous run's files go first, so a run stopped
    part way leaves a partial bundle of its own, never old measurements beside new ones. Other files
    stay."""
    names = sorted((p.name for p in out.iterdir() if bf.is_bundle_file(p.name)), key=lambda n: n == bf.META)
    for name in names:  # meta.json last: until then the folder still reads as a bundle
        (out / name).unlink()


def _start_meta(config: CalibrationConfig, settings: dict) -> dict:
    path = config.out / bf.META
    if config.resume and path.exists():
        old = bf.read_file(path, bf.MetaFile).model_dump(by_alias=True)
        for key in _RESUME_KEYS:
            if old["config"].get(key) != settings[key]:
                raise TrainsimError(
                    f"the bundle was made with {key}={old['config'].get(key)!r}, not "
                    f"{settings[key]!r}; rerun without --resume or with the same options",
                    file=str(path),
                    field=f"config.{key}",
                )
        done = {}
        for step, record in old["steps_done"].items():
            if all((config.out / name).is_file() for name in record["files"]):
                done[step] = record
        old.update(status="running", steps_done=done, config=settings, steps_planned=list(config.steps))
        old["provenance"] = {**_provenance(settings["device"]), "resumed_from": old["provenance"].get("date")}
        return old
    return {
        "schema": "trainsim.calibration/1",
        "provenance": _provenance(settings["device"]),
        "config": settings,
        "status": "running",
        "steps_planned": list(config.steps),
        "steps_done": {},
        "notes": [],
    }


def _provenance(device: str) -> dict:
    import torch

    extra = {"cuda": torch.version.cuda, "device": device}
    if device == "cuda":
        extra["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        try:
            extra["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception:  # NCCL not built in
            extra["nccl"] = None
    else:
        from trainsim.calibrate.measure.topo_probe import host_probe

        extra["devices"] = [host_probe().get("cpu_model") or "cpu"]
    return provenance(timestamp=True, **extra)


def _write_meta(out: Path, meta: dict) -> None:
    bf.write_json(out / bf.META, meta)


# ------------------------------------------------------------------------------------------------ steps


def _step_probe(run: _Run):
    import torch

    from trainsim.calibrate.measure import linkbench, topo_probe

    run.progress("probe", "host and devices")
    host = topo_probe.host_probe()
    run.progress("probe", "GEMM FLOP/s per core")
    gemm = linkbench.gemm_flops_per_core()
    run.progress("probe", "memory bandwidth (first estimate)")
    memory_bw = linkbench.quick_memory_bandwidth()
    threads = max(1, host["cores"] // run.ranks)
    gpus = []
    if run.device == "cuda":
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            gpus.append(
                {
                    "index": i,
                    "name": props.name,
                    "memory_bytes": props.total_memory,
                    "sm_count": props.multi_processor_count,
                    "capability": f"{props.major}.{props.minor}",
                }
            )
    machine_doc = _machine_doc(run, host, gemm, memory_bw, threads, gpus)
    if run.device == "cuda":
        from trainsim.calibrate.measure import nvsmi

        run.progress("probe", "nvidia-smi topo -m and NVML")
        machine_doc["nvml"] = nvsmi.nvml_probe()  # kept raw: common ancestors, NVLink states, P2P status
        topo = topo_probe.cuda_topology(
            host,
            gpu_names=[g["name"] for g in gpus],
            gpu_memory_gib=[g["memory_bytes"] / 2**30 for g in gpus],
            dram_bandwidth_gbps=memory_bw / 1e9,
            nvml=machine_doc["nvml"],
        )
    else:
        topo = topo_probe.cpu_topology(host, run.ranks, dram_bandwidth_gbps=memory_bw / 1e9)
    bf.write_json(run.out / bf.MACHINE, machine_doc)
    _write_topology(run, topo)
    return (
        [bf.MACHINE, bf.TOPOLOGY],
        {"gemm_flops_per_core": gemm, "memory_bandwidth_estimate": memory_bw},
        [],
    )


def _machine_doc(run: _Run, host: dict, gemm: float, memory_bw: float, threads: int, gpus: list) -> dict:
    spec = None
    try:
        from trainsim.sim.core.devices import cpu_device

        memory = host["memory_bytes"] // run.ranks if host.get("memory_bytes") else None
        spec = cpu_device(
            threads, gemm, memory_bw, memory_bytes=memory, source="trainsim calibrate (one CPU rank)"
        ).to_json_dict()
    except ImportError:
        pass
    return {
        "schema": "trainsim.machine/1",
        "provenance": provenance(timestamp=True),
        "device": run.device,
        "ranks": run.ranks,
        "host": host,
        "gpus": gpus,
        "device_spec": spec,
        "cpu": {
            "cores": host["cores"],
            "threads_per_rank": threads,
            "gemm_flops_per_core": gemm,
            "memory_bandwidth_bytes_per_s": memory_bw,
            "model": host.get("cpu_model"),
        },
    }


def _write_topology(run: _Run, doc: dict) -> None:
    """Check the document loads with the topology library, then write it."""
    from trainsim.topologies import load_topology

    try:
        load_topology(doc)
    except TrainsimError as exc:
        raise TrainsimError(
            f"the calibrated topology does not load: {exc}", file=str(run.out / bf.TOPOLOGY)
        ) from None
    bf.write_yaml(run.out / bf.TOPOLOGY, doc)


def _step_links(run: _Run):
    from trainsim.calibrate.measure import linkbench, topo_probe

    cfg = linkbench.sweep_for(run.device, run.config.quick)
    links = linkbench.measure_links(run.device, cfg, progress=lambda text: run.progress("links", text))
    doc = {
        "schema": "trainsim.links/1",
        "provenance": provenance(timestamp=True),
        "device": run.device,
        "classes": [link.to_json() for link in links],
    }
    bf.write_json(run.out / bf.LINKS, doc)
    machine_doc = bf.read_file(run.out / bf.MACHINE, bf.MachineFile).model_dump(by_alias=True)
    host = machine_doc["host"]
    usable = [link for link in links if linkbench.scales_with_size(link)]
    results = {
        link.name: {"bandwidth_gbps": link.fit.bandwidth_gbps, "latency_us": link.fit.latency_us}
        for link in usable
    }
    notes = [
        f"{link.name}: time did not grow with size (stalls, e.g. a core taken by another process); not used"
        for link in links
        if link not in usable
    ]
    if run.device == "cpu":
        memory_bw = linkbench.dram_bandwidth(links)
        machine_doc["cpu"]["memory_bandwidth_bytes_per_s"] = memory_bw
        if machine_doc.get("device_spec"):
            machine_doc["device_spec"] = _machine_doc(
                run,
                host,
                machine_doc["cpu"]["gemm_flops_per_core"],
                memory_bw,
                machine_doc["cpu"]["threads_per_rank"],
                [],
            )["device_spec"]
        rank_copy = next((link for link in usable if link.kind == "rank_copy"), None)
        topo = topo_probe.cpu_topology(
            host, run.ranks, dram_bandwidth_gbps=memory_bw / 1e9, rank_link=rank_copy
        )
        bf.write_json(run.out / bf.MACHINE, machine_doc)
        results["memory_bandwidth_gbps"] = memory_bw / 1e9
    else:
        import torch

        topo = bf.read_file(run.out / bf.TOPOLOGY)
        n = torch.cuda.device_count()
        peer = all(torch.cuda.can_device_access_peer(i, j) for i in range(n) for j in range(n) if i != j)
        topo = topo_probe.apply_link_fits(topo, usable, p2p=peer)
        if not peer:
            notes.append("some GPU pairs have no peer access: p2p false in the topology")
    _write_topology(run, topo)
    return [bf.LINKS, bf.TOPOLOGY, bf.MACHINE], results, notes


def collective_sizes(device: str, quick: bool) -> list[int]:
    """1 KiB .. 1 GiB on GPUs (64 MiB with --quick); trimmed on CPU ranks (gloo is ~1000x slower)."""
    from trainsim.calibrate.measure.alphabeta import log_sizes

    kib, mib = 1024, 1024**2
    if device == "cuda":
        return log_sizes(kib, 64 * mib if quick else 1024 * mib, 4)
    return log_sizes(kib, 4 * mib if quick else 256 * mib, 4)


def _step_collectives(run: _Run):
    from trainsim.calibrate.measure import collbench

    if run.ranks < 2:
        doc = {
            "schema": "trainsim.collectives/1",
            "provenance": provenance(timestamp=True),
            "device": run.device,
            "backend": "nccl" if run.device == "cuda" else "gloo",
            "world_size": run.ranks,
            "results": [],
        }
        bf.write_json(run.out / bf.COLLECTIVES, doc)
        return [bf.COLLECTIVES], {}, ["one rank: no collectives to measure"]
    run.progress("collectives", f"{run.ranks} ranks, launching")
    doc, results = measure_collectives_doc(run.device, run.ranks, model=run.config.model,
                                           batch_sizes=run.config.batch_sizes, quick=run.config.quick,
                                           model_options=run.config.model_options,
                                           progress=lambda what: run.progress("collectives", what))
    summary, notes = {}, []
    if doc.timer_tick is not None:
        if doc.timer_tick.period_s is None:
            notes.append(f"timer tick: {doc.timer_tick.reason}")
        else:
            summary["timer_tick_ms"] = round(doc.timer_tick.period_s * 1e3, 4)
    bf.write_json(run.out / bf.COLLECTIVES, doc.model_dump(by_alias=True, mode="json"))
    for r in results:
        if r.skipped:
            notes.append(r.skipped)
        elif r.fit:
            summary[r.collective] = {
                "latency_us": r.fit.latency_us,
                "busbw_gbps": r.fit.bandwidth_gbps * collbench.bus_factor(r.collective, r.ranks),
            }
    files = [bf.COLLECTIVES]
    if run.device == "cuda" and (run.out / bf.TOPOLOGY).is_file():
        from trainsim.calibrate.measure import nccl_protocols

        # NCCL's cost per algorithm and protocol, for the simulator to use over NCCL's tuning tables
        block, more = nccl_protocols.measure(run.ranks, collective_sizes(run.device, run.config.quick),
                                             repeats=3, target_s=0.003,
                                             progress=lambda what: run.progress("collectives", what))
        notes += more
        if block is not None:
            topo = bf.read_file(run.out / bf.TOPOLOGY)
            _write_topology(run, {**topo, "nccl": block})
            files.append(bf.TOPOLOGY)
            summary["nccl_figures"] = len(block["figures"])
    if run.device == "cpu" and "all_reduce" in summary and (run.out / bf.TOPOLOGY).is_file():
        from trainsim.calibrate.measure import topo_probe

        # CPU ranks talk through gloo, not a bare memory copy: the rank links get gloo's figures
        fit = summary["all_reduce"]
        topo = topo_probe.apply_gloo_transport(bf.read_file(run.out / bf.TOPOLOGY), fit["busbw_gbps"])
        _write_topology(run, topo)
        files.append(bf.TOPOLOGY)
    return files, summary, notes


def measure_collectives_doc(device: str, ranks: int, *, model: str, batch_sizes, quick: bool,
                            model_options: dict | None = None, progress=None) -> tuple[CollectivesFile, list]:
    """collectives.json's document (validated, `trainsim.formats.bundle.CollectivesFile`) and the results:
    every collective on ``ranks`` ranks and, on gloo CPU ranks, the timer tick that stalled calls wake on."""
    from trainsim.calibrate.measure import collbench

    batches = sorted(batch_sizes)
    # a gloo message is met as the runs meet it: after a training step of the model (its middle batch)
    training = collbench.TrainingStep(model, batches[len(batches) // 2], dict(model_options or {}))
    results = collbench.measure_collectives(
        device,
        ranks,
        collective_sizes(device, quick),
        repeats=3 if quick else 5,
        target_s=0.003 if quick else 0.02,
        training=training if device == "cpu" else None,
    )
    tick = None
    if device == "cpu":  # gloo calls that stall return on the host's timer tick
        from trainsim.calibrate.measure import timer_tick

        if progress is not None:
            progress("timer tick probe")
        tick = TimerTick.model_validate(timer_tick.measure(ranks))
    doc = CollectivesFile(
        schema_=COLLECTIVES_SCHEMA,
        provenance=provenance(timestamp=True),
        device=device,
        backend=results[0].backend,
        world_size=ranks,
        results=[CollectiveRecord.model_validate(r.to_json()) for r in results],
        timer_tick=tick,
    )
    return doc, results


def _step_data(run: _Run):
    import torch

    from trainsim.calibrate.execute import data_prep

    samples = 64 if run.config.quick else 512
    run.progress("data", f"preparing {samples} samples")
    threads = torch.get_num_threads()
    if run.device == "cpu":  # on one rank's threads: normalising is a torch op
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // run.ranks))
    try:
        seconds = data_prep.measure_prep(run.config.model, samples, **run.config.model_options)
    finally:
        torch.set_num_threads(threads)
    return [], {"prep_s_per_sample": seconds, "cores": len(os.sched_getaffinity(0))}, []


def _step_layers(run: _Run):
    from trainsim.calibrate.measure import layer_profile
    from trainsim.formats.workload import save_workload

    kwargs = {}
    if run.config.repeats is not None:
        kwargs["repeats"] = run.config.repeats
    elif run.config.quick:
        kwargs.update(repeats=3, warmup=1)
    if run.device == "cpu":
        # A CPU "device" is one rank: time the layers with the threads one rank has.
        kwargs["threads"] = max(1, len(os.sched_getaffinity(0)) // run.ranks)
    prep = run.step_results("data").get("prep_s_per_sample")
    names = []
    for precision in run.config.precisions:
        profiled = layer_profile.profile_layers(
            run.config.model,
            run.device,
            list(run.config.batch_sizes),
            prep_samples=0 if prep is not None else 64,
            progress=lambda text, p=precision: run.progress("layers", f"{p}: {text}"),
            precision=precision,
            **kwargs,
            **run.config.model_options,
        )
        if prep is None:
            prep = profiled.input.prep_s_per_sample
        if prep is not None and profiled.input.prep_s_per_sample is None:
            profiled = profiled.model_copy(
                update={"input": profiled.input.model_copy(update={"prep_s_per_sample": prep})}
            )
        names.append(bf.workload_file(run.config.model, precision))
        save_workload(profiled, run.out / names[-1])
        if precision == "fp32":
            workload = profiled
    facts = workload.provenance.model_dump()
    measured = facts.get("batch_sizes_measured") or sorted(
        {p[0] for layer in workload.layers if layer.forward for p in layer.forward.points}
    )
    notes = [f"batch size {s['batch']} skipped: {s['reason']}" for s in facts.get("skipped") or []]
    if notes:
        notes.append(f"largest batch size that fits: {max(measured)}")
    return names, {"batch_sizes_measured": measured, "threads": facts.get("threads"),
                   "precisions": list(run.config.precisions)}, notes


def _step_rank_step(run: _Run):
    from trainsim.calibrate.execute import rank_step
    from trainsim.formats.workload import load_workload, save_workload

    if run.device != "cpu":
        return [], {"skipped": "GPU layer times are kernel times, taken as the runs see them"}, []
    name = bf.workload_file(run.config.model)
    path = run.out / name
    if not path.exists():
        raise TrainsimError("needs the workload file of the layers step; run that step first", file=str(path))
    workload = load_workload(path)
    batches = run.step_results("layers").get("batch_sizes_measured") or list(run.config.batch_sizes)
    threads = max(1, len(os.sched_getaffinity(0)) // run.ranks)
    what = "alone and with every rank at once" if run.ranks > 1 else "alone"
    run.progress("rank_step", f"{run.ranks} pinned rank(s), {what}, batch sizes {batches}")
    quick = run.config.quick
    points = rank_step.measure_rank_step(run.config.model, batches, run.ranks, rounds=6 if quick else 12,
                                         window_s=0.25 if quick else 0.5, threads_per_rank=threads,
                                         options=run.config.model_options)
    record = rank_step.rank_step_record(points, run.ranks, threads)
    provenance = workload.provenance.model_copy(update={"rank_step": record})
    save_workload(workload.model_copy(update={"provenance": provenance}), path)
    results = {"ranks": run.ranks, "alone_s": {p.batch: p.alone_s for p in points}}
    if run.ranks > 1:
        results["slowdown"] = {p.batch: round(p.slowdown, 3) for p in points if p.slowdown is not None}
    return [name], results, []


_STEP_FUNCTIONS = {
    "probe": _step_probe,
    "links": _step_links,
    "collectives": _step_collectives,
    "data": _step_data,
    "layers": _step_layers,
    "rank_step": _step_rank_step,
}


def summarize(path: str | os.PathLike) -> dict:
    """What a finished (or partial) run found, in a few lines: for the CLI and its --json."""
    meta = bf.read_file(Path(path) / bf.META, bf.MetaFile)
    steps, notes = {}, list(meta.notes)
    for step, record in meta.steps_done.items():
        steps[step] = {
            "seconds": record.seconds,
            "files": record.files,
            "results": record.results,
            "headline": _headline(step, record.results),
        }
        notes.extend(f"{step}: {note}" for note in record.notes)
    return {"path": str(path), "status": meta.status, "config": meta.config, "steps": steps, "notes": notes}


def _headline(step: str, results: dict) -> str:
    if step == "probe":
        return (
            f"fp32 GEMM {results.get('gemm_flops_per_core', 0) / 1e9:.1f} GFLOP/s per core, memory "
            f"~{results.get('memory_bandwidth_estimate', 0) / 1e9:.1f} GB/s"
        )
    if step == "links":
        parts = [
            f"{name} {fit['bandwidth_gbps']:.2f} GB/s + {fit['latency_us']:.2f} us"
            for name, fit in results.items()
            if isinstance(fit, dict)
        ]
        if "memory_bandwidth_gbps" in results:
            parts.append(f"memory {results['memory_bandwidth_gbps']:.1f} GB/s")
        return "; ".join(parts[:4]) + (" ..." if len(parts) > 4 else "")
    if step == "collectives":
        parts = [f"{name} busbw {r['busbw_gbps']:.2f} GB/s + {r['latency_us']:.0f} us"
                 for name, r in results.items() if isinstance(r, dict)]
        if results.get("timer_tick_ms"):
            parts.append(f"stalled calls wake on a {results['timer_tick_ms']:g} ms timer tick")
        return "; ".join(parts)
    if step == "data":
        return (
            f"{results.get('prep_s_per_sample', 0) * 1e3:.3f} ms per sample, "
            f"{results.get('cores')} cores available"
        )
    if step == "layers":
        return f"batch sizes measured: {results.get('batch_sizes_measured')}"
    if step == "rank_step":
        if "skipped" in results:
            return f"not measured: {results['skipped']}"
        alone = ", ".join(f"batch {b}: {t * 1e3:.2f} ms" for b, t in (results.get("alone_s") or {}).items())
        slow = ", ".join(f"x{s:.2f}" for s in (results.get("slowdown") or {}).values())
        return f"one rank alone {alone}" + (f"; {results.get('ranks')} at once {slow}" if slow else "")
    return ""
