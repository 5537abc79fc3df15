"""`mesh`: large-model training as it is run today, on a device mesh (sim/parallel/layout.py): tensor
parallelism (Megatron column/row, with sequence parallelism), context parallelism, pipeline stages (1F1B or
GPipe), expert parallelism, and data parallelism as DDP, ZeRO-1/2 or ZeRO-3/FSDP (HSDP with ``shard``),
with activation recomputation.

**What runs.** Every rank of a pipeline stage does the same work, so one rank per stage is simulated (its
first) and stands for the stage's others (`Mesh.representatives`; results and memory are reported for every
GPU). Per iteration a stage runs its schedule's passes over ``M = batch / (dp x micro_batch)`` micro-batches;
a pass runs the stage's blocks (sim/parallel/split.py) in order, forward or backward:

- a block's compute is its split layers' times (the stage's share of each layer, at ``micro_batch``:
  sim/parallel/stage_costs.py, the same figures the closed forms use), its backward with the forward again
  under full recomputation (the attention core under selective);
- inside it, the collectives that sit on the critical path run in turn with the compute (Megatron issues
  them synchronously on the compute stream's order): tensor parallelism's all-reduces (or all-gathers and
  reduce-scatters), context parallelism's key/value exchange, expert parallelism's all-to-alls, and under
  recomputation the forward's again (sim/parallel/comms.py lists them; with ``async_tp`` sequence
  parallelism's in tp steps under the GEMMs beside them, what they do not hide added). Their time is the
  analytic collective model on that group's GPUs of the topology (sim/collectives/ops.py), the bytes
  credited to its links;
- ZeRO-3/FSDP: before a block's forward its parameters are all-gathered over the shard group (expert
  parameters over the ranks of the shard holding the same experts) on the communication channel, the next
  block's gathered while this one computes (FSDP's prefetch); the gathered copy is freed after the block's
  forward and gathered again for its backward, or (``reshard_after_forward: false``) kept until its
  backward;
- at a stage's last micro-batch the gradients of each block are synchronised as its backward ends, on the
  communication channel beside the compute: all-reduced over the data-parallel group (zero 0: DDP), or
  reduce-scattered over the shard group (zero >= 1), then all-reduced over the replica group (HSDP); expert
  parameters over the ranks holding the same experts (shard / ep of them within a shard). Then the
  optimizer steps its shard, and zero 1 and 2 all-gather the updated parameters;
- pipeline stages send each micro-batch's activations forward and its gradients back (peer copies between
  the stages' simulated ranks), without waiting for the receiver (isend);
- ``schedule: zb-h1`` (sim/parallel/zero_bubble.py): a backward is B (the input gradient, sent back as it
  ends) and W (the weight gradient, its own pass, deferred by the stage's index); a block keeps what W needs
  from B to W, the first micro-batch's W writes the gradients and the last one's synchronises them.

These data-parallel collectives and sends are flows on the topology (or analytic with ``collectives:
analytic``), over the whole group, one group at a time: concurrent groups of other replicas are not
simulated against them.

**Memory per GPU**: parameters, gradients and optimizer state as the ZeRO stage shards them (16-bit weights
and gradients with an fp32 master copy under master mixed precision), the gathered blocks (zero 3), and each
micro-batch's saved activations from its forward to its backward (only the block inputs with ``recompute:
full``; the attention core's beyond its inputs dropped with ``selective``; a recomputed block's back while
its backward runs), so a 1F1B stage holds up to pp - s micro-batches. `trainsim.sim.parallel.memory` gives
the same peak in closed form.
"""

from __future__ import annotations

import dataclasses

from trainsim.errors import TrainsimError
from trainsim.sim.compute.costs import WEIGHT_BYTES
from trainsim.sim.core.interference import MATRIX, run_pieces
from trainsim.sim.core.latency import CallSite
from trainsim.sim.core.machine import COMM, COMPUTE
from trainsim.sim.parallel.comms import Call, call_seconds, pass_calls
from trainsim.sim.parallel.layout import Mesh
from trainsim.sim.parallel.memory import interleaved_order, kept_bytes
from trainsim.sim.parallel.split import split_stages
from trainsim.sim.parallel.stage_costs import BlockTable, Layout, ModelCosts, stage_ranges
from trainsim.sim.parallel.zero_bubble import zb_h1_order

from .context import Context
from .pipeline import schedule_order
from .registry import register

FIELD = "strategy.mesh"


def options(spec):
    from trainsim.formats.scenario_options import MeshOptions

    return getattr(spec, "mesh", None) or MeshOptions()


def mesh_of(scenario, ranks) -> Mesh:
    o = options(scenario.strategy)
    return Mesh(tuple(ranks), tp=o.tp, cp=o.cp, pp=o.pp, ep=o.ep, shard=o.shard)


def micro_batches(scenario, mesh: Mesh) -> int:
    """M: micro-batches per data-parallel replica and iteration (the global batch / (dp x micro_batch))."""
    o = options(scenario.strategy)
    per_replica = mesh.dp * o.micro_batch
    if scenario.batch_size % per_replica:
        raise TrainsimError(
            f"batch_size {scenario.batch_size} does not split into {mesh.dp} data-parallel "
            f"replicas x micro_batch {o.micro_batch}",
            file=scenario.source,
            field="batch_size",
        )
    return scenario.batch_size // per_replica


def _rank_batch(scenario, ranks, workload) -> int:
    """Check the mesh against the GPUs, the model and the batch; the micro-batch the costs are at. An error
    is the scenario file's."""
    try:
        return _checked_micro_batch(scenario, ranks, workload)
    except TrainsimError as exc:
        if exc.file is not None:
            raise
        raise TrainsimError(exc.reason, file=scenario.source, field=exc.field) from None


def _checked_micro_batch(scenario, ranks, workload) -> int:
    mesh = mesh_of(scenario, ranks)
    o = options(scenario.strategy)
    if o.sequence_parallel and o.tp == 1:
        raise TrainsimError(
            "sequence_parallel splits the norms over tensor parallelism: give tp > 1",
            field=f"{FIELD}.sequence_parallel",
        )
    if o.ep > 1 and o.zero >= 1 and mesh.shard_size % o.ep and o.ep % mesh.shard_size:
        raise TrainsimError(
            f"the shard of {mesh.shard_size} data-parallel ranks and ep {o.ep}: one must divide "
            "the other (experts shard over the ranks of a shard that hold them)",
            field=f"{FIELD}.shard",
        )
    split_stages(
        workload,
        tp=o.tp,
        cp=o.cp,
        pp=o.pp * o.virtual_stages,
        ep=o.ep,
        sequence_parallel=o.sequence_parallel,
        stage_blocks=o.stage_blocks,
    )
    m = micro_batches(scenario, mesh)
    if o.virtual_stages > 1 and m % o.pp:
        raise TrainsimError(
            f"an interleaved pipeline runs its micro-batches in groups of pp: {m} micro-batches (batch_size "
            f"/ (dp x micro_batch)) is not a multiple of pp {o.pp}",
            field="batch_size",
        )
    return o.micro_batch


def _check(run) -> None:
    sc = run.scenario
    o = options(sc.strategy)
    if o.shard is not None and o.zero == 0:
        raise TrainsimError(
            "shard (HSDP) shards the state: give zero 1, 2 or 3", file=sc.source, field=f"{FIELD}.shard"
        )
    if o.fp8:
        from trainsim.sim.core.devices import get_device
        from trainsim.sim.parallel.fp8 import check_fp8

        for name in sorted({run.topology.gpu_spec(g) for g in run.ranks}):
            device = (getattr(run, "devices", None) or {}).get(name) or get_device(name)
            check_fp8(device, file=sc.source, field=f"{FIELD}.fp8")


def _representatives(run):
    if not options(run.scenario.strategy).mirror:
        return {g: [g] for g in run.ranks}
    return mesh_of(run.scenario, run.ranks).representatives()


@dataclasses.dataclass
class _Chunk:
    """One model chunk of a simulated rank (its stage's blocks without interleaving): per block figures
    from the `BlockTable` rows [lo, hi)."""

    table: BlockTable
    lo: int
    hi: int
    backward_s: list[float]  # with recomputation (zb-h1: its B, without the weight gradient)
    kept: list[float]  # one micro-batch's activations kept from forward to backward
    transient: list[float]  # live while the block's backward runs: recomputed activations, gradients
    step_s: float  # the optimizer step of this rank's shard of the chunk
    weight_s: list[float]  # zb-h1: the weight gradient's pass (W); empty otherwise
    weight_kept: list[float]  # zb-h1: what W needs from B until it runs

    @property
    def blocks(self) -> range:
        return range(self.lo, self.hi)


class _Mesh:
    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.o = o = options(ctx.settings.strategy)
        self.layout = Layout.of(o)
        self.mesh = Mesh(tuple(ctx.ranks), tp=o.tp, cp=o.cp, pp=o.pp, ep=o.ep, shard=o.shard)
        self.v = o.virtual_stages
        self.M = ctx.settings.batch_size // (self.mesh.dp * o.micro_batch)
        self.topology = ctx.machine.topology
        self.act = WEIGHT_BYTES[ctx.settings.precision]  # bytes per activation value
        self.shard = self.mesh.shard_size if o.zero >= 1 else 1
        self.shard_e = max(1, self.shard // o.ep)  # ranks of a shard holding the same experts
        models: dict = {}  # per device and host factor
        self.chunks: dict[str, list[_Chunk]] = {}
        sharing = ctx.machine.host_sharing(ctx.ranks)
        host = ctx.plugins.host
        for gpu in ctx.simulated:
            device = ctx.machine.gpus[gpu].device
            # a calibrated CPU rank's layer times as its whole step runs them, beside the host's other ranks
            # (the host plug-in's factor, as every strategy's rank costs take it); 1 on GPUs
            scale = host.step_scale(device, o.micro_batch, sharing[gpu]) if host is not None else 1.0
            if (device.name, scale) not in models:
                models[device.name, scale] = ModelCosts(
                    ctx.workload,
                    device,
                    ctx.settings.precision,
                    ctx.settings.optimizer,
                    mixed_precision=ctx.settings.mixed_precision,
                    compute_model=ctx.settings.compute_model,
                    fp8=o.fp8,
                    scale=scale,
                )
            model = self.model = models[device.name, scale]
            table = model.blocks(self.layout)
            ranges = stage_ranges(
                model.n_blocks, o.pp * self.v, o.stage_blocks, pre=bool(model.pre), post=bool(model.post)
            )
            s = self.mesh.stage(gpu)
            self.chunks[gpu] = [self._chunk(model, table, *ranges[s + k * o.pp]) for k in range(self.v)]
        self.config = self.model.config
        self.inbox: dict = {}
        self._times: dict = {}
        self._calls: dict = {}  # collectives some of whose simulated ranks have arrived
        self._held: dict = {}  # (gpu, chunk, block) -> gathered and not yet released (reshard off)
        self.synced: dict = {}

    # ---- costs ------------------------------------------------------------------------------------------
    def _chunk(self, model: ModelCosts, table: BlockTable, lo: int, hi: int) -> _Chunk:
        o, layout = self.o, self.layout
        hidden_kept = model.hidden_bytes(layout) / (o.tp if o.sequence_parallel else 1)
        backward, kept, transient = [], [], []
        zb = o.schedule == "zb-h1"
        for b in range(lo, hi):
            extra = {"full": table.forward[b], "selective": table.core[b]}.get(o.recompute, 0.0)
            backward.append(table.backward[b] + extra - (table.weight_grad[b] if zb else 0.0))
            a = kept_bytes(table, b, layout, hidden_kept)
            kept.append(a)
            # recomputed activations, and the activation gradients, live while the block's backward runs
            transient.append(max(0.0, table.saved[b] - a) + table.grads_held(b))
        experts = sum(table.experts[lo:hi]) / model.weight  # parameters in experts
        dense = sum(table.num_params[lo:hi]) - experts
        step = model.step_seconds(dense / self.shard + experts / self.shard_e)
        weight = table.weight_grad[lo:hi] if zb else []
        weight_kept = table.weight_kept[lo:hi] if zb else []
        return _Chunk(table, lo, hi, backward, kept, transient, step, weight, weight_kept)

    def _dense(self, chunk: _Chunk, b: int) -> float:
        return chunk.table.params[b] - chunk.table.experts[b]

    def _time_of(self, gpu: str):
        """``time_of(op, dim, nbytes)``: an inline collective's seconds on ``gpu``'s group ``dim``
        (analytic, cached), its bytes credited to the links each time."""
        from trainsim.sim.collectives.ops import analytic_collective

        def time_of(op: str, dim: str, nbytes: float) -> float:
            group = self.mesh.group(gpu, "cp")[:2] if dim == "cp_pair" else self.mesh.group(gpu, dim)
            if len(group) < 2 or nbytes <= 0:
                return 0.0
            key = (op, tuple(group), nbytes)
            if key not in self._times:
                self._times[key] = analytic_collective(
                    self.topology, op, group, nbytes, algo=self.ctx.settings.collective_algo
                )
            seconds, links, link_bytes = self._times[key]
            self.ctx.machine.net.credit(links, link_bytes)
            # a measured host's own cost of each call before its bytes move (gloo's), as Context.collective
            paid = self.ctx.machine.latency.cost(CallSite(op), nbytes, now=self.ctx.env.now)
            return seconds + (paid or 0.0)

        return time_of

    def _inline(self, gpu: str, chunk: _Chunk, b: int, kind: str) -> list[tuple[Call, float]]:
        """The critical-path collectives of block b's pass, each with its exposed seconds."""
        time_of = self._time_of(gpu)
        return [
            (call, call_seconds(call, time_of))
            for call in pass_calls(chunk.table, b, self.layout, self.config, self.act, kind)
        ]

    # ---- one block's pass -------------------------------------------------------------------------------
    def _block(self, gpu: str, it: int, m: int, chunk: _Chunk, b: int, kind: str):
        ctx, machine = self.ctx, self.ctx.machine
        name = chunk.table.names[b]
        compute = {"F": chunk.table.forward[b], "B": chunk.backward_s[b - chunk.lo]}.get(kind)
        if compute is None:  # W: the weight gradients' GEMMs, no collective on the critical path
            compute, comms = chunk.weight_s[b - chunk.lo], []
        else:
            comms = self._inline(gpu, chunk, b, kind)
        with machine.gpus[gpu].streams["compute"].request() as req:
            yield req
            start = ctx.env.now
            # the block's kernels share the GPU with the collectives in flight beside them (a ZeRO-3 prefetch,
            # a gradient sync): matrix work slows by the SMs their channels hold (`interference`)
            yield from run_pieces(ctx.env, machine.gpus[gpu].contention, start, start + compute, (compute,),
                                  (MATRIX,))
            end = ctx.env.now
            inline = sum(seconds for _, seconds in comms)
            if inline > 0:
                yield ctx.env.timeout(inline)
            if ctx.settings.detail or compute > 0:
                machine.record(
                    iteration=it,
                    resource=gpu,
                    stream="compute",
                    op={"F": "forward", "B": "backward", "W": "weight_grad"}[kind],
                    start=start,
                    end=end,
                    category=COMPUTE,
                    layer=name,
                    args={"micro_batch": m},
                )
            t = end
            for call, seconds in comms:  # recorded in turn after the block's compute
                if seconds > 0:
                    machine.record(
                        iteration=it,
                        resource=gpu,
                        stream="comm",
                        op=call.name,
                        start=t,
                        end=t + seconds,
                        category=COMM,
                        nbytes=call.nbytes * call.repeat,
                        layer=name,
                        args={"micro_batch": m, "method": "analytic"},
                    )
                t += seconds

    def _collective(self, gpu: str, op: str, nbytes: float, it: int, *, gpus: list[str], label: str = ""):
        """A process body: a collective of ``gpus`` that each of its simulated ranks calls: the last to
        arrive runs it (`Context.collective`) and every caller waits for it to end."""
        simulated = [g for g in gpus if g in self.chunks]
        key = (op, it, label, tuple(gpus))
        if key not in self._calls:
            self._calls[key] = [0, self.ctx.env.event()]
        entry = self._calls[key]
        entry[0] += 1
        if entry[0] == len(simulated):
            del self._calls[key]
            yield from self.ctx.collective(op, nbytes, it, gpus=gpus, label=label)
            entry[1].succeed()
        else:
            yield entry[1]

    # ---- ZeRO-3 / FSDP: gathered blocks ------------------------------------------------------------------
    def _gathered_bytes(self, chunk: _Chunk, b: int) -> float:
        """What a block's gather adds on a rank: the other ranks' shards of its weights."""
        dense, experts = self._dense(chunk, b), chunk.table.experts[b]
        return dense * (1 - 1 / self.shard) + experts * (1 - 1 / self.shard_e)

    def _gather(self, gpu: str, it: int, k: int, b: int, label: str):
        """A process body: chunk k's block b's parameters all-gathered, then held."""
        chunk = self.chunks[gpu][k]
        groups = self._groups(gpu)
        yield from self._collective(
            gpu, "allgather", self._dense(chunk, b), it, gpus=groups["shard"], label=f":{label}"
        )
        if chunk.table.experts[b] > 0:
            yield from self._collective(
                gpu,
                "allgather",
                chunk.table.experts[b],
                it,
                gpus=groups["expert_shard"],
                label=f":{label}:experts",
            )
        self.ctx.machine.gpus[gpu].memory.alloc(
            self.ctx.env.now, self._gathered_bytes(chunk, b), "gathered_params"
        )

    def _release(self, gpu: str, k: int, b: int) -> None:
        chunk = self.chunks[gpu][k]
        self.ctx.machine.gpus[gpu].memory.free(
            self.ctx.env.now, self._gathered_bytes(chunk, b), "gathered_params"
        )

    def _groups(self, gpu: str) -> dict[str, list[str]]:
        """``gpu``'s data-parallel groups: dp, shard, replica, and the experts' (the ranks holding the same
        experts: all of them, those of its shard, and their copies in the other shards)."""
        key = ("groups", gpu)
        if key not in self._times:
            mesh = self.mesh
            c = mesh.coords(gpu)
            shard = mesh.shard_size
            expert_dp = [
                mesh.gpu(**{**c, "dp": c["dp"] % mesh.ep + k * mesh.ep}) for k in range(mesh.dp // mesh.ep)
            ]
            mine = set(mesh.group(gpu, "shard"))
            position = c["dp"] % shard
            self._times[key] = {
                "dp": mesh.group(gpu, "dp"),
                "shard": mesh.group(gpu, "shard"),
                "replica": mesh.group(gpu, "replica"),
                "expert_dp": expert_dp,
                "expert_shard": [g for g in expert_dp if g in mine],
                "expert_replica": [g for g in expert_dp if mesh.coords(g)["dp"] % shard == position],
            }
        return self._times[key]

    def _weight_pass(self, gpu: str, it: int, m: int, k: int = 0):
        """zb-h1: micro-batch m's weight gradients (W) through chunk k's blocks, last block first: each frees
        what it kept from its B; the first micro-batch's write the gradients, the last's synchronise them."""
        ctx, chunk = self.ctx, self.chunks[gpu][k]
        memory = ctx.machine.gpus[gpu].memory
        for b in list(chunk.blocks)[::-1]:
            yield from self._block(gpu, it, m, chunk, b, "W")
            memory.free(ctx.env.now, chunk.weight_kept[b - chunk.lo], "activations")
            if m == 0:
                memory.alloc(ctx.env.now, self._grads(chunk, b), "grads")
            if m == self.M - 1:
                self.synced[it, gpu, k, b] = ctx.env.process(self._sync(gpu, it, k, b))

    def _grads(self, chunk: _Chunk, b: int) -> float:
        """Block b's gradients on this rank (its shard of them under ZeRO-2/3)."""
        dense, experts = self._dense(chunk, b), chunk.table.experts[b]
        return dense + experts if self.o.zero < 2 else dense / self.shard + experts / self.shard_e

    def _pass(self, gpu: str, it: int, m: int, kind: str, k: int = 0):
        """Micro-batch m's forward or backward (zb-h1: its B, or W) through the blocks of chunk k."""
        if kind == "W":
            yield from self._weight_pass(gpu, it, m, k)
            return
        ctx, chunk = self.ctx, self.chunks[gpu][k]
        memory = ctx.machine.gpus[gpu].memory
        zb = bool(chunk.weight_s)
        order = list(chunk.blocks) if kind == "F" else list(chunk.blocks)[::-1]
        zero3 = self.o.zero == 3 and self.shard > 1
        keep = not self.o.reshard_after_forward

        def needs_gather(b: int) -> bool:
            return zero3 and not self._held.get((gpu, k, b))

        pending = {}
        if needs_gather(order[0]):
            pending[order[0]] = ctx.env.process(
                self._gather(gpu, it, k, order[0], f"{kind}{m}:{k}:{order[0]}")
            )
        last = m == self.M - 1
        for j, b in enumerate(order):
            if b in pending:
                yield pending.pop(b)
                if keep:
                    self._held[gpu, k, b] = True
            if j + 1 < len(order) and needs_gather(order[j + 1]):  # the next block's, while this one runs
                nxt = order[j + 1]
                pending[nxt] = ctx.env.process(self._gather(gpu, it, k, nxt, f"{kind}{m}:{k}:{nxt}"))
            i = b - chunk.lo
            if kind == "F":
                memory.alloc(ctx.env.now, chunk.kept[i], "activations")
            else:
                memory.alloc(ctx.env.now, chunk.transient[i], "activations")  # recomputed
            yield from self._block(gpu, it, m, chunk, b, kind)
            if kind == "B" and zb:  # what W needs stays until it runs
                memory.free(ctx.env.now, chunk.kept[i] + chunk.transient[i], "activations")
                memory.alloc(ctx.env.now, chunk.weight_kept[i], "activations")
            elif kind == "B":
                memory.free(ctx.env.now, chunk.kept[i] + chunk.transient[i], "activations")
                if m == 0:  # the first backward writes the gradients (this rank's shard of them: ZeRO-2/3)
                    memory.alloc(ctx.env.now, self._grads(chunk, b), "grads")
                if last:
                    self.synced[it, gpu, k, b] = ctx.env.process(self._sync(gpu, it, k, b))
            if zero3 and (kind == "B" or not keep):
                self._release(gpu, k, b)
                self._held.pop((gpu, k, b), None)

    # ---- gradients --------------------------------------------------------------------------------------
    def _sync(self, gpu: str, it: int, k: int, b: int):
        """Chunk k's block b's gradients synchronised over data parallelism (see the module)."""
        chunk, mesh, o = self.chunks[gpu][k], self.mesh, self.o
        dense, experts = self._dense(chunk, b), chunk.table.experts[b]
        groups = self._groups(gpu)
        label = f":b{k}.{b}"
        if mesh.dp == 1:
            return
        if o.zero == 0:
            yield from self._collective(gpu, "allreduce", dense, it, gpus=groups["dp"], label=label)
            if experts > 0:
                yield from self._collective(
                    gpu, "allreduce", experts, it, gpus=groups["expert_dp"], label=f"{label}:experts"
                )
            return
        yield from self._collective(gpu, "reduce_scatter", dense, it, gpus=groups["shard"], label=label)
        if experts > 0:
            yield from self._collective(
                gpu, "reduce_scatter", experts, it, gpus=groups["expert_shard"], label=f"{label}:experts"
            )
        if len(groups["replica"]) > 1:
            yield from self._collective(
                gpu, "allreduce", dense / self.shard, it, gpus=groups["replica"], label=f"{label}:replicas"
            )
        if experts > 0 and len(groups["expert_replica"]) > 1:
            yield from self._collective(
                gpu,
                "allreduce",
                experts / self.shard_e,
                it,
                gpus=groups["expert_replica"],
                label=f"{label}:expert_replicas",
            )

    # ---- pipeline messages ------------------------------------------------------------------------------
    def _event(self, gpu: str, it: int, kind: str, g: int, m: int):
        """Fires when ``gpu`` has the message of global chunk ``g``'s micro-batch m for a pass of ``kind``."""
        key = (gpu, it, kind, g, m)
        if key not in self.inbox:
            self.inbox[key] = self.ctx.env.event()
        return self.inbox[key]

    def _send(self, src: str, dst: str, it: int, kind: str, g: int, m: int):
        nbytes = self.model.hidden_bytes(self.layout) / (self.o.tp if self.o.sequence_parallel else 1)
        op = "send_activation" if kind == "F" else "send_gradient"
        yield from self.ctx.machine.peer_copy(
            src, dst, nbytes, iteration=it, op=op, engine_gpu=src, stream="d2h", category=COMM
        )
        self._event(dst, it, kind, g, m).succeed()

    # ---- the iteration ----------------------------------------------------------------------------------
    def order(self, s: int) -> list[tuple[str, int, int]]:
        """(pass, chunk, micro-batch) in the order pipeline rank ``s`` runs them: 1F1B, GPipe, ZB-H1
        (`zero_bubble.zb_h1_order`: passes F, B and W), or
        interleaved 1F1B over its chunks (Megatron-LM's: micro-batches in groups of pp through each chunk in
        turn, the warm-up (pp - s - 1) x 2 + (v - 1) x pp forwards)."""
        o, pp, v, M = self.o, self.o.pp, self.v, self.M
        if o.schedule == "zb-h1":
            return [(kind, 0, m) for kind, m in zb_h1_order(s, pp, M)]
        if v == 1:
            return [(kind, 0, m) for kind, m in schedule_order(o.schedule, s, pp, M)]
        return interleaved_order(pp, v, s, M)  # the one order the memory closed form replays too

    def stage_process(self, gpu: str):
        ctx, mesh, o = self.ctx, self.mesh, self.o
        chunks = self.chunks[gpu]
        s, memory = mesh.stage(gpu), ctx.machine.gpus[gpu].memory
        c = mesh.coords(gpu)
        last = o.pp * self.v - 1  # the last global chunk

        def rank_of(g: int) -> str:
            return mesh.gpu(**{**c, "pp": g % o.pp})

        blocks = [(k, b) for k, chunk in enumerate(chunks) for b in chunk.blocks]
        dense = sum(self._dense(chunk, b) for chunk in chunks for b in chunk.blocks)
        experts = sum(chunk.table.experts[b] for chunk in chunks for b in chunk.blocks)
        grads = dense + experts if o.zero < 2 else dense / self.shard + experts / self.shard_e
        groups = self._groups(gpu)
        for it in range(ctx.total_iterations):
            if s == 0:
                yield from ctx.get_batch(gpu, it, batch=o.micro_batch * self.M)
            for kind, k, m in self.order(s):
                g = s + k * o.pp
                if kind == "W":  # zb-h1: its own B ran before it
                    yield from self._pass(gpu, it, m, kind, k)
                    continue
                if (kind == "F" and g > 0) or (kind == "B" and g < last):
                    yield self._event(gpu, it, kind, g, m)
                yield from self._pass(gpu, it, m, kind, k)
                target = g + 1 if kind == "F" else g - 1
                if 0 <= target <= last:
                    ctx.env.process(self._send(gpu, rank_of(target), it, kind, target, m))
            yield ctx.env.all_of([self.synced[it, gpu, k, b] for k, b in blocks])
            step = sum(chunk.step_s for chunk in chunks)
            yield from ctx.machine.run(
                gpu, "compute", step, op="optimizer", iteration=it, optimizer=ctx.settings.optimizer
            )
            memory.free(ctx.env.now, grads, "grads")
            if o.zero in (1, 2) and self.shard > 1:  # the updated shards to every rank
                yield from self._collective(
                    gpu, "allgather", dense, it, gpus=groups["shard"], label=":params"
                )
                if experts > 0 and self.shard_e > 1:
                    yield from self._collective(
                        gpu, "allgather", experts, it, gpus=groups["expert_shard"], label=":params:experts"
                    )
            ctx.finish(it, gpu)

    def start(self) -> None:
        ctx, o = self.ctx, self.o
        zero3 = o.zero == 3
        for gpu in ctx.simulated:
            chunks, memory = self.chunks[gpu], ctx.machine.gpus[gpu].memory
            dense = sum(self._dense(chunk, b) for chunk in chunks for b in chunk.blocks)
            experts = sum(chunk.table.experts[b] for chunk in chunks for b in chunk.blocks)
            sharded = dense / self.shard + experts / self.shard_e
            memory.alloc(ctx.env.now, sharded if zero3 else dense + experts, "params")
            memory.alloc(ctx.env.now, chunks[0].table.workspace_bytes, "workspaces")
            memory.alloc(ctx.env.now, sharded * self.model.state_per_param, "optimizer_state")
            ctx.env.process(self.stage_process(gpu))
        ctx.extra["mesh"] = {
            "tp": o.tp,
            "cp": o.cp,
            "pp": o.pp,
            "ep": o.ep,
            "dp": self.mesh.dp,
            "zero": o.zero,
            "shard": self.mesh.shard_size,
            "micro_batch": o.micro_batch,
            "micro_batches": self.M,
            "sequence_parallel": o.sequence_parallel,
            "async_tp": o.async_tp,
            "fp8": o.fp8,
            "recompute": o.recompute,
            "schedule": o.schedule,
            "virtual_stages": self.v,
            "blocks_per_stage": sum(len(ch.blocks) for ch in self.chunks[ctx.simulated[0]]),
            "notes": self._notes(),
        }

    def _notes(self) -> list[str]:
        notes = []
        machine_of = self.topology.machine_of
        names = {"tp": "tensor parallelism", "cp": "context parallelism"}
        for dim in ("tp", "cp"):
            degree = getattr(self.o, dim)
            if degree > 1 and self.mesh.crosses_machines(dim, machine_of):
                notes.append(
                    f"{names[dim]} of {degree} ({dim} {degree}) crosses the network between machines: "
                    "its collectives on every layer leave the NVLink domain"
                )
        return notes


@register("mesh", rank_batch=_rank_batch, check=_check, representatives=_representatives)
def run_mesh(ctx: Context) -> None:
    _Mesh(ctx).start()
