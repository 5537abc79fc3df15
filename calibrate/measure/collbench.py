"""Collective microbenchmarks across all local devices: all-reduce, broadcast, reduce, all-gather,
reduce-scatter, gather, scatter, send/recv and the halo exchange.

Run with ``launch`` (NCCL on GPUs, gloo on CPU ranks). For every size S (bytes of the whole array, as
nccl-tests reports them) each rank times ``k`` back-to-back operations between barriers, the slowest rank's
time per operation is the sample, and the median of the repeats is the point, with its interquartile range.
On CPU ranks (gloo) every sample is one isolated operation after a barrier, the slowest rank's time; a
one-way call (send/recv, broadcast, scatter: `ROOT_LATE`) is met as training meets it
(`_as_training_meets`): every rank has just run a training step of the calibrated model (`TrainingStep`),
the sender (the root) arrives late, and the sample runs from its arrival to the last waiting receiver's
return. The point is the samples' mean and the samples are kept: the
simulator takes from those at the sizes around a call's own how long it takes when fast and how often it
stalls, a stall lasting until the host's timer tick (`trainsim.calibrate.measure.timer_tick`,
`trainsim.sim.hosts.call_latency`).

On gloo the two ways of meeting a call differ in how often it stalls (docs/gloo-on-a-small-vm.md):
all-reduce, reduce, gather and the halo exchange are timed between barriers; broadcast, scatter and send/recv
with the root arriving late to waiting receivers, as training meets them.

Bandwidths follow nccl-tests (doc/PERFORMANCE.md): algbw = S / t; busbw = algbw x F, where F = 2(n-1)/n for
all-reduce, (n-1)/n for all-gather, reduce-scatter, gather and scatter (S = the whole gathered / reduced
array) and 1 for broadcast and reduce. busbw is the figure comparable with a link's bandwidth whatever the
rank count. Each collective gets an alpha-beta fit ``t = alpha + S / beta`` (beta is the asymptotic algbw;
its busbw is beta x F).

A backend without some collective (older gloo has no reduce-scatter) records the reason and skips it.

``send_recv`` is the point-to-point message (pipeline activations, EASGD's pushes): rank 0 sends S bytes to
rank 1 (the others idle). With NCCL a point is half a ping-pong's round trip; on gloo it is one message,
from the sender's call to the waiting receiver's return. On gloo it costs far more than a memory copy (a TCP
message and the peer's wake-up), so the simulator charges point-to-point flows its measured latency on
calibrated CPU boxes.

``exchange`` is the spatial halo exchange: every rank swaps S bytes with its partner (rank r with r xor 1)
at once, ``isend`` and ``irecv`` both ways then wait, as the executor's halo exchange does
(`trainsim.calibrate.execute.spatial`). On gloo it is timed between barriers like the collectives. Both
neighbours arrive together and each waits for
the other's rows, so on gloo it stalls as the collectives do, not as a message to a waiting receiver."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from trainsim.calibrate.launch import RankContext, launch
from trainsim.calibrate.measure.alphabeta import AlphaBeta, fit_alpha_beta
from trainsim.calibrate.sampling import iterations_for, median_spread
from trainsim.errors import TrainsimError

# reduce, gather and scatter: what the parameter-server and DataParallel-style flows call, one call per phase
COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "gather", "scatter",
               "send_recv", "exchange")
MESSAGES_PER_OP = {"send_recv": 2}  # a ping-pong is two messages: the point is one message's time (NCCL)
CPU_SINGLE_SHOTS = 15  # gloo samples per size, each one isolated operation (see bench_rank)
# point-to-point calls are cheap and bimodal (the peer awake or not): more samples steady their means
CPU_P2P_SHOTS = 4 * CPU_SINGLE_SHOTS
P2P = ("send_recv", "exchange")
# how late a message's sender arrives: its receiver is already waiting (a pipeline stage, a halo's neighbour)
CPU_ARRIVAL_LAG_S = 0.002
# one-way calls, rank 0 sending: their receivers wait for a root that has worked first (see above)
ROOT_LATE = ("send_recv", "broadcast", "scatter")


def bus_factor(collective: str, nranks: int) -> float:
    """nccl-tests' busbw / algbw factor for ``collective`` on ``nranks`` ranks."""
    n = nranks
    factors = {
        "all_reduce": 2.0 * (n - 1) / n,
        "all_gather": (n - 1) / n,
        "reduce_scatter": (n - 1) / n,
        "gather": (n - 1) / n,  # the root receives every other rank's chunk of the whole array
        "scatter": (n - 1) / n,
        "broadcast": 1.0,
        "reduce": 1.0,
        "send_recv": 1.0,
        "exchange": 1.0,  # S is what each rank sends (and receives)
    }
    if collective not in factors:
        raise TrainsimError(f"unknown collective {collective!r}; valid choices: {', '.join(sorted(factors))}")
    return factors[collective]


@dataclass
class CollectiveResult:
    """One collective on one group size: the raw points, bandwidths and the fit (or why it was skipped)."""

    collective: str
    ranks: int
    backend: str
    points: list[dict] = field(default_factory=list)  # bytes, time_s, spread_s, algbw_gbps, busbw_gbps
    fit: AlphaBeta | None = None
    skipped: str | None = None

    def to_json(self) -> dict:
        fit = None
        if self.fit is not None:
            fit = {
                **self.fit.to_json(),
                "busbw_gbps": self.fit.bandwidth_gbps * bus_factor(self.collective, self.ranks),
            }
        return {
            "collective": self.collective,
            "ranks": self.ranks,
            "backend": self.backend,
            "bus_factor": bus_factor(self.collective, self.ranks),
            "points": self.points,
            "fit": fit,
            "skipped": self.skipped,
        }


def _operation(name: str, size_bytes: int, ctx: RankContext, one_way: bool = False) -> Callable[[], None]:
    """A closure running one ``name`` collective on a float32 array of ``size_bytes`` (whole array);
    ``send_recv`` is a ping-pong, or with ``one_way`` a single message."""
    import torch
    import torch.distributed as dist

    n = ctx.world_size
    numel = max(n, size_bytes // 4 // n * n)  # divisible by n so all-gather/reduce-scatter chunks are equal
    full = torch.ones(numel, dtype=torch.float32, device=ctx.device)
    if name == "send_recv":
        return _one_way(full, ctx.rank) if one_way else _ping_pong(full, ctx.rank)
    if name == "exchange":
        return _swap(full, torch.empty_like(full), ctx.rank, n)
    if name == "all_reduce":
        return lambda: dist.all_reduce(full)
    if name == "broadcast":
        return lambda: dist.broadcast(full, src=0)
    if name == "reduce":
        return lambda: dist.reduce(full, dst=0)
    chunk = torch.ones(numel // n, dtype=torch.float32, device=ctx.device)
    if name == "gather":
        parts = list(full.chunk(n)) if ctx.rank == 0 else None
        return lambda: dist.gather(chunk, parts, dst=0)
    if name == "scatter":
        parts = list(full.chunk(n)) if ctx.rank == 0 else None
        return lambda: dist.scatter(chunk, parts, src=0)
    if name == "all_gather":
        return lambda: dist.all_gather_into_tensor(full, chunk)
    if name == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(chunk, full)
    raise TrainsimError(f"unknown collective {name!r}; valid choices: {', '.join(COLLECTIVES)}")


def _ping_pong(buf, rank: int) -> Callable[[], None]:
    """Rank 0 sends ``buf`` to rank 1, which sends it back; other ranks do nothing."""
    import torch.distributed as dist

    def op() -> None:
        if rank == 0:
            dist.send(buf, dst=1)
            dist.recv(buf, src=1)
        elif rank == 1:
            dist.recv(buf, src=0)
            dist.send(buf, dst=0)

    return op


def _one_way(buf, rank: int) -> Callable[[], None]:
    """Rank 0 sends ``buf`` to rank 1; other ranks do nothing."""
    import torch.distributed as dist

    def op() -> None:
        if rank == 0:
            dist.send(buf, dst=1)
        elif rank == 1:
            dist.recv(buf, src=0)

    return op


def _swap(buf, inbox, rank: int, nranks: int) -> Callable[[], None]:
    """Rank r sends ``buf`` to rank r xor 1 and receives its partner's into ``inbox`` (isend and irecv both
    ways, then wait); a last odd rank idles."""
    import torch.distributed as dist

    peer = rank ^ 1

    def op() -> None:
        if peer < nranks:  # batched: one NCCL group (no send/recv ordering deadlock); plain calls on gloo
            for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, buf, peer),
                                                dist.P2POp(dist.irecv, inbox, peer)]):
                work.wait()

    return op


@dataclass(frozen=True)
class TrainingStep:
    """The model whose training step every rank runs before each timed gloo call (`_as_training_meets`)."""

    model: str
    batch: int
    options: dict = field(default_factory=dict)

    def build(self) -> Callable[[], None]:
        """One forward, backward and optimizer step of the model on a fixed synthetic batch."""
        import torch

        from trainsim.calibrate import zoo

        torch.manual_seed(0)
        model = zoo.build_model(self.model, **self.options)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        inputs, targets = zoo.example_batch(self.model, self.batch, **self.options)

        def step() -> None:
            optimizer.zero_grad(set_to_none=True)
            zoo.loss_fn(self.model, model(inputs), targets).backward()
            optimizer.step()

        return step


def _as_training_meets(op: Callable[[], None], ctx: RankContext, late: int,
                       step: Callable[[], None] | None = None) -> float:
    """Seconds from the last rank's arrival at one operation to the last rank's return: every rank runs
    ``step`` (a training step) first, then rank ``late`` arrives `CPU_ARRIVAL_LAG_S` after the others, which
    wait in the call. Ranks of one host read the same monotonic clock, so arrivals and returns compare across
    ranks."""
    import torch
    import torch.distributed as dist

    dist.barrier()
    if step is not None:
        step()
    if ctx.rank == late:
        until = time.perf_counter() + CPU_ARRIVAL_LAG_S
        while time.perf_counter() < until:  # busy, as a rank finishing its step is
            pass
    arrived = time.perf_counter()
    op()
    stamps = torch.tensor([arrived, time.perf_counter()], dtype=torch.float64)
    dist.all_reduce(stamps, op=dist.ReduceOp.MAX)
    return float(stamps[1] - stamps[0])


def _timed(op: Callable[[], None], k: int, ctx: RankContext) -> float:
    """Seconds per operation for k back-to-back operations: the slowest rank's, all ranks agreeing."""
    import torch
    import torch.distributed as dist

    cuda = ctx.device.startswith("cuda")
    dist.barrier()
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(k):
        op()
    if cuda:
        torch.cuda.synchronize()
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item()) / k


def bench_rank(
    ctx: RankContext, collectives: tuple[str, ...], sizes: list[int], repeats: int, target_s: float,
    training: TrainingStep | None = None,
) -> list[dict]:
    """What every rank runs (via ``launch``); rank 0's return value is the report."""
    import torch.distributed as dist

    step = training.build() if training is not None and ctx.device == "cpu" else None
    if step is not None:
        step()  # warm-up: first-touch allocations, oneDNN primitives
    cpu = ctx.device == "cpu"
    out = []
    for name in collectives:
        entry = {"collective": name, "points": [], "skipped": None}
        for size in sizes:
            op = _operation(name, size, ctx, one_way=cpu)
            try:
                op()  # warm-up: connections, algorithm selection, first touch
            except (RuntimeError, NotImplementedError, ValueError) as exc:
                text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                entry["skipped"] = f"{ctx.backend} cannot run {name}: {text}"
                dist.barrier()
                break
            kept = None
            if cpu:
                # gloo: one operation per sample. Back to back the ranks never stop, and what a call costs in
                # training (bimodal: fast, or a 4-5 ms stall) drops out. The mean is the point (a median of a
                # two-mode sample flips); the samples go with it.
                shots = max(repeats, CPU_P2P_SHOTS if name in P2P else CPU_SINGLE_SHOTS)
                if name in ROOT_LATE:  # its receivers wait for it, as a pipeline stage or a replica does
                    samples = [_as_training_meets(op, ctx, 0, step) for _ in range(shots)]
                else:  # between barriers: the mean came out nearest the runs' (see above)
                    samples = [_timed(op, 1, ctx) for _ in range(shots)]
                kept = [round(t, 7) for t in samples]  # the point is the mean of what is kept
                med, spread = sum(kept) / len(kept), median_spread(kept)[1]
            else:
                # Every rank must use the same k, so the estimate is agreed through a collective too.
                k = iterations_for(_timed(op, 1, ctx), target_s, cap=1000)
                samples = [_timed(op, k, ctx) for _ in range(repeats)]
                med, spread = median_spread(samples)
            numel = max(ctx.world_size, size // 4 // ctx.world_size * ctx.world_size)
            per_op = 1 if cpu else MESSAGES_PER_OP.get(name, 1)
            point = {"bytes": numel * 4, "time_s": med / per_op, "spread_s": spread / per_op}
            if kept is not None:
                point["samples_s"] = kept
            entry["points"].append(point)
        out.append(entry)
    return out


def measure_collectives(
    device: str,
    nranks: int,
    sizes: list[int],
    *,
    repeats: int = 3,
    target_s: float = 0.005,
    collectives: tuple[str, ...] = COLLECTIVES,
    timeout_s: float = 900.0,
    training: TrainingStep | None = None,
    env: dict[str, str] | None = None,
) -> list[CollectiveResult]:
    """Launch ``nranks`` ranks on ``device`` and benchmark ``collectives`` over ``sizes``; on CPU ranks with
    ``training``, each call is met after a training step of that model, as the runs meet it. ``env``: extra
    environment of the ranks (NCCL_ALGO / NCCL_PROTO to force NCCL's choice)."""
    for name in collectives:
        bus_factor(name, max(nranks, 1))  # validates the name
    if nranks < 2:
        raise TrainsimError(f"collectives need at least 2 ranks, got {nranks}", field="ranks")
    backend = "nccl" if device == "cuda" else "gloo"
    report = launch(
        bench_rank,
        nranks,
        args=(tuple(collectives), list(sizes), repeats, target_s, training),
        device=device,
        timeout_s=timeout_s,
        env=env,
    )[0]
    return results_from_report(report, nranks, backend)


def results_from_report(report: list[dict], nranks: int, backend: str) -> list[CollectiveResult]:
    """Bandwidths and alpha-beta fits of rank 0's report (``bench_rank``'s return value)."""
    results = []
    for entry in report:
        res = CollectiveResult(entry["collective"], nranks, backend, skipped=entry["skipped"])
        factor = bus_factor(res.collective, nranks)
        for p in entry["points"]:
            algbw = p["bytes"] / p["time_s"] / 1e9
            res.points.append({**p, "algbw_gbps": algbw, "busbw_gbps": algbw * factor})
        if res.skipped is None and len({p["bytes"] for p in res.points}) >= 2:
            res.fit = fit_alpha_beta([p["bytes"] for p in res.points], [p["time_s"] for p in res.points])
        results.append(res)
    return results
