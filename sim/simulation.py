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
from trainsim.sim.compute.costs import mixed, rank_costs
from trainsim.sim.core.collector import fewer_collections
from trainsim.sim.core.machine import Machine, build_machine
from trainsim.sim.core.result import GpuResult, LinkResult, Result, breakdown, busy_time
from trainsim.sim.hosts import host_model_for
from trainsim.sim.run import Run, rank_names
from trainsim.sim.strategies.base import Context, get_strategy, rank_batch_hook
from trainsim.sim.symmetry import mirror_ranks
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
    def __init__(self, run: Run, *, machine: Machine | None = None, record: bool = True, mirror: bool = True):
        """``run``: a resolved `Run` (`trainsim.resolve.resolve`). ``machine``: the machine to run on
        (default: one built from the run's topology and devices). ``record``: keep every op, flow, link-rate
        and memory change (for records and traces). ``mirror``: where it is exact, simulate one machine per
        class of identical ones and mirror it (sim/symmetry.py); False simulates every rank (to check
        that)."""
        if not isinstance(run, Run):
            raise TypeError(f"Simulation takes a resolved Run (trainsim.resolve.resolve), not "
                            f"{type(run).__name__}")
        measured = run.measured  # RunMeasurements; None: nothing measured
        self.run_spec = run
        self.scenario = sc = run.scenario
        self.workload, devices = run.workload, dict(run.devices)
        topology = machine.topology if machine is not None else run.topology
        self.topology = topology
        self.ranks = list(run.ranks) if machine is None else rank_names(sc, topology)
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
        calls = dict(run.host.calls)
        self.host = host_model_for(calls, self.workload, devices, tick=run.host.tick)
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
        prepare(self.ctx, sc, rerun=lambda sub: Simulation(run.with_scenario(sub), record=False).run())
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
