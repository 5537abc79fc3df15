"""`single` and `ddp`: one process per GPU, each with its own shard of the batch.

Each rank: wait for its batch from its data loader, copy it from its socket's memory to the GPU (on the
GPU's H2D engine, in the compute stream's order: PyTorch's ``.to(device)`` without a side stream), forward,
backward. DDP assigns the layers' gradients to buckets in reverse layer order (the first bucket capped at
``first_bucket_cap_mb``, PyTorch's 1 MiB; the others at ``bucket_cap_mb``); when every rank has produced a
bucket's gradients, that bucket is all-reduced on the communication channel while backward goes on
(buckets in order, one at a time, as on NCCL's stream). The optimizer step runs when the last bucket is
reduced. `single` is the same loop on one GPU with no buckets.
"""

from __future__ import annotations

from trainsim.sim.core.latency import CallSite

from .context import Context
from .registry import register


def assign_buckets(
    grad_bytes_per_layer: list[float], cap: float, first_cap: float | None = None
) -> list[list[int]]:
    """Layer indices per bucket, in the order backward fills them (reverse layer order).

    A bucket closes once its bytes reach its cap (as PyTorch's ``compute_bucket_assignment_by_size``); layers
    without parameters join the bucket being filled and never open one.
    """
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0.0
    limit = first_cap if first_cap is not None else cap
    for i in reversed(range(len(grad_bytes_per_layer))):
        if grad_bytes_per_layer[i] <= 0:
            continue
        current.append(i)
        size += grad_bytes_per_layer[i]
        if size >= limit:
            buckets.append(current)
            current, size, limit = [], 0.0, cap
    if current:
        buckets.append(current)
    return buckets


def _rank(ctx: Context, gpu: str, buckets: list[list[int]], ready, done, counts: dict, skews: dict):
    closes_at = {bucket[-1]: b for b, bucket in enumerate(buckets)}  # the layer whose backward completes it
    for it in range(ctx.total_iterations):
        yield from ctx.get_batch(gpu, it)
        yield from ctx.input_copy(gpu, it)
        yield from ctx.forward(gpu, it)

        def bucket_done(b: int, it=it):
            counts[it, b] = counts.get((it, b), 0) + 1
            if counts[it, b] == 1:
                skews[it, b] = ctx.env.now  # the first rank's arrival, until the last's
            if counts[it, b] == len(ctx.simulated):  # every rank has this bucket's gradients: NCCL starts
                skews[it, b] = ctx.env.now - skews[it, b]  # how far apart the ranks arrived
                ready(it, b).succeed()

        stops = {layer: (lambda b=b, f=bucket_done: f(b)) for layer, b in closes_at.items()}
        yield from ctx.backward(gpu, it, stops)
        if buckets:
            yield done(it, len(buckets) - 1)
        yield from ctx.optimizer_step(gpu, it)
        ctx.finish(it, gpu)


def _reducer(ctx: Context, buckets: list[list[int]], ready, done, bucket_bytes: list[float], skews: dict):
    for it in range(ctx.total_iterations):
        for b in range(len(buckets)):
            yield ready(it, b)
            skew = skews.pop((it, b))
            if ctx.plugins.codec is None:
                yield from ctx.collective("allreduce", bucket_bytes[b], it, label=f":bucket{b}",
                                          call=_met(skew))
            else:
                yield from _compressed_allreduce(ctx, buckets[b], it, b, skew)
            done(it, b).succeed()


def _met(skew_s: float) -> CallSite:
    """A bucket's all-reduce, its ranks arriving ``skew_s`` apart."""
    return CallSite("allreduce", skew_s=skew_s)


def _codec_pass(ctx: Context, op: str, seconds: float, it: int, b: int):
    """A codec step of one bucket on every rank's compute stream (a DDP comm hook's tensor ops)."""
    env = ctx.env
    yield env.all_of([
        env.process(ctx.machine.run(g, "compute", seconds, op=op, iteration=it, layer=f"bucket{b}",
                                    codec=ctx.plugins.codec.spec.label()))
        for g in ctx.ranks
    ])


def _compressed_allreduce(ctx: Context, layers: list[int], it: int, b: int, skew_s: float):
    """``param_compression``: encode, all-reduce the compressed bytes, decode
    (sim/optimizations/compression.py); PowerSGD
    is three chained all-reduces instead. Each rank encodes as soon as its bucket is ready, so the ranks
    meet the first all-reduce as far apart as they filled the bucket (``skew_s``)."""
    codec = ctx.plugins.codec
    grads = ctx.costs[ctx.ranks[0]].grad_bytes_per_layer
    if codec.spec.method == "powersgd":
        yield from _powersgd_allreduce(ctx, layers, it, b, skew_s)
        return
    yield from _codec_pass(ctx, "encode_grads", codec.encode_s(grads, layers), it, b)
    yield from ctx.collective("allreduce", codec.wire_bytes(grads, layers), it, label=f":bucket{b}",
                              call=_met(skew_s))
    yield from _codec_pass(ctx, "decode_grads", codec.decode_s(grads, layers), it, b)


def _powersgd_allreduce(ctx: Context, layers: list[int], it: int, b: int, skew_s: float):
    """PyTorch's ``powerSGD_hook`` on one bucket: three all-reduces, each chained on the previous one's future
    (a collective of 0 bytes, e.g. no uncompressed tensor, is skipped). The ranks meet the first as far
    apart as they filled the bucket; the previous all-reduce released them together for the others."""
    phases = ctx.plugins.codec.powersgd_phases(ctx.costs[ctx.ranks[0]].grad_bytes_per_layer, layers)
    # error feedback, then P = M Q: the hook computes the Ps before it launches the first all-reduce
    yield from _codec_pass(ctx, "encode_grads", phases.error_feedback_s + phases.matmul_s, it, b)
    yield from ctx.collective("allreduce", phases.uncompressed_bytes, it, label=f":bucket{b}:uncompressed",
                              call=_met(skew_s))
    yield from ctx.collective("allreduce", phases.p_bytes, it, label=f":bucket{b}:P",
                              call=_met(0.0 if phases.uncompressed_bytes > 0 else skew_s))
    yield from _codec_pass(ctx, "encode_q_grads", phases.matmul_s, it, b)  # Q = M^T P
    yield from ctx.collective("allreduce", phases.q_bytes, it, label=f":bucket{b}:Q", call=_met(0.0))
    yield from _codec_pass(ctx, "decode_grads", phases.matmul_s + phases.error_feedback_s, it, b)


def _events(env):
    table: dict = {}

    def get(it: int, b: int):
        key = (it, b)
        if key not in table:
            table[key] = env.event()
        return table[key]

    return get


@register("ddp")
def run_ddp(ctx: Context) -> None:
    first = ctx.ranks[0]
    costs = ctx.costs[first]
    buckets = (
        assign_buckets(costs.grad_bytes_per_layer, ctx.settings.bucket_cap_bytes,
                       ctx.settings.first_bucket_cap_bytes)
        if ctx.n > 1
        else []
    )
    bucket_bytes = [sum(costs.grad_bytes_per_layer[i] for i in bucket) for bucket in buckets]
    ready, done = _events(ctx.env), _events(ctx.env)
    counts: dict[tuple[int, int], int] = {}
    skews: dict[tuple[int, int], float] = {}  # per bucket: how far apart the ranks filled it
    for gpu in ctx.simulated:  # mirrored ranks (sim/symmetry.py) are their representatives
        # DDP's buckets are flat copies of the gradients (gradient_as_bucket_view=False, the default); the
        # gradients themselves live from backward to the step's zero_grad
        ctx.hold_model(gpu, grads="backward", buckets=sum(bucket_bytes))
        ctx.env.process(_rank(ctx, gpu, buckets, ready, done, counts, skews))
    if buckets:
        ctx.env.process(_reducer(ctx, buckets, ready, done, bucket_bytes, skews))


@register("single")
def run_single(ctx: Context) -> None:
    run_ddp(ctx)
