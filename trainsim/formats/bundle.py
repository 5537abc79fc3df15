"""The calibration bundle: the folder ``trainsim calibrate`` writes and ``simulate`` reads.

    meta.json               trainsim.calibration/1  provenance, the run's configuration, steps done, status
    machine.json            trainsim.machine/1      host (sockets, cores, memory), GPUs; the CPU: cores,
                                                    threads per rank, GEMM FLOP/s per core, memory bandwidth,
                                                    and one rank as a sim.devices spec (trainsim.device/1)
    topology.yaml           trainsim.topology/1     the box, calibrated with the fitted link figures
    links.json              trainsim.links/1        raw copy points + alpha-beta fit per link class
    collectives.json        trainsim.collectives/1  raw points, algbw/busbw + alpha-beta fit per collective
    workload-<model>.json   trainsim.workload/2     per-layer times, bytes and FLOPs of the model

``load_bundle`` validates every file: meta.json always, and every other file that a finished step promises
or that is there; anything missing, unreadable, unparsable or off-schema is a one-line ``TrainsimError``
naming the file and field. A partial bundle (interrupted run) loads with what it has. The writers are in
`trainsim.calibrate.measure.bundle`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trainsim.errors import TrainsimError, from_validation_error
from trainsim.yamlio import load_yaml, parse_json

from .device import DeviceFile

META, MACHINE, TOPOLOGY = "meta.json", "machine.json", "topology.yaml"
LINKS, COLLECTIVES = "links.json", "collectives.json"
COLLECTIVES_SCHEMA = "trainsim.collectives/1"
WORKLOAD_SCHEMAS = ("trainsim.workload/1", "trainsim.workload/2")


def workload_file(model: str, precision: str = "fp32") -> str:
    """``workload-<model>.json``: the model measured in fp32; ``workload-<model>.<precision>.json`` under
    autocast to another precision (bf16, fp16)."""
    return f"workload-{model}.json" if precision == "fp32" else f"workload-{model}.{precision}.json"


def is_bundle_file(name: str) -> bool:
    """Whether a file of this name is one a calibration writes into a bundle."""
    return name in (META, MACHINE, TOPOLOGY, LINKS, COLLECTIVES) or (
        name.startswith("workload-") and name.endswith(".json"))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Fit(_Strict):
    model: Literal["alpha_beta"]
    alpha_s: float = Field(ge=0)
    beta_bytes_per_s: float = Field(gt=0)
    latency_us: float = Field(ge=0)
    bandwidth_gbps: float = Field(gt=0)
    rel_rms: float = Field(ge=0)
    points: int = Field(ge=0)
    busbw_gbps: float | None = Field(default=None, gt=0)


class LinkRecord(_Strict):
    name: str
    kind: Literal[
        "h2d_pinned", "h2d_pageable", "h2d_batch", "d2h_pinned", "d2h_pageable", "d2d", "p2p", "rank_copy",
        "dram_copy",
    ]
    src: str
    dst: str
    points: list[tuple[int, float, float]]
    fit: Fit | None = None
    note: str | None = None


class LinksFile(_Strict):
    schema_: Literal["trainsim.links/1"] = Field(alias="schema")
    provenance: dict[str, Any]
    device: Literal["cpu", "cuda"]
    classes: list[LinkRecord]


class CollectivePoint(_Strict):
    bytes: int = Field(gt=0)
    time_s: float = Field(gt=0)
    spread_s: float = Field(ge=0)
    algbw_gbps: float = Field(ge=0)
    busbw_gbps: float = Field(ge=0)
    # gloo: every call timed (the simulator takes a call's fast time and stall chance from those around its
    # size, or their mean where the bundle found no timer tick)
    samples_s: list[float] | None = None

    @field_validator("samples_s")
    @classmethod
    def _non_negative(cls, value):
        if value is not None and (not value or min(value) < 0):
            raise ValueError("must be a non-empty list of seconds >= 0")
        return value


class CollectiveRecord(_Strict):
    collective: Literal["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "gather",
                        "scatter", "send_recv", "exchange"]
    ranks: int = Field(ge=2)
    backend: Literal["gloo", "nccl"]
    bus_factor: float = Field(gt=0)
    points: list[CollectivePoint]
    fit: Fit | None = None
    skipped: str | None = None


class TimerTick(_Strict):
    """The tick stalled gloo calls return on (calibrate/measure/timer_tick.py); period None: none found."""

    period_s: float | None = Field(default=None, gt=0)
    offset_s: float | None = Field(default=None, ge=0)
    dead_time_s: float | None = Field(default=None, ge=0)
    resultant: float | None = Field(default=None, ge=0, le=1)
    stalled_calls: int = Field(ge=0)
    calls: int = Field(ge=0)
    together_s: float | None = Field(default=None, gt=0)  # ranks this close met a call together
    stall_together: float | None = Field(default=None, ge=0, le=1)  # share of those calls that stalled
    stall_apart: float | None = Field(default=None, ge=0, le=1)
    probe_bytes: int | None = Field(default=None, gt=0)  # the probe's all-reduce
    reason: str | None = None

    @model_validator(mode="after")
    def _within_the_period(self):
        if self.period_s is not None and not all(
                v is not None and v < self.period_s for v in (self.offset_s, self.dead_time_s)):
            raise ValueError("offset_s and dead_time_s must be given and below period_s")
        return self


class CollectivesFile(_Strict):
    schema_: Literal["trainsim.collectives/1"] = Field(default=COLLECTIVES_SCHEMA, alias="schema")
    provenance: dict[str, Any]
    device: Literal["cpu", "cuda"]
    backend: Literal["gloo", "nccl"]
    world_size: int = Field(ge=1)
    results: list[CollectiveRecord]
    timer_tick: TimerTick | None = None


class CpuDevice(_Strict):
    cores: int = Field(gt=0)
    threads_per_rank: int = Field(gt=0)
    gemm_flops_per_core: float = Field(gt=0, description="fp32, one thread, measured")
    memory_bandwidth_bytes_per_s: float = Field(gt=0, description="STREAM-Copy convention, measured")
    model: str | None = None


class MachineFile(_Strict):
    schema_: Literal["trainsim.machine/1"] = Field(alias="schema")
    provenance: dict[str, Any]
    device: Literal["cpu", "cuda"]
    ranks: int = Field(ge=1)
    host: dict[str, Any]
    cpu: CpuDevice
    gpus: list[dict[str, Any]] = Field(default_factory=list)
    device_spec: DeviceFile | None = None  # one CPU rank as a device, when available
    nvml: dict[str, Any] | None = None  # what NVML said (CUDA boxes with nvidia-ml-py)


class StepRecord(_Strict):
    files: list[str]
    seconds: float = Field(ge=0)
    finished: str
    results: dict[str, Any] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)


class MetaFile(_Strict):
    schema_: Literal["trainsim.calibration/1"] = Field(alias="schema")
    provenance: dict[str, Any]
    config: dict[str, Any]
    status: Literal["running", "partial", "complete"]
    steps_planned: list[str]
    steps_done: dict[str, StepRecord] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)


def read_file(path: Path, model: type[BaseModel] | None = None):
    """Parse a bundle file (JSON, or YAML by extension) and validate it against ``model``."""
    path = Path(path)
    label = str(path)
    if not path.is_file():
        raise TrainsimError("missing from the bundle", file=label)
    try:
        text = path.read_text(encoding="utf-8")
        data = load_yaml(text) if path.suffix in (".yaml", ".yml") else parse_json(text, label)
    except UnicodeDecodeError as exc:
        raise TrainsimError(f"not a text file (byte {exc.start} is not UTF-8)", file=label) from None
    except OSError as exc:
        raise TrainsimError(f"cannot read: {exc.strerror or exc}", file=label) from None
    except json.JSONDecodeError as exc:
        raise TrainsimError(
            f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})", file=label
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise TrainsimError(f"not valid YAML{where}", file=label) from None
    if model is None:
        return data
    if not isinstance(data, dict):
        raise TrainsimError("expected a JSON object", file=label)
    expected = model.model_fields["schema_"].annotation.__args__[0]
    if data.get("schema") != expected:
        raise TrainsimError(
            f"expected schema {expected!r}, found {data.get('schema')!r}", file=label, field="schema"
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc, file=label) from None


class LoaderOverlap(_Strict):
    """With a preload thread in a CPU rank's own process: how many times longer the step (``step``) and one
    batch's preparation (``prep``) take while both run."""

    step: float = Field(default=1.0, gt=0)
    prep: float = Field(default=1.0, gt=0)


class RunMeasurements(_Strict):
    """What validation measured on the box for one run configuration, beside the calibration: the run's
    input pipeline per sample timed back to back (None: the default pipeline the calibration measured), the
    preload thread's interference, and a compression hook's cost per step. A bundle carries them for the
    run it is handed to (`Bundle.with_run`)."""

    prep_s_per_sample: float | None = Field(default=None, ge=0)
    loader_overlap: LoaderOverlap | None = None
    codec_s: float | None = Field(default=None, ge=0)


@dataclass
class Bundle:
    """A loaded, validated calibration bundle; parts of an interrupted run that never finished are None.

    ``workloads``: model name (``workload-<model>.json``) -> the workload, as the reader given to
    `load_bundle` returned it (the simulator's `Workload` through `trainsim.api.load_bundle`; the checked JSON
    document without a reader). ``device_spec``: machine.json's measured CPU rank as a device file.
    """

    path: Path
    meta: MetaFile
    machine: MachineFile | None = None
    topology: Any = None  # trainsim.topologies.Topology
    topology_path: Path | None = None
    links: LinksFile | None = None
    collectives: CollectivesFile | None = None
    workloads: dict[str, Any] = field(default_factory=dict)
    run: RunMeasurements | None = None  # measured for the one run this bundle is handed to, if any

    def with_run(self, run: RunMeasurements | None) -> Bundle:
        """This bundle, carrying ``run``: what validation measured for one run configuration."""
        return dataclasses.replace(self, run=run)

    @property
    def complete(self) -> bool:
        return self.meta.status == "complete"

    @property
    def device_spec(self) -> DeviceFile | None:
        return self.machine.device_spec if self.machine is not None else None

    @property
    def workload(self) -> Any:
        """The bundle's first workload (a bundle usually profiles one model); None without one."""
        return next(iter(self.workloads.values()), None)

    @property
    def workload_path(self) -> Path | None:
        return self.path / workload_file(next(iter(self.workloads))) if self.workloads else None

    def workload_for(self, model: str, precision: str = "fp32") -> Any:
        """The workload of ``model`` measured in ``precision`` when the bundle has it, else the fp32 one (the
        simulator rescales it); a TrainsimError naming the models the bundle has if it has neither."""
        if precision != "fp32" and f"{model}.{precision}" in self.workloads:
            return self.workloads[f"{model}.{precision}"]
        if model not in self.workloads:
            have = ", ".join(self.workloads) or "none"
            raise TrainsimError(
                f"the scenario's workload {model!r} is not in the calibration bundle (it has: {have}); "
                "calibrate that model or simulate one of these",
                file=str(self.path),
            )
        return self.workloads[model]


def _workload_document(data: Any, *, file: str) -> dict:
    """A workload file checked as far as the format goes without the simulator: an object of a known
    schema."""
    if not isinstance(data, dict):
        raise TrainsimError("a workload must be a JSON object", file=file)
    if data.get("schema") not in WORKLOAD_SCHEMAS:
        raise TrainsimError(
            f"unsupported schema {data.get('schema')!r}; expected one of {', '.join(WORKLOAD_SCHEMAS)}",
            file=file, field="schema",
        )
    return data


def load_bundle(
    path: str | os.PathLike, *, read_workload: Callable[..., Any] | None = None
) -> Bundle:
    """Load and validate the bundle in folder ``path``; a TrainsimError naming the file and field if not.

    ``read_workload(data, file=...)`` turns a workload file's decoded JSON into the object the caller wants
    (and validates it); without one, the document is checked for a JSON object of a workload schema.
    """
    root = Path(path)
    if not root.is_dir():
        raise TrainsimError(
            "not a calibration bundle folder (it does not exist or is not a folder)", file=str(root)
        )
    meta = read_file(root / META, MetaFile)
    bundle = Bundle(path=root, meta=meta)
    promised = {name for step in meta.steps_done.values() for name in step.files}
    for name in sorted(promised):
        if not (root / name).is_file():
            raise TrainsimError(
                "missing from the bundle although meta.json lists it as written", file=str(root / name)
            )
    present = promised | {n for n in (MACHINE, LINKS, COLLECTIVES, TOPOLOGY) if (root / n).is_file()}
    if MACHINE in present:
        bundle.machine = read_file(root / MACHINE, MachineFile)
    if LINKS in present:
        bundle.links = read_file(root / LINKS, LinksFile)
    if COLLECTIVES in present:
        bundle.collectives = read_file(root / COLLECTIVES, CollectivesFile)
    if TOPOLOGY in present:
        bundle.topology_path = root / TOPOLOGY
        bundle.topology = load_calibrated_topology(root / TOPOLOGY)
    reader = read_workload or _workload_document
    workloads = {p.name for p in root.glob("workload-*.json")} | {
        n for n in promised if n.startswith("workload-") and n.endswith(".json")}
    for name in sorted(workloads):
        file = root / name
        bundle.workloads[name.removeprefix("workload-").removesuffix(".json")] = reader(
            read_file(file), file=str(file))
    return bundle


def load_calibrated_topology(path: Path):
    """The topology file through the topology library's loader (validation, routes)."""
    data = read_file(path)
    if not isinstance(data, dict):
        raise TrainsimError("expected a YAML mapping", file=str(path))
    from trainsim.topologies import load_topology

    return load_topology(str(path))
