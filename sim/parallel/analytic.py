"""Iteration time of a parallel layout in closed form: what strategy ``mesh`` simulates, without simulating.

From the same per-block costs (`stage_costs.BlockTable`: the split layers' times at the micro-batch) and
the same analytic collective model on the same groups of the topology (sim/collectives/ops.py) as the
strategy, per pipeline stage s:

- a pass (one micro-batch's forward or backward through the stage's blocks) is each block's compute plus
  its critical-path collectives (tensor parallelism's all-reduces or all-gathers/reduce-scatters, context
  parallelism's key/value exchange, expert parallelism's all-to-alls, as the strategy issues them); under
  ZeRO-3 the first block's all-gather is exposed and each next one is prefetched on the communication
  channel while the current block computes (exposed where it is slower);
- the last micro-batch's backward also synchronises each block's gradients as its backward ends (all-reduce,
  or reduce-scatter and HSDP's replica all-reduce) on the same channel, queued with the prefetches; what
  the backward does not hide is the stage's exposed data-parallel sync;
- then the optimizer steps its shard, and ZeRO-1/2 all-gather the updated parameters.

While a gather or sync is on the channel, the block computing beside it runs on the share of the SMs its
NCCL channels leave (`LayoutTimer.share`, the strategy's `comm_interference`; ``interference=False`` for
free overlap), as the strategy's blocks do.

The pipeline: with W_s = F_s + B_s a stage's forward and backward of one micro-batch and k the slowest
stage, stage 0's last backward ends at ``M W_k + sum_{s != k} W_s / v + 2 (pp - 1) p`` (1F1B: the other
stages' one micro-batch each is the fill; with v virtual stages the bubble is (pp - 1) / v of a
micro-batch; GPipe fills forward and backward apart, with the slowest forward and backward stage), p a
stage-to-stage message; the last micro-batch's backward (with its syncs) replaces a plain one on the
drain (stages 0..k). Stage s's last backward ends ``sum_{s' < s} (BL_s' + p)`` earlier than stage 0's; it
finishes after its exposed sync, step and gather; the iteration is the last stage to finish.

Everything per stage is cached on the `BlockTable` (per block range and the layout's fields that matter),
so a layout whose stages were seen costs a few additions per stage.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainsim.sim.collectives.ops import collective_time

from .comms import call_seconds, pass_calls
from .layout import Mesh
from .stage_costs import BlockTable, Layout, ModelCosts, stage_ranges
from .zero_bubble import zb_h1_ends

__all__ = ["IterationTime", "LayoutTimer"]


@dataclass(frozen=True)
class IterationTime:
    """A layout's iteration in seconds, with its parts (the slowest stage's, for the parts)."""

    iteration_s: float
    pipeline_s: float  # stage 0's last backward ends
    compute_s: float  # one micro-batch's compute on the slowest stage (forward + backward) x M
    inline_comm_s: float  # its critical-path collectives x M
    bubble_s: float  # the pipeline fill and drain
    exposed_sync_s: float  # the last stage to finish's exposed data-parallel sync
    optimizer_s: float
    param_gather_s: float  # ZeRO-1/2's all-gather after the step
    micro_batches: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class _Passes:
    """One stage's pass durations: forward, backward, the last backward, and its figures."""

    forward: float
    backward: float
    last_backward: float
    sync_tail: float  # the last backward's syncs still running after its compute
    compute: float  # forward + backward compute of one micro-batch (no collectives)
    inline: float  # forward + backward critical-path collectives of one micro-batch
    step: float
    params: float  # weight bytes of the stage (ZeRO-1/2 all-gather them after the step)
    experts: float  # the part of ``params`` in experts (gathered over the ranks holding them)
    weight: float = 0.0  # zb-h1: the W pass (``backward`` is then the B pass)


class LayoutTimer:
    """Iteration times of layouts of one model on one topology's GPUs (``ranks``, rank order), at global
    ``batch_size``. ``algo``: the scenario's ``collective_algo``. ``symmetric``: a stage whose ranks are
    whole machines times its collectives as stage 0's (exact on a machine-symmetric fabric, and what
    keeps a search from planning every stage's groups)."""

    def __init__(self, model: ModelCosts, topology, ranks, batch_size: int, *, algo: str = "auto",
                 symmetric: bool = True, interference: bool = True):
        self.model, self.topology, self.ranks = model, topology, tuple(ranks)
        self.batch_size, self.algo, self.symmetric = batch_size, algo, symmetric
        self.interference = interference and len(self.ranks) > 1
        self._coll: dict = {}
        self._per_machine = self._gpus_per_machine()

    def _gpus_per_machine(self) -> int | None:
        counts: dict = {}
        for g in self.ranks:
            m = self.topology.machine_of(g)
            counts[m] = counts.get(m, 0) + 1
        sizes = set(counts.values())
        return sizes.pop() if len(sizes) == 1 else None

    # ---- collectives ------------------------------------------------------------------------------------
    def coll(self, op: str, group, nbytes: float) -> float:
        if len(group) < 2 or nbytes <= 0:
            return 0.0
        key = (op, tuple(group), nbytes)
        t = self._coll.get(key)
        if t is None:
            t = self._coll[key] = collective_time(self.topology, op, list(group), nbytes, algo=self.algo)
        return t

    def share(self, op: str, group, nbytes: float, gpu: str) -> float:
        """The share of ``gpu``'s SMs left to compute while this collective runs (its NCCL channels hold
        the rest, `trainsim.sim.core.interference`); 1 without interference, for a CPU rank or an idle
        call."""
        if not self.interference or len(group) < 2 or nbytes <= 0:
            return 1.0
        key = ("share", op, tuple(group), nbytes, gpu)
        s = self._coll.get(key)
        if s is None:
            from trainsim.sim.collectives.footprint import footprint
            from trainsim.sim.core.devices import get_device

            device = get_device(self.topology.gpu_spec(gpu))
            sms = device.sm_count if device.kind == "gpu" else None
            ctas = footprint(self.topology, op, list(group), nbytes, algo=self.algo).ctas if sms else 0
            s = self._coll[key] = max(1, sms - ctas) / sms if sms else 1.0
        return s

    def _parts(self, gpu: str, calls) -> tuple[float, float]:
        """(seconds, share of SMs left to compute) of collectives run one after the other: their seconds
        summed, the share averaged over their time."""
        seconds = lost = 0.0
        for op, group, nbytes in calls:
            t = self.coll(op, group, nbytes)
            seconds += t
            lost += t * (1.0 - self.share(op, group, nbytes, gpu))
        return seconds, (1.0 - lost / seconds) if seconds > 0 else 1.0

    def p2p(self, src: str, dst: str, nbytes: float) -> float:
        """A stage-to-stage message: each leg's latency and bytes at its bottleneck (no contention)."""
        key = ("p2p", src, dst, nbytes)
        t = self._coll.get(key)
        if t is None:
            topo = self.topology
            legs = topo.gpu_copy_legs(src, dst)
            t = sum(topo.route_latency(leg) + nbytes / topo.bottleneck(leg) for leg in legs)
            self._coll[key] = t
        return t

    # ---- per stage --------------------------------------------------------------------------------------
    def _groups(self, mesh: Mesh, gpu: str, layout: Layout) -> dict:
        key = ("groups", mesh.tp, mesh.cp, mesh.pp, mesh.ep, mesh.shard, gpu)
        g = self._coll.get(key)
        if g is None:
            g = {dim: tuple(mesh.group(gpu, dim)) for dim in ("tp", "cp", "dp", "ep", "shard", "replica")}
            g["cp_pair"] = g["cp"][:2]
            c = mesh.coords(gpu)
            g["expert_dp"] = tuple(mesh.gpu(**{**c, "dp": c["dp"] % mesh.ep + k * mesh.ep})
                                   for k in range(mesh.dp // mesh.ep))
            mine, position = set(g["shard"]), c["dp"] % mesh.shard_size
            g["expert_shard"] = tuple(x for x in g["expert_dp"] if x in mine)
            g["expert_replica"] = tuple(x for x in g["expert_dp"]
                                        if mesh.coords(x)["dp"] % mesh.shard_size == position)
            self._coll[key] = g
        return g

    def _inline(self, table: BlockTable, b: int, layout: Layout, groups: dict, kind: str) -> float:
        """Block b's critical-path collectives in one pass (sim/parallel/comms.py, as the strategy)."""

        def time_of(op: str, dim: str, nbytes: float) -> float:
            return self.coll(op, groups[dim], nbytes)

        calls = pass_calls(table, b, layout, self.model.config, self.model.act, kind)
        return sum(call_seconds(call, time_of) for call in calls)

    def _block_costs(self, table: BlockTable, b: int, layout: Layout, mesh: Mesh, gpu: str) -> tuple:
        """(forward, backward: compute with its collectives; gather, sync, compute, collectives) of block b
        (cached per kind of block)."""
        zb = layout.schedule == "zb-h1"
        key = ("block", table.kinds[b], layout.zero, layout.shard, layout.recompute, layout.context, zb,
               layout.async_tp,
               mesh.tp, mesh.cp, mesh.pp, mesh.ep, gpu)
        hit = table.derived.get(key)
        if hit is not None:
            return hit
        groups = self._groups(mesh, gpu, layout)
        bwd = table.backward[b]
        if layout.recompute == "full":
            bwd += table.forward[b]
        elif layout.recompute == "selective":
            bwd += table.core[b]
        weight = table.weight_grad[b] if zb else 0.0  # zb-h1: W, its own pass
        bwd -= weight
        i_f = self._inline(table, b, layout, groups, "F")
        i_b = self._inline(table, b, layout, groups, "B")
        gather = sync = 0.0
        gather_share = sync_share = 1.0
        p, e = table.params[b], table.experts[b]
        if layout.zero == 3 and mesh.shard_size > 1:
            gather, gather_share = self._parts(gpu, [("allgather", groups["shard"], p - e),
                                                     ("allgather", groups["expert_shard"], e)])
        if mesh.dp > 1:
            if layout.zero == 0:
                sync, sync_share = self._parts(gpu, [("allreduce", groups["dp"], p - e),
                                                     ("allreduce", groups["expert_dp"], e)])
            else:
                shard_e = len(groups["expert_shard"])
                sync, sync_share = self._parts(gpu, [
                    ("reduce_scatter", groups["shard"], p - e), ("reduce_scatter", groups["expert_shard"], e),
                    ("allreduce", groups["replica"], (p - e) / len(groups["shard"])),
                    ("allreduce", groups["expert_replica"], e / shard_e)])
        # (forward, backward: compute with its collectives; gather, sync; compute; collectives; W; the shares
        # of SMs the gather and the sync leave to compute; forward and backward compute alone)
        out = (table.forward[b] + i_f, bwd + i_b, gather, sync, table.forward[b] + bwd + weight, i_f + i_b,
               weight, gather_share, sync_share, table.forward[b], bwd)
        table.derived[key] = out
        return out

    def _passes(self, table: BlockTable, lo: int, hi: int, layout: Layout, mesh: Mesh, gpu: str) -> _Passes:
        """A stage's (or chunk's) blocks [lo, hi): its passes (cached per signature of its blocks)."""
        shard = mesh.shard_size
        zb = layout.schedule == "zb-h1"
        key = ("time", table.signature(lo, hi), layout.zero, layout.shard, layout.recompute, layout.context,
               layout.reshard_after_forward, zb, layout.async_tp, mesh.tp, mesh.cp, mesh.pp, mesh.ep, gpu)
        hit = table.derived.get(key)
        if hit is not None:
            return hit
        costs = []
        for _, count in table.signature(lo, hi):
            b = lo + sum(n for _, n in costs)  # the run's first block
            costs.append((self._block_costs(table, b, layout, mesh, gpu), count))
        blocks = [c for c, n in costs for _ in range(n)]
        zero3 = layout.zero == 3 and shard > 1
        forward, _ = _pass([(c[9], c[0] - c[9], c[2], 0.0, c[7], 1.0) for c in blocks], zero3)
        back = blocks[::-1]
        regather = zero3 and layout.reshard_after_forward
        backward, _ = _pass([(c[10], c[1] - c[10], c[2], 0.0, c[7], 1.0) for c in back], regather)
        if zb:  # the gradients are synchronised as the last micro-batch's W ends, block by block
            weight, tail = _pass([(c[6], 0.0, 0.0, c[3], 1.0, c[8]) for c in back], False)
            last = backward
        else:
            weight = 0.0
            last, tail = _pass([(c[10], c[1] - c[10], c[2], c[3], c[7], c[8]) for c in back], regather)
        experts = sum(table.experts[lo:hi])
        shard = shard if layout.zero >= 1 else 1
        expert_params = experts / self.model.weight
        dense_params = sum(table.num_params[lo:hi]) - expert_params
        step = self.model.step_seconds(dense_params / shard + expert_params / max(1, shard // layout.ep))
        out = _Passes(forward, backward, last, tail, sum(c[4] for c in blocks), sum(c[5] for c in blocks),
                      step, sum(table.params[lo:hi]), experts, weight)
        table.derived[key] = out
        return out

    # ---- the iteration ----------------------------------------------------------------------------------
    def time(self, layout) -> IterationTime:
        layout = Layout.of(layout)
        n = len(self.ranks)
        key = ("mesh", layout.tp, layout.cp, layout.pp, layout.ep, layout.shard)
        mesh = self._coll.get(key)
        if mesh is None:
            mesh = self._coll[key] = Mesh(self.ranks, tp=layout.tp, cp=layout.cp, pp=layout.pp, ep=layout.ep,
                                          shard=layout.shard)
        M = self.batch_size // (mesh.dp * layout.micro_batch)
        table = self.model.blocks(layout)
        pp, v = layout.pp, layout.virtual_stages
        ranges = stage_ranges(self.model.n_blocks, pp * v, layout.stage_blocks, pre=bool(self.model.pre),
                              post=bool(self.model.post))
        whole = self.symmetric and self._per_machine and (n // pp) % self._per_machine == 0
        ranks = []  # per pipeline rank: its chunks' passes (chunk 0 first)
        alike: dict = {}
        for s in range(pp):
            sig = tuple(table.signature(*ranges[s + k * pp]) for k in range(v)) if whole else s
            chunks = alike.get(sig)
            if chunks is None:
                gpu = mesh.gpu(pp=0 if whole else s)
                chunks = alike[sig] = [self._passes(table, *ranges[s + k * pp], layout, mesh, gpu)
                                       for k in range(v)]
            ranks.append(chunks)
        send = self.model.hidden_bytes(layout) / (layout.tp if layout.sequence_parallel else 1)
        p = [self.p2p(mesh.gpu(pp=s), mesh.gpu(pp=s + 1), send) for s in range(pp - 1)]
        F = [sum(c.forward for c in chunks) for chunks in ranks]
        B = [sum(c.backward for c in chunks) for chunks in ranks]
        # the last micro-batch's backward of each chunk, with its syncs (chunk 0's is the rank's last pass)
        extra = [sum(c.last_backward - c.backward for c in chunks) for chunks in ranks]
        W = [f + b for f, b in zip(F, B, strict=True)]
        if layout.schedule == "zb-h1":
            return self._zero_bubble(layout, mesh, ranks, p, M, whole)
        if layout.schedule == "gpipe":
            kf = max(range(pp), key=lambda s: F[s])
            k = max(range(pp), key=lambda s: B[s])
            fill = sum(F) - F[kf] + sum(B) - B[k]
            steady = M * (F[kf] + B[k])
        else:
            k = max(range(pp), key=lambda s: W[s])
            fill = (sum(W) - W[k]) / v
            steady = M * W[k]
        end0 = steady + fill + 2 * sum(p) + sum(extra[: k + 1])
        finish, before = [], 0.0
        for s, chunks in enumerate(ranks):
            step = sum(c.step for c in chunks)
            gather = self._param_gather(layout, mesh, chunks, s, whole)
            finish.append((end0 - before + chunks[0].sync_tail + step + gather, step, gather))
            last = chunks[0].last_backward + sum(c.last_backward - c.backward for c in chunks[1:])
            before += last + (p[s] if s < len(p) else 0.0)
        f = max(range(pp), key=lambda s: finish[s][0])
        slow = ranks[k]
        return IterationTime(
            iteration_s=finish[f][0], pipeline_s=end0, compute_s=M * sum(c.compute for c in slow),
            inline_comm_s=M * sum(c.inline for c in slow), bubble_s=fill + 2 * sum(p),
            exposed_sync_s=ranks[f][0].sync_tail, optimizer_s=finish[f][1], param_gather_s=finish[f][2],
            micro_batches=M)

    def _zero_bubble(self, layout: Layout, mesh: Mesh, ranks: list, p: list[float], M: int, whole
                     ) -> IterationTime:
        """ZB-H1: the stages' F, B and W passes replayed in their order (`zero_bubble.replay`); each stage
        then finishes its last W's syncs, its step and (ZeRO-1/2) its gather."""
        pp = layout.pp
        stages = [chunks[0] for chunks in ranks]
        durations = tuple((c.forward, c.backward, c.weight) for c in stages)
        key = ("zb-h1", durations, tuple(p), M)  # ZeRO 0-2 and HSDP shards differ only after the passes
        ends = self._coll.get(key)
        if ends is None:
            ends = self._coll[key] = zb_h1_ends(pp, M,
                                            [dict(F=f, B=b, W=w) for f, b, w in durations], p)
        finish = []
        for s, c in enumerate(stages):
            gather = self._param_gather(layout, mesh, [c], s, whole)
            finish.append((ends[s] + c.sync_tail + c.step + gather, c.step, gather))
        f = max(range(pp), key=lambda s: finish[s][0])
        k = max(range(pp), key=lambda s: stages[s].forward + stages[s].backward + stages[s].weight)
        slow = stages[k]
        steady = M * (slow.forward + slow.backward + slow.weight)
        return IterationTime(
            iteration_s=finish[f][0], pipeline_s=max(ends), compute_s=M * slow.compute,
            inline_comm_s=M * slow.inline, bubble_s=max(ends) - steady, exposed_sync_s=stages[f].sync_tail,
            optimizer_s=finish[f][1], param_gather_s=finish[f][2], micro_batches=M)

    def _param_gather(self, layout: Layout, mesh: Mesh, chunks: list, s: int, whole) -> float:
        """ZeRO-1/2: the all-gather of a stage's updated parameters after its step."""
        if layout.zero not in (1, 2) or mesh.shard_size <= 1:
            return 0.0
        groups = self._groups(mesh, mesh.gpu(pp=0 if whole else s), layout)
        experts = sum(c.experts for c in chunks)
        gather = self.coll("allgather", groups["shard"], sum(c.params for c in chunks) - experts)
        if len(groups["expert_shard"]) > 1:
            gather += self.coll("allgather", groups["expert_shard"], experts)
        return gather


def _pass(blocks: list[tuple], gather: bool) -> tuple[float, float]:
    """(duration, sync tail) of one pass over ``blocks`` ((compute, inline collectives, gather, sync, the
    share of SMs the gather leaves to compute, the sync's) each, in pass order): block k starts when the
    previous one ended and (``gather``) its gathered parameters arrived; the next block's gather starts with
    it on the communication channel (behind whatever is queued there), and a block's gradient sync is queued
    there as its compute ends. A block's compute runs at the share of the SMs the channel's collective in
    flight leaves it (`_advance`), its inline collectives after it."""
    T = C = 0.0  # compute done; communication channel free
    arrived = 0.0
    busy: list[tuple[float, float, float]] = []  # the channel's collectives: (begin, end, share left)
    if gather:
        C = arrived = blocks[0][2]
        busy.append((0.0, C, blocks[0][4]))
    n = len(blocks)
    for i in range(n):
        compute, inline, _, sync, _, sync_share = blocks[i]
        start = T if not gather or T >= arrived else arrived
        while busy and busy[0][1] <= start:  # over before this block starts
            busy.pop(0)
        if gather and i + 1 < n:
            begin = start if start > C else C
            C = begin + blocks[i + 1][2]
            busy.append((begin, C, blocks[i + 1][4]))
            arrived = C
        T = _advance(start, compute, busy) + inline
        if sync:
            begin = C if C > T else T
            C = begin + sync
            busy.append((begin, C, sync_share))
    return T, max(0.0, C - T)


def _advance(t: float, work: float, busy: list[tuple[float, float, float]]) -> float:
    """When ``work`` seconds of compute started at ``t`` end, running at the share ``s`` of the SMs during
    each ``busy`` (begin, end, s) interval (in order, apart) and at full rate outside them."""
    for begin, end, s in busy:
        if end <= t or s >= 1.0:
            continue
        if begin > t:
            if work <= begin - t:
                return t + work
            work -= begin - t
            t = begin
        if work <= (end - t) * s:
            return t + work / s
        work -= (end - t) * s
        t = end
    return t + work
