"""The simulation of one validated scenario:

    from trainsim.sim.simulation import Simulation, build_machine
    machine = build_machine("dgx-a100")              # optional: GPUs, hosts and links of a topology
    sim = Simulation(scenario)                        # a validated Scenario (trainsim.formats.scenario)
    result = sim.run()                                # a Result

Loading a scenario by name or path and a calibration bundle by folder is the caller's
(`trainsim.api.simulate` does both). A loaded calibration bundle (``bundle=``, `trainsim.formats.bundle`)
replaces the scenario's topology and workload with the bundle's ``topology.yaml`` and
``workload-<model>.json`` of the scenario's model, and its measured device (machine.json's ``device_spec``)
becomes the device of the GPUs whose spec it names. On a CPU box (gloo) each call of a collective pays a
latency from that collective's measured calls in ``collectives.json`` and every point-to-point message one
from the measured send/recv messages (`bundle_call_latencies`): fast, or stalled until the timer tick the
bundle found (`bundle_timer_tick`), else their mean. What such a host measured is one plug-in
(`trainsim.sim.hosts`), chosen from the bundle's contents; without one the plain GPU model runs.

It stays one module: it composes the parts (inputs, machine, host plug-in, costs, strategy) into one
run and turns the run into a Result.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import simpy

from trainsim.errors import TrainsimError, raised_first
from trainsim.formats.scenario import Scenario, cublas_workspace_config_bytes
from trainsim.formats.workload import Workload, load_workload, parse_workload
from trainsim.sim.compute.costs import mixed, rank_costs
from trainsim.sim.core.collector import fewer_collections
from trainsim.sim.core.devices import DeviceSpec, check_topology_devices, device_from_file
from trainsim.sim.core.machine import Machine, build_machine
from trainsim.sim.core.result import GpuResult, LinkResult, Result, breakdown, busy_time
from trainsim.sim.hosts import call_latency, host_model_for
from trainsim.sim.hosts.call_latency import Latency
from trainsim.sim.strategies.base import Context, get_strategy, rank_batch_hook
from trainsim.sim.symmetry import mirror_ranks
from trainsim.topologies.machine_classes import prefix

if TYPE_CHECKING:  # the bundle's file models are imported where a bundle is given
    from trainsim.formats.bundle import Bundle, CollectivesFile

__all__ = ["Simulation", "build_machine", "load_inputs"]


class CountingEnvironment(simpy.Environment):
    """A SimPy environment that counts the events it processes (for the speed benchmark)."""

    def __init__(self):
        super().__init__()
        self.events_processed = 0

    def step(self) -> None:
        self.events_processed += 1
        super().step()


# ---- inputs -----------------------------------------------------------------------------------------------


def _resolve_path(text: str, base_dir: str | None) -> str:
    if base_dir and not Path(text).is_absolute() and (Path(base_dir) / text).exists():
        return str(Path(base_dir) / text)
    return text


def _load_topology(scenario):
    from trainsim.topologies import load_topology

    source = scenario.topology
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
        from trainsim.errors import unknown_name

        raise unknown_name("analytic model", ref.name, MODELS, field="workload.name")
    return build_analytic(ref.name, **overrides)


def _load_workload(scenario) -> Workload:
    """The scenario's workload; an error that names no file is the scenario's, at its ``workload`` field."""
    try:
        return load_workload_ref(scenario.workload, scenario.path_base("workload"))
    except TrainsimError as exc:
        if exc.file is not None:
            raise
        field = exc.field if exc.field and exc.field.startswith("workload") else ".".join(
            part for part in ("workload", exc.field) if part)
        raise TrainsimError(exc.reason, file=scenario.source, field=field) from None


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


def bundle_workload(bundle: Bundle, scenario) -> Workload:
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


def load_inputs(scenario, bundle: Bundle | None = None):
    """(topology, workload, extra devices) for a scenario, from the bundle when one is given."""
    if bundle is None:
        return _load_topology(scenario), _load_workload(scenario), {}
    if bundle.topology is None:
        raise TrainsimError("calibration bundle has no topology.yaml", file=str(bundle.path))
    return bundle.topology, bundle_workload(bundle, scenario), bundle_devices(bundle)


def resolve_gpus(scenario, topology) -> list[str]:
    """The GPU names the scenario runs on, checked against the topology."""
    available = topology.gpus
    spec = scenario.gpus
    if spec is None:
        spec = 1 if scenario.strategy.name == "single" else len(available)
    if isinstance(spec, int):
        if spec > len(available):
            raise TrainsimError(
                f"the scenario asks for {spec} GPUs but topology {topology.name!r} has {len(available)}",
                file=scenario.source,
                field="gpus",
            )
        return available[:spec]
    bad = [i for i in spec if i >= len(available)]
    if bad:
        raise TrainsimError(
            f"GPU index {bad[0]} is out of range: topology {topology.name!r} has "
            f"{len(available)} GPUs (0..{len(available) - 1})",
            file=scenario.source,
            field="gpus",
        )
    return [available[i] for i in spec]


# ---- the simulation ---------------------------------------------------------------------------------------


def recorded_workspace_config(workload: Workload) -> str | None:
    """The CUBLAS_WORKSPACE_CONFIG the calibration of ``workload`` ran with; None where it recorded none, or
    one PyTorch could not parse (it then warns and keeps its default)."""
    config = (workload.provenance.model_extra or {}).get("cublas_workspace_config")
    if not isinstance(config, str):
        return None
    try:
        cublas_workspace_config_bytes(config)
    except ValueError:
        return None
    return config


class Simulation:
    """One scenario on one machine. ``machine`` defaults to the scenario's topology."""

    @fewer_collections()
    def __init__(
        self,
        scenario: Scenario,
        *,
        bundle: Bundle | None = None,
        machine: Machine | None = None,
        record: bool = True,
        mirror: bool = True,
    ):
        """``bundle``: a loaded calibration bundle (`trainsim.api.load_bundle`); its topology, its workload of
        the scenario's model and its measured device replace the scenario's, and what validation measured for
        this run (``bundle.run``, `RunMeasurements`) applies. ``record``: keep every op, flow, link-rate and
        memory change (for records and traces). ``mirror``: where it is exact, simulate one machine per class
        of identical ones and mirror it (sim/symmetry.py); False simulates every rank (to check that)."""
        if not isinstance(scenario, Scenario):
            raise TypeError(
                "Simulation takes a validated Scenario (trainsim.api.load_scenario), "
                f"not {type(scenario).__name__}"
            )
        measured = bundle.run if bundle is not None else None  # RunMeasurements; None: nothing measured

        self.scenario = scenario
        sc = self.scenario
        self.bundle = bundle
        topology, self.workload, devices = load_inputs(sc, bundle)
        if machine is not None:
            topology = machine.topology
        self.topology = topology
        self.ranks = resolve_gpus(sc, topology)
        n = len(self.ranks)
        batch_hook = rank_batch_hook(sc.strategy.name)  # pipeline: micro-batches over replicas
        if batch_hook is None and sc.batch_size % n:
            raise TrainsimError(
                f"batch_size {sc.batch_size} does not divide over {n} GPUs",
                file=sc.source,
                field="batch_size",
            )
        self.strategy = get_strategy(sc.strategy.name)
        self.env = CountingEnvironment() if machine is None else machine.env
        self.machine = machine or Machine(
            topology,
            self.env,
            devices=devices,
            record_link_rates=record,
            record_flows=record,
            record_memory=record,
        )
        calls = bundle_call_latencies(bundle)
        tick = bundle_timer_tick(bundle)
        self.host = host_model_for(calls, self.workload, devices, tick=tick)
        if machine is None and self.host is not None and calls:
            self.machine.latency = self.host.latency
        spatial = sc.strategy.name in ("spatial", "hybrid")
        if spatial and sc.mixed_precision == "autocast" and mixed(sc.precision):
            raise TrainsimError("autocast is not modelled for spatial decomposition; valid "
                                "there: master", file=sc.source, field="mixed_precision")
        per_gpu = sc.batch_size if sc.strategy.name == "single" else sc.batch_size // n
        if batch_hook is not None:
            per_gpu = batch_hook(sc, self.ranks, self.workload)
        measured_on = None
        spec = self.workload.provenance.device_spec
        if spec is not None and spec in devices:
            measured_on = devices[spec]
        sharing = self.machine.host_sharing(self.ranks)
        workspace_config = sc.host.cublas_workspace_config or recorded_workspace_config(self.workload)
        cache: dict = {}
        costs = {}

        def costs_for(gpu: str, batch: int):
            device = self.machine.gpus[gpu].device
            key = (device.name, batch, sharing[gpu])
            if key not in cache:
                scale = self.host.step_scale(device, batch, sharing[gpu]) if self.host else 1.0
                cache[key] = rank_costs(self.workload, device, batch, sc.precision, sc.optimizer.name,
                                        measured_on=measured_on, scale=scale,
                                        mixed_precision=sc.mixed_precision, workspace_config=workspace_config)
            return cache[key]

        for gpu in self.ranks:
            costs[gpu] = costs_for(gpu, per_gpu)

        # a cost the scenario states wins over the bundle's measured pipeline and the workload's
        stated = sc.host.prep_s_per_sample
        given = stated if stated is not None else measured.prep_s_per_sample if measured else None
        prep = self._prep_s_per_sample(given, per_gpu, max(sharing.values()))
        st = sc.strategy
        self.ctx = Context(
            machine=self.machine,
            ranks=self.ranks,
            costs=costs,
            total_iterations=sc.warmup_iterations + sc.iterations,
            precision=sc.precision,
            mixed_precision=sc.mixed_precision,
            optimizer=sc.optimizer.name,
            pinned=sc.host.pinned,
            data_workers=sc.host.data_workers,
            loader_layout=sc.host.loader,
            prep_s_per_sample=prep,
            bucket_cap_bytes=st.bucket_cap_mb * 2**20,
            first_bucket_cap_bytes=(
                st.first_bucket_cap_mb * 2**20
                if st.first_bucket_cap_mb is not None
                else st.bucket_cap_mb * 2**20
            ),
            collectives=st.collectives,
            collective_algo=st.collective_algo,
            ps_cores=st.ps_cores,
            ps_socket=st.ps_socket,
            detail=record,
            workload=self.workload,
            spec=sc.strategy,
            optimizations=sc.optimizations,
            batch_size=sc.batch_size,
            costs_for=costs_for,
            measured_on=measured_on,
            jitter_spec=st.jitter if st.jitter is not None else self._measured_jitter(per_gpu),
            host=self.host,
        )
        first = costs[self.ranks[0]]
        if first.forward_host_s:  # the host's dispatch is modelled (`sim/compute/dispatch.py`)
            self.ctx.extra["host_dispatch"] = {
                "rank": self.ranks[0],
                "forward_s": sum(first.forward_host_s), "backward_s": sum(first.backward_host_s),
                "gpu_forward_s": sum(first.forward_s), "gpu_backward_s": sum(first.backward_s)}
        self.mirror = None
        if mirror:
            self.mirror = mirror_ranks(sc, topology, self.ranks, costs, detail=record, host=self.host,
                                       jitter=self.ctx.jitter_spec)
        if self.mirror is not None:
            self.ctx.mirrors = self.mirror.stands_for
        from trainsim.sim.optimizations.data_movement import prepare

        # ScaleDNN / vDNN switches: codec, preload, offload plan (an auto prefetch distance simulates
        # variants)
        prepare(self.ctx, sc, rerun=lambda sub: Simulation(sub, bundle=bundle, record=False).run())
        if measured and measured.codec_s is not None and self.ctx.codec is not None:  # measured on the box
            self.ctx.codec.fit_to(measured.codec_s, self.ctx.costs[self.ranks[0]].grad_bytes_per_layer)
        overlap = measured.loader_overlap if measured else None
        if overlap and self.host is not None and self.ctx.preload_depth and self.ctx.data_workers:
            self.host.share_process_with_loader(self.ctx, overlap)
        self._link_snapshot = None
        self._memory_area: dict[int, dict[str, float]] = {}
        self._stop_requested = False
        self._last_iteration = self.ctx.total_iterations - 1  # the last one the result covers

    def _prep_s_per_sample(self, given: float | None, per_gpu: int, sharing: int) -> float:
        """The input pipeline's cost per sample: ``given`` (another pipeline than the default, measured back
        to back), else the workload's; a host plug-in's measured loop where there is one."""
        sc = self.scenario
        if self.host is None:
            return given if given is not None else self.workload.input.prep_s_per_sample or 0.0
        # a pipeline's first stage prepares the replica's whole batch at once, then splits it
        loaded = per_gpu
        if sc.strategy.name == "pipeline":
            from trainsim.sim.strategies.pipeline import options as pipeline_options

            loaded *= pipeline_options(sc.strategy).micro_batches
        return self.host.prep_s_per_sample(given, [self.machine.gpus[g].device for g in self.ranks], loaded,
                                           sharing)

    def _measured_jitter(self, batch: int):
        """The spread a host plug-in measured (None without one)."""
        if self.host is None:
            return None
        return self.host.jitter([self.machine.gpus[g].device for g in self.ranks], batch)

    def request_stop(self) -> None:
        """Ask a running ``run()`` to stop when the next iteration has finished on every rank (the first
        measured one at the earliest) and to return the Result of the iterations done so far, with
        ``stopped_early`` set. Safe to call from a signal handler: it only sets a flag."""
        self._stop_requested = True

    def _stop_here(self, iteration: int) -> None:
        if self._stop_requested and self.scenario.warmup_iterations <= iteration < self._last_iteration:
            self._last_iteration = iteration
            stop = self.env.event()  # processed by env.step, outside any process: ends env.run()
            stop.callbacks.append(simpy.core.StopSimulation.callback)
            stop.succeed()

    def _on_finish(self, iteration: int) -> None:
        self._stop_here(iteration)
        # each GPU's byte-seconds at the measured window's ends (its average memory use)
        if iteration in (self.scenario.warmup_iterations - 1, self._last_iteration):
            now = self.env.now
            self._memory_area[iteration] = {g: self.machine.gpus[g].memory.byte_seconds(now)
                                            for g in self.ctx.simulated}
        if iteration == self.scenario.warmup_iterations - 1:
            net = self.machine.net
            net.drain()
            self._link_snapshot = net.link_bytes.copy()
            self._snapshot_credited = net.credited.copy()

    @fewer_collections()
    def run(self) -> Result:
        sc, ctx, env = self.scenario, self.ctx, self.env
        wall = time.perf_counter()
        finished = set()

        def watch(iteration: int, gpu: str, _finish=ctx.finish):
            _finish(iteration, gpu)
            if len(ctx.iteration_end[iteration]) == ctx.n and iteration not in finished:
                finished.add(iteration)
                self._on_finish(iteration)

        ctx.finish = watch  # type: ignore[method-assign]
        try:
            self.strategy(ctx)
            env.run()
        except TrainsimError as exc:  # a strategy field the machine cannot satisfy: the scenario's error
            exc = raised_first(exc)
            if exc.file is not None:
                raise exc from None
            field = "strategy.collective_algo" if exc.field == "algo" else exc.field  # the collectives' word
            raise TrainsimError(exc.reason, file=sc.source, field=field) from None
        wall = time.perf_counter() - wall
        total = self._last_iteration + 1
        missing = [i for i in range(total) if len(ctx.iteration_end.get(i, {})) < ctx.n]
        if missing:
            raise RuntimeError(f"the simulation stopped before iteration {missing[0]} finished (a deadlock)")
        ends = [max(ctx.iteration_end[i].values()) for i in range(total)]
        w = sc.warmup_iterations
        starts = [ends[i - 1] if i > 0 else 0.0 for i in range(total)]
        windows = [(starts[i], ends[i]) for i in range(w, total)]
        last = ctx.iteration_end[total - 1]
        critical = max(enumerate(self.ranks), key=lambda ig: (last[ig[1]], -ig[0]))[1]  # first of the last
        n_it = len(windows)
        parts = breakdown(self.machine.ops, critical, windows)
        span = (windows[0][0], windows[-1][1])
        return Result(
            scenario=sc.name,
            strategy=sc.strategy.name,
            topology=self.topology.name,
            workload=self.workload.name,
            gpus=self._gpu_results(span),
            batch_size=sc.batch_size,
            precision=sc.precision,
            iterations=total - w,
            warmup_iterations=w,
            iteration_times_s=[b - a for a, b in windows],
            breakdown_s={k: v / n_it for k, v in parts.items()},
            critical_gpu=critical,
            links=self._link_results(span),
            measured_window_s=span,
            iteration_ends_s=ends,
            stats={
                "events": getattr(env, "events_processed", None),
                "wall_s": round(wall, 6),
                "flows": self.machine.net.stats.flows_started,
                "recomputes": self.machine.net.stats.recomputes,
                "simulated_ranks": len(ctx.simulated),
            },
            machine=self.machine,
            extra=dict(ctx.extra),
            stopped_early=total < ctx.total_iterations,
        )

    def _gpu_results(self, span) -> list[GpuResult]:
        by_gpu: dict[str, list] = {g: [] for g in self.ranks}
        for op in self.machine.ops:
            if op.stream == "compute" and op.resource in by_gpu:
                by_gpu[op.resource].append((op.start, op.end))
        out = {}
        length = span[1] - span[0]
        w, last = self.scenario.warmup_iterations, self._last_iteration
        for g in self.ctx.simulated:
            gpu = self.machine.gpus[g]
            util = busy_time(by_gpu[g], *span) / length if length > 0 else 0.0
            start = self._memory_area[w - 1][g] if w > 0 else 0.0
            average = (self._memory_area[last][g] - start) / length if length > 0 else gpu.memory.in_use
            for copy in self.ctx.mirrors.get(g, [g]) if self.ctx.mirrors is not None else [g]:
                out[copy] = GpuResult(
                    copy,
                    self.machine.gpus[copy].index,
                    gpu.device.name,
                    util,
                    gpu.memory.peak,
                    gpu.memory.capacity,
                    dict(gpu.memory.peak_by_category),
                    average,
                )
        return [out[g] for g in self.ranks]

    def _mirrored_bytes(self, moved):
        """Link bytes with each mirrored machine's own links carrying what its representative's flows moved,
        and each mirrored link between machines what its representative link's did (sim/symmetry.py);
        credited collective bytes are every link's own already. Only whole runs are mirrored, so the warm-up
        snapshot scales the same way and drops out."""
        net, topo = self.machine.net, self.topology
        flows = net.link_bytes - net.credited
        if self._link_snapshot is not None:
            flows = flows - (self._link_snapshot - self._snapshot_credited)
        moved = moved.copy()
        copies = self.mirror.machines
        machine = dict(topo.graph.nodes(data="machine"))
        # per mirrored machine: its prefix's length and its representative's prefix (`rename`, inlined:
        # this runs once per link of the cluster, hundreds of thousands at scale)
        renames = {m: (len(prefix(m)), prefix(first)) for m, first in copies.items() if first != m}
        index_of = net.index_of
        mine, theirs = [], []
        for i, (u, v) in enumerate(net.links):
            m = machine[u]
            if m not in renames or machine[v] != m:
                continue
            cut, there = renames[m]
            mine.append(i)
            theirs.append(index_of((there + u[cut:], there + v[cut:])))
        moved[mine] += flows[theirs]  # each link once: the same sums as one at a time
        for link, first_link in self.mirror.links.items():  # a mirrored pipeline replica's network links
            moved[net.index_of(link)] += flows[net.index_of(first_link)]
        return moved

    def _link_results(self, span) -> list[LinkResult]:
        net = self.machine.net
        net.drain()
        moved = net.link_bytes - (self._link_snapshot if self._link_snapshot is not None else 0.0)
        if self.mirror is not None:
            moved = self._mirrored_bytes(moved)
        length = span[1] - span[0]
        out = []
        kind = self.topology.edge_kind
        hot = np.flatnonzero(moved > 0.5)  # the links that carried anything (of 100k+ at scale)
        # as Python floats in one go each, not a numpy scalar per link
        for i, cap, nbytes in zip(hot.tolist(), net.capacity[hot].tolist(), moved[hot].tolist(), strict=True):
            link = net.links[i]
            out.append(LinkResult(link[0], link[1], kind[link], cap, nbytes,
                                  nbytes / (cap * length) if length > 0 else 0.0))
        return sorted(out, key=lambda link: link.name)
