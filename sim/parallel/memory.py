"""Per-GPU memory of a parallel layout, in closed form: what strategy ``mesh`` allocates, without simulating.

Per pipeline stage (one rank's share; the worst stage is the layout's answer), with P the stage's weight
bytes on the rank (its tensor/expert share, `stage_costs.BlockTable.params`), N the ZeRO shard (the
data-parallel degree, or HSDP's ``shard``) and the dtype rules of `trainsim.sim.compute.costs` (16-bit
weights and gradients with an fp32 master copy and the moments under master mixed precision):

- parameters: P, or P / N under ZeRO-3 (FSDP);
- gradients: P (DDP, ZeRO-1), P / N (ZeRO-2, -3); written block by block by the first micro-batch's
  backward, freed after the optimizer step;
- optimizer state: P x state/weight bytes, over N under ZeRO >= 1;
- activations: one micro-batch's saved tensors per block (`BlockTable.saved`; with ``recompute: full`` only
  each block's input, the hidden states, over tp under sequence parallelism; with ``selective`` without the
  attention core's) times the micro-batches in flight: 1F1B ``min(pp - s, M)`` on stage s, GPipe M;
- ZeRO-3's gathered blocks: the block being computed and the next one prefetched, ``p_b (1 - 1/N)`` each;
- workspaces (cuBLAS's, `compute.workspaces`).

The peak is the worst instant, which the allocation order decides: it lies in a backward pass (each
forward instant is matched by a fuller backward one), either the first micro-batch's (the gradients still
being written, block by block) or a later one's (the gradients all written, one micro-batch fewer in
flight under GPipe). So per stage, with A one micro-batch's activations, G all gradients, ``F`` the
micro-batches in flight and ``F' = min(F, M - 1)``::

    peak = static + max( F A  + max_b [gathered_b - sum_{b'>b} a_b' + sum_{b'>b} G_b' (+ transient_b)],
                         F' A + G + max_b [gathered_b - sum_{b'>b} a_b' (+ transient_b)] )

(and the instant after block b's backward, its gradients written before its gathered copy goes). With
interleaved 1F1B (``virtual_stages`` v: a rank holds v model chunks) the passes' order is replayed (the
same order the strategy runs), each pass's worst instant taken from its chunk's terms as above.

Beyond what the split keeps per layer: a recomputed block's activations are live again while its backward
runs (``transient_b``: full recomputation brings the whole block's back, selective the attention core's),
and so are the activation gradients its worst layer holds (`stage_costs.BlockTable.grad_held`: that layer's
output and input gradients, the loss's two fp32 gradients of the logits in the head's block);
selective recomputation keeps the attention core's inputs (queries, keys, values) and its output; expert
parameters are alike only on the data-parallel ranks of one expert position, so ZeRO shards their gradients,
optimizer state (and, ZeRO-3, weights) over ``shard / ep`` ranks; with ``reshard_after_forward: false`` a
stage's blocks stay gathered from their forward to their backward (all of them at once at worst). The
strategy allocates the same: its simulated peak equals this count.

Under ``schedule: zb-h1`` (sim/parallel/zero_bubble.py) a micro-batch's B frees its activations but for
what its W needs (``Aw``: per block `BlockTable.weight_kept`, each linear layer's saved input and its output
gradient, and the embedding's output gradient), which W frees; the first micro-batch's W writes the
gradients. Stage s holds up to F micro-batches before their B and up to s between B and W (F + s <= pp): the
passes' states are replayed (`zero_bubble_states`), each pass's worst instant from its terms as above.

It assumes the prefetched gather has arrived while the current block computes (FSDP's aim); where the
gathers are slower than the compute the simulated peak can be lower by up to one block.
"""

from __future__ import annotations

from dataclasses import dataclass

from .stage_costs import BlockTable, Layout, ModelCosts, stage_ranges

__all__ = ["StageMemory", "layout_memory", "stage_memory"]


@dataclass(frozen=True)
class StageMemory:
    """One rank of pipeline stage ``stage``: its peak and what was held then (bytes)."""

    stage: int
    peak: float
    params: float
    grads: float  # at the peak
    optimizer_state: float
    activations: float  # at the peak, including a recomputed block's transient
    gathered_params: float  # at the peak
    workspaces: float
    in_flight: int  # micro-batches whose activations the stage holds at most

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def in_flight(layout: Layout, stage: int, micro_batches: int) -> int:
    """Micro-batches whose activations stage ``stage`` holds at most: 1F1B ``min(pp - s, M)``; GPipe M
    (interleaved 1F1B: see `_interleaved`)."""
    if layout.schedule == "gpipe":
        return micro_batches
    return min(layout.pp - stage, micro_batches)


def kept_bytes(table: BlockTable, b: int, layout: Layout, hidden_kept: float) -> float:
    """One micro-batch's activations block ``b`` keeps from its forward to its backward: all it saves
    (`BlockTable.saved`), only its input (``hidden_kept``) under full recomputation, or without what its
    attention core saves beyond the core's inputs and output (a recomputation starts from them) under
    selective."""
    saved = table.saved[b]
    if layout.recompute == "full":
        return hidden_kept
    if layout.recompute == "selective":
        return max(0.0, saved - max(0.0, table.core_saved[b] - table.core_inputs[b]))
    return saved


def _stage_terms(table: BlockTable, lo: int, hi: int, layout: Layout, shard: int, hidden_kept: float
                 ) -> tuple:
    """(P, A, G, X0, X1, XF, held, state) of a stage's (or chunk's) blocks [lo, hi): weights, one
    micro-batch's activations, all the gradients, and the worst instant's offset (bytes, then its
    activations, gradients and gathered parts) in the first micro-batch's backward (X0, gradients being
    written), a later one's (X1, without G) and a forward (XF, above the activations and gradients already
    held); the weights held (ZeRO-3: their shard) and the optimizer state's weights (ZeRO >= 1: their
    shard). Cached on the table."""
    zb = layout.schedule == "zb-h1"
    key = ("memory", table.signature(lo, hi), layout.zero, shard, layout.recompute,
           layout.reshard_after_forward, hidden_kept, zb)
    hit = table.derived.get(key)
    if hit is not None:
        return hit
    zero3 = layout.zero == 3 and shard > 1
    # experts are alike only on the data-parallel ranks of one expert position: their state shards over
    # shard / ep of them
    shard_e = max(1, shard // layout.ep)
    P = A = weights = state = 0.0
    kept, grads, gathered, transient = [], [], [], []
    for b in range(lo, hi):
        p, e = table.params[b], table.experts[b]
        d = p - e
        a = kept_bytes(table, b, layout, hidden_kept)
        P += p
        A += a
        weights += d / shard + e / shard_e if zero3 else p
        state += d / shard + e / shard_e if layout.zero >= 1 else p
        kept.append(a)
        grads.append(p if layout.zero < 2 else d / shard + e / shard_e)
        gathered.append(d * (1 - 1 / shard) + e * (1 - 1 / shard_e) if zero3 else 0.0)
        transient.append(max(0.0, table.saved[b] - a) + table.grads_held(b))  # recomputed; gradients
    G = sum(grads)
    n = hi - lo
    # each candidate instant: (bytes above F A, its activations, gradients and gathered parts)
    X0 = X1 = (float("-inf"), 0.0, 0.0, 0.0)
    suf_a = suf_g = 0.0  # over the blocks after b (done first in backward)
    held = sum(gathered)  # reshard_after_forward false: every block not yet back through its backward
    for k in range(n - 1, -1, -1):
        if not zero3:
            gath = 0.0
        elif layout.reshard_after_forward:
            gath = gathered[k] + (gathered[k - 1] if k > 0 else 0.0)  # this block and the prefetched
        else:
            gath = held
        acts = transient[k] - suf_a
        after = -suf_a - kept[k]  # block k's backward done: its activations freed, its gradients written
        X0 = max(X0, (acts + suf_g + gath, acts, suf_g, gath),
                 (after + suf_g + grads[k] + gath, after, suf_g + grads[k], gath))
        X1 = max(X1, (acts + gath, acts, 0.0, gath))
        suf_a += kept[k]
        suf_g += grads[k]
        held -= gathered[k]
    # the forward's worst instant: block k computing, its predecessors' activations kept, k and k+1 gathered
    XF, pre_a = (float("-inf"), 0.0, 0.0, 0.0), 0.0
    for k in range(n):
        pre_a += kept[k]
        if not zero3:
            gath = 0.0
        elif layout.reshard_after_forward:
            gath = gathered[k] + (gathered[k + 1] if k + 1 < n else 0.0)
        else:
            gath = sum(gathered[: k + 2])
        XF = max(XF, (pre_a + gath, pre_a, 0.0, gath))
    out = (P, A, G, X0, X1, XF, weights, state)
    if zb:
        out += _zero_bubble_terms(table, lo, hi, kept, grads, gathered, transient, layout, zero3)
    table.derived[key] = out
    return out


def _zero_bubble_terms(table: BlockTable, lo: int, hi: int, kept, grads, gathered, transient, layout: Layout,
                       zero3: bool) -> tuple:
    """zb-h1: (Aw, XB, XW0, XW1): the bytes one micro-batch keeps from its B to its W (each block's
    `BlockTable.weight_kept`), and the worst instant (as `_stage_terms`' X) of a B pass (its activations
    freed block by block but for what W needs; the gathered blocks as a backward's), of the first
    micro-batch's W (the gradients written block by block) and of a later one's (nothing gathered: the B
    before it released its blocks)."""
    wk = table.weight_kept[lo:hi]
    n = hi - lo
    XB = (float("-inf"), 0.0, 0.0, 0.0)
    suf_a = suf_w = 0.0
    held = sum(gathered)
    for k in range(n - 1, -1, -1):
        if not zero3:
            gath = 0.0
        elif layout.reshard_after_forward:
            gath = gathered[k] + (gathered[k - 1] if k > 0 else 0.0)
        else:
            gath = held
        during = transient[k] - suf_a + suf_w
        after = -suf_a - kept[k] + suf_w + wk[k]
        XB = max(XB, (during + gath, during, 0.0, gath), (after + gath, after, 0.0, gath))
        suf_a += kept[k]
        suf_w += wk[k]
        held -= gathered[k]
    XW0 = XW1 = (0.0, 0.0, 0.0, 0.0)  # as the pass starts
    suf_w = suf_g = 0.0
    for k in range(n - 1, -1, -1):  # after block k's W: what it kept freed, its gradients written
        suf_w += wk[k]
        suf_g += grads[k]
        XW0 = max(XW0, (suf_g - suf_w, -suf_w, suf_g, 0.0))
    return sum(wk), XB, XW0, XW1


_zb_states: dict = {}


def zero_bubble_states(pp: int, s: int, M: int) -> tuple:
    """The states stage ``s`` is in as a ZB-H1 pass starts (`zero_bubble.zb_h1_order`) that can hold the most:
    (pass, first micro-batch, micro-batches forward but not B, B but not W, whether W has written the
    gradients), and the most micro-batches whose W had not run."""
    key = (pp, s, M)
    hit = _zb_states.get(key)
    if hit is not None:
        return hit
    from .zero_bubble import zb_h1_order

    seen = {}
    fb = bw = most = 0
    written = False
    for kind, m in zb_h1_order(s, pp, M):
        seen.setdefault((kind, m == 0, fb, bw, written), None)
        if kind == "F":
            fb += 1
            most = max(most, fb + bw)
        elif kind == "B":
            fb, bw = fb - 1, bw + 1
        else:
            bw -= 1
            written = written or m == 0
    # the bytes held grow with each count (A, Aw, G >= 0): only states no other of the same pass exceeds count
    states = [x for x in seen if not any(y != x and y[:2] == x[:2] and y[2] >= x[2] and y[3] >= x[3]
                                         and y[4] >= x[4] for y in seen)]
    out = (tuple(states), most)
    if len(_zb_states) > 4096:
        _zb_states.clear()
    _zb_states[key] = out
    return out


def _zero_bubble(terms: tuple, layout: Layout, s: int, M: int) -> tuple[int, tuple]:
    """`_interleaved` for ZB-H1 (one chunk): each distinct state a pass starts in, its worst instant."""
    _, A, G, _, _, XF, _, _, Aw, XB, XW0, XW1 = terms
    states, most = zero_bubble_states(layout.pp, s, M)
    best = (float("-inf"), 0.0, 0.0, 0.0)
    for kind, first, fb, bw, written in states:
        acts, grads = fb * A + bw * Aw, G if written else 0.0
        X = XF if kind == "F" else XB if kind == "B" else XW0 if first else XW1
        best = max(best, (acts + grads + X[0], acts + X[1], grads + X[2], X[3]))
    return most, best


def stage_memory(model: ModelCosts, layout: Layout, gpus: int, batch_size: int, *,
                 worst_only: bool = False) -> list[StageMemory]:
    """Every pipeline rank's `StageMemory` for ``layout`` on ``gpus`` GPUs at global ``batch_size``
    (``worst_only``: only the first of the ranks whose blocks are alike, which holds the most of them)."""
    layout = Layout.of(layout)
    dp = layout.dp(gpus)
    M = batch_size // (dp * layout.micro_batch)
    shard = (layout.shard or dp) if layout.zero >= 1 else 1
    table = model.blocks(layout)
    hidden_kept = model.hidden_bytes(layout) / (layout.tp if layout.sequence_parallel else 1)
    pp, v = layout.pp, layout.virtual_stages
    ranges = stage_ranges(model.n_blocks, pp * v, layout.stage_blocks, pre=bool(model.pre),
                          post=bool(model.post))
    out = []
    stages = range(pp)
    if worst_only:
        # a stage like an earlier one holds no more than it (fewer micro-batches in flight); under zb-h1
        # stage s holds up to pp - s micro-batches before their B and s between B and W, so the first or the
        # last of the stages alike holds the most
        alike: dict = {}
        for s in range(pp):
            alike.setdefault(tuple(table.signature(*ranges[s + k * pp]) for k in range(v)), []).append(s)
        ends = (0, -1) if layout.schedule == "zb-h1" else (0,)
        stages = sorted({group[e] for group in alike.values() for e in ends})
    for s in stages:
        chunks = [_stage_terms(table, *ranges[s + k * pp], layout, shard, hidden_kept)
                  for k in range(v)]
        held = sum(c[6] for c in chunks)
        state = sum(c[7] for c in chunks) * model.state_per_param
        static = held + state + table.workspace_bytes
        if layout.schedule == "zb-h1":
            F, (dyn, acts, grads, gath) = _zero_bubble(chunks[0], layout, s, M)
        elif v == 1:
            _, A, G, X0, X1, _, _, _ = chunks[0]
            F = in_flight(layout, s, M)
            first = F * A + X0[0]
            later = min(F, M - 1) * A + G + X1[0] if M >= 2 else float("-inf")
            if later > first:
                dyn, acts, grads, gath = later, min(F, M - 1) * A + X1[1], G, X1[3]
            else:
                dyn, acts, grads, gath = first, F * A + X0[1], X0[2], X0[3]
        else:
            F, (dyn, acts, grads, gath) = _interleaved(chunks, layout, s, M)
        out.append(StageMemory(s, static + dyn, held, grads, state, acts, gath, table.workspace_bytes, F))
    return out


_orders: dict = {}


def interleaved_order(pp: int, v: int, s: int, M: int) -> list[tuple[str, int, int]]:
    """(pass, chunk, micro-batch) in the order pipeline rank ``s`` runs interleaved 1F1B (Megatron-LM's, as
    the ``mesh`` strategy runs it: micro-batches in groups of pp through each chunk in turn, the warm-up
    (pp - s - 1) x 2 + (v - 1) x pp forwards)."""
    key = (pp, v, s, M)
    hit = _orders.get(key)
    if hit is not None:
        return hit

    def unit(i: int, backward: bool) -> tuple[int, int]:
        group, within = divmod(i, pp * v)
        k = within // pp
        return (v - 1 - k if backward else k), group * pp + within % pp

    total = M * v
    warm = min((pp - s - 1) * 2 + (v - 1) * pp, total)
    out = [("F", *unit(i, False)) for i in range(warm)]
    for i in range(total - warm):
        out += [("F", *unit(warm + i, False)), ("B", *unit(i, True))]
    out += [("B", *unit(i, True)) for i in range(total - warm, total)]
    if len(_orders) > 4096:
        _orders.clear()
    _orders[key] = out
    return out


def _interleaved(chunks: list[tuple], layout: Layout, s: int, M: int) -> tuple[int, tuple]:
    """(most chunk passes in flight, (dynamic peak, activations, gradients, gathered at it)) of rank ``s``
    running its chunks interleaved: the allocation order replayed pass by pass, each pass's worst instant
    from its chunk's terms (`_alike_chunks` where the chunks are alike)."""
    if all(c is chunks[0] for c in chunks):
        return _alike_chunks(chunks[0], layout, s, M)
    acts = grads = 0.0
    flight = most = 0
    best = (float("-inf"), 0.0, 0.0, 0.0)
    for kind, k, m in interleaved_order(layout.pp, layout.virtual_stages, s, M):
        _, A, G, X0, X1, XF, _, _ = chunks[k]
        if kind == "F":
            best = max(best, (acts + grads + XF[0], acts + XF[1], grads, XF[3]))
            acts += A
            flight += 1
            most = max(most, flight)
            continue
        X = X0 if m == 0 else X1
        best = max(best, (acts + grads + X[0], acts + X[1], grads + X[2], X[3]))
        if m == 0:
            grads += G
        acts -= A
        flight -= 1
    return most, best


def _alike_chunks(terms: tuple, layout: Layout, s: int, M: int) -> tuple[int, tuple]:
    """`_interleaved` for v alike chunks, in closed form. Backward j (of M v) holds ``n_j = min(w + j + 1,
    M v) - j`` chunk passes (w the warm-up), non-increasing in j; the first backward of the c-th chunk to go
    back (j = c pp) finds c chunks' gradients written, the next ones (j = c pp + 1) c + 1. Forward instants
    are each below the next backward's (the same blocks, fuller)."""
    _, A, G, X0, X1, _, _, _ = terms
    pp, v = layout.pp, layout.virtual_stages
    total = M * v
    warm = min((pp - s - 1) * 2 + (v - 1) * pp, total)

    def n(j: int) -> int:
        return min(warm + j + 1, total) - j

    best = (float("-inf"), 0.0, 0.0, 0.0)
    for c in range(v):
        j = c * pp
        if j < total:
            best = max(best, (n(j) * A + c * G + X0[0], n(j) * A + X0[1], c * G + X0[2], X0[3]))
        if j + 1 < total:
            grads = (c + 1) * G
            best = max(best, (n(j + 1) * A + grads + X1[0], n(j + 1) * A + X1[1], grads, X1[3]))
    return n(0), best


def layout_memory(model: ModelCosts, layout: Layout, gpus: int, batch_size: int) -> StageMemory:
    """The worst stage's `StageMemory`: the layout's per-GPU memory peak."""
    return max(stage_memory(model, layout, gpus, batch_size, worst_only=True),
               key=lambda m: m.peak)
