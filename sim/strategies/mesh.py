"""`mesh`: large-model training as it is run today, on a device mesh (sim/parallel/layout.py): tensor
parallelism (Megatron column/row, with sequence parallelism), context parallelism, pipeline stages (1F1B or
GPipe), expert parallelism, and data parallelism as DDP, ZeRO-1/2 or ZeRO-3/FSDP (HSDP with ``shard``),
with activation recomputation.

**What runs.** Every rank of a pipeline stage does the same work, so one rank per stage is simulated (its
first) and stands for the stage's others (`Mesh.representatives`; results and memory are reported for every
GPU). Per iteration a stage runs its schedule's passes over ``M = batch / (dp x micro_batch)`` micro-batches;
a pass runs the stage's blocks (sim/parallel/split.py) in order, forward or backward:

- a block's compute is its split layers' times (the stage's share of each layer, at ``micro_batch``);
- inside it, the collectives that sit on the critical path run in turn with the compute (Megatron issues
  them synchronously on the compute stream's order): per row-split layer one all-reduce of the hidden
  states over the tensor-parallel group forward and one backward, or under sequence parallelism an
  all-gather and a reduce-scatter each way; for attention under context parallelism the keys and values
  all-gathered (forward) and their gradients reduce-scattered (backward) over the context-parallel group,
  or with ``context: ring`` passed around the ring under the attention compute (only what the compute does
  not hide shows); for a mixture-of-experts layer the dispatch and combine all-to-alls over the
  expert-parallel group, each way. Their time is the analytic collective model on that group's GPUs of the
  topology (sim/collectives/ops.py), the bytes credited to its links;
- ZeRO-3/FSDP: before a block's forward (and, resharded after forward, its backward) its parameters are
  all-gathered over the shard group on the communication channel, the next block's gathered while this one
  computes (FSDP's prefetch); the gathered copy is held while the block runs;
- at a stage's last micro-batch the gradients of each block are synchronised as its backward ends, on the
  communication channel beside the compute: all-reduced over the data-parallel group (zero 0: DDP), or
  reduce-scattered over the shard group (zero >= 1), then all-reduced over the replica group (HSDP); expert
  parameters over their expert-data-parallel group. Then the optimizer steps its shard (zero >= 1: 1/shard
  of the state), and zero 1 and 2 all-gather the updated parameters;
- pipeline stages send each micro-batch's activations forward and its gradients back (peer copies between
  the stages' simulated ranks), without waiting for the receiver (isend).

These data-parallel collectives and sends are flows on the topology (or analytic with ``collectives:
analytic``), over the whole group, one group at a time: concurrent groups of other replicas are not
simulated against them.

**Memory per GPU**: parameters, gradients and optimizer state as the ZeRO stage shards them (16-bit weights
and gradients with an fp32 master copy under master mixed precision), the gathered blocks (zero 3), and each
micro-batch's saved activations from its forward to its backward (only the block inputs with ``recompute:
full``; the attention core's dropped with ``selective``), so a 1F1B stage holds up to pp - s micro-batches.
"""

from __future__ import annotations

import dataclasses

from trainsim.errors import TrainsimError
from trainsim.sim.compute.costs import WEIGHT_BYTES, RankCosts, rank_costs
from trainsim.sim.core.machine import COMM, COMPUTE
from trainsim.sim.parallel.layout import Mesh
from trainsim.sim.parallel.split import StageSplit, split_stages, transformer_config

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
            file=scenario.source,
            field=f"{FIELD}.sequence_parallel",
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
    if sc.precision == "fp8":  # pragma: no cover - the schema has no fp8 yet
        raise TrainsimError("fp8 is not a training precision here yet", field="precision")


def _representatives(run):
    if not options(run.scenario.strategy).mirror:
        return {g: [g] for g in run.ranks}
    return mesh_of(run.scenario, run.ranks).representatives()


@dataclasses.dataclass
class _Stage:
    """A simulated rank's stage: its split, costs and per-block figures."""

    split: StageSplit
    costs: RankCosts
    forward_s: list[float]  # per block, one micro-batch
    backward_s: list[float]
    core_s: list[float]  # the attention core's forward per block (selective recompute, ring overlap)
    params: list[float]  # per block, this rank's bytes as weights (its tensor/expert share, before ZeRO)
    expert_params: list[float]  # the part of ``params`` in experts
    saved: list[float]  # per block, one micro-batch's saved activations (as recompute leaves them)
    state_per_param: float  # optimizer state bytes per weight byte

    @property
    def index(self) -> int:
        return self.split.index


class _Mesh:
    def __init__(self, ctx: Context):
        self.ctx = ctx
        sc_strategy = ctx.settings.strategy
        self.o = options(sc_strategy)
        self.mesh = Mesh(
            tuple(ctx.ranks), tp=self.o.tp, cp=self.o.cp, pp=self.o.pp, ep=self.o.ep, shard=self.o.shard
        )
        self.M = ctx.settings.batch_size // (self.mesh.dp * self.o.micro_batch)
        self.topology = ctx.machine.topology
        workload = ctx.workload
        config = transformer_config(workload) or {}
        self.seq = config.get("seq_len", 1)
        self.hidden = config.get("hidden_size", 0)
        heads = config.get("num_attention_heads", 1)
        self.kv_dim = (config.get("num_key_value_heads") or heads) * (
            config.get("head_dim") or self.hidden // max(1, heads)
        )
        self.top_k = config.get("num_experts_per_tok") or 0
        self.act = WEIGHT_BYTES[ctx.settings.precision]  # bytes per activation value
        self.v = self.o.virtual_stages
        splits = split_stages(
            workload,
            tp=self.o.tp,
            cp=self.o.cp,
            pp=self.o.pp * self.v,
            ep=self.o.ep,
            sequence_parallel=self.o.sequence_parallel,
            expert_imbalance=self.o.expert_imbalance,
            stage_blocks=self.o.stage_blocks,
        )
        # each simulated rank's model chunks: chunk k of pipeline rank s is split s + k x pp
        self.chunks: dict[str, list[_Stage]] = {}
        for gpu in ctx.simulated:
            s = self.mesh.stage(gpu)
            self.chunks[gpu] = [self._stage(gpu, splits[s + k * self.o.pp]) for k in range(self.v)]
        self.inbox: dict = {}
        self._times: dict = {}
        self._calls: dict = {}  # collectives some of whose simulated ranks have arrived
        self.synced: dict = {}

    # ---- costs ------------------------------------------------------------------------------------------
    def _stage(self, gpu: str, split: StageSplit) -> _Stage:
        ctx, o = self.ctx, self.o
        device = ctx.machine.gpus[gpu].device
        costs = rank_costs(
            split.workload,
            device,
            o.micro_batch,
            ctx.settings.precision,
            ctx.settings.optimizer,
            mixed_precision=ctx.settings.mixed_precision,
            compute_model=ctx.settings.compute_model,
        )
        fwd, bwd, core, params, experts, saved = [], [], [], [], [], []
        hidden_kept = self._hidden_bytes() / (o.tp if o.sequence_parallel else 1)
        for block in split.blocks:
            idx = block.layers
            f = sum(costs.forward_s[i] for i in idx)
            b = sum(costs.backward_s[i] for i in idx)
            c = sum(costs.forward_s[i] for i in idx if split.workload.layers[i].kind.endswith("attention"))
            kept = sum(costs.saved_bytes_per_layer[i] for i in idx)
            if o.recompute == "full":  # the block keeps its input and runs its forward again
                b, kept = b + f, hidden_kept
            elif o.recompute == "selective":  # the attention core again; its saved tensors dropped
                b += c
                kept -= sum(
                    costs.saved_bytes_per_layer[i]
                    for i in idx
                    if split.workload.layers[i].kind.endswith("attention")
                )
            fwd.append(f)
            bwd.append(b)
            core.append(c)
            params.append(sum(costs.grad_bytes_per_layer[i] for i in idx))
            experts.append(
                sum(
                    costs.grad_bytes_per_layer[i]
                    for i in idx
                    if split.workload.layers[i].kind == "expert_linear"
                )
            )
            saved.append(max(0.0, kept))
        total = sum(params)
        state = costs.state_bytes / total if total > 0 else 0.0
        return _Stage(split, costs, fwd, bwd, core, params, experts, saved, state)

    def _hidden_bytes(self) -> float:
        """One micro-batch's hidden states on a context-parallel rank (the tensor-parallel messages)."""
        return self.o.micro_batch * self.seq / self.o.cp * self.hidden * self.act

    def _collective_s(self, op: str, group: list[str], nbytes: float) -> float:
        """An inline collective's time on ``group`` (analytic), its bytes credited to the links."""
        if len(group) < 2 or nbytes <= 0:
            return 0.0
        from trainsim.sim.collectives.ops import analytic_collective

        key = (op, tuple(group), nbytes)
        if key not in self._times:
            self._times[key] = analytic_collective(
                self.topology, op, group, nbytes, algo=self.ctx.settings.collective_algo
            )
        seconds, links, link_bytes = self._times[key]
        self.ctx.machine.net.credit(links, link_bytes)
        return seconds

    def _inline(self, gpu: str, stage: _Stage, b: int, kind: str) -> list[tuple[str, float, float]]:
        """The critical-path collectives of block ``b``'s pass: (op, bytes, seconds) each."""
        o, mesh, block = self.o, self.mesh, stage.split.blocks[b]
        out = []
        points = block.row_layers + (1 if block.name in ("pre", "post") and o.tp > 1 else 0)
        if o.tp > 1 and points:
            group, hidden = mesh.group(gpu, "tp"), self._hidden_bytes()
            ops = ("allgather", "reduce_scatter") if o.sequence_parallel else ("allreduce",)
            for _ in range(points):
                out += [(f"tp_{op}", hidden, self._collective_s(op, group, hidden)) for op in ops]
        if o.cp > 1 and block.attention:
            group = mesh.group(gpu, "cp")
            kv = o.micro_batch * self.seq * 2 * self.kv_dim / o.tp * self.act  # every rank's K and V
            if o.context == "allgather":
                op = "allgather" if kind == "F" else "reduce_scatter"
                out.append((f"cp_{op}", kv, self._collective_s(op, group, kv)))
            else:  # ring: cp - 1 steps of one chunk, hidden under the attention compute where it can
                chunk = kv / o.cp
                ring = (
                    (o.cp - 1) * self._collective_s("sendrecv", group[:2], chunk) * (1 if kind == "F" else 2)
                )
                core = stage.core_s[b] * (1 if kind == "F" else 2.5)
                exposed = max(0.0, ring - core * (o.cp - 1) / o.cp)
                out.append(("cp_ring", chunk * (o.cp - 1), exposed))
        if o.ep > 1 and block.moe:
            group = mesh.group(gpu, "ep")
            tokens = o.micro_batch * self.seq / o.cp / (o.tp if o.sequence_parallel else 1)
            nbytes = tokens * self.top_k * self.hidden * self.act * o.expert_imbalance
            for op in ("dispatch", "combine"):
                out.append((f"ep_{op}", nbytes, self._collective_s("alltoall", group, nbytes)))
        return out

    # ---- one block's pass -------------------------------------------------------------------------------
    def _block(self, gpu: str, it: int, m: int, k: int, b: int, kind: str):
        ctx, machine, stage = self.ctx, self.ctx.machine, self.chunks[gpu][k]
        block = stage.split.blocks[b]
        compute = stage.forward_s[b] if kind == "F" else stage.backward_s[b]
        comms = self._inline(gpu, stage, b, kind)
        with machine.gpus[gpu].streams["compute"].request() as req:
            yield req
            start = ctx.env.now
            total = compute + sum(seconds for _, _, seconds in comms)
            if total > 0:
                yield ctx.env.timeout(total)
            if ctx.settings.detail or compute > 0:
                machine.record(
                    iteration=it,
                    resource=gpu,
                    stream="compute",
                    op="forward" if kind == "F" else "backward",
                    start=start,
                    end=start + compute,
                    category=COMPUTE,
                    layer=block.name,
                    args={"micro_batch": m},
                )
            t = start + compute
            for op, nbytes, seconds in comms:  # recorded in turn after the block's compute
                if seconds > 0:
                    machine.record(
                        iteration=it,
                        resource=gpu,
                        stream="comm",
                        op=op,
                        start=t,
                        end=t + seconds,
                        category=COMM,
                        nbytes=nbytes,
                        layer=block.name,
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
    def _gather(self, gpu: str, it: int, k: int, b: int, label: str):
        """A process body: chunk k's block b's parameters all-gathered over the shard group, then held."""
        stage = self.chunks[gpu][k]
        full = stage.params[b]
        group = self.mesh.group(gpu, "shard")
        yield from self._collective(gpu, "allgather", full, it, gpus=group, label=f":{label}")
        self.ctx.machine.gpus[gpu].memory.alloc(self.ctx.env.now, full - full / len(group), "gathered_params")

    def _release(self, gpu: str, k: int, b: int) -> None:
        stage, group = self.chunks[gpu][k], self.mesh.group(gpu, "shard")
        full = stage.params[b]
        self.ctx.machine.gpus[gpu].memory.free(self.ctx.env.now, full - full / len(group), "gathered_params")

    def _pass(self, gpu: str, it: int, m: int, kind: str, k: int = 0):
        """Micro-batch m's forward or backward through the blocks of the rank's chunk k."""
        ctx, stage = self.ctx, self.chunks[gpu][k]
        memory = ctx.machine.gpus[gpu].memory
        blocks = list(range(len(stage.split.blocks)))
        order = blocks if kind == "F" else blocks[::-1]
        zero3 = self.o.zero == 3 and self.mesh.shard_size > 1
        gather = zero3 and (kind == "F" or self.o.reshard_after_forward)
        pending = {}
        if gather:
            pending[order[0]] = ctx.env.process(
                self._gather(gpu, it, k, order[0], f"{kind}{m}:{k}:{order[0]}")
            )
        last = m == self.M - 1
        for j, b in enumerate(order):
            if gather:
                yield pending.pop(b)
                if j + 1 < len(order):  # prefetch the next block while this one runs
                    nxt = order[j + 1]
                    pending[nxt] = ctx.env.process(self._gather(gpu, it, k, nxt, f"{kind}{m}:{k}:{nxt}"))
            if kind == "F":
                memory.alloc(ctx.env.now, stage.saved[b], "activations")
            yield from self._block(gpu, it, m, k, b, kind)
            if kind == "B":
                memory.free(ctx.env.now, stage.saved[b], "activations")
                if m == 0 and self.o.zero < 2:  # the first backward writes the gradients
                    memory.alloc(ctx.env.now, stage.params[b], "grads")
                elif m == 0:  # sharded gradients: this rank keeps 1/shard
                    memory.alloc(ctx.env.now, stage.params[b] / self.mesh.shard_size, "grads")
                if last:
                    self.synced[it, gpu, k, b] = ctx.env.process(self._sync(gpu, it, k, b))
            if gather and (kind == "B" or self.o.reshard_after_forward):
                self._release(gpu, k, b)

    # ---- gradients --------------------------------------------------------------------------------------
    def _sync(self, gpu: str, it: int, k: int, b: int):
        """Chunk k's block b's gradients synchronised over data parallelism (see the module)."""
        stage, mesh, o = self.chunks[gpu][k], self.mesh, self.o
        grads, experts = stage.params[b], stage.expert_params[b]
        label = f":b{k}.{b}"
        if mesh.dp == 1:
            return
        if o.zero == 0:
            yield from self._collective(
                gpu, "allreduce", grads - experts, it, gpus=mesh.group(gpu, "dp"), label=label
            )
            if experts > 0:
                yield from self._collective(
                    gpu, "allreduce", experts, it, gpus=self._expert_dp(gpu), label=f"{label}:experts"
                )
            return
        shard = mesh.group(gpu, "shard")
        yield from self._collective(gpu, "reduce_scatter", grads, it, gpus=shard, label=label)
        replicas = mesh.group(gpu, "replica")
        if len(replicas) > 1:
            yield from self._collective(
                gpu, "allreduce", grads / len(shard), it, gpus=replicas, label=f"{label}:replicas"
            )

    def _expert_dp(self, gpu: str) -> list[str]:
        """The ranks holding the same experts: the same position in every expert-parallel block."""
        c, mesh = self.mesh.coords(gpu), self.mesh
        return [mesh.gpu(**{**c, "dp": c["dp"] % mesh.ep + k * mesh.ep}) for k in range(mesh.dp // mesh.ep)]

    # ---- pipeline messages ------------------------------------------------------------------------------
    def _event(self, gpu: str, it: int, kind: str, g: int, m: int):
        """Fires when ``gpu`` has the message of global chunk ``g``'s micro-batch m for a pass of ``kind``."""
        key = (gpu, it, kind, g, m)
        if key not in self.inbox:
            self.inbox[key] = self.ctx.env.event()
        return self.inbox[key]

    def _send(self, src: str, dst: str, it: int, kind: str, g: int, m: int):
        nbytes = self._hidden_bytes() / (self.o.tp if self.o.sequence_parallel else 1)
        op = "send_activation" if kind == "F" else "send_gradient"
        yield from self.ctx.machine.peer_copy(
            src, dst, nbytes, iteration=it, op=op, engine_gpu=src, stream="d2h", category=COMM
        )
        self._event(dst, it, kind, g, m).succeed()

    # ---- the iteration ----------------------------------------------------------------------------------
    def order(self, s: int) -> list[tuple[str, int, int]]:
        """(pass, chunk, micro-batch) in the order pipeline rank ``s`` runs them: 1F1B or GPipe, or
        interleaved 1F1B over its chunks (Megatron-LM's: micro-batches in groups of pp through each chunk in
        turn, the warm-up (pp - s - 1) x 2 + (v - 1) x pp forwards)."""
        o, pp, v, M = self.o, self.o.pp, self.v, self.M
        if v == 1:
            return [(kind, 0, m) for kind, m in schedule_order(o.schedule, s, pp, M)]

        def unit(i: int, backward: bool) -> tuple[int, int]:
            group, within = divmod(i, pp * v)
            k = within // pp
            return (v - 1 - k if backward else k), group * pp + within % pp

        total = M * v
        warm = min((pp - s - 1) * 2 + (v - 1) * pp, total)
        out = [("F", *unit(i, False)) for i in range(warm)]
        for i in range(total - warm):
            out += [("F", *unit(warm + i, False)), ("B", *unit(i, True))]
        return out + [("B", *unit(i, True)) for i in range(total - warm, total)]

    def stage_process(self, gpu: str):
        ctx, mesh, o = self.ctx, self.mesh, self.o
        chunks = self.chunks[gpu]
        s, memory = mesh.stage(gpu), ctx.machine.gpus[gpu].memory
        c = mesh.coords(gpu)
        last = o.pp * self.v - 1  # the last global chunk

        def rank_of(g: int) -> str:
            return mesh.gpu(**{**c, "pp": g % o.pp})

        shard = self.mesh.shard_size if o.zero >= 1 else 1
        blocks = [(k, b) for k in range(self.v) for b in range(len(chunks[k].split.blocks))]
        for it in range(ctx.total_iterations):
            if s == 0:
                yield from ctx.get_batch(gpu, it, batch=o.micro_batch * self.M)
            for kind, k, m in self.order(s):
                g = s + k * o.pp
                if (kind == "F" and g > 0) or (kind == "B" and g < last):
                    yield self._event(gpu, it, kind, g, m)
                yield from self._pass(gpu, it, m, kind, k)
                target = g + 1 if kind == "F" else g - 1
                if 0 <= target <= last:
                    ctx.env.process(self._send(gpu, rank_of(target), it, kind, target, m))
            yield ctx.env.all_of([self.synced[it, gpu, k, b] for k, b in blocks])
            step = sum(chunk.costs.step_s for chunk in chunks) / shard
            yield from ctx.machine.run(
                gpu, "compute", step, op="optimizer", iteration=it, optimizer=ctx.settings.optimizer
            )
            params = sum(sum(chunk.params) for chunk in chunks)
            memory.free(ctx.env.now, params / (self.mesh.shard_size if o.zero >= 2 else 1), "grads")
            if o.zero in (1, 2) and self.mesh.shard_size > 1:  # the updated shards to every rank
                yield from self._collective(
                    gpu, "allgather", params, it, gpus=mesh.group(gpu, "shard"), label=":params"
                )
            ctx.finish(it, gpu)

    def start(self) -> None:
        ctx, o = self.ctx, self.o
        for gpu in ctx.simulated:
            chunks, memory = self.chunks[gpu], ctx.machine.gpus[gpu].memory
            params = sum(sum(chunk.params) for chunk in chunks)
            held = params / self.mesh.shard_size if o.zero == 3 else params
            state = sum(sum(ch.params) * ch.state_per_param for ch in chunks)
            memory.alloc(ctx.env.now, held, "params")
            memory.alloc(ctx.env.now, chunks[0].costs.workspace_bytes, "workspaces")
            memory.alloc(ctx.env.now, state / (self.mesh.shard_size if o.zero >= 1 else 1), "optimizer_state")
            ctx.costs[gpu] = chunks[0].costs
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
            "recompute": o.recompute,
            "schedule": o.schedule,
            "virtual_stages": self.v,
            "blocks_per_stage": sum(len(ch.split.blocks) for ch in self.chunks[ctx.simulated[0]]),
            "notes": self._notes(),
        }

    def _notes(self) -> list[str]:
        notes = []
        machine_of = self.topology.machine_of
        for dim in ("tp", "cp"):
            if getattr(self.o, dim) > 1 and self.mesh.crosses_machines(dim, machine_of):
                notes.append(
                    f"{dim} {getattr(self.o, dim)} spans more than one machine: its collectives "
                    "cross the network"
                )
        return notes


@register("mesh", rank_batch=_rank_batch, check=_check, representatives=_representatives)
def run_mesh(ctx: Context) -> None:
    _Mesh(ctx).start()
