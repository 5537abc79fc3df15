"""The `Context` a strategy's processes run against: the vocabulary every strategy is written in.

A strategy (sim/strategies/registry.py) starts SimPy processes that, per rank and iteration, wait for a batch
(`get_batch`), copy it in (`input_copy`), run the layers (`forward`, `backward`, with the memory timeline of
activations and gradients), reduce gradients (`collective`), step the optimizer (`optimizer_step`) and say
they are done (`finish`). The Context holds what those passes need, in typed parts:

- the machine, the ranks, their per-rank costs (and ``costs_for``: costs at another batch, a micro-batch);
- ``settings``: the run's frozen settings (`RunSettings`);
- ``plugins``: the optimizations and host model the run uses (`Plugins`, Protocols), built once with it;
- each rank's own state (`RankState`: its loader, preloader, gradients held, host dispatch progress);
- what the run reports: ``iteration_end`` (when each rank finished each iteration, observed through
  ``on_iteration_end``) and ``extra`` (strategy-specific figures that land in Result.extra).

It stays one module: the passes over the layers, with their memory timeline, are the one interface every
strategy and plug-in is written against.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from itertools import accumulate
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from trainsim.sim.compute.costs import RankCosts, weight_bytes
from trainsim.sim.compute.dispatch import gpu_spans
from trainsim.sim.core.interference import MATRIX, STREAMING, restamp, run_pieces, settle, warp
from trainsim.sim.core.jitter import Jitter
from trainsim.sim.core.latency import CallSite
from trainsim.sim.core.machine import COMM, COMPUTE, DATA, Machine

from .loaders import DataLoader, Preloader, SharedLoader
from .plugins import Plugins
from .settings import RunSettings

if TYPE_CHECKING:
    from trainsim.formats.workload import Workload
    from trainsim.sim.core.devices import DeviceSpec

__all__ = ["COMM", "COMPUTE", "Context", "RankState", "gradients_in", "gradients_out"]

# NCCL-style kernel names, so trace tools that look for "nccl" kernels find them
NCCL_KERNEL = {
    "allreduce": "ncclDevKernel_AllReduce_Sum_{dtype}_{algo}",
    "broadcast": "ncclDevKernel_Broadcast",
    "reduce": "ncclDevKernel_Reduce_Sum_{dtype}_{algo}",
    "allgather": "ncclDevKernel_AllGather_{algo}",
    "reduce_scatter": "ncclDevKernel_ReduceScatter_Sum_{dtype}_{algo}",
}
DTYPE_NAME = {"fp32": "f32", "tf32": "f32", "fp16": "f16", "bf16": "bf16"}


@dataclass
class RankState:
    """One rank's own state in a run."""

    loader: Any = None  # its DataLoader, or its view of its machine's SharedLoader (`Context.loader`)
    preloader: Any = None  # its `Preloader`, with ``optimizations.preload``
    # backward writes its parameters' gradients layer by layer and the step's zero_grad frees them
    # (`hold_model`'s ``grads="backward"``); the layers whose gradients are held now
    grads_from_backward: bool = False
    live_grads: set[int] = field(default_factory=set)
    host_free: float | None = None  # when its host is done dispatching the layers given so far (`_spans`)


@dataclass
class Context:
    """Everything a strategy's processes need (see the module). ``plugins`` may be given as a function of
    the new Context (plug-ins built against it); it is called once, when the Context is made."""

    machine: Machine
    ranks: list[str]  # GPU names, rank order
    costs: dict[str, RankCosts]  # per rank
    total_iterations: int
    settings: RunSettings = field(default_factory=RunSettings)
    workload: Workload | None = None
    costs_for: Callable[[str, int], RankCosts] | None = None  # a rank's costs at another batch
    measured_on: DeviceSpec | None = None  # the device the workload was measured on (a bundle's), if known
    # sim/symmetry.py: simulated rank -> the ranks it stands for (itself first); None: every rank runs
    mirrors: dict[str, list[str]] | None = None
    # the training loop keeps ``output = model(inputs)`` until its backward is done (the strategy says)
    loop_holds_output: bool = True
    plugins: Plugins | Callable[[Context], Plugins] = field(default_factory=Plugins)
    extra: dict[str, Any] = field(default_factory=dict)
    iteration_end: dict[int, dict[str, float]] = field(default_factory=dict)
    on_iteration_end: list[Callable[[int], None]] = field(default_factory=list)
    shared_loaders: dict[int, SharedLoader] = field(default_factory=dict)  # machine -> its one loader
    _rank_state: dict[str, RankState] = field(default_factory=dict, repr=False)
    _announced: set[int] = field(default_factory=set, repr=False)
    _loads: dict = field(default_factory=dict, repr=False)  # `_load_table`

    def __post_init__(self):
        if callable(self.plugins):
            self.plugins = self.plugins(self)

    @property
    def env(self) -> simpy.Environment:
        return self.machine.env

    @property
    def grad_itemsize(self) -> int:
        """Bytes per gradient value: 16-bit only under master-weight mixed precision."""
        return weight_bytes(self.settings.precision, self.settings.mixed_precision)

    @property
    def n(self) -> int:
        return len(self.ranks)

    @cached_property
    def jitter(self) -> Jitter:
        return Jitter(self.settings.jitter_spec)

    @property
    def simulated(self) -> list[str]:
        """The ranks whose processes run (all of them unless `mirrors` says otherwise)."""
        return self.ranks if self.mirrors is None else list(self.mirrors)

    def finish(self, iteration: int, gpu: str) -> None:
        """``gpu`` is done with ``iteration`` (and the ranks it stands for, when mirrored); once every rank
        is, the `on_iteration_end` observers hear of it."""
        ends = self.iteration_end.setdefault(iteration, {})
        for g in self.mirrors.get(gpu, [gpu]) if self.mirrors is not None else [gpu]:
            ends[g] = self.env.now
        if len(ends) == self.n and iteration not in self._announced:
            self._announced.add(iteration)
            for observer in self.on_iteration_end:
                observer(iteration)

    def rank(self, gpu: str) -> RankState:
        """``gpu``'s own state in this run (created on first use)."""
        state = self._rank_state.get(gpu)
        if state is None:
            state = self._rank_state[gpu] = RankState()
        return state

    # ---- data -----------------------------------------------------------------------------------------
    def loader(self, gpu: str) -> DataLoader:
        """The data loader feeding ``gpu`` (created on first use): its own, on the GPU's nearest socket, or
        with ``loader_layout`` shared its view of its machine's one loader."""
        state = self.rank(gpu)
        if state.loader is None:
            batch = self.costs[gpu].batch if gpu in self.costs else 0
            if self.settings.loader_layout == "shared":
                machine = self.machine.topology.machine_of(gpu)
                if machine not in self.shared_loaders:
                    self.shared_loaders[machine] = SharedLoader(self, machine)
                state.loader = self.shared_loaders[machine].view(gpu, batch)
            else:
                state.loader = DataLoader(self, gpu, batch)
        return state.loader

    def get_batch(self, gpu: str, iteration: int, batch: int | None = None):
        """Wait for the next prepared batch; the wait is exposed data preparation on ``gpu``. With
        ``preload``, the rank's preloader takes the batches instead (see `input_copy`)."""
        loader = self.loader(gpu)
        if batch is not None:
            loader.batch = batch
        if self.settings.preload_depth:
            return
        yield from self.loader_wait(gpu, iteration)

    def loader_wait(self, gpu: str, iteration: int):
        loader = self.loader(gpu)
        start = self.env.now
        yield from loader.get()
        if self.env.now > start:
            self.machine.record_since(start, gpu, "data", "data_wait", iteration, category=DATA)

    # ---- the model's passes ---------------------------------------------------------------------------
    def input_copy(self, gpu: str, iteration: int, nbytes: float | None = None):
        """The rank's input batch from its host memory to the GPU (pinned or pageable); none on a CPU rank,
        nor for an empty batch (copying an empty tensor launches no copy)."""
        nbytes = self.costs[gpu].input_bytes if nbytes is None else nbytes
        # ScaleDNN pre-loading: the copy ran ahead on the H2D engine (`Preloader`)
        if self.settings.preload_depth:
            state = self.rank(gpu)
            if state.preloader is None:
                state.preloader = Preloader(self, gpu, nbytes, self.settings.preload_depth)
            yield from state.preloader.take(iteration)
            return
        self.machine.gpus[gpu].memory.alloc(self.env.now, nbytes, "input")
        if self.machine.gpus[gpu].device.kind == "cpu" or nbytes <= 0:
            return  # a CPU rank's batch is prepared in its own memory: there is no host-to-device copy
        yield from self.machine.h2d(gpu, nbytes, iteration=iteration, pinned=self.settings.pinned)

    def _segment(
        self, gpu: str, iteration: int, op: str, layers: list[int], times: list[float], saved_delta: int
    ):
        """Layers back to back on the compute stream in one timeout (a rank's own stream runs them without a
        gap, so one event stands for many); each layer is still recorded, and its activations allocated
        (forward, ``saved_delta`` = +1) or freed (backward, -1) at its own start or end.

        Where the rank's costs hold the host's dispatch time per layer (`dispatch`), each layer also waits
        for its dispatch (`dispatch.gpu_spans`): the host starts a forward once it has the stream and its own
        earlier dispatch is done, and goes on to the backward and its later segments without waiting for
        the GPU. A layer the GPU waited for starts late; the gap is idle.

        Backward also holds the activation gradients (`gradients_in`, `gradients_out`)."""
        costs, machine, env = self.costs[gpu], self.machine, self.env
        memory = machine.gpus[gpu].memory
        if self.settings.jitter_spec is not None:  # one draw per rank, iteration and pass: it drifts whole
            factor = self.jitter.factor(machine.gpus[gpu].index, iteration, 0 if op == "forward" else 1)
            times = [t * factor for t in times]

        def record(begin: float, end: float, layer: str, k: int, kind: str | None = None) -> None:
            # where the host's dispatch is modelled, when it began enqueueing the layer (a trace's launch)
            args = {} if dispatched is None else {"dispatched": dispatched[k]}
            if kind is not None:  # one layer's kernels: named by what they compute in a trace
                args["kind"] = kind
            machine.record(iteration=iteration, resource=gpu, stream="compute", op=op, start=begin, end=end,
                           category=COMPUTE, layer=layer, args=args)

        with machine.gpus[gpu].streams["compute"].request() as req:
            yield req
            start = env.now
            seconds = [times[i] for i in layers]
            spans, marks = self._spans(gpu, start, layers, seconds, saved_delta > 0)
            dispatched = marks[:-1] if marks is not None else None
            first_op = len(machine.ops)
            first_event = len(memory.timeline)
            grads = costs.output_bytes_per_layer if saved_delta < 0 else []
            last = len(costs.layer_names) - 1
            run_start = 0  # the first layer of the current run of layers with no gap between them
            for k, (i, (t, end)) in enumerate(zip(layers, spans, strict=True)):
                if saved_delta > 0:
                    memory.alloc(t, costs.saved_bytes_per_layer[i], "activations")
                    if i == last and self.loop_holds_output:  # ``output = model(x)`` lives through backward
                        memory.alloc(end, costs.output_bytes, "output")
                if grads:
                    gradients_in(memory, t, grads, i, costs.loss_input_bytes)
                    self.write_param_grads(gpu, t, i)
                if self.settings.detail:
                    kind = costs.layer_kinds[i] if costs.layer_kinds else None
                    record(t, end, costs.layer_names[i], k, kind)
                if saved_delta < 0:
                    memory.free(end, costs.saved_bytes_per_layer[i], "activations")
                    if grads:
                        gradients_out(memory, end, grads, i)
                    if i == 0:  # the training loop holds the batch and the output until its backward is done
                        memory.free(end, costs.input_bytes, "input")
                        memory.free(end, costs.output_bytes, "output")
                if not self.settings.detail and (k == len(layers) - 1 or spans[k + 1][0] > end):
                    first_name, last_name = costs.layer_names[layers[run_start]], costs.layer_names[i]
                    record(spans[run_start][0], end, f"{first_name}..{last_name}", run_start)
                    run_start = k + 1
            stamped = (first_op, len(machine.ops)), (first_event, len(memory.timeline))
            contention = machine.gpus[gpu].contention
            if contention is None:
                if spans and spans[-1][1] > start:
                    yield env.timeout(spans[-1][1] - start)
                return
            if not spans:
                return
            table = self._load_table(costs, saved_delta > 0)

            def loads():  # asked for only where a collective overlaps the pass
                return table[layers] if len(table) else np.tile(MATRIX, (len(layers), 1))

            actual = yield from run_pieces(env, contention, start, spans[-1][1], seconds, loads, dispatched,
                                           marks[1:] if marks is not None else None)
            if actual is not None:  # communication overlapped it: what was stamped nominally moves
                restamp(machine, memory, *stamped, warp(spans, actual))

    def _load_table(self, costs: RankCosts, forward: bool):
        """The (sm, hbm) of every layer's forward or backward pass as an array, made once per costs."""
        key = (id(costs), forward)
        entry = self._loads.get(key)
        if entry is None or entry[0] is not costs:
            loads = costs.forward_loads if forward else costs.backward_loads
            entry = self._loads[key] = (costs, np.asarray(loads, dtype=float).reshape(-1, 2))
        return entry[1]

    def _spans(self, gpu: str, start: float, layers: list[int], times: list[float],
               forward: bool) -> tuple[list[tuple[float, float]], list[float] | None]:
        """Each of ``layers``' (start, end) on the GPU, whose stream is the rank's from ``start``: back to
        back, or as their dispatch allows (the host's progress kept in `host_free`); and when the host began
        dispatching each, then when it finished the last (None where its dispatch is not modelled)."""
        costs = self.costs[gpu]
        host_s = costs.forward_host_s if forward else costs.backward_host_s
        if not host_s:
            ends = list(accumulate(times, initial=start))
            return list(zip(ends, ends[1:], strict=False)), None
        state = self.rank(gpu)
        host_free = state.host_free if state.host_free is not None else start
        if forward:  # the loop calls the model once it has the batch on the stream
            host_free = max(host_free, start)
        dispatch = [host_s[i] for i in layers]
        spans, state.host_free = gpu_spans(start, host_free, times, dispatch)
        return spans, list(accumulate(dispatch, initial=host_free))

    def forward(self, gpu: str, iteration: int):
        """Every layer's forward on the compute stream; saved activations allocated as they are made."""
        if self.plugins.offload is not None:  # vDNN: offloaded layers' activations go to host memory
            yield from self.plugins.offload.forward(gpu, iteration)
            return
        costs = self.costs[gpu]
        yield from self._segment(
            gpu, iteration, "forward", list(range(len(costs.layer_names))), costs.forward_s, +1
        )

    def backward(self, gpu: str, iteration: int, stops: dict[int, Callable[[], None]] | None = None):
        """Every layer's backward in reverse order, freeing its saved activations when done; after layer i,
        ``stops[i]()`` is called (e.g. a DDP bucket is complete)."""
        if self.plugins.offload is not None:  # vDNN: each offloaded layer waits for its prefetch
            yield from self.plugins.offload.backward(gpu, iteration, stops or {})
            return
        costs = self.costs[gpu]
        stops = stops or {}
        segment: list[int] = []
        for i in reversed(range(len(costs.layer_names))):
            segment.append(i)
            if i in stops or i == 0:
                yield from self._segment(gpu, iteration, "backward", segment, costs.backward_s, -1)
                segment = []
                if i in stops:
                    stops[i]()

    def optimizer_step(self, gpu: str, iteration: int):
        """The rank's optimizer step on its compute stream; with its state offloaded, streamed in chunks.
        Then ``zero_grad(set_to_none=True)``, as the executor's loops do: the gradients backward wrote go."""
        if self.plugins.state_stream is not None:
            costs = self.costs[gpu]
            yield from self.plugins.state_stream.step(gpu, iteration, costs.state_bytes, costs.step_s)
        else:
            yield from self.machine.run(
                gpu,
                "compute",
                self.costs[gpu].step_s,
                op="optimizer",
                iteration=iteration,
                load=STREAMING,
                optimizer=self.settings.optimizer,
            )
        self.zero_grad(gpu)

    def hold_model(self, gpu: str, *, grads: bool | str = True, state: bool = True,
                   buckets: float = 0.0) -> None:
        """Allocate what stays on the GPU for the whole run (the weights, the matmul threads' cuBLAS
        workspaces, the optimizer state, the buckets). ``grads``: True, the parameter gradients too;
        ``"backward"``, they are written by each layer's backward and freed by the step's ``zero_grad``
        (`write_param_grads`); False, none."""
        costs, memory = self.costs[gpu], self.machine.gpus[gpu].memory
        memory.alloc(self.env.now, costs.param_bytes, "params")
        memory.alloc(self.env.now, costs.workspace_bytes, "workspaces")
        if grads == "backward":
            self.rank(gpu).grads_from_backward = True
        elif grads:
            memory.alloc(self.env.now, costs.grad_bytes, "grads")
        if state and self.plugins.state_stream is not None:
            self.plugins.state_stream.hold(gpu, costs.state_bytes)
        elif state:
            memory.alloc(self.env.now, costs.state_bytes, "optimizer_state")
        memory.alloc(self.env.now, buckets, "buckets")

    def write_param_grads(self, gpu: str, t: float, i: int) -> None:
        """Layer ``i``'s backward writes its parameters' gradients, unless they are held already."""
        state = self.rank(gpu)
        if not state.grads_from_backward:
            return
        live = state.live_grads
        if i not in live:
            live.add(i)
            self.machine.gpus[gpu].memory.alloc(t, self.costs[gpu].grad_bytes_per_layer[i], "grads")

    def zero_grad(self, gpu: str) -> None:
        """``zero_grad(set_to_none=True)``: the gradients backward wrote are freed."""
        state = self.rank(gpu)
        live, state.live_grads = state.live_grads, set()
        held = sum(self.costs[gpu].grad_bytes_per_layer[i] for i in live)
        self.machine.gpus[gpu].memory.free(self.env.now, held, "grads")

    # ---- communication --------------------------------------------------------------------------------
    def collective(
        self, op: str, nbytes: float, iteration: int, *, gpus: list[str] | None = None, label: str = "",
        call: CallSite | None = None,
    ):
        """One collective over ``gpus`` (default all ranks) on their communication channels: flows on the
        topology, or the analytic alpha-beta time when ``collectives: analytic``. ``call``: what the strategy
        knows of this call (e.g. how far apart the ranks arrived), for the machine's latency model."""
        from trainsim.sim.collectives import ops as coll
        from trainsim.sim.collectives.footprint import footprint

        gpus = gpus or self.ranks
        if len(gpus) < 2 or nbytes <= 0:
            return
        machine, env = self.machine, self.env
        # the ranks that run take part (mirrored ones are their representatives, sim/symmetry.py)
        local = gpus if self.mirrors is None else [g for g in gpus if g in self.mirrors]
        requests = [machine.gpus[g].streams["comm"].request() for g in local]
        yield env.all_of(requests)
        start = env.now
        # the NCCL kernel is resident from now to its end: its CTAs and HBM traffic slow overlapping compute
        shared = [machine.gpus[g].contention for g in local if machine.gpus[g].contention is not None]
        if shared:
            fp = footprint(machine.topology, op, gpus, nbytes, algo=self.settings.collective_algo)
            holds = [c.hold(fp.ctas, fp.demand) for c in shared]
            marks = [c.lost for c in shared]
        tag = f"it{iteration}:{op}{label}"
        paid = machine.latency.cost(call or CallSite(op), nbytes, now=env.now)
        if paid is not None:  # the call's own cost (a measured host's), then its bytes
            yield env.timeout(paid)
        # CPU ranks move gloo's bytes with their own cores: no layer runs meanwhile (Machine.rank_transfer)
        held = yield from machine.hold_compute(machine.cpu_ranks(gpus))
        if self.settings.collectives == "analytic":
            seconds, links, link_bytes = coll.analytic_collective(machine.topology, op, gpus, nbytes,
                                                                  algo=self.settings.collective_algo)
            yield env.timeout(seconds)
            machine.net.credit(links, link_bytes)  # what the flow path would have moved on them
        else:
            yield env.process(
                coll.run_collective(
                    env, machine.net, machine.topology, op, gpus, nbytes,
                    algo=self.settings.collective_algo, tag=tag
                )
            )
        machine.release_compute(held)
        if shared:
            yield from settle(env, shared, marks)  # the HBM the compute beside it took from its bytes
            for c, h in zip(shared, holds, strict=True):
                c.release(h)
        for g, req in zip(local, requests, strict=True):
            machine.gpus[g].streams["comm"].release(req)
        algo = self.settings.collective_algo
        if algo == "auto":  # name the kernel after what "auto" ran, as NCCL's kernel names do
            algo = coll.choose_algorithm(machine.topology, op, gpus, nbytes)
        dtype = "f32" if self.grad_itemsize == 4 else DTYPE_NAME[self.settings.precision]
        kernel = NCCL_KERNEL.get(op, "ncclDevKernel_" + op).format(dtype=dtype,
                                                                   algo=algo.upper())
        for rank, g in enumerate(gpus):
            if self.mirrors is not None and g not in self.mirrors:
                continue
            machine.record(
                iteration=iteration,
                resource=g,
                stream="comm",
                op=op,
                start=start,
                end=env.now,
                category=COMM,
                nbytes=nbytes,
                layer=label.strip(":") or None,
                args={
                    "kernel": kernel,
                    "group_size": len(gpus),
                    "rank": rank,
                    "method": self.settings.collectives,
                    "algo": algo,
                },
            )


# ---- activation gradients in backward ----------------------------------------------------------------------


def gradients_in(memory, t: float, grads: list[float], i: int, loss_input: float = 0.0) -> None:
    """Layer ``i``'s backward starts: it writes the gradient of its input (the previous layer's output size;
    the first layer's input needs none). Before the last layer, the loss's backward makes the gradient of
    the last output: cross entropy's two gradients of its input (NLL's, then log-softmax's), ``loss_input``
    bytes each (the output cast to fp32; 0: the output's size), then that gradient in the output's dtype."""
    if i == len(grads) - 1:
        loss = loss_input or grads[i]
        memory.alloc(t, 2 * loss, "activation_grads")
        memory.free(t, 2 * loss - grads[i], "activation_grads")
    if i > 0:
        memory.alloc(t, grads[i - 1], "activation_grads")


def gradients_out(memory, t: float, grads: list[float], i: int) -> None:
    """Layer ``i``'s backward is done: the gradient of its output is freed."""
    memory.free(t, grads[i], "activation_grads")
