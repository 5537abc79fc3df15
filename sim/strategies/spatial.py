"""`spatial` and `hybrid`: each GPU computes its slab of every layer (sim/spatial/decomposition.py has the
geometry).

Per rank and iteration: its samples' slab of the input from host memory; forward layer by layer, where a
convolution split along an axis sends its halo to each neighbour as a point-to-point flow (no stream held:
Distconv-style halo exchange runs beside the NCCL stream), computes the interior of its output meanwhile and
the boundary once the neighbours' halos have arrived; where two consecutive layers have different grids,
the activation that changes owner moves as flows and the next layer waits for what it needs. Backward
mirrors it (the output-gradient halo, or the halo rows' input gradient sent back after the layer; the
gradient's redistribution back), and every layer's weight gradient joins DDP-style buckets all-reduced over
all ranks while backward goes on; the optimizer step runs when the last bucket is reduced.
"""

from __future__ import annotations

from trainsim.sim.core.latency import CallSite
from trainsim.sim.core.machine import COMM
from trainsim.sim.spatial.decomposition import SpatialLayout, check_scenario, prepare_layout

from .context import Context, gradients_in, gradients_out
from .ddp import assign_buckets
from .registry import register


class _Events:
    """SimPy events by key, created on first use by whichever side (sender or receiver) gets there first."""

    def __init__(self, env):
        self.env = env
        self.table: dict = {}

    def __call__(self, *key):
        if key not in self.table:
            self.table[key] = self.env.event()
        return self.table[key]

    def pop(self, *key):
        return self.table.pop(key)


def _send(ctx: Context, src: int, dst: int, nbytes: float, event, *, iteration: int, op: str, layer: str,
          call: CallSite | None = None):
    """A point-to-point copy of ``nbytes`` from rank ``src`` to ``dst`` (staged through host memory where the
    topology has no P2P), part of ``call`` if named; ``event`` fires when it has arrived."""
    machine, env = ctx.machine, ctx.env
    a, b = ctx.ranks[src], ctx.ranks[dst]
    start = env.now
    legs = machine.topology.gpu_copy_legs(a, b)
    for leg, latency in zip(legs, machine.message_latencies(legs, nbytes, call), strict=True):
        yield from machine.rank_transfer([a, b], leg, nbytes, latency=latency,
                                         tag=f"it{iteration}:{op}:{layer}:{a}->{b}")
    machine.record_since(start, a, "p2p", op, iteration, category=COMM, layer=layer, nbytes=nbytes,
                         route=tuple(e for leg in legs for e in leg), peer=b)
    event.succeed()


def _start_sends(
    ctx: Context, events: _Events, sends, kind: str, it: int, i: int, src: int, op: str, layer: str,
    call: str | None = None,
):
    """Rank ``src``'s sends of one step. A gloo halo swap is one call of the two neighbours, a gather one of
    every rank: each rank's part of it is a part of that one call (`CallSite.key`)."""
    for dst, nbytes in sends:
        site = None
        if call == "halo_exchange":
            site = CallSite(call, (kind, it, i, min(src, dst), max(src, dst)))
        elif call is not None:
            site = CallSite(call, (kind, it, i))
        ctx.env.process(
            _send(ctx, src, dst, nbytes, events(kind, it, i, src, dst), iteration=it, op=op, layer=layer,
                  call=site)
        )


def _pass(
    ctx: Context,
    layout: SpatialLayout,
    events: _Events,
    gpu: str,
    rank: int,
    it: int,
    i: int,
    direction: str,
    seconds: float,
):
    """Layer ``i``'s pass on ``rank``: halo out, interior, wait for the neighbours' halos, boundary; without
    ``halo_overlap`` the whole pass waits for the halos (a blocking exchange before the layer). A backward
    that sends the halo rows' input gradient back runs the other way round (`_pass_then_return`)."""
    machine = ctx.machine
    name = layout.workload.layers[i].name
    halos = layout.halos(i, rank, direction)
    if not halos:
        yield from machine.run(gpu, "compute", seconds, op=direction, layer=name, iteration=it)
        return
    kind = "halo_" + direction
    if direction == "backward" and layout.backward_halo == "input-gradient":
        yield from _pass_then_return(ctx, layout, events, gpu, rank, it, i, seconds, halos)
        return
    # a halo goes out while the neighbour's comes in: where the swap was measured (gloo), each pays it
    _start_sends(ctx, events, halos, kind, it, i, rank, kind, name, call="halo_exchange")
    overlap = ctx.settings.strategy.halo_overlap
    boundary = layout.boundary(i, rank, direction)
    if overlap:
        yield from machine.run(
            gpu, "compute", seconds * (1 - boundary), op=direction, layer=name, iteration=it, part="interior"
        )
    arrivals = [events(kind, it, i, peer, rank) for peer, _ in halos]
    yield ctx.env.all_of(arrivals)
    for peer, _ in halos:
        events.pop(kind, it, i, peer, rank)
    if overlap:
        yield from machine.run(
            gpu, "compute", seconds * boundary, op=direction, layer=name, iteration=it, part="boundary"
        )
    else:
        yield from machine.run(gpu, "compute", seconds, op=direction, layer=name, iteration=it)


def _pass_then_return(ctx: Context, layout: SpatialLayout, events: _Events, gpu: str, rank: int, it: int,
                      i: int, seconds: float, halos):
    """Backward of layer ``i`` where the gradient of the halo rows received in forward goes back to their
    owners: the rows at the slab's edge first (all of them without ``halo_overlap``), send, the rest, then
    wait for the neighbours' part of this slab's gradient before the layer below can start."""
    machine = ctx.machine
    name = layout.workload.layers[i].name
    kind = "halo_backward"
    if ctx.settings.strategy.halo_overlap:
        edge = layout.boundary(i, rank, "backward")
        yield from machine.run(
            gpu, "compute", seconds * edge, op="backward", layer=name, iteration=it, part="boundary"
        )
        _start_sends(ctx, events, halos, kind, it, i, rank, kind, name, call="halo_exchange")
        yield from machine.run(
            gpu, "compute", seconds * (1 - edge), op="backward", layer=name, iteration=it, part="interior"
        )
    else:
        yield from machine.run(gpu, "compute", seconds, op="backward", layer=name, iteration=it)
        _start_sends(ctx, events, halos, kind, it, i, rank, kind, name, call="halo_exchange")
    yield ctx.env.all_of([events(kind, it, i, peer, rank) for peer, _ in halos])
    for peer, _ in halos:
        events.pop(kind, it, i, peer, rank)


def _receive(ctx: Context, events: _Events, kind: str, it: int, i: int, rank: int, moves):
    sources = [s for s, d, nbytes in moves if d == rank and nbytes > 0]
    if sources:
        yield ctx.env.all_of([events(kind, it, i, s, rank) for s in sources])
        for s in sources:
            events.pop(kind, it, i, s, rank)


def _sends_from(moves, rank: int):
    return [(d, nbytes) for s, d, nbytes in moves if s == rank and nbytes > 0]


def _rank(
    ctx: Context,
    layout: SpatialLayout,
    rank: int,
    buckets,
    ready,
    done,
    counts: dict,
    events: _Events,
    block: int,
):
    machine, env = ctx.machine, ctx.env
    gpu = ctx.ranks[rank]
    memory = machine.gpus[gpu].memory
    layers = layout.workload.layers
    grids = layout.grids
    closes_at = {bucket[-1]: b for b, bucket in enumerate(buckets)}
    # the loss reads this rank's share of the output cast to fp32, as the whole model's loss does
    whole = ctx.costs[gpu]
    share = layout.output_bytes[-1] / whole.output_bytes if whole.output_bytes else 0.0
    loss_input = whole.loss_input_bytes * share
    for it in range(ctx.total_iterations):
        yield from ctx.get_batch(gpu, it, batch=layout.local_samples(0))
        yield from ctx.input_copy(gpu, it, nbytes=layout.input_bytes)
        for i, layer in enumerate(layers):
            if i > 0 and grids[i] != grids[i - 1]:
                yield from _receive(ctx, events, "redist_forward", it, i, rank, layout.moves(i, "forward"))
            memory.alloc(env.now, layout.saved_bytes[i], "activations")
            yield from _pass(ctx, layout, events, gpu, rank, it, i, "forward", layout.forward_s[i])
            if i == len(layers) - 1 and ctx.loop_holds_output:  # the loop keeps its output through backward
                memory.alloc(env.now, layout.output_bytes[i], "output")
            if i + 1 < len(layers) and grids[i + 1] != grids[i]:
                _start_sends(
                    ctx,
                    events,
                    _sends_from(layout.moves(i + 1, "forward"), rank),
                    "redist_forward",
                    it,
                    i + 1,
                    rank,
                    "redistribute",
                    layer.name,
                    call="allgather" if layout.gathers(i + 1) else None,
                )
        for i in reversed(range(len(layers))):
            if i + 1 < len(layers) and grids[i + 1] != grids[i]:
                yield from _receive(
                    ctx, events, "redist_backward", it, i + 1, rank, layout.moves(i + 1, "backward")
                )
            gradients_in(memory, env.now, layout.output_bytes, i, loss_input)
            ctx.write_param_grads(gpu, env.now, i)
            yield from _pass(ctx, layout, events, gpu, rank, it, i, "backward", layout.backward_s[i])
            memory.free(env.now, layout.saved_bytes[i], "activations")
            gradients_out(memory, env.now, layout.output_bytes, i)
            if i == 0:  # the training loop holds the batch and the output until its backward is done
                memory.free(env.now, layout.input_bytes, "input")
                memory.free(env.now, layout.output_bytes[-1], "output")
            b = closes_at.get(i)
            if b is not None:
                counts[it, b] = counts.get((it, b), 0) + 1
                if counts[it, b] == block:  # every simulated rank has this bucket's gradients
                    ready(it, b).succeed()
            if i > 0 and grids[i] != grids[i - 1]:
                _start_sends(
                    ctx,
                    events,
                    _sends_from(layout.moves(i, "backward"), rank),
                    "redist_backward",
                    it,
                    i,
                    rank,
                    "redistribute_grad",
                    layers[i].name,
                )
        if buckets:
            yield done(it, len(buckets) - 1)
        yield from ctx.optimizer_step(gpu, it)
        for mirror in range(rank, ctx.n, block):  # the ranks this one stands for (itself without symmetry)
            ctx.finish(it, ctx.ranks[mirror])


def _reducer(ctx: Context, buckets, ready, done, bucket_bytes: list[float]):
    for it in range(ctx.total_iterations):
        for b in range(len(buckets)):
            yield ready(it, b)
            yield from ctx.collective("allreduce", bucket_bytes[b], it, label=f":bucket{b}")
            done(it, b).succeed()


def symmetric_block(layout: SpatialLayout, topology, ranks: list[str]) -> int:
    """How many leading ranks to simulate when the rest mirror them: a union of sample groups under every
    layer's grid (no halo or redistribution leaves it) that is also a union of whole machines (ranks of one
    machine share its PCIe switches and host links, so they are simulated together); all ranks when the
    machines differ in how many of the ranks they hold."""
    import math

    per_machine: dict[int, int] = {}
    for gpu in ranks:
        machine = topology.machine_of(gpu)
        per_machine[machine] = per_machine.get(machine, 0) + 1
    sizes = set(per_machine.values())
    if len(sizes) != 1:
        return len(ranks)
    block = math.lcm(layout.block, sizes.pop())
    if len(ranks) % block:
        return len(ranks)
    machines = [{topology.machine_of(g) for g in ranks[k : k + block]} for k in range(0, len(ranks), block)]
    if sum(len(m) for m in machines) != len(set().union(*machines)):
        return len(ranks)  # a machine's ranks are spread over several blocks
    return block


def _rank_batch(scenario, ranks, workload) -> int:
    """Checks the grids against the model and the GPUs (one line naming the layer and fields); the batch of
    the first layer's sample group, which the per-rank costs the simulator prepares are computed at."""
    return check_scenario(scenario, workload, len(ranks))


def _check(run) -> None:
    """Autocast keeps fp32 weights beside their 16-bit copies; a spatial split of that is not modelled."""
    from trainsim.errors import TrainsimError
    from trainsim.sim.compute.costs import mixed

    sc = run.scenario
    if sc.mixed_precision == "autocast" and mixed(sc.precision):
        raise TrainsimError("autocast is not modelled for spatial decomposition; valid there: master",
                            file=sc.source, field="mixed_precision")


@register("spatial", rank_batch=_rank_batch, check=_check)
@register("hybrid", rank_batch=_rank_batch, check=_check)
def run_spatial(ctx: Context) -> None:
    settings = ctx.settings
    layout = prepare_layout(
        settings.strategy, ctx.workload, settings.batch_size, ctx.ranks, ctx.machine, settings.precision,
        settings.optimizer, measured_on=ctx.measured_on, host=ctx.plugins.host,
    )
    base = layout.base
    buckets = (
        assign_buckets(base.grad_bytes_per_layer, settings.bucket_cap_bytes, settings.first_bucket_cap_bytes)
        if ctx.n > 1
        else []
    )
    bucket_bytes = [sum(base.grad_bytes_per_layer[i] for i in bucket) for bucket in buckets]
    ready, done, events = _Events(ctx.env), _Events(ctx.env), _Events(ctx.env)
    counts: dict[tuple[int, int], int] = {}
    block = ctx.n
    # symmetric ranks need collectives: analytic (check_scenario says so)
    if getattr(settings.strategy, "symmetric_ranks", False):
        block = symmetric_block(layout, ctx.machine.topology, ctx.ranks)
    for rank, gpu in enumerate(ctx.ranks):
        ctx.costs[gpu] = base
        ctx.hold_model(gpu, grads="backward", buckets=sum(bucket_bytes))
        if rank < block:
            ctx.env.process(_rank(ctx, layout, rank, buckets, ready, done, counts, events, block))
    if buckets:
        ctx.env.process(_reducer(ctx, buckets, ready, done, bucket_bytes))
    ctx.extra["spatial"] = {**layout.summary(), "simulated_ranks": block}
