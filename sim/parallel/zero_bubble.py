"""The zero-bubble pipeline schedule ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", section 3.1):
its pass order, how a block's backward splits into its input- and weight-gradient parts, and the replay of
a fixed pass order that times it in closed form.

**B and W.** A backward pass splits into B (the input gradient, which the previous stage waits for) and W
(the weight gradient, which nobody waits for until the optimizer step). A linear layer's backward is two
GEMMs of equal FLOPs, dX = dY W^T (B) and dW = X^T dY (W), so half its backward time is W (`W_SHARE`); an
embedding's backward is all W (its input is token ids: no input gradient); the attention core, the norms,
the activations, RoPE and the MoE dispatch and combine are all B. W needs, per linear layer, its saved
input X and the output gradient dY that B computed: a block holds those from its B to its W
(`stage_costs.BlockTable.weight_kept`); B frees the rest of the block's activations.

**The order** (`zb_h1_order`). Stage s of p keeps 1F1B's warm-up (p - s - 1 forwards) and steady state (a
forward, then a B), and defers each W by s micro-batches: the stage holds at most p micro-batches whose W
has not run, the number stage 0 (which defers nothing) holds under 1F1B, so the pipeline's peak stays
1F1B's while the later stages' B's return sooner. In the cool-down each B is followed by the oldest
deferred W, and the W's left run at the end: they fill 1F1B's cool-down bubble. With equal F, B and W the
bubble is (p - 1)(F + B - W), a third of 1F1B's (p - 1)(F + B + W) (the paper's Figure 3).

**The replay** (`replay`): each stage runs its passes in order, a pass starting when the stage is free and
its input is there (F: the previous stage's F of that micro-batch and a message; B: the next stage's B and a
message, or on the last stage its own F; W: its own B). Exact for fixed pass durations; what the ``mesh``
strategy simulates with the same durations.
"""

from __future__ import annotations

__all__ = ["W_SHARE", "replay", "zb_h1_ends", "zb_h1_order"]

#: the share of a layer's backward time that is its weight gradient (W), by layer kind; other kinds: 0
W_SHARE = {"linear": 0.5, "expert_linear": 0.5, "router": 0.5, "embedding": 1.0}

_orders: dict = {}


def zb_h1_order(s: int, pp: int, M: int) -> list[tuple[str, int]]:
    """(pass, micro-batch) in the order pipeline stage ``s`` of ``pp`` runs ZB-H1 over ``M`` micro-batches
    (F, B, W; see the module)."""
    key = (s, pp, M)
    hit = _orders.get(key)
    if hit is not None:
        return hit
    warm = min(pp - s - 1, M)
    out = [("F", m) for m in range(warm)]
    deferred: list[int] = []
    for i in range(M - warm):
        out += [("F", warm + i), ("B", i)]
        deferred.append(i)
        if len(deferred) > s:
            out.append(("W", deferred.pop(0)))
    for m in range(M - warm, M):
        out.append(("B", m))
        deferred.append(m)
        out.append(("W", deferred.pop(0)))
    out += [("W", m) for m in deferred]
    if len(_orders) > 4096:
        _orders.clear()
    _orders[key] = out
    return out


def replay(orders: list[list[tuple[str, int]]], durations: list[dict], messages: list[float], *,
           record: list | None = None) -> list[float]:
    """When each stage's last pass ends: stage s runs ``orders[s]`` with pass seconds ``durations[s]`` ({F, B,
    W: seconds}), ``messages[s]`` the seconds of a message between stages s and s + 1. ``record``: a list of
    one empty list per stage, to which each pass's end is appended."""
    pp = len(orders)
    M = 1 + max((m for _, m in orders[0]), default=0)
    nan = None
    f_end = [[nan] * M for _ in range(pp)]  # when stage s's F (B) of micro-batch m ended
    b_end = [[nan] * M for _ in range(pp)]
    free = [0.0] * pp
    at = [0] * pp
    lengths = [len(order) for order in orders]
    moved = True
    while moved:
        moved = False
        for s in range(pp):
            i, n = at[s], lengths[s]
            if i == n:
                continue
            order, dur, fe, be = orders[s], durations[s], f_end[s], b_end[s]
            f, b, w = dur["F"], dur["B"], dur["W"]
            prev_f = f_end[s - 1] if s > 0 else None
            next_b = b_end[s + 1] if s < pp - 1 else None
            to_prev = messages[s - 1] if s > 0 else 0.0
            to_next = messages[s] if s < pp - 1 else 0.0
            t = free[s]
            while i < n:
                kind, m = order[i]
                if kind == "F":
                    if prev_f is not None:
                        ready = prev_f[m]
                        if ready is None:
                            break
                        ready += to_prev
                        if ready > t:
                            t = ready
                    t += f
                    fe[m] = t
                elif kind == "B":
                    ready = fe[m] if next_b is None else next_b[m]
                    if ready is None:
                        break
                    if next_b is not None:
                        ready += to_next
                    if ready > t:
                        t = ready
                    t += b
                    be[m] = t
                else:  # W: after this stage's own B, which ran before it in the order
                    t += w
                if record is not None:
                    record[s].append(t)
                i += 1
            if i != at[s]:
                moved = True
                free[s], at[s] = t, i
    if at != lengths:
        raise RuntimeError("a pipeline order that deadlocks")  # not for the orders built here
    return free


def zb_h1_ends(pp: int, M: int, durations: list[dict], messages: list[float]) -> list[float]:
    """`replay` of ZB-H1 over ``M`` micro-batches, in time independent of M once the pipeline is periodic.

    From global step pp - 1 to M - pp every stage runs the same step (its F, B and a deferred W), so the
    stages' state after a step (each one's F end and the step's end) is a fixed max-plus map of the state
    before it. Once a step's state is the previous one's shifted by one figure lambda on every stage, every
    later step shifts it by lambda again: a replay of fewer micro-batches that reaches such a step gives
    the ends of M micro-batches exactly, as its ends plus lambda per micro-batch more. (A max-plus map does
    not expand differences, so a shift equal to within rounding stays so.)"""
    small = 3 * pp + 4
    trial = small
    while trial < M:
        record = [[] for _ in range(pp)]
        ends = replay([zb_h1_order(s, pp, trial) for s in range(pp)], durations, messages, record=record)
        shift = _periodic(record, pp, trial)
        if shift is not None:
            return [e + (M - trial) * shift for e in ends]
        trial *= 2
    return replay([zb_h1_order(s, pp, M) for s in range(pp)], durations, messages)


def _periodic(record: list[list[float]], pp: int, M: int) -> float | None:
    """Lambda, where two consecutive all-steady steps of a ZB-H1 replay (`zb_h1_ends`) differ by it on every
    stage."""

    def state(i: int) -> list[float]:
        out = []
        for s in range(pp):
            start = (pp - s - 1) + 2 * s + 3 * (i - s)  # warm-up, s steps of F and B, then F, B and W
            out += [record[s][start], record[s][start + 2]]
        return out

    before = state(pp - 1)
    for i in range(pp, M - pp + 1):
        now = state(i)
        shift = now[0] - before[0]
        scale = abs(now[0]) + 1e-30
        if all(abs(a - b - shift) <= 1e-12 * scale for a, b in zip(now, before, strict=True)):
            return shift
        before = now
    return None
