"""`parameter-server`: gradients pushed to a CPU parameter server, updated there, parameters pulled back.

Synchronous: each rank runs forward and backward, then copies its gradients to the server's host memory
(D2H on its copy engine, flows into the server socket's DRAM). When every rank's gradients are in, the
server sums them and steps the optimizer on ``ps_cores`` cores (default: all cores of socket ``ps_socket``).
That update is memory-bound: it reads the n gradient copies and reads and writes the fp32 weights and the
optimizer state, so it runs as flows over the socket's DRAM link (reads DRAM -> socket, writes back), capped
at ``ps_cores`` x the rate one core streams memory (`PAGEABLE_COPY_RATE`, the same single-core memcpy
figure) and holding those cores. Then every rank copies the new parameters from the server's memory (H2D)
and starts its next iteration. The GPUs hold parameters and activations, no optimizer state; each layer's
gradients exist from its backward until they are pushed (the loop's ``zero_grad(set_to_none=True)``).
While a rank waits for the server's update it records ``wait_parameter_server``, counted as exposed
communication (the gradient exchange is not over).
"""

from __future__ import annotations

from trainsim.errors import TrainsimError
from trainsim.sim.compute.costs import STATE_BYTES
from trainsim.sim.core.latency import CallSite
from trainsim.sim.core.machine import COMM

from .context import Context
from .registry import register


def _rank(ctx: Context, gpu: str, dram: str, pushed, pulled):
    for it in range(ctx.total_iterations):
        yield from ctx.get_batch(gpu, it)
        yield from ctx.input_copy(gpu, it)
        yield from ctx.forward(gpu, it)
        yield from ctx.backward(gpu, it)
        yield from ctx.machine.d2h(
            gpu, ctx.costs[gpu].grad_bytes, iteration=it, op="push_grads", dst=dram, category=COMM,
            call=CallSite("reduce", ("push", it)),  # on CPU ranks: one gloo reduce to the server rank
        )
        ctx.zero_grad(gpu)
        pushed(it).succeed()
        waiting = ctx.env.now
        yield pulled(it)
        if ctx.env.now > waiting:  # the exchange is not over until the server has updated: communication
            ctx.machine.record_since(waiting, gpu, "wait", "wait_parameter_server", it, category=COMM)
        yield from ctx.machine.h2d(
            gpu, ctx.costs[gpu].param_bytes, iteration=it, op="pull_params", src=dram, category=COMM,
            call=CallSite("broadcast", ("pull", it)),  # one gloo broadcast from the server rank
        )
        ctx.finish(it, gpu)


def _server(ctx: Context, host, pushed, pulled):
    machine, env = ctx.machine, ctx.env
    costs = ctx.costs[ctx.ranks[0]]
    # fp32 on the CPU: weights and state read and written, every rank's gradients read
    num_params = costs.grad_bytes / _grad_itemsize(ctx)
    weights_and_state = num_params * (4 + STATE_BYTES[ctx.settings.optimizer])
    reads = ctx.n * costs.grad_bytes + weights_and_state
    writes = weights_and_state
    cores = ctx.settings.ps_cores or host.num_cores
    for it in range(ctx.total_iterations):
        yield env.all_of([pushed(it, r) for r in range(ctx.n)])
        yield from machine.host_update(host, reads, writes, cores=cores, op="ps_update", iteration=it,
                                       optimizer=ctx.settings.optimizer)
        pulled(it).succeed()


def _grad_itemsize(ctx: Context) -> int:
    return ctx.grad_itemsize


@register("parameter-server")
def run_ps(ctx: Context) -> None:
    machine, env = ctx.machine, ctx.env
    cpus = machine.topology.cpus
    if ctx.settings.ps_socket >= len(cpus):
        raise TrainsimError(
            f"the topology has {len(cpus)} CPU socket{'s' if len(cpus) != 1 else ''} (0..{len(cpus) - 1}), "
            f"no socket {ctx.settings.ps_socket}",
            field="strategy.ps_socket",
        )
    host = machine.hosts[cpus[ctx.settings.ps_socket]]
    if ctx.settings.ps_cores is not None and ctx.settings.ps_cores > host.num_cores:
        socket = ctx.settings.ps_socket
        raise TrainsimError(f"socket {socket} ({cpus[socket]}) has {host.num_cores} cores, "
                            f"fewer than {ctx.settings.ps_cores}", field="strategy.ps_cores")
    push_events: dict = {}
    pull_events: dict = {}

    def pushed(it, r=None):
        key = (it, r)
        if key not in push_events:
            push_events[key] = env.event()
        return push_events[key]

    def pulled(it):
        if it not in pull_events:
            pull_events[it] = env.event()
        return pull_events[it]

    for r, gpu in enumerate(ctx.ranks):
        ctx.hold_model(gpu, grads="backward", state=False)
        env.process(_rank(ctx, gpu, host.dram, lambda it, r=r: pushed(it, r), pulled))
    env.process(_server(ctx, host, pushed, pulled))
