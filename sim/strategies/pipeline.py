"""`pipeline`: inter-layer (pipeline) parallelism x data parallelism, with micro-batches (Myelin / AxoNN).

The model's layers are cut into ``stages`` contiguous ranges (balanced by forward + backward time at the
micro-batch unless ``stage_layers`` gives the counts); GPUs = stages x data-parallel replicas, replica ``r``'s
stage ``s`` on ``ranks[r * stages + s]`` (a replica's stages on neighbouring GPUs). Each replica's share of
the batch is split into ``micro_batches`` micro-batches. A stage's forward of micro-batch m sends its output
activation to the next stage, its backward sends dL/dx to the previous one: point-to-point copies on the
topology (P2P, or staged through host memory without it) on the sender's copy-out engine. Schedules:

- ``gpipe``: every stage runs all forwards, then all backwards (keeps all M micro-batches' activations);
- ``1f1b``: stage s runs min(S - s - 1, M) forwards, then alternates one forward, one backward, then the
  remaining backwards (at most S - s micro-batches in flight: same bubble, less memory);
- ``message-driven`` (AxoNN): receives are always posted and sends are non-blocking (the sender goes on
  computing while its message moves); each stage runs whichever forward/backward message arrived first (a
  backward on a tie). The first stage injects a new micro-batch while fewer than S are in flight, the last
  stage runs a micro-batch's backward right after its forward, a later stage s keeps at most S - s + 1 in
  flight (1F1B's bound plus one: room to run a ready forward while a backward is late).

The fixed schedules communicate as Megatron-style 1F1B does: ``batch_isend_irecv`` then wait. A stage posts
the receive of its next step together with its send; the send is a rendezvous (it starts once the receiver has
posted the matching receive) and the stage waits for it to finish, so each transfer is exposed on the sender.
``blocking_sends: false`` models a stage that issues ``isend`` and goes on (its sends waited for at the end of
the iteration), as trainsim's executor may run them; each receive still blocks. On free links and without
jitter all three schedules take (M + S - 1) x (f + b) for uniform stages (bubble (S - 1) / (M + S - 1)); with
real links message-driven hides its transfers; under jitter it does not wait for one particular message while
another is ready, which pays when micro-batches are few per stage and can lose when many are (a greedy order
can delay the forward stream the last stage waits on).

A stage's parameter gradients exist from the end of its first backward of an iteration (later micro-batches
accumulate into them) until the optimizer's step is done (``zero_grad(set_to_none=True)``, as the executor
does). After its last backward each stage's gradients are all-reduced over its data-parallel group (the same
stage in every replica), then the optimizer steps. ``optimizations.offload_optimizer_state`` keeps the fp32
master weights and optimizer state in pinned host memory: they stream to the GPU in chunks of
``offload_chunk_mb`` (two chunk buffers on the GPU, H2D engine) while the all-reduce runs, each chunk is
stepped on the GPU and streamed back (D2H engine; sim/optimizations/optimizer_offload.py). The GPU then
holds only the 16-bit weights and gradients (mixed-precision Adam: 16 -> 4 bytes per parameter,
docs/hardware-figures.md, "Memory accounting") plus the two buffers.

``strategy.pipeline.recompute`` checkpoints activations at stage granularity (Megatron/DeepSpeed-style
recomputation, as AxoNN's large runs need on 16 GB GPUs): a forward builds its micro-batch's activations and
drops them when it ends, keeping only the stage input (what the previous stage sent, or the batch); the
backward first reruns the stage's forward, holding those activations until it ends. Backward then costs
forward + backward.

``strategy.jitter`` multiplies each stage's compute of one micro-batch by a reproducible random factor.

Where data-parallel replicas are exact copies of one another (sim/symmetry.py states the condition), only the
first replica of each class runs (``ctx.simulated``); each stage's all-reduce waits for the replicas that run.

It stays one module: the three schedules (gpipe, 1f1b, message-driven) share the stage and
micro-batch bookkeeping.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from trainsim.errors import TrainsimError
from trainsim.formats.scenario_options import SCHEDULES, PipelineOptions  # noqa: F401 (re-exported)
from trainsim.sim.compute.costs import RankCosts
from trainsim.sim.core.jitter import Jitter
from trainsim.sim.core.machine import COMM, COMPUTE

from .context import Context
from .registry import register


def options(spec) -> PipelineOptions:
    return getattr(spec, "pipeline", None) or PipelineOptions()


def micro_batch_size(scenario, ranks: list[str], workload) -> int:
    """Check the pipeline's shape against the GPUs, the workload and the batch; the micro-batch size."""
    opts = options(scenario.strategy)
    n, stages, layers = len(ranks), opts.stages, len(workload.layers)
    src = scenario.source
    if n % stages:
        raise TrainsimError(
            f"strategy.pipeline.stages ({stages}) does not divide the {n} GPUs of the scenario (gpus)",
            file=src,
            field="strategy.pipeline.stages",
        )
    if stages > layers:
        raise TrainsimError(
            f"strategy.pipeline.stages ({stages}) is more than the {layers} layers of "
            f"workload {workload.name!r} (workload)",
            file=src,
            field="strategy.pipeline.stages",
        )
    if opts.stage_layers is not None and sum(opts.stage_layers) != layers:
        raise TrainsimError(
            f"strategy.pipeline.stage_layers add up to {sum(opts.stage_layers)}, but "
            f"workload {workload.name!r} has {layers} layers (workload)",
            file=src,
            field="strategy.pipeline.stage_layers",
        )
    dp = n // stages
    if scenario.batch_size % (dp * opts.micro_batches):
        raise TrainsimError(
            f"batch_size {scenario.batch_size} does not divide over {dp} data-parallel "
            f"replicas x strategy.pipeline.micro_batches ({opts.micro_batches})",
            file=src,
            field="batch_size",
        )
    return scenario.batch_size // (dp * opts.micro_batches)


def balance(times: list[float], stages: int) -> list[int]:
    """Layers per stage: the contiguous split of ``times`` into ``stages`` non-empty parts whose slowest part
    is fastest (dynamic programming over prefix sums; the earliest such split on ties)."""
    n = len(times)
    if not 1 <= stages <= n:
        raise ValueError(f"cannot split {n} layers into {stages} stages")
    prefix = np.concatenate([[0.0], np.cumsum(times)])
    # best[i]: the slowest stage of the best split of layers [0, i) into the stages so far
    best = prefix.copy()
    cuts: list[np.ndarray] = []
    for _ in range(1, stages):
        new = np.full(n + 1, np.inf)
        arg = np.zeros(n + 1, dtype=int)
        for i in range(1, n + 1):
            j = np.arange(0, i)
            cost = np.maximum(best[j], prefix[i] - prefix[j])
            cost[j < 1] = np.inf  # the earlier stages need a layer each
            k = int(np.argmin(cost))
            new[i], arg[i] = cost[k], k
        cuts.append(arg)
        best = new
    bounds = [n]
    for arg in reversed(cuts):
        bounds.append(int(arg[bounds[-1]]))
    bounds.append(0)
    bounds.reverse()
    return [bounds[k + 1] - bounds[k] for k in range(stages)]


@dataclass(frozen=True)
class Stage:
    """One stage's work for one micro-batch, and what it holds."""

    index: int
    first: int
    last: int  # inclusive layer indices
    label: str
    forward_s: float
    backward_s: float
    saved_bytes: float
    param_bytes: float
    state_bytes: float
    step_s: float
    send_bytes: float  # its output activation (and the gradient coming back), per micro-batch
    input_bytes: float  # the micro-batch's input (first stage only)
    kept_bytes: float = 0.0  # with recompute: what a forward keeps until its backward (the stage input)


def build_stages(ctx: Context, costs: RankCosts, counts: list[int]) -> list[Stage]:
    num = sum(costs.grad_bytes_per_layer) or 1.0
    out, first = [], 0
    for s, count in enumerate(counts):
        layers = range(first, first + count)
        params = sum(costs.grad_bytes_per_layer[i] for i in layers)
        out.append(
            Stage(
                index=s,
                first=layers[0],
                last=layers[-1],
                label=f"{costs.layer_names[layers[0]]}..{costs.layer_names[layers[-1]]}",
                forward_s=sum(costs.forward_s[i] for i in layers),
                backward_s=sum(costs.backward_s[i] for i in layers),
                saved_bytes=sum(costs.saved_bytes_per_layer[i] for i in layers),
                param_bytes=params,
                state_bytes=costs.state_bytes * params / num,
                step_s=costs.step_s * params / num,
                send_bytes=costs.output_bytes_per_layer[layers[-1]],
                input_bytes=costs.input_bytes if s == 0 else 0.0,
            )
        )
        first += count
    for s in range(len(out)):  # a stage's input is what the previous stage sends (the batch on the first)
        kept = out[s - 1].send_bytes if s > 0 else out[0].input_bytes
        out[s] = dataclasses.replace(out[s], kept_bytes=kept)
    return out


def schedule_order(schedule: str, s: int, stages: int, micro: int) -> list[tuple[str, int]]:
    """The fixed order of (pass, micro-batch) a stage runs under gpipe or 1f1b."""
    if schedule == "gpipe":
        return [("F", m) for m in range(micro)] + [("B", m) for m in range(micro)]
    warm = min(stages - s - 1, micro)
    order = [("F", m) for m in range(warm)]
    for i in range(micro - warm):
        order += [("F", warm + i), ("B", i)]
    return order + [("B", m) for m in range(micro - warm, micro)]


class Inbox:
    """Messages a stage has received: one event per (iteration, pass, micro-batch), and the list of those
    not yet taken (for message-driven scheduling)."""

    def __init__(self, env):
        self.env = env
        self.events: dict = {}
        self.pending: list[tuple[float, int, int, str, int]] = []  # (arrived, tie rank, micro, pass, it)
        self.wake = env.event()

    def event(self, it: int, kind: str, m: int):
        key = (it, kind, m)
        if key not in self.events:
            self.events[key] = self.env.event()
        return self.events[key]

    def posted(self, it: int, kind: str, m: int):
        """Fires when this stage has posted the receive of (it, kind, m)."""
        key = ("posted", it, kind, m)
        if key not in self.events:
            self.events[key] = self.env.event()
        return self.events[key]

    def post(self, it: int, kind: str, m: int) -> None:
        event = self.posted(it, kind, m)
        if not event.triggered:
            event.succeed()

    def deliver(self, it: int, kind: str, m: int) -> None:
        self.event(it, kind, m).succeed()
        self.pending.append((self.env.now, 0 if kind == "B" else 1, m, kind, it))
        if not self.wake.triggered:
            self.wake.succeed()

    def take(self, it: int, kinds: tuple[str, ...] = ("F", "B")):
        """The earliest arrived message of iteration ``it`` (a backward first on a tie), or None."""
        mine = [p for p in self.pending if p[4] == it and p[3] in kinds]
        if not mine:
            return None
        first = min(mine)  # the earliest arrival; a backward first on a tie
        self.pending.remove(first)
        return first[3], first[2]

    def wait(self):
        if self.wake.triggered:
            self.wake = self.env.event()
        return self.wake


class _Pipeline:
    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.opts = opts = options(ctx.settings.strategy)
        self.S, self.M = opts.stages, opts.micro_batches
        self.dp = ctx.n // self.S
        self.mb = ctx.settings.batch_size // (self.dp * self.M)
        self.jitter = Jitter(ctx.settings.jitter_spec)
        self.offload = ctx.plugins.state_stream is not None
        first = ctx.ranks[0]
        counts = opts.stage_layers or balance(self._layer_times(ctx.costs_for(first, self.mb)), self.S)
        self.counts = counts
        self.position = {g: i for i, g in enumerate(ctx.ranks)}
        # only the ranks that run (sim/symmetry.py mirrors whole replicas: a stage's peers run with it)
        self.stages = {
            g: build_stages(ctx, ctx.costs_for(g, self.mb), counts)[self.stage_of(g)] for g in ctx.simulated
        }
        self.inbox = {g: Inbox(ctx.env) for g in ctx.simulated}
        env = ctx.env
        self.bwd_done = {(it, g): env.event() for it in range(ctx.total_iterations) for g in ctx.simulated}
        self.grads_live: set[str] = set()  # stages whose gradients exist (first backward to the step)
        self.reduced = {(it, s): env.event() for it in range(ctx.total_iterations) for s in range(self.S)}

    @staticmethod
    def _layer_times(costs: RankCosts) -> list[float]:
        return [f + b for f, b in zip(costs.forward_s, costs.backward_s, strict=True)]

    def gpu(self, r: int, s: int) -> str:
        return self.ctx.ranks[r * self.S + s]

    def stage_of(self, gpu: str) -> int:
        return self.position[gpu] % self.S

    def replica_of(self, gpu: str) -> int:
        return self.position[gpu] // self.S

    # ---- one micro-batch's pass on one stage ------------------------------------------------------------
    def _compute(self, gpu: str, it: int, m: int, kind: str):
        stage, machine = self.stages[gpu], self.ctx.machine
        base = stage.forward_s if kind == "F" else stage.backward_s
        if kind == "B" and self.opts.recompute:
            base += stage.forward_s  # the checkpointed forward runs again first
        factor = self.jitter.factor(machine.gpus[gpu].index, it, m, 0 if kind == "F" else 1)
        yield from machine.run(
            gpu,
            "compute",
            base * factor,
            op="forward" if kind == "F" else "backward",
            iteration=it,
            layer=stage.label,
            category=COMPUTE,
            micro_batch=m,
        )

    def _send(self, src: str, dst: str, nbytes: float, it: int, kind: str, m: int):
        op = "send_activation" if kind == "F" else "send_gradient"
        yield from self.ctx.machine.peer_copy(
            src, dst, nbytes, iteration=it, op=op, engine_gpu=src, stream="d2h", category=COMM
        )
        self.inbox[dst].deliver(it, kind, m)

    def _kept(self, stage: Stage) -> float:
        """What a forward leaves allocated until its micro-batch's backward."""
        return stage.kept_bytes if self.opts.recompute else stage.saved_bytes

    def _needs_message(self, s: int, kind: str) -> bool:
        return s > 0 if kind == "F" else s < self.S - 1

    def step(
        self,
        gpu: str,
        it: int,
        kind: str,
        m: int,
        *,
        then: tuple[str, int] | None = None,
        blocking: bool = False,
    ):
        """One pass of micro-batch m on this stage: wait for its message, compute, send the result on.

        ``blocking`` (the fixed schedules, as Megatron's p2p: ``batch_isend_irecv`` then wait): the stage
        posts the receive of its next step ``then`` together with the send, the send starts only once the
        receiver has posted the matching receive (NCCL send/recv is a rendezvous), and the stage waits for
        it to finish. Otherwise (message-driven) receives are always posted and the send runs on its own."""
        ctx, stage = self.ctx, self.stages[gpu]
        s, r = stage.index, self.replica_of(gpu)
        memory = ctx.machine.gpus[gpu].memory
        inbox = self.inbox[gpu]
        if self._needs_message(s, kind):
            inbox.post(it, kind, m)
            yield inbox.event(it, kind, m)
        if kind == "F":
            if s == 0 and stage.input_bytes > 0:
                memory.alloc(ctx.env.now, stage.input_bytes, "input")
                if ctx.machine.gpus[gpu].device.kind != "cpu":  # a CPU rank's batch is in its own memory
                    yield from ctx.machine.h2d(gpu, stage.input_bytes, iteration=it,
                                               pinned=ctx.settings.pinned)
            memory.alloc(ctx.env.now, self._kept(stage), "activations")
        if self.opts.recompute:  # a forward (the first or the rerun) builds this micro-batch's activations
            memory.alloc(ctx.env.now, stage.saved_bytes, "activations")
        yield from self._compute(gpu, it, m, kind)
        if kind == "F":
            if self.opts.recompute:  # dropped after the first forward, kept after the rerun until backward
                memory.free(ctx.env.now, stage.saved_bytes, "activations")
            memory.free(ctx.env.now, stage.input_bytes if s == 0 else 0.0, "input")
            dst = self.gpu(r, s + 1) if s < self.S - 1 else None
            nbytes = stage.send_bytes
        else:
            if gpu not in self.grads_live:  # the first backward writes the gradients, later ones accumulate
                self.grads_live.add(gpu)
                memory.alloc(ctx.env.now, stage.param_bytes, "grads")
            memory.free(ctx.env.now, self._kept(stage), "activations")
            if self.opts.recompute:
                memory.free(ctx.env.now, stage.saved_bytes, "activations")
            dst = self.gpu(r, s - 1) if s > 0 else None
            nbytes = self.stages[dst].send_bytes if dst else 0.0
        if then is not None and self._needs_message(s, then[0]):
            inbox.post(it, *then)
        if dst is None:
            return
        if blocking:
            yield self.inbox[dst].posted(it, kind, m)
            yield from self._send(gpu, dst, nbytes, it, kind, m)
        else:
            ctx.env.process(self._send(gpu, dst, nbytes, it, kind, m))

    # ---- schedules --------------------------------------------------------------------------------------
    def _fixed(self, gpu: str, it: int):
        order = schedule_order(self.opts.schedule, self.stages[gpu].index, self.S, self.M)
        for i, (kind, m) in enumerate(order):
            then = order[i + 1] if i + 1 < len(order) else None
            yield from self.step(gpu, it, kind, m, then=then, blocking=self.opts.blocking_sends)

    def _message_driven(self, gpu: str, it: int):
        s, inbox = self.stages[gpu].index, self.inbox[gpu]
        # 1F1B's bound on micro-batches in flight, plus one of slack on the later stages: room to run a
        # forward that is ready while a backward is late
        limit = self.S - s + (1 if s > 0 else 0)
        forwards = backwards = 0
        while backwards < self.M:
            room = forwards - backwards < limit
            if s == 0 and room and forwards < self.M:  # the first stage injects the next micro-batch
                kind, m = "F", forwards
            else:
                message = inbox.take(it, ("F", "B") if room and s > 0 else ("B",))
                if message is None:
                    yield inbox.wait()
                    continue
                kind, m = message
            if kind == "F":
                yield from self.step(gpu, it, "F", m)
                forwards += 1
                if s == self.S - 1:  # the loss is here: backward at once
                    yield from self.step(gpu, it, "B", m)
                    backwards += 1
            else:
                yield from self.step(gpu, it, "B", m)
                backwards += 1

    # ---- the iteration ----------------------------------------------------------------------------------
    def stage_process(self, gpu: str):
        ctx = self.ctx
        s = self.stages[gpu].index
        for it in range(ctx.total_iterations):
            if s == 0:
                yield from ctx.get_batch(gpu, it, batch=self.mb * self.M)
            if self.opts.schedule == "message-driven":
                yield from self._message_driven(gpu, it)
            else:
                yield from self._fixed(gpu, it)
            self.bwd_done[it, gpu].succeed()
            if self.offload:
                yield from self._offloaded_step(gpu, it)
            else:
                if self.dp > 1:
                    yield self.reduced[it, s]
                stage = self.stages[gpu]
                yield from ctx.machine.run(
                    gpu, "compute", stage.step_s, op="optimizer", iteration=it,
                    optimizer=ctx.settings.optimizer
                )
            self.grads_live.discard(gpu)  # zero_grad(set_to_none=True)
            ctx.machine.gpus[gpu].memory.free(ctx.env.now, self.stages[gpu].param_bytes, "grads")
            ctx.finish(it, gpu)

    def _offloaded_step(self, gpu: str, it: int):
        """The optimizer state streamed in chunks (sim/optimizations/optimizer_offload.py): their H2D
        overlaps the stage's all-reduce, their steps wait for it."""
        stage = self.stages[gpu]
        before = self.reduced[it, stage.index] if self.dp > 1 else None
        yield from self.ctx.plugins.state_stream.step(gpu, it, stage.state_bytes, stage.step_s,
                                                      before_step=before)

    def reducer(self, s: int):
        ctx = self.ctx
        group = [self.gpu(r, s) for r in range(self.dp)]
        running = [g for g in group if g in self.stages]  # mirrored replicas end with their representative
        for it in range(ctx.total_iterations):
            yield ctx.env.all_of([self.bwd_done[it, g] for g in running])
            yield from ctx.collective(
                "allreduce", self.stages[group[0]].param_bytes, it, gpus=group, label=f":stage{s}"
            )
            self.reduced[it, s].succeed()

    def start(self) -> None:
        ctx = self.ctx
        for g in ctx.simulated:
            stage, memory = self.stages[g], ctx.machine.gpus[g].memory
            memory.alloc(ctx.env.now, stage.param_bytes, "params")
            memory.alloc(ctx.env.now, ctx.costs[g].workspace_bytes, "workspaces")
            if self.offload:
                ctx.plugins.state_stream.hold(g, stage.state_bytes)
            else:
                memory.alloc(ctx.env.now, stage.state_bytes, "optimizer_state")
            ctx.env.process(self.stage_process(g))
        if self.dp > 1:
            for s in range(self.S):
                ctx.env.process(self.reducer(s))
        stages = [self.stages[self.gpu(0, s)] for s in range(self.S)]
        ctx.extra["pipeline"] = {
            "stages": self.S,
            "data_parallel": self.dp,
            "micro_batches": self.M,
            "micro_batch_size": self.mb,
            "schedule": self.opts.schedule,
            "stage_layers": list(self.counts),
            "stage_compute_s": [round(st.forward_s + st.backward_s, 12) for st in stages],
            "ideal_bubble_fraction": round((self.S - 1) / (self.M + self.S - 1), 6),
            "offload_optimizer_state": self.offload,
            "recompute": self.opts.recompute,
        }


def _loaded_batch(scenario, per_rank: int) -> int:
    """A first stage prepares its replica's whole batch at once (every micro-batch), then splits it."""
    return per_rank * options(scenario.strategy).micro_batches


@register("pipeline", rank_batch=micro_batch_size, loaded_batch=_loaded_batch)
def run_pipeline(ctx: Context) -> None:
    _Pipeline(ctx).start()
