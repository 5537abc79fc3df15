"""Hybrid GPU/CPU memory (vDNN; Kim et al.): saved activations offloaded to pinned host memory during forward
and prefetched back during backward.

- **Offload.** An offloaded layer's saved activations (its input, which exists when it starts) are copied to
  pinned host memory on the GPU's D2H copy engine while the layer computes, and freed from GPU memory when
  the copy is done; the next layer waits for that copy (vDNN synchronises there, so the memory is released
  before more is allocated): forward pays max(compute, copy) per offloaded layer.
- **Blocking copies** (``offload_copies: blocking``, torch's ``save_on_cpu``): each copy is issued in the
  compute stream's order and the host waits for it, so nothing overlaps: forward pays the layer, then its
  copy out; backward (distance 0) pays each copy back when it reaches the layer. Such a copy moves every
  tensor each time autograd packs it, parameters too (the workload's packed bytes, where described).
- **Prefetch.** Backward visits the layers in reverse; before computing position p it issues the prefetch
  (H2D engine, into a buffer allocated then) of every offloaded layer up to ``prefetch_distance`` = k
  positions ahead (k = 0: a layer's own backward issues it). A prefetch can start only once that layer's
  offload has finished. A layer's backward waits for its prefetch; the wait is a stall, recorded per
  iteration in ``Result.extra["offload"]`` and shown as exposed host-device transfer in the breakdown.
- **Contention-aware staggering.** Links that several ranks' host routes share and that cannot carry all
  of them at their own links' speed (a PCIe switch's uplink) get a token per direction, as many as the link
  carries at full speed; an offload or prefetch holds the tokens of its route for its whole copy, so GPUs
  behind one uplink take turns (each copy at full speed, the first done first) instead of all crawling.
- **auto distance.** `resolve_auto_distance` simulates the scenario at increasing k and keeps the smallest k
  whose stall is as small as the largest k's (no stall when prefetching can hide at all).

Policies: ``all`` (every layer with saved activations), ``conv`` (vDNN_conv: the tensors convolutions save,
i.e. each convolution's own and its input's, which the workload counts at the layer just before it in
execution order: exact for sequential CNNs, the nearest layer for branching ones), or a list of layer names.
"""

from __future__ import annotations

import math

import simpy

from trainsim.errors import TrainsimError

GIB = 2**30


def offloaded_layers(workload, policy, *, packed: bool = False) -> list[int]:
    """Indices of the layers ``policy`` offloads (layers saving nothing are skipped; with ``packed``, the
    blocking copies', layers packing nothing)."""
    layers = workload.layers
    if policy in (None, "none"):
        return []
    if policy == "all":
        chosen = range(len(layers))
    elif policy == "conv":
        # a convolution's input X is counted once, at the layer that produced and saved it (the ReLU or
        # pool before it), so vDNN_conv's "offload X of every convolution" is that layer plus the conv
        convs = [i for i, layer in enumerate(layers) if layer.kind.startswith("conv")]
        chosen = sorted(set(convs) | {i - 1 for i in convs if i > 0})
    else:
        names = {layer.name: i for i, layer in enumerate(layers)}
        unknown = [name for name in policy if name not in names]
        if unknown:
            from trainsim.errors import unknown_name

            raise unknown_name("layer", unknown[0], names, field="optimizations.offload_activations")
        chosen = sorted(names[name] for name in policy)
    def saves(layer) -> bool:
        if packed and layer.saved_packed_bytes_per_sample is not None:
            return layer.saved_packed_bytes_per_sample > 0 or (layer.saved_packed_bytes_fixed or 0) > 0
        return layer.saved_activation_bytes_per_sample > 0 or layer.saved_activation_bytes_fixed > 0

    return [i for i in chosen if saves(layers[i])]


def contention_tokens(machine, ranks: list[str]) -> dict[tuple, simpy.Resource]:
    """A token pool per directed link that the ranks' host routes share beyond its capacity."""
    topo = machine.topology
    capacity = {}
    tokens: dict[tuple, simpy.Resource] = {}
    for direction in ("d2h", "h2d"):
        routes = {}
        for g in ranks:
            host = machine.gpus[g].host_memory
            routes[g] = topo.route(g, host) if direction == "d2h" else topo.route(host, g)
        users: dict[tuple, list[str]] = {}
        for g, route in routes.items():
            for edge in route:
                users.setdefault(tuple(edge), []).append(g)
        for edge, sharers in users.items():
            if len(sharers) < 2:
                continue
            own = [
                min((topo.graph.edges[e]["bandwidth"] for e in routes[g] if len(users[tuple(e)]) == 1),
                    default=math.inf)
                for g in sharers
            ]
            capacity[edge] = topo.graph.edges[edge]["bandwidth"]
            if capacity[edge] < sum(own) * (1 - 1e-9):
                slots = max(1, int(capacity[edge] // max(own)))
                tokens[edge] = simpy.Resource(machine.env, capacity=slots)
    return tokens


class Offloader:
    """Per-run offload state: which layers, how far ahead to prefetch, events per (rank, iteration, layer)."""

    def __init__(self, ctx, layers: list[int], distance: int, contention_aware: bool, *,
                 blocking: bool = False):
        self.ctx = ctx
        self.layers = set(layers)
        self.distance = distance
        self.blocking = blocking
        self.tokens = contention_tokens(ctx.machine, ctx.ranks) if contention_aware else {}
        self._offloaded: dict[tuple, simpy.Event] = {}
        self._queues: dict[tuple, simpy.Resource] = {}
        self._prefetched: dict[tuple, simpy.Event] = {}
        self.stall_s: dict[int, float] = {}  # backward waiting for prefetches
        self.wait_s: dict[int, float] = {}  # forward waiting for offloads to finish
        self.stats = {
            "layers": [ctx.costs[ctx.ranks[0]].layer_names[i] for i in sorted(self.layers)],
            "offloaded_bytes_per_gpu": sum(
                ctx.costs[ctx.ranks[0]].saved_bytes_per_layer[i] for i in self.layers
            ),
            "prefetch_distance": distance,
            "contention_aware": contention_aware,
            "copies": "blocking" if blocking else "overlapped",
            "stall_s_by_iteration": self.stall_s,
            "offload_wait_s_by_iteration": self.wait_s,
        }
        ctx.extra["offload"] = self.stats

    def _event(self, table: dict, key: tuple) -> simpy.Event:
        if key not in table:
            table[key] = self.ctx.env.event()
        return table[key]

    def _route_tokens(self, gpu: str, direction: str) -> list[simpy.Resource]:
        if not self.tokens:
            return []
        machine = self.ctx.machine
        host = machine.gpus[gpu].host_memory
        topo = machine.topology
        route = topo.route(gpu, host) if direction == "d2h" else topo.route(host, gpu)
        return [self.tokens[tuple(e)] for e in sorted(map(tuple, route)) if tuple(e) in self.tokens]

    def _copy(self, gpu: str, direction: str, nbytes: float, iteration: int, layer: str):
        machine = self.ctx.machine
        held = []
        pools = self._route_tokens(gpu, direction)
        if pools:
            # a rank's copies queue on its own engine first (they are serial there anyway), so the shared
            # link's token passes between ranks in turn rather than to one rank's whole backlog
            queue = self._queues.setdefault((gpu, direction), simpy.Resource(self.ctx.env, capacity=1))
            turn = queue.request()
            yield turn
            held.append((queue, turn))
        for pool in pools:  # sorted order: no two copies wait on each other
            req = pool.request()
            yield req
            held.append((pool, req))
        copy = machine.d2h if direction == "d2h" else machine.h2d
        op = "offload_activations" if direction == "d2h" else "prefetch_activations"
        yield from copy(gpu, nbytes, iteration=iteration, op=op, pinned=True)
        machine.ops[-1].layer = layer
        for pool, req in reversed(held):
            pool.release(req)

    def _moved(self, costs, i: int) -> float:
        """Bytes one copy of layer ``i`` moves: its distinct saved tensors, or with blocking (save_on_cpu)
        copies every tensor each time autograd packs it, parameters too, where the workload says."""
        if self.blocking and costs.packed_bytes_per_layer:
            return costs.packed_bytes_per_layer[i]
        return costs.saved_bytes_per_layer[i]

    def _offload(self, gpu: str, iteration: int, i: int):
        costs, env = self.ctx.costs[gpu], self.ctx.env
        nbytes = costs.saved_bytes_per_layer[i]
        yield from self._copy(gpu, "d2h", self._moved(costs, i), iteration, costs.layer_names[i])
        self.ctx.machine.gpus[gpu].memory.free(env.now, nbytes, "activations")
        self._event(self._offloaded, (gpu, iteration, i)).succeed()

    def _prefetch(self, gpu: str, iteration: int, i: int):
        costs, env = self.ctx.costs[gpu], self.ctx.env
        nbytes = costs.saved_bytes_per_layer[i]
        yield self._event(self._offloaded, (gpu, iteration, i))
        self.ctx.machine.gpus[gpu].memory.alloc(env.now, nbytes, "activations")
        yield from self._copy(gpu, "h2d", self._moved(costs, i), iteration, costs.layer_names[i])
        self._event(self._prefetched, (gpu, iteration, i)).succeed()

    def forward(self, gpu: str, iteration: int):
        """vDNN's forward: an offloaded layer's saved tensors (its input) start copying out as the layer
        starts, and the next layer waits for that copy (so the memory is free before more is allocated).
        Blocking copies start when the layer is done instead."""
        ctx = self.ctx
        costs = ctx.costs[gpu]
        n = len(costs.layer_names)
        segment: list[int] = []
        for i in range(n):
            if i in self.layers:
                if segment:
                    yield from ctx._segment(gpu, iteration, "forward", segment, costs.forward_s, +1)
                    segment = []
                if not self.blocking:
                    ctx.env.process(self._offload(gpu, iteration, i))
                yield from ctx._segment(gpu, iteration, "forward", [i], costs.forward_s, +1)
                if self.blocking:
                    ctx.env.process(self._offload(gpu, iteration, i))
                start = ctx.env.now
                yield self._event(self._offloaded, (gpu, iteration, i))
                if ctx.env.now > start:
                    self.wait_s[iteration] = self.wait_s.get(iteration, 0.0) + ctx.env.now - start
            else:
                segment.append(i)
        if segment:
            yield from ctx._segment(gpu, iteration, "forward", segment, costs.forward_s, +1)

    def backward(self, gpu: str, iteration: int, stops: dict):
        ctx, env = self.ctx, self.ctx.env
        costs = ctx.costs[gpu]
        order = list(reversed(range(len(costs.layer_names))))
        issued: set[int] = set()
        for p, i in enumerate(order):
            for j in order[p : p + self.distance + 1]:
                if j in self.layers and j not in issued:
                    issued.add(j)
                    env.process(self._prefetch(gpu, iteration, j))
            if i in self.layers:
                start = env.now
                yield self._event(self._prefetched, (gpu, iteration, i))
                if env.now > start:
                    self.stall_s[iteration] = self.stall_s.get(iteration, 0.0) + env.now - start
            yield from ctx._segment(gpu, iteration, "backward", [i], costs.backward_s, -1)
            if i in stops:
                stops[i]()


def check_host_memory(ctx, layers: list[int], host_memory_gib: float | None) -> None:
    """Every rank's offloaded bytes need pinned buffers on its socket; more than it has is an error."""
    if host_memory_gib is None or not layers:
        return
    need: dict[str, float] = {}
    for g in ctx.ranks:
        host = ctx.machine.host_of(g).name
        need[host] = need.get(host, 0.0) + sum(ctx.costs[g].saved_bytes_per_layer[i] for i in layers)
    for host, nbytes in sorted(need.items()):
        if nbytes > host_memory_gib * GIB:
            raise TrainsimError(
                f"optimizations.offload_activations needs {nbytes / GIB:.2f} GiB of pinned memory on {host}, "
                f"more than host.memory_gib {host_memory_gib:g} leaves",
                field="optimizations.offload_activations",
            )


def offload_stall_s(result, key: str = "stall_s_by_iteration") -> float:
    """Mean prefetch stall (backward) per measured iteration of a result (0 without offload); with
    ``key="offload_wait_s_by_iteration"``: forward's mean wait for offloads to finish."""
    stats = result.extra.get("offload")
    if not stats:
        return 0.0
    measured = range(result.warmup_iterations, result.warmup_iterations + result.iterations)
    return sum(stats[key].get(i, 0.0) for i in measured) / result.iterations


def _stall_at(scenario, distance: int, run) -> float:
    opts = scenario.optimizations.model_copy(update={"prefetch_distance": distance})
    return offload_stall_s(run(scenario.model_copy(update={"optimizations": opts})))


def resolve_auto_distance(scenario, layers: int, run) -> int:
    """The smallest prefetch distance whose stall is no more than the stall of prefetching everything at the
    start of backward (zero when the transfers can hide at all); bisection, stall falling with distance.
    ``run(scenario) -> Result`` simulates a variant of the scenario on the same inputs (the caller's)."""
    worst = max(1, layers)
    floor = _stall_at(scenario, worst, run)
    tolerance = 1e-9 + 1e-6 * floor
    lo, hi = 0, worst  # stall(hi) <= floor + tolerance
    while lo < hi:
        mid = (lo + hi) // 2
        if _stall_at(scenario, mid, run) <= floor + tolerance:
            hi = mid
        else:
            lo = mid + 1
    return hi
