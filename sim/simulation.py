"""The simulation of one resolved run:

    from trainsim.resolve import resolve
    from trainsim.sim.simulation import Simulation
    result = Simulation(resolve("ddp-resnet50-dgx-a100")).run()     # a Result

A `Run` (sim/run.py) carries the validated scenario, the loaded topology and workload, the devices and host
figures a calibration bundle measured, and the ranks; nothing here reads a file. On a CPU box (gloo) each
call of a collective pays a latency from that collective's measured calls and every point-to-point message
one from the measured send/recv messages: fast, or stalled until the timer tick the bundle found, else their
mean. What such a host measured is one plug-in (`trainsim.sim.hosts`), chosen from the run's host figures;
without one the plain GPU model runs.

It stays one module: it composes the parts (machine, host plug-in, costs, strategy) into one run and turns
the run into a Result.
"""

from __future__ import annotations

import time

import numpy as np
import simpy

from trainsim.errors import TrainsimError, raised_first
from trainsim.formats.scenario import cublas_workspace_config_bytes
from trainsim.formats.workload import Workload
from trainsim.sim.compute.costs import rank_costs
from trainsim.sim.core.collector import fewer_collections
from trainsim.sim.core.machine import Machine, build_machine
from trainsim.sim.core.result import GpuResult, LinkResult, Result, breakdown, busy_time
from trainsim.sim.core.window import MeasuredWindow, StopFlag
from trainsim.sim.hosts import host_model_for
from trainsim.sim.optimizations.data_movement import plugins_for
from trainsim.sim.planning.prefetch import auto_prefetch_distance
from trainsim.sim.run import Run, rank_names
from trainsim.sim.strategies.context import Context
from trainsim.sim.strategies.registry import get_strategy
from trainsim.sim.strategies.settings import RunSettings
from trainsim.sim.symmetry import Mirror, mirror_ranks
from trainsim.topologies.machine_classes import prefix

__all__ = ["CountingEnvironment", "Simulation", "build_machine"]


class CountingEnvironment(simpy.Environment):
    """A SimPy environment that counts the events it processes (for the speed benchmark)."""

    def __init__(self):
        super().__init__()
        self.events_processed = 0

    def step(self) -> None:
        self.events_processed += 1
        super().step()


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
    """One resolved run on one machine (by default the run's topology)."""

    @fewer_collections()
    def __init__(self, run: Run, *, machine: Machine | None = None, record: bool = True, mirror: bool = True,
                 stop: StopFlag | None = None):
        """``run``: a resolved `Run` (`trainsim.resolve.resolve`). ``machine``: the machine to run on
        (default: one built from the run's topology and devices). ``record``: keep every op, flow, link-rate
        and memory change (for records and traces). ``mirror``: where it is exact, simulate one machine per
        class of identical ones and mirror it (sim/symmetry.py); False simulates every rank (to check
        that). ``stop``: a flag that, once requested (Ctrl-C), stops the run when the next iteration has
        finished on every rank (`request_stop`)."""
        if not isinstance(run, Run):
            raise TypeError(f"Simulation takes a resolved Run (trainsim.resolve.resolve), not "
                            f"{type(run).__name__}")
        self.scenario = sc = run.scenario
        self.workload, devices = run.workload, dict(run.devices)
        self.topology = topology = machine.topology if machine is not None else run.topology
        self.ranks = list(run.ranks) if machine is None else rank_names(sc, topology)
        if machine is not None:
            run = run.with_topology(topology)
        self.strategy = get_strategy(sc.strategy.name)
        self.strategy.check(run)
        per_gpu = self.strategy.rank_batch(run)
        # an auto prefetch distance: the run simulated at fixed distances, nothing recorded
        prefetch = auto_prefetch_distance(run, lambda probe: Simulation(probe, record=False).run())
        self.env = CountingEnvironment() if machine is None else machine.env
        self.machine = machine or Machine(topology, self.env, devices=devices, record_link_rates=record,
                                          record_flows=record, record_memory=record)
        calls = dict(run.host.calls)
        self.host = host_model_for(calls, self.workload, devices, tick=run.host.tick)
        if machine is None and self.host is not None and calls:
            self.machine.latency = self.host.latency
        measured_on = devices.get(self.workload.provenance.device_spec)
        sharing = self.machine.host_sharing(self.ranks)
        costs_for = self._cost_table(sharing, measured_on)
        costs = {gpu: costs_for(gpu, per_gpu) for gpu in self.ranks}
        rank_devices = {g: self.machine.gpus[g].device for g in self.ranks}
        prep = self._prep_s_per_sample(run, self.strategy.loaded_batch(run, per_gpu), max(sharing.values()))
        jitter = sc.strategy.jitter
        if jitter is None and self.host is not None:  # the spread the host plug-in measured
            jitter = self.host.jitter(list(rank_devices.values()), per_gpu)
        self.mirror = None
        alike = self.strategy.representatives(run)
        if alike is not None:  # the strategy's ranks are alike by construction (the mesh's stages)
            self.mirror = Mirror(stands_for=alike, machines={})
        elif mirror:
            self.mirror = mirror_ranks(sc, topology, self.ranks, costs, detail=record, host=self.host,
                                       jitter=jitter)
        measured = run.measured  # RunMeasurements; None: nothing measured
        overlap = measured.loader_overlap if measured else None
        if overlap and self.host is not None and sc.optimizations.preload and sc.host.data_workers:
            prep, costs = self.host.share_process_with_loader(prep, costs, rank_devices, overlap)
        extra = {}
        first = costs[self.ranks[0]]
        if first.forward_host_s:  # the host's dispatch is modelled (`sim/compute/dispatch.py`)
            extra["host_dispatch"] = {
                "rank": self.ranks[0],
                "forward_s": sum(first.forward_host_s), "backward_s": sum(first.backward_host_s),
                "gpu_forward_s": sum(first.forward_s), "gpu_backward_s": sum(first.backward_s)}
        self.ctx = Context(
            machine=self.machine, ranks=self.ranks, costs=costs,
            total_iterations=sc.warmup_iterations + sc.iterations,
            settings=RunSettings.of(sc, prep_s_per_sample=prep, jitter_spec=jitter, detail=record),
            workload=self.workload, costs_for=costs_for, measured_on=measured_on,
            mirrors=self.mirror.stands_for if self.mirror is not None else None,
            loop_holds_output=self.strategy.loop_holds_output, extra=extra,
            plugins=plugins_for(sc, host=self.host, codec_s=measured.codec_s if measured else None,
                                prefetch_distance=prefetch))
        if self.ctx.settings.comm_interference and len(self.ranks) > 1:
            self.machine.enable_interference(self.ctx.simulated)
        self.window = MeasuredWindow(self.machine, sc.warmup_iterations, self.ctx.total_iterations,
                                     self.ctx.simulated, stop)
        self.ctx.on_iteration_end.append(self.window)

    def _cost_table(self, sharing: dict[str, int], measured_on):
        """``costs_for(gpu, batch)``: a rank's costs at a batch, computed once per device, batch and number of
        ranks sharing its host."""
        sc, cache = self.scenario, {}
        workspace_config = sc.host.cublas_workspace_config or recorded_workspace_config(self.workload)

        def costs_for(gpu: str, batch: int):
            device = self.machine.gpus[gpu].device
            key = (device.name, batch, sharing[gpu])
            if key not in cache:
                scale = self.host.step_scale(device, batch, sharing[gpu]) if self.host else 1.0
                cache[key] = rank_costs(self.workload, device, batch, sc.precision, sc.optimizer.name,
                                        measured_on=measured_on, scale=scale,
                                        mixed_precision=sc.mixed_precision, workspace_config=workspace_config,
                                        compute_model=sc.compute_model)
            return cache[key]

        return costs_for

    def _prep_s_per_sample(self, run: Run, loaded: int, sharing: int) -> float:
        """The input pipeline's cost per sample: the scenario's stated cost, else another pipeline than the
        default measured back to back for this run, else the workload's; a host plug-in's measured loop
        where there is one (its ranks each preparing ``loaded`` samples at once)."""
        stated = self.scenario.host.prep_s_per_sample
        measured = run.measured
        given = stated if stated is not None else measured.prep_s_per_sample if measured else None
        if self.host is None:
            return given if given is not None else self.workload.input.prep_s_per_sample or 0.0
        return self.host.prep_s_per_sample(given, [self.machine.gpus[g].device for g in self.ranks], loaded,
                                           sharing)

    def request_stop(self) -> None:
        """Ask a running ``run()`` to stop when the next iteration has finished on every rank (the first
        measured one at the earliest) and to return the Result of the iterations done so far, with
        ``stopped_early`` set. Safe to call from a signal handler: it only sets a flag."""
        self.window.stop.request()

    @fewer_collections()
    def run(self) -> Result:
        sc, ctx, env = self.scenario, self.ctx, self.env
        wall = time.perf_counter()
        try:
            self.strategy.start(ctx)
            env.run()
        except TrainsimError as exc:  # a strategy field the machine cannot satisfy: the scenario's error
            exc = raised_first(exc)
            if exc.file is not None:
                raise exc from None
            field = "strategy.collective_algo" if exc.field == "algo" else exc.field  # the collectives' word
            raise TrainsimError(exc.reason, file=sc.source, field=field) from None
        wall = time.perf_counter() - wall
        total = self.window.last + 1
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
        w, last = self.scenario.warmup_iterations, self.window.last
        for g in self.ctx.simulated:
            gpu = self.machine.gpus[g]
            util = busy_time(by_gpu[g], *span) / length if length > 0 else 0.0
            start = self.window.memory_area[w - 1][g] if w > 0 else 0.0
            average = (self.window.memory_area[last][g] - start) / length if length > 0 else gpu.memory.in_use
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
        if self.window.link_snapshot is not None:
            flows = flows - (self.window.link_snapshot - self.window.snapshot_credited)
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
        snapshot = self.window.link_snapshot
        moved = net.link_bytes - (snapshot if snapshot is not None else 0.0)
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
