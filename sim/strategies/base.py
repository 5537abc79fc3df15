"""Parallel strategies: the registry and the pieces every strategy's iteration is made of.

A strategy is a function ``run(ctx) -> None`` that starts SimPy processes on ``ctx.machine`` for
``ctx.total_iterations`` iterations and calls ``ctx.finish(iteration, gpu)`` when a rank is done with one.
The shared pieces here: the data loader (host cores preparing batches ahead), a rank's input copy,
forward and backward over the layers (with the memory timeline), collectives on the communication channel,
the optimizer step.

Strategies live in their own modules of this package (ddp.py, dp_gpu0.py, parameter_server.py, ...) and
register here when imported; `MODULES` names the module of each shipped strategy, so a run imports only the
one it uses (the others cost start-up time).

It stays one module: the context, the data loader, the passes over the layers with their memory timeline
and the registry are the one interface every strategy is written against.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from itertools import accumulate
from typing import Any

import simpy

from trainsim.errors import unknown_name
from trainsim.sim.compute.costs import RankCosts, weight_bytes
from trainsim.sim.compute.dispatch import gpu_spans
from trainsim.sim.core.jitter import Jitter
from trainsim.sim.core.latency import CallSite
from trainsim.sim.core.machine import COMM, COMPUTE, DATA, Machine

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
class Context:
    """Everything a strategy needs: the machine, the ranks, their costs and the run's settings."""

    machine: Machine
    ranks: list[str]  # GPU names, rank order
    costs: dict[str, RankCosts]  # per rank
    total_iterations: int
    precision: str = "fp32"
    mixed_precision: str = "master"  # how a 16-bit precision keeps weights and gradients (costs.MIXED_MODES)
    optimizer: str = "sgd"
    pinned: bool = True
    data_workers: int = 4
    loader_layout: str = "per-gpu"  # or "shared": one DataLoader per machine feeds its ranks (SharedLoader)
    prep_s_per_sample: float = 0.0
    bucket_cap_bytes: float = 25 * 2**20
    first_bucket_cap_bytes: float = 1 * 2**20
    collectives: str = "flow"  # or "analytic"
    collective_algo: str = "auto"
    ps_cores: int | None = None
    ps_socket: int = 0
    detail: bool = True  # False: one record per run of back-to-back layers instead of one per layer
    iteration_end: dict[int, dict[str, float]] = field(default_factory=dict)
    loaders: dict[str, DataLoader] = field(default_factory=dict)
    shared_loaders: dict[int, SharedLoader] = field(default_factory=dict)  # machine -> its one loader
    # for strategies that need more than the per-rank costs (pipeline, easgd): the scenario's pieces,
    # costs at another batch (a micro-batch), and strategy-specific figures that land in Result.extra
    workload: Any = None
    spec: Any = None  # the scenario's StrategySpec
    optimizations: Any = None
    batch_size: int = 0  # global
    costs_for: Callable[[str, int], RankCosts] | None = None
    measured_on: Any = None  # the DeviceSpec the workload was measured on (a calibration bundle's), if known
    extra: dict[str, Any] = field(default_factory=dict)
    # data-movement optimizations' per-run state (sim/optimizations/data_movement.py sets them up)
    preload_depth: int = 0
    cpu_batch_split: bool = False
    preloaders: dict[str, Any] = field(default_factory=dict)
    # sim/optimizations/offload.py Offloader when optimizations.offload_activations is on
    offloader: Any = None
    codec: Any = None  # sim/optimizations/compression.py Codec when optimizations.param_compression is set
    # sim/optimizations/optimizer_offload.py StateStreamer when optimizations.offload_optimizer_state is on
    state_streamer: Any = None
    # the spread of a rank's passes (sim/core/jitter.py JitterSpec): the scenario's strategy.jitter, else on a
    # calibrated CPU box the measured one; None: every pass takes its nominal time
    jitter_spec: Any = None
    # the host plug-in (trainsim.sim.hosts) of a calibrated host; None: the plain model
    host: Any = None
    # sim/symmetry.py: simulated rank -> the ranks it stands for (itself first); None: every rank runs
    mirrors: dict[str, list[str]] | None = None
    # the training loop keeps ``output = model(inputs)`` until its backward is done (DataParallel's gathered
    # output is dp_gpu0's own)
    loop_holds_output: bool = True
    # ranks whose parameter gradients backward writes layer by layer and the step's zero_grad frees
    # (`hold_model`'s ``grads="backward"``), and the layers whose gradients are held now
    grads_from_backward: set[str] = field(default_factory=set)
    live_grads: dict[str, set[int]] = field(default_factory=dict)
    # rank -> when its host is done dispatching the layers it has been given (`_spans`, `dispatch`)
    host_free: dict[str, float] = field(default_factory=dict)

    @property
    def env(self) -> simpy.Environment:
        return self.machine.env

    @property
    def grad_itemsize(self) -> int:
        """Bytes per gradient value: 16-bit only under master-weight mixed precision."""
        return weight_bytes(self.precision, self.mixed_precision)

    @property
    def n(self) -> int:
        return len(self.ranks)

    @cached_property
    def jitter(self) -> Jitter:
        return Jitter(self.jitter_spec)

    @property
    def simulated(self) -> list[str]:
        """The ranks whose processes run (all of them unless `mirrors` says otherwise)."""
        return self.ranks if self.mirrors is None else list(self.mirrors)

    def finish(self, iteration: int, gpu: str) -> None:
        ends = self.iteration_end.setdefault(iteration, {})
        for g in self.mirrors.get(gpu, [gpu]) if self.mirrors is not None else [gpu]:
            ends[g] = self.env.now

    # ---- data -----------------------------------------------------------------------------------------
    def loader(self, gpu: str) -> DataLoader:
        """The data loader feeding ``gpu`` (created on first use): its own, on the GPU's nearest socket, or
        with ``loader_layout`` shared its view of its machine's one loader."""
        if gpu not in self.loaders:
            batch = self.costs[gpu].batch if gpu in self.costs else 0
            if self.loader_layout == "shared":
                machine = self.machine.topology.machine_of(gpu)
                if machine not in self.shared_loaders:
                    self.shared_loaders[machine] = SharedLoader(self, machine)
                self.loaders[gpu] = self.shared_loaders[machine].view(gpu, batch)
            else:
                self.loaders[gpu] = DataLoader(self, gpu, batch)
        return self.loaders[gpu]

    def get_batch(self, gpu: str, iteration: int, batch: int | None = None):
        """Wait for the next prepared batch; the wait is exposed data preparation on ``gpu``. With
        ``preload``, the rank's preloader takes the batches instead (see `input_copy`)."""
        loader = self.loaders.get(gpu) or self.loader(gpu)
        if batch is not None:
            loader.batch = batch
        if self.preload_depth:
            return
        yield from self.loader_wait(gpu, iteration)

    def loader_wait(self, gpu: str, iteration: int):
        loader = self.loaders.get(gpu) or self.loader(gpu)
        start = self.env.now
        yield from loader.get()
        if self.env.now > start:
            self.machine.record_since(start, gpu, "data", "data_wait", iteration, category=DATA)

    # ---- the model's passes ---------------------------------------------------------------------------
    def input_copy(self, gpu: str, iteration: int, nbytes: float | None = None):
        """The rank's input batch from its host memory to the GPU (pinned or pageable); none on a CPU rank,
        nor for an empty batch (copying an empty tensor launches no copy)."""
        nbytes = self.costs[gpu].input_bytes if nbytes is None else nbytes
        # ScaleDNN pre-loading: the copy ran ahead on the H2D engine (sim/optimizations/preload.py)
        if self.preload_depth:
            if gpu not in self.preloaders:
                from trainsim.sim.optimizations.preload import Preloader

                self.preloaders[gpu] = Preloader(self, gpu, nbytes, self.preload_depth)
            yield from self.preloaders[gpu].take(iteration)
            return
        self.machine.gpus[gpu].memory.alloc(self.env.now, nbytes, "input")
        if self.machine.gpus[gpu].device.kind == "cpu" or nbytes <= 0:
            return  # a CPU rank's batch is prepared in its own memory: there is no host-to-device copy
        yield from self.machine.h2d(gpu, nbytes, iteration=iteration, pinned=self.pinned)

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
        if self.jitter_spec is not None:  # one draw per rank, iteration and pass: the whole pass drifts
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
            spans, dispatched = self._spans(gpu, start, layers, [times[i] for i in layers], saved_delta > 0)
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
                if self.detail:
                    kind = costs.layer_kinds[i] if costs.layer_kinds else None
                    record(t, end, costs.layer_names[i], k, kind)
                if saved_delta < 0:
                    memory.free(end, costs.saved_bytes_per_layer[i], "activations")
                    if grads:
                        gradients_out(memory, end, grads, i)
                    if i == 0:  # the training loop holds the batch and the output until its backward is done
                        memory.free(end, costs.input_bytes, "input")
                        memory.free(end, costs.output_bytes, "output")
                if not self.detail and (k == len(layers) - 1 or spans[k + 1][0] > end):
                    first_name, last_name = costs.layer_names[layers[run_start]], costs.layer_names[i]
                    record(spans[run_start][0], end, f"{first_name}..{last_name}", run_start)
                    run_start = k + 1
            if spans and spans[-1][1] > start:
                yield env.timeout(spans[-1][1] - start)

    def _spans(self, gpu: str, start: float, layers: list[int], times: list[float],
               forward: bool) -> tuple[list[tuple[float, float]], list[float] | None]:
        """Each of ``layers``' (start, end) on the GPU, whose stream is the rank's from ``start``: back to
        back, or as their dispatch allows (the host's progress kept in `host_free`); and when the host began
        dispatching each (None where its dispatch is not modelled)."""
        costs = self.costs[gpu]
        host_s = costs.forward_host_s if forward else costs.backward_host_s
        if not host_s:
            ends = list(accumulate(times, initial=start))
            return list(zip(ends, ends[1:], strict=False)), None
        host_free = self.host_free.get(gpu, start)
        if forward:  # the loop calls the model once it has the batch on the stream
            host_free = max(host_free, start)
        dispatch = [host_s[i] for i in layers]
        spans, self.host_free[gpu] = gpu_spans(start, host_free, times, dispatch)
        return spans, list(accumulate(dispatch, initial=host_free))[:-1]

    def forward(self, gpu: str, iteration: int):
        """Every layer's forward on the compute stream; saved activations allocated as they are made."""
        if self.offloader is not None:  # vDNN: offloaded layers' activations go to host memory
            yield from self.offloader.forward(gpu, iteration)
            return
        costs = self.costs[gpu]
        yield from self._segment(
            gpu, iteration, "forward", list(range(len(costs.layer_names))), costs.forward_s, +1
        )

    def backward(self, gpu: str, iteration: int, stops: dict[int, Callable[[], None]] | None = None):
        """Every layer's backward in reverse order, freeing its saved activations when done; after layer i,
        ``stops[i]()`` is called (e.g. a DDP bucket is complete)."""
        if self.offloader is not None:  # vDNN: each offloaded layer waits for its prefetch
            yield from self.offloader.backward(gpu, iteration, stops or {})
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
        if self.state_streamer is not None:
            costs = self.costs[gpu]
            yield from self.state_streamer.step(gpu, iteration, costs.state_bytes, costs.step_s)
        else:
            yield from self.machine.run(
                gpu,
                "compute",
                self.costs[gpu].step_s,
                op="optimizer",
                iteration=iteration,
                optimizer=self.optimizer,
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
            self.grads_from_backward.add(gpu)
        elif grads:
            memory.alloc(self.env.now, costs.grad_bytes, "grads")
        if state and self.state_streamer is not None:
            self.state_streamer.hold(gpu, costs.state_bytes)
        elif state:
            memory.alloc(self.env.now, costs.state_bytes, "optimizer_state")
        memory.alloc(self.env.now, buckets, "buckets")

    def write_param_grads(self, gpu: str, t: float, i: int) -> None:
        """Layer ``i``'s backward writes its parameters' gradients, unless they are held already."""
        if gpu not in self.grads_from_backward:
            return
        live = self.live_grads.setdefault(gpu, set())
        if i not in live:
            live.add(i)
            self.machine.gpus[gpu].memory.alloc(t, self.costs[gpu].grad_bytes_per_layer[i], "grads")

    def zero_grad(self, gpu: str) -> None:
        """``zero_grad(set_to_none=True)``: the gradients backward wrote are freed."""
        live = self.live_grads.pop(gpu, set())
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

        gpus = gpus or self.ranks
        if len(gpus) < 2 or nbytes <= 0:
            return
        machine, env = self.machine, self.env
        # the ranks that run take part (mirrored ones are their representatives, sim/symmetry.py)
        local = gpus if self.mirrors is None else [g for g in gpus if g in self.mirrors]
        requests = [machine.gpus[g].streams["comm"].request() for g in local]
        yield env.all_of(requests)
        start = env.now
        tag = f"it{iteration}:{op}{label}"
        paid = machine.latency.cost(call or CallSite(op), nbytes, now=env.now)
        if paid is not None:  # the call's own cost (a measured host's), then its bytes
            yield env.timeout(paid)
        # CPU ranks move gloo's bytes with their own cores: no layer runs meanwhile (Machine.rank_transfer)
        held = yield from machine.hold_compute(machine.cpu_ranks(gpus))
        if self.collectives == "analytic":
            seconds, links, link_bytes = coll.analytic_collective(machine.topology, op, gpus, nbytes,
                                                                  algo=self.collective_algo)
            yield env.timeout(seconds)
            machine.net.credit(links, link_bytes)  # what the flow path would have moved on them
        else:
            yield env.process(
                coll.run_collective(
                    env, machine.net, machine.topology, op, gpus, nbytes, algo=self.collective_algo, tag=tag
                )
            )
        machine.release_compute(held)
        for g, req in zip(local, requests, strict=True):
            machine.gpus[g].streams["comm"].release(req)
        algo = self.collective_algo
        if algo == "auto":  # name the kernel after what "auto" ran, as NCCL's kernel names do
            algo = coll.choose_algorithm(machine.topology, op, gpus, nbytes)
        dtype = "f32" if self.grad_itemsize == 4 else DTYPE_NAME[self.precision]
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
                    "method": self.collectives,
                    "algo": algo,
                },
            )


class DataLoader:
    """A PyTorch-style DataLoader for one rank: ``workers`` processes on the rank's socket each prepare whole
    batches (``batch x prep_s_per_sample`` seconds on one core), at most two batches ahead per worker
    (``prefetch_factor=2``). With no preparation cost every batch is ready at once. With 0 workers the
    training loop prepares each batch itself when it asks for it (``num_workers=0``)."""

    PREFETCH = 2

    def __init__(self, ctx: Context, gpu: str, batch: int):
        self.ctx = ctx
        self.gpu = gpu
        self.batch = batch
        self.host = ctx.machine.host_of(gpu)
        self.started = False
        self.store: simpy.Store | None = None

    def _start(self) -> None:
        self.started = True
        if self.ctx.prep_s_per_sample <= 0:
            return
        workers = self.ctx.data_workers
        self.store = simpy.Store(self.ctx.env, capacity=self.PREFETCH * workers)
        for w in range(workers):
            self.ctx.env.process(self._worker(w, workers))

    def _worker(self, w: int, workers: int):
        for iteration in range(w, self.ctx.total_iterations, workers):
            yield from self.ctx.machine.host_work(
                self.host,
                self.batch * self.ctx.prep_s_per_sample,
                op="data_prep",
                iteration=iteration,
                gpu=self.gpu,
            )
            yield self.store.put(iteration)

    def get(self):
        if self.ctx.data_workers == 0:  # num_workers=0: the loop prepares the batch, nothing overlaps
            duration = self.batch * self.ctx.prep_s_per_sample
            if duration > 0:
                yield self.ctx.env.timeout(duration)
            return
        if not self.started:
            self._start()
        if self.store is not None:
            yield self.store.get()


class SharedLoader:
    """One DataLoader for the ranks of a machine (``host.loader: shared``: one process feeds every GPU, as
    torch.nn.DataParallel does). Its ``data_workers`` processes, on the socket of the machine's first rank,
    take the next task from one queue: a batch of the rank with the fewest batches handed out so far (ties
    in rank order), so the ranks are served in turn; each task is ``batch x prep_s_per_sample`` seconds on
    one core. At most two batches per worker wait to be taken, over all the ranks (``prefetch_factor=2``).
    With 0 workers the one training loop prepares each rank's batch itself, one after another."""

    PREFETCH = DataLoader.PREFETCH

    def __init__(self, ctx: Context, machine: int):
        self.ctx = ctx
        first = next(g for g in ctx.ranks if ctx.machine.topology.machine_of(g) == machine)
        self.host = ctx.machine.host_of(first)
        self.order = {g: i for i, g in enumerate(ctx.ranks)}
        self.views: list[_SharedView] = []
        self.running = 0  # workers taking tasks
        self.room: simpy.Container | None = None  # batches prepared and not yet taken
        self.loop = simpy.Resource(ctx.env, capacity=1)  # the one process's loop (0 workers)

    def view(self, gpu: str, batch: int) -> _SharedView:
        view = _SharedView(self, gpu, batch)
        self.views.append(view)
        self.views.sort(key=lambda v: self.order[v.gpu])
        if self.room is not None and self.running == 0:  # a rank joined after the others were served
            self._start()
        return view

    def _start(self) -> None:
        workers = self.ctx.data_workers
        if self.room is None:
            self.room = simpy.Container(self.ctx.env, capacity=self.PREFETCH * workers)
        for _ in range(workers):
            self.running += 1
            self.ctx.env.process(self._worker())

    def _next(self) -> _SharedView | None:
        open_ = [v for v in self.views if v.issued < self.ctx.total_iterations]
        if not open_:
            return None
        view = min(open_, key=lambda v: v.issued)  # stable: the first in rank order among the fewest
        view.issued += 1
        return view

    def _worker(self):
        while (view := self._next()) is not None:
            iteration = view.issued - 1
            yield from self.ctx.machine.host_work(self.host, view.batch * self.ctx.prep_s_per_sample,
                                                  op="data_prep", iteration=iteration, gpu=view.gpu)
            yield self.room.put(1)
            yield view.store.put(iteration)
        self.running -= 1

    def get(self, view: _SharedView):
        if self.ctx.prep_s_per_sample <= 0:  # nothing to prepare: every batch is ready at once
            return
        if self.ctx.data_workers == 0:  # num_workers=0: the one loop prepares this rank's batch
            with self.loop.request() as turn:
                yield turn
                yield self.ctx.env.timeout(view.batch * self.ctx.prep_s_per_sample)
            return
        if self.room is None:
            self._start()
        yield view.store.get()
        yield self.room.get(1)


class _SharedView:
    """One rank's view of a `SharedLoader`: ``get`` waits for that rank's next batch."""

    def __init__(self, shared: SharedLoader, gpu: str, batch: int):
        self.shared = shared
        self.gpu = gpu
        self.batch = batch
        self.issued = 0  # tasks handed to the workers for this rank
        self.store = simpy.Store(shared.ctx.env)

    def get(self):
        yield from self.shared.get(self)


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


# ---- registry ---------------------------------------------------------------------------------------------

StrategyFn = Callable[[Context], None]
_REGISTRY: dict[str, StrategyFn] = {}

#: the module of this package that registers each shipped strategy
MODULES = {"single": "ddp", "ddp": "ddp", "dp-gpu0": "dp_gpu0", "parameter-server": "parameter_server",
           "easgd": "easgd", "pipeline": "pipeline", "spatial": "spatial", "hybrid": "spatial"}


def _load(name: str) -> None:
    """Import the shipped module that registers strategy ``name`` (nothing for other names)."""
    if name in MODULES and name not in _REGISTRY:
        importlib.import_module(f"{__package__}.{MODULES[name]}")


def register(name: str):
    def wrap(fn: StrategyFn) -> StrategyFn:
        _REGISTRY[name] = fn
        return fn

    return wrap


def strategies() -> dict[str, StrategyFn]:
    """Every registered strategy by name (the shipped ones imported, and so registered, first)."""
    for name in MODULES:
        _load(name)
    return dict(_REGISTRY)


#: strategies whose ranks do not each take batch_size / GPUs samples: name -> fn(scenario, ranks, workload)
#: returning the batch the per-rank costs are computed at (and checking the strategy's options)
_RANK_BATCH: dict[str, Callable[..., int]] = {}


def register_rank_batch(name: str):
    def wrap(fn):
        _RANK_BATCH[name] = fn
        return fn
    return wrap


def rank_batch_hook(name: str) -> Callable[..., int] | None:
    _load(name)
    return _RANK_BATCH.get(name)


def get_strategy(name: str) -> StrategyFn:
    _load(name)
    if name not in _REGISTRY:
        raise unknown_name("strategy", name, strategies(), field="strategy.name")
    return _REGISTRY[name]


__all__ = ["COMM", "COMPUTE", "Context", "DataLoader", "SharedLoader", "get_strategy", "register",
           "strategies"]
