"""From what a user names to a `Run`: the one place that follows a scenario's file references.

    from trainsim.resolve import resolve
    run = resolve("ddp-resnet50-dgx-a100", overrides=["batch_size=512"])          # a shipped scenario
    run = resolve("validate-cpu", variant="ddp-2", calibration="bundle-dir")      # on a calibrated box

`resolve_scenario` reads the scenario (a shipped name, a YAML path or a mapping) with its ``--set``
overrides and variant; `resolve` then loads what it names — its topology (a preset, a file, a generator
mapping), its workload (a built-in, a JSON file, an analytic model with options) — or, given a calibration
bundle, the bundle's topology, its measured workload of the scenario's model and its measured device, and the
host figures the bundle measured (gloo call costs and timer tick). A relative path in a scenario file resolves
against the file's folder first; one given with ``--set`` against the working folder.

Errors are one-line `TrainsimError`s naming the scenario file and the field (``topology``,
``workload.image_size``, ``gpus``, ``batch_per_gpu``...).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainsim.errors import TrainsimError, unknown_name
from trainsim.formats.scenario import Scenario
from trainsim.formats.scenario_loader import load_scenario
from trainsim.formats.workload import Workload, load_workload, parse_workload
from trainsim.sim.core.devices import DeviceSpec, check_topology_devices, device_from_file
from trainsim.sim.hosts import call_latency
from trainsim.sim.hosts.call_latency import Latency
from trainsim.sim.run import HostMeasurements, Run, rank_names

if TYPE_CHECKING:
    from trainsim.formats.bundle import Bundle, CollectivesFile, RunMeasurements

__all__ = ["Run", "load_bundle", "load_inputs", "load_workload_ref", "resolve", "resolve_scenario"]

ScenarioSource = str | os.PathLike | dict | Scenario


def resolve_scenario(source: ScenarioSource, overrides: Sequence[str] = (), *, variant: str | None = None,
                     values: dict[str, Any] | None = None, where: str | None = None) -> Scenario:
    """The validated scenario ``source`` names, with ``overrides`` (``key.path=value`` texts), parsed
    ``values`` and ``variant`` applied. A Scenario with nothing to apply is returned as it is."""
    if isinstance(source, Scenario) and not overrides and variant is None and not values:
        return source
    return load_scenario(source, list(overrides), variant=variant, values=values, where=where)


def load_bundle(path: str | os.PathLike | Bundle) -> Bundle:
    """The calibration bundle in folder ``path``, every file validated (its workloads as `Workload`s); a
    one-line TrainsimError naming the file and field if not. A Bundle is returned as it is."""
    from trainsim.formats import bundle as bundle_format

    if isinstance(path, bundle_format.Bundle):
        return path
    return bundle_format.load_bundle(path, read_workload=parse_workload)


def resolve(source: ScenarioSource, *, overrides: Sequence[str] = (), variant: str | None = None,
            calibration: str | os.PathLike | Bundle | None = None,
            measurements: RunMeasurements | None = None, values: dict[str, Any] | None = None,
            where: str | None = None) -> Run:
    """The `Run` of scenario ``source`` (see `resolve_scenario` for ``overrides``, ``variant``, ``values``,
    ``where``) on the calibration bundle ``calibration`` (a folder or a loaded Bundle) if given, carrying
    ``measurements`` (what validation measured for this run; they need the bundle)."""
    scenario = resolve_scenario(source, overrides, variant=variant, values=values, where=where)
    bundle = load_bundle(calibration) if calibration is not None else None
    if measurements is not None:
        if bundle is None:
            raise TrainsimError("measurements of a run need the calibration bundle they complete",
                                field="calibration")
        bundle = bundle.with_run(measurements)
    topology, workload, devices = load_inputs(scenario, bundle)
    scenario = _global_batch(scenario, topology)
    host = HostMeasurements(calls=bundle_call_latencies(bundle), tick=bundle_timer_tick(bundle),
                            run=bundle.run if bundle is not None else None)
    return Run(scenario=scenario, topology=topology, workload=workload, ranks=rank_names(scenario, topology),
               devices=devices, host=host)


def _global_batch(scenario: Scenario, topology) -> Scenario:
    """The scenario with ``batch_size`` the global batch: ``batch_per_gpu`` times the GPUs it runs on (and
    ``batch_per_gpu`` then unset: the run reads ``batch_size`` only)."""
    per_gpu = scenario.batch_per_gpu
    if per_gpu is None:
        return scenario
    n = len(rank_names(scenario, topology))
    resolved = scenario.model_copy(update={"batch_size": per_gpu * n, "batch_per_gpu": None})
    resolved._source, resolved._base_dir, resolved._set_here = (scenario._source, scenario._base_dir,
                                                                 scenario._set_here)
    return resolved


# ---- topology and workload ---------------------------------------------------------------------------------


def _resolve_path(text: str, base_dir: str | None) -> str:
    if base_dir and not Path(text).is_absolute() and (Path(base_dir) / text).exists():
        return str(Path(base_dir) / text)
    return text


def load_topology_ref(scenario: Scenario):
    """The scenario's ``topology:`` loaded and its GPUs checked against the device library; an error about
    a field of the scenario's own generator mapping is the scenario's, at ``topology.<field>``."""
    from trainsim.topologies import load_topology

    source = scenario.topology
    if source is None:
        raise TrainsimError("missing (required): the machine to simulate on, a preset (`trainsim topo "
                            "list`), a topology file or a generator mapping", file=scenario.source,
                            field="topology")
    if source == "calibrated":  # validate-cpu/-gpu: the topology is the box's calibration bundle
        raise TrainsimError("'calibrated' is the topology of a calibration bundle (`trainsim calibrate`): "
                            "give the bundle with --calibration DIR (simulate, validate) or its topology "
                            "with --set topology=DIR/topology.yaml", file=scenario.source, field="topology")
    if isinstance(source, str):
        source = _resolve_path(source, scenario.path_base("topology"))
    try:
        topology = load_topology(source)
        check_topology_devices(topology)
        return topology
    except TrainsimError as exc:
        if exc.file is None:  # a field of the scenario's own topology mapping (a generator's parameter)
            field = f"topology.{exc.field}" if exc.field else "topology"
            raise TrainsimError(exc.reason, file=scenario.source, field=field) from None
        raise TrainsimError(str(exc), file=scenario.source, field="topology") from None


def load_workload_ref(ref, base_dir: str | None = None) -> Workload:
    """A scenario's ``workload:``: a built-in name, a JSON path, or ``{name: ..., <config overrides>}``."""
    if isinstance(ref, str):
        return load_workload(_resolve_path(ref, base_dir))
    overrides = ref.overrides
    if not overrides:
        return load_workload(_resolve_path(ref.name, base_dir))
    from trainsim.sim.compute.analytic_models import MODELS, build_analytic

    if ref.name not in MODELS:
        raise unknown_name("analytic model", ref.name, MODELS, field="workload.name")
    return build_analytic(ref.name, **overrides)


def _load_workload(scenario: Scenario) -> Workload:
    """The scenario's workload; an error that names no file is the scenario's, at its ``workload`` field."""
    try:
        return load_workload_ref(scenario.workload, scenario.path_base("workload"))
    except TrainsimError as exc:
        if exc.file is not None:
            raise
        field = exc.field if exc.field and exc.field.startswith("workload") else ".".join(
            part for part in ("workload", exc.field) if part)
        raise TrainsimError(exc.reason, file=scenario.source, field=field) from None


def load_inputs(scenario: Scenario, bundle: Bundle | None = None):
    """(topology, workload, measured devices) for a scenario, from the bundle when one is given."""
    if bundle is None:
        return load_topology_ref(scenario), _load_workload(scenario), {}
    if bundle.topology is None:
        raise TrainsimError("calibration bundle has no topology.yaml", file=str(bundle.path))
    return bundle.topology, bundle_workload(bundle, scenario), bundle_devices(bundle)


# ---- what a calibration bundle measured --------------------------------------------------------------------

#: collectives.json names -> the simulator's op names
_BUNDLE_OPS = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reduce_scatter",
               "broadcast": "broadcast", "reduce": "reduce", "gather": "gather", "scatter": "scatter",
               "send_recv": "p2p", "exchange": "halo_exchange"}


def _gloo(bundle: Bundle | None) -> CollectivesFile | None:
    """The bundle's collectives where gloo measured them; None without them or on NCCL."""
    coll = bundle.collectives if bundle is not None else None
    return coll if coll is not None and coll.backend == "gloo" else None


def bundle_timer_tick(bundle: Bundle | None) -> call_latency.TimerTick | None:
    """The timer tick the bundle's stalled gloo calls returned on (calibrate/measure/timer_tick.py); None
    without one."""
    coll = _gloo(bundle)
    tick = coll.timer_tick if coll is not None else None
    if tick is None or tick.period_s is None:
        return None
    return call_latency.TimerTick(
        tick.period_s, tick.offset_s or 0.0, tick.dead_time_s or 0.0, tick.together_s or 0.0,
        tick.stall_together, tick.stall_apart, float(tick.probe_bytes or 0.0))


def bundle_call_latencies(bundle: Bundle | None) -> dict[str, Latency]:
    """What one gloo call costs before its bytes move, per op (``p2p``: one send/recv message), from a
    calibration bundle's collectives.json: the measured calls less their bytes' time (`call_latency`), or
    the fit's alpha where the bundle kept no samples; empty without one or on NCCL."""
    coll = _gloo(bundle)
    out = {}
    for entry in coll.results if coll is not None else []:
        op = _BUNDLE_OPS.get(entry.collective)
        if op and entry.fit is not None:
            points = [p.model_dump() for p in entry.points]
            measured = call_latency.from_points(points, entry.fit.beta_bytes_per_s)
            out[op] = measured or entry.fit.latency_us * 1e-6
    return out


def bundle_devices(bundle: Bundle | None) -> dict[str, DeviceSpec]:
    """The devices a bundle measured, by spec name: machine.json's CPU rank (also as ``cpu``, the spec name a
    CPU box's topology gives its ranks)."""
    spec = bundle.device_spec if bundle is not None else None
    if spec is None:
        return {}
    from trainsim.formats.bundle import MACHINE

    device = device_from_file(spec, file=f"{bundle.path / MACHINE}: device_spec")
    devices = {device.name: device}
    if device.kind == "cpu":
        devices.setdefault("cpu", device)
    return devices


def bundle_workload(bundle: Bundle, scenario: Scenario) -> Workload:
    """The bundle's workload of the scenario's model, measured in the scenario's precision where the bundle
    has that (else in fp32, which the roofline rescales); an error naming the bundle's models if it has not
    the model."""
    wanted = scenario.workload if isinstance(scenario.workload, str) else scenario.workload.name
    workload = bundle.workload_for(wanted, scenario.precision)
    if isinstance(workload, Workload):
        return workload
    measured_in = scenario.precision if f"{wanted}.{scenario.precision}" in bundle.workloads else "fp32"
    from trainsim.formats.bundle import workload_file

    return parse_workload(workload, file=str(bundle.path / workload_file(wanted, measured_in)))
