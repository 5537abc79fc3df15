"""The collectives on a block's critical path under a parallel layout: what the `mesh` strategy issues and
what the closed-form `analytic` model times, from one list so the two cannot drift apart.

Per pass of one micro-batch through a block (sim/parallel/stage_costs.py's `BlockTable` row ``b``):

- tensor parallelism (``tp > 1``): after each row-split layer (and the vocabulary-parallel embedding and
  head), an all-reduce of the hidden states over the tensor-parallel group, or under sequence parallelism
  an all-gather and a reduce-scatter of them; the same each way (forward and backward). With ``async_tp``
  (PyTorch's async tensor parallelism, a micro-pipelined collective matmul) each all-gather is split into
  tp steps under the column-parallel GEMMs it feeds (forward; backward: under the row layer's input
  gradient) and each reduce-scatter into tp steps under the row-parallel GEMM that makes it (backward: the
  column layers' input gradient): tp GEMM steps and tp - 1 transfers, each transfer beside a GEMM step, so
  a pair takes ``(tp - 1) max(C / tp, X / (tp - 1)) + C / tp`` for C the GEMMs and X the collective
  (`Call.steps`), about max(C, X + C / tp), not C + X. The GEMMs take as long as they do alone (no
  contention for the SMs is modelled for the inline collectives, with or without it). The embedding's and
  head's collectives stay as they are;
- context parallelism (``cp > 1``) on an attention block: the keys and values all-gathered over the
  context-parallel group (forward) and their gradients reduce-scattered (backward); or with ``context:
  ring`` ``cp - 1`` steps of one chunk to the ring's neighbour, hidden under the attention core's compute
  where they can be (one pass forward, two backward: the chunks and their gradients);
- expert parallelism (``ep > 1``) on a mixture-of-experts block: the dispatch and the combine, each an
  all-to-all of the routed tokens' hidden states over the expert-parallel group, each way.

A backward under recomputation runs the forward's collectives again where the recomputed forward needs
them: all of them under full recomputation; under selective the context-parallel exchange of the attention
core (the gathered keys and values are not kept).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Call", "call_seconds", "pass_calls"]


@dataclass(frozen=True)
class Call:
    """One collective in a pass: ``op`` over the mesh group ``dim`` (tp, cp, ep; ``cp_pair``: a rank and
    its ring neighbour), ``nbytes`` as nccl-tests size it, ``repeat`` times in turn, hiding under
    ``hidden_s`` seconds of compute; ``name`` says what it is (tp_allreduce, cp_ring, ep_dispatch...).
    ``steps`` > 1: decomposed with that compute into that many steps, each step's transfer beside a step's
    compute (async TP)."""

    name: str
    op: str
    dim: str
    nbytes: float
    repeat: int = 1
    hidden_s: float = 0.0
    steps: int = 1


def call_seconds(call: Call, time_of: Callable[[str, str, float], float]) -> float:
    """The exposed seconds of ``call``, ``time_of(op, dim, nbytes)`` timing one collective: beyond the
    compute it hides under (with ``steps`` n: n compute steps and n - 1 transfers, each transfer beside a
    compute step, ``(n - 1) max(C / n, X / (n - 1)) + C / n - C``)."""
    seconds = call.repeat * time_of(call.op, call.dim, call.nbytes)
    if call.steps > 1:
        n, c = call.steps, call.hidden_s
        return (n - 1) * max(c / n, seconds / (n - 1)) + c / n - c
    return max(0.0, seconds - call.hidden_s)


def _calls(table, b: int, layout, config: dict, act: float, kind: str) -> list[Call]:
    out = []
    seq, hidden = config.get("seq_len", 1), config.get("hidden_size", 0)
    mb, tp, cp = layout.micro_batch, layout.tp, layout.cp
    points = table.row_layers[b] + (1 if table.names[b] in ("pre", "post") and tp > 1 else 0)
    if tp > 1 and points:
        nbytes = mb * seq / cp * hidden * act
        ops = ("allgather", "reduce_scatter") if layout.sequence_parallel else ("allreduce",)
        gemms = table.tp_gemms[b] if getattr(layout, "async_tp", False) and layout.sequence_parallel else ()
        if len(gemms) != table.row_layers[b]:
            gemms = ()
        for col_f, col_b, row_f, row_b in gemms:  # async TP: each collective in steps under its GEMMs
            under = (col_f, row_f) if kind == "F" else (row_b, col_b)
            out += [Call(f"tp_{op}", op, "tp", nbytes, hidden_s=c, steps=tp)
                    for op, c in zip(ops, under, strict=True)]
        out += [Call(f"tp_{op}", op, "tp", nbytes) for _ in range(points - len(gemms)) for op in ops]
    if cp > 1 and table.attention[b]:
        heads = config.get("num_attention_heads", 1)
        kv_dim = (config.get("num_key_value_heads") or heads) * (
            config.get("head_dim") or hidden // max(1, heads)
        )
        kv = mb * seq * 2 * kv_dim / tp * act  # every rank's keys and values
        if layout.context == "allgather":
            op = "allgather" if kind == "F" else "reduce_scatter"
            out.append(Call(f"cp_{op}", op, "cp", kv))
        else:
            core = table.core[b] * (1 if kind == "F" else 2.5)
            out.append(
                Call(
                    "cp_ring",
                    "sendrecv",
                    "cp_pair",
                    kv / cp,
                    (cp - 1) * (1 if kind == "F" else 2),
                    core * (cp - 1) / cp,
                )
            )
    if layout.ep > 1 and table.moe[b]:
        tokens = mb * seq / cp / (tp if layout.sequence_parallel else 1)
        nbytes = tokens * (config.get("num_experts_per_tok") or 0) * hidden * act * layout.expert_imbalance
        out += [Call(f"ep_{name}", "alltoall", "ep", nbytes) for name in ("dispatch", "combine")]
    return out


def pass_calls(table, b: int, layout, config: dict, act: float, kind: str) -> list[Call]:
    """The critical-path collectives of block ``b``'s pass ``kind`` (F or B), in the order they run (see the
    module); ``act`` is the bytes of one activation value."""
    calls = _calls(table, b, layout, config, act, kind)
    if kind == "B" and layout.recompute == "full":
        calls = _calls(table, b, layout, config, act, "F") + calls
    elif kind == "B" and layout.recompute == "selective":
        calls = [c for c in _calls(table, b, layout, config, act, "F") if c.name.startswith("cp_")] + calls
    return calls
