"""`dp-gpu0`: single-process data parallelism the old way, as ``torch.nn.DataParallel`` does it.

Every iteration, driven by one process:
1. the whole batch is copied from host memory to GPU0;
2. GPU0 scatters each other GPU its shard and sends it a copy of the parameters (replicate), all at once,
   so these flows share GPU0's links;
3. every GPU runs forward on its shard; the outputs are gathered to GPU0, where the loss is computed, and
   the output gradients scattered back;
4. every GPU runs backward; the gradients are copied to GPU0 (reduce_add), GPU0 sums them (memory-bound:
   reads n gradient copies, writes one) and steps the optimizer.

Peer copies into a GPU run on that GPU's copy-in (H2D) engine, copies out of a GPU on its copy-out (D2H)
engine; without P2P they are staged through host memory. The replicas hold parameters and activations, and
each layer's parameter gradients from its backward until they are reduced onto GPU0 (DataParallel's
Broadcast keeps them for its reduce_add; GPU0's own, the reduced sum, live until the step's
``zero_grad(set_to_none=True)``); only GPU0 holds optimizer state and the gathered outputs. With
``cpu_batch_split`` every GPU loads its own shard and GPU0 gathers the other shards' labels for the loss.

On a calibrated gloo box (CPU ranks) each phase is one blocking gloo call (broadcast, scatter, gather,
reduce): its copies pay that call's measured latency (the machine's latency model), and the calls run in turn.
"""

from __future__ import annotations

from trainsim.sim.compute.roofline import streaming_seconds
from trainsim.sim.core.latency import CallSite
from trainsim.sim.core.machine import COMPUTE

from .context import Context
from .registry import register

LABEL_BYTES = 8  # one int64 class label per sample


def _all(ctx: Context, bodies):
    return ctx.env.all_of([ctx.env.process(body) for body in bodies])


def _own_shard(ctx: Context, gpu: str, it: int):
    yield from ctx.get_batch(gpu, it)
    yield from ctx.input_copy(gpu, it)


def _all_layers(ctx: Context, gpu: str) -> list[int]:
    return list(range(len(ctx.costs[gpu].layer_names)))


def _compressed_copy(ctx: Context, src: str, dst: str, full: float, it: int, op: str, stream: str, call: str):
    """A peer copy of parameters or gradients; with ``param_compression`` the wire carries the compressed
    bytes and ``dst`` decodes them on its compute stream (the sender encoded them, see `_iteration`)."""
    engine = dst if stream == "h2d" else src
    if ctx.plugins.codec is None:
        yield from ctx.machine.peer_copy(src, dst, full, iteration=it, op=op, engine_gpu=engine,
                                         stream=stream, call=CallSite(call))
        return
    grads, layers = ctx.costs[src].grad_bytes_per_layer, _all_layers(ctx, src)
    wire = ctx.plugins.codec.wire_bytes(grads, layers)
    yield from ctx.machine.peer_copy(src, dst, wire, iteration=it, op=op, engine_gpu=engine, stream=stream,
                                     call=CallSite(call))
    yield from ctx.machine.run(dst, "compute", ctx.plugins.codec.decode_s(grads, layers), op=f"decode_{op}",
                               iteration=it, codec=ctx.plugins.codec.spec.label())


def _encode(ctx: Context, gpu: str, it: int, what: str):
    grads, layers = ctx.costs[gpu].grad_bytes_per_layer, _all_layers(ctx, gpu)
    yield from ctx.machine.run(gpu, "compute", ctx.plugins.codec.encode_s(grads, layers), op=f"encode_{what}",
                               iteration=it, codec=ctx.plugins.codec.spec.label())


def _iteration(ctx: Context, it: int):
    machine = ctx.machine
    root, others = ctx.ranks[0], ctx.ranks[1:]
    costs = ctx.costs
    total_input = sum(costs[g].input_bytes for g in ctx.ranks)
    if ctx.settings.cpu_batch_split:
        # ScaleDNN: the host splits the batch; every GPU copies its shard from its own socket's memory
        yield _all(ctx, [_own_shard(ctx, g, it) for g in ctx.ranks])
        # the loss of the whole batch is computed on GPU0, which needs every shard's labels
        scatter = [
            machine.peer_copy(g, root, costs[g].batch * LABEL_BYTES, iteration=it, op="gather_targets",
                              engine_gpu=g, stream="d2h", call=CallSite("gather"))
            for g in others
        ]
    else:
        yield from ctx.get_batch(root, it)
        yield from ctx.input_copy(root, it, nbytes=total_input)
        machine.gpus[root].memory.free(ctx.env.now, total_input - costs[root].input_bytes, "input")
        scatter = [
            machine.peer_copy(
                root, g, costs[g].input_bytes, iteration=it, op="scatter_input", engine_gpu=g, stream="h2d",
                call=CallSite("scatter"),
            )
            for g in others
        ]
        for g in others:
            machine.gpus[g].memory.alloc(ctx.env.now, costs[g].input_bytes, "input")
    if ctx.plugins.codec is not None and others:
        yield from _encode(ctx, root, it, "params")
    replicate = [
        _compressed_copy(ctx, root, g, costs[g].param_bytes, it, "broadcast_params", "h2d", "broadcast")
        for g in others
    ]
    if machine.latency.blocking_calls:  # gloo: blocking calls, one after the other (broadcast, then scatter)
        yield _all(ctx, replicate)
        yield _all(ctx, scatter)
    else:  # DataParallel's copies run at once on their own streams
        yield _all(ctx, scatter + replicate)
    yield _all(ctx, [ctx.forward(g, it) for g in ctx.ranks])
    gathered = sum(costs[g].output_bytes for g in others)
    machine.gpus[root].memory.alloc(ctx.env.now, gathered, "buffers")
    yield _all(
        ctx,
        [
            machine.peer_copy(
                g, root, costs[g].output_bytes, iteration=it, op="gather_outputs", engine_gpu=g, stream="d2h",
                call=CallSite("gather"),
            )
            for g in others
        ],
    )
    yield _all(
        ctx,
        [
            machine.peer_copy(
                root,
                g,
                costs[g].output_bytes,
                iteration=it,
                op="scatter_output_grads",
                engine_gpu=g,
                stream="h2d",
                call=CallSite("scatter"),
            )
            for g in others
        ],
    )
    machine.gpus[root].memory.free(ctx.env.now, gathered, "buffers")
    yield _all(ctx, [ctx.backward(g, it) for g in ctx.ranks])
    grads = costs[root].grad_bytes
    machine.gpus[root].memory.alloc(ctx.env.now, grads * len(others), "buffers")
    if ctx.plugins.codec is not None:
        yield _all(ctx, [_encode(ctx, g, it, "grads") for g in others])
    yield _all(
        ctx,
        [_compressed_copy(ctx, g, root, costs[g].grad_bytes, it, "reduce_grads", "d2h", "reduce")
         for g in others],
    )
    device = machine.gpus[root].device
    sum_s = streaming_seconds(device, grads * (len(others) + 2))  # read n copies, write the sum
    yield from machine.run(root, "compute", sum_s, op="reduce_add", iteration=it, category=COMPUTE)
    machine.gpus[root].memory.free(ctx.env.now, grads * len(others), "buffers")
    for g in others:  # the replicas' gradients are summed on GPU0: theirs go
        ctx.zero_grad(g)
    yield from ctx.optimizer_step(root, it)
    for g in ctx.ranks:
        ctx.finish(it, g)


def _driver(ctx: Context):
    for it in range(ctx.total_iterations):
        yield from _iteration(ctx, it)


# the loop does not hold the model's output through backward: the root's gathered output is accounted in
# `_iteration` (``gathered``)
@register("dp-gpu0", loop_holds_output=False)
def run_dp_gpu0(ctx: Context) -> None:
    root = ctx.ranks[0]
    for g in ctx.ranks:
        ctx.hold_model(g, grads="backward", state=(g == root))
    # one loader, on GPU0's socket, prepares the whole batch (cpu_batch_split: each GPU's loader its shard)
    if not ctx.settings.cpu_batch_split:
        ctx.loader(root).batch = sum(ctx.costs[g].batch for g in ctx.ranks)
    ctx.env.process(_driver(ctx))
