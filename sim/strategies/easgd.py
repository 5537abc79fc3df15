"""`easgd`: elastic averaging SGD (Zhang et al.; the HPC co-design of You, Buluç, Demmel, SC17).

Every rank is a worker with its own weights W_i, training on its shard of the batch; every ``tau`` iterations
it exchanges with the centre variable W~ (worker: W_i -= a (W_i - W~); centre: W~ += a (W_i - W~)).
Variants (how the centre serves the workers):

- ``original``: one worker at a time, round-robin in rank order (worker i's k-th exchange waits for
  worker i-1's): W_i to the centre, centre update, W~ back;
- ``async``: one worker at a time, first come first served (a lock on the centre);
- ``async-momentum``: as async, the centre also keeps a momentum buffer (read and written each update);
- ``hogwild``: no lock: exchanges of different workers run concurrently on the centre (sharing its links,
  cores or compute stream);
- ``sync``: all workers together: W~ broadcast to every worker, each updates its weights, sum of W_i reduced
  to the centre, which updates W~. Deterministic. With ``centre: replicated`` every worker keeps its own
  copy of W~ (they stay equal): one all-reduce of the W_i, then each worker updates its weights and its copy
  (what trainsim's executor runs).

Co-design switches: ``flat_buffer`` (one message for all layers; else one per layer with parameters, each
paying its route's latency alpha), ``tree_reduce`` (sync: binomial-tree broadcast and reduce, log2 P rounds,
ordered by the topology (`tree_order`), instead of the centre sending/receiving P messages one after the
other), ``weights_on_gpu`` (else W_i lives
in host memory: copied to the GPU before forward and back after the update every iteration, and the
worker's elastic update runs on a host core), ``overlap`` (the exchange runs while the worker computes its
next iterations; it waits only for its previous exchange), and ``centre`` on the ``host`` (socket
``centre_socket``: updates are memory-bound CPU work on ``centre_cores`` cores, as flows over the socket's
DRAM at one core's copy rate each) or a ``gpu`` (rank ``centre_gpu``: updates on its compute stream at its
memory bandwidth). Parameter traffic counts as communication in the breakdown; the input batch as transfer.

Staleness of each centre update = updates applied to W~ since the worker last read it (0 for sync, P - 1 for
original in steady state); counted over the whole run (warm-up included) into ``Result.extra["staleness"]``.
"""

from __future__ import annotations

from collections import Counter

from trainsim.errors import TrainsimError
from trainsim.formats.scenario_options import VARIANTS, EasgdOptions  # noqa: F401 (re-exported)
from trainsim.sim.compute.roofline import streaming_seconds
from trainsim.sim.core.latency import CallSite
from trainsim.sim.core.machine import COMM, COMPUTE

from .context import Context
from .registry import register


class _Easgd:
    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.opts = opts = getattr(ctx.settings.strategy, "easgd", None) or EasgdOptions()
        machine = ctx.machine
        cpus = machine.topology.cpus
        if opts.centre == "gpu" and opts.centre_gpu >= ctx.n:
            raise TrainsimError(
                f"strategy.easgd.centre_gpu is {opts.centre_gpu} but the scenario has {ctx.n} GPUs (gpus)",
                field="strategy.easgd.centre_gpu",
            )
        if opts.centre == "host" and opts.centre_socket >= len(cpus):
            raise TrainsimError(
                f"strategy.easgd.centre_socket is {opts.centre_socket} but the topology has "
                f"{len(cpus)} cpu sockets",
                field="strategy.easgd.centre_socket",
            )
        self.tree = opts.tree_reduce if opts.tree_reduce is not None else True
        first = ctx.costs[ctx.ranks[0]]
        self.weight_bytes = first.param_bytes
        layer_bytes = [b for b in first.grad_bytes_per_layer if b > 0]
        self.messages = [self.weight_bytes] if opts.flat_buffer or not layer_bytes else layer_bytes
        if opts.centre == "gpu":
            self.centre = ctx.ranks[opts.centre_gpu]
            self.centre_host = None
        elif opts.centre == "replicated":  # a copy in every worker's weights' home
            self.centre = "replicated"
            self.centre_host = None
        else:
            self.centre_host = machine.hosts[cpus[opts.centre_socket]]
            self.centre = self.centre_host.dram
        self.version = 0
        self.first_arrival: dict[int, float] = {}  # sync: per round, when the first worker arrived
        self.read_version = dict.fromkeys(ctx.ranks, 0)
        self.staleness: Counter = Counter()
        env = ctx.env
        self.lock = None
        if opts.variant in ("async", "async-momentum"):
            import simpy

            self.lock = simpy.Resource(env, capacity=1)
        self.events: dict = {}
        self.rounds = ctx.total_iterations // opts.tau
        self.summary = {"updates": 0, "mean": 0.0, "max": 0, "histogram": {}}

    # ---- small pieces -----------------------------------------------------------------------------------
    def event(self, *key):
        if key not in self.events:
            self.events[key] = self.ctx.env.event()
        return self.events[key]

    def home(self, gpu: str) -> str:
        """Where worker ``gpu``'s weights live."""
        return gpu if self.opts.weights_on_gpu else self.ctx.machine.gpus[gpu].host_memory

    def _legs(self, src: str, dst: str) -> list:
        topo = self.ctx.machine.topology
        if src == dst:
            return []
        if src in self.ctx.machine.gpus and dst in self.ctx.machine.gpus:
            return topo.gpu_copy_legs(src, dst)
        return [topo.route(src, dst)]

    def move(self, src: str, dst: str, it: int, op: str, gpu: str, call: str = "p2p"):
        """W (as one message or one per layer) from ``src`` to ``dst``, recorded on worker ``gpu``. ``call``:
        the gloo call it is on a calibrated CPU box (a message pays that call's measured latency)."""
        ctx = self.ctx
        legs = self._legs(src, dst)
        if not legs:
            return
        start = ctx.env.now
        for nbytes in self.messages:
            latencies = ctx.machine.message_latencies(legs, nbytes, CallSite(call))
            for leg, latency in zip(legs, latencies, strict=True):
                yield ctx.machine.net.transfer(leg, nbytes, latency=latency, tag=f"it{it}:{op}:{gpu}")
        other = dst if src == gpu else src
        ctx.machine.record_since(start, gpu, "comm", op, it, category=COMM, nbytes=self.weight_bytes,
                                 peer=other if other in ctx.machine.gpus else None,
                                 route=tuple(e for leg in legs for e in leg),
                                 args={"messages": len(self.messages)})

    def update(self, where: str, traffic: float, it: int, op: str, host=None, cores: int = 1):
        """A memory-bound update moving ``traffic`` bytes: on a GPU's compute stream, or on host cores as
        reads/writes over the socket's DRAM (2/3 reads, 1/3 writes: a = a + c (b - a))."""
        machine = self.ctx.machine
        if where in machine.gpus:
            seconds = streaming_seconds(machine.gpus[where].device, traffic)
            yield from machine.run(where, "compute", seconds, op=op, iteration=it, category=COMPUTE)
            return
        host = host or machine.host_by_dram(where)
        yield from machine.host_update(host, traffic * 2 / 3, traffic / 3, cores=cores, op=op, iteration=it)

    def count(self, gpu: str) -> None:
        """One centre update by ``gpu``: its staleness, then it has read the new centre."""
        stale = self.version - self.read_version[gpu]
        self.version += 1
        self.read_version[gpu] = self.version
        self._tally([stale])

    def _tally(self, values: list[int]) -> None:
        self.staleness.update(values)
        total = sum(self.staleness.values())
        self.summary.update(
            updates=total,
            mean=round(sum(k * v for k, v in self.staleness.items()) / total, 6),
            max=max(self.staleness),
            histogram={str(k): v for k, v in sorted(self.staleness.items())},
        )

    # ---- a worker ---------------------------------------------------------------------------------------
    def worker(self, gpu: str):
        ctx, machine, opts = self.ctx, self.ctx.machine, self.opts
        costs = ctx.costs[gpu]
        pending = None
        for it in range(ctx.total_iterations):
            yield from ctx.get_batch(gpu, it)
            yield from ctx.input_copy(gpu, it)
            if not opts.weights_on_gpu:
                yield from machine.h2d(gpu, costs.param_bytes, iteration=it, op="h2d_weights", category=COMM)
            yield from ctx.forward(gpu, it)
            yield from ctx.backward(gpu, it)
            yield from ctx.optimizer_step(gpu, it)
            if not opts.weights_on_gpu:
                yield from machine.d2h(gpu, costs.param_bytes, iteration=it, op="d2h_weights", category=COMM)
            if (it + 1) % opts.tau == 0:
                k = (it + 1) // opts.tau - 1
                exchange = self.exchange(gpu, it, k)
                if opts.overlap:
                    if pending is not None:
                        yield pending  # one exchange in flight per worker
                    pending = ctx.env.process(exchange)
                else:
                    yield from exchange
            ctx.finish(it, gpu)

    def exchange(self, gpu: str, it: int, k: int):
        if self.opts.variant == "sync":
            self.first_arrival.setdefault(k, self.ctx.env.now)
            self.event("arrived", k, gpu).succeed()
            yield self.event("done", k)
            return
        ctx, opts = self.ctx, self.opts
        rank = ctx.ranks.index(gpu)
        req = None
        if opts.variant == "original":
            if not (k == 0 and rank == 0):
                yield self.event("turn", k, rank)
        elif self.lock is not None:
            req = self.lock.request()
            yield req
        home = self.home(gpu)
        yield from self.move(home, self.centre, it, "easgd_push", gpu)
        momentum = 2 if opts.variant == "async-momentum" else 0
        yield from self.update(
            self.centre,
            (3 + momentum) * self.weight_bytes,
            it,
            "easgd_centre_update",
            host=self.centre_host,
            cores=opts.centre_cores,
        )
        yield from self.move(self.centre, home, it, "easgd_pull", gpu)
        self.count(gpu)
        if req is not None:
            self.lock.release(req)
        if opts.variant == "original":
            nxt = (k, rank + 1) if rank + 1 < ctx.n else (k + 1, 0)
            self.event("turn", *nxt).succeed()
        yield from self.update(home, 3 * self.weight_bytes, it, "easgd_elastic_update")

    # ---- sync: broadcast, update, reduce ----------------------------------------------------------------
    def _tree_rounds(self, nodes: list[str]) -> list[list[tuple[int, int]]]:
        """Binomial-tree broadcast rounds over node indices (0 is the root): [(src, dst), ...] per round."""
        rounds, span = [], 1
        while span < len(nodes):
            rounds.append([(i, i + span) for i in range(span) if i + span < len(nodes)])
            span *= 2
        return rounds

    def _send_all(self, pairs: list[tuple[str, str, str]], it: int, op: str, call: str):
        env = self.ctx.env
        yield env.all_of([env.process(self.move(src, dst, it, op, gpu, call)) for src, dst, gpu in pairs])

    def replicated(self):
        """Sync with a copy of the centre on every worker: S = sum of W_i all-reduced, then each worker
        moves W_i towards its copy and its copy towards S / P (both memory-bound, 3 |W| each)."""
        ctx, opts, env = self.ctx, self.opts, self.ctx.env
        for k in range(self.rounds):
            it = (k + 1) * opts.tau - 1
            yield env.all_of([self.event("arrived", k, g) for g in ctx.ranks])
            skew = env.now - self.first_arrival.pop(k)  # how far apart the workers arrived
            yield from ctx.collective("allreduce", self.weight_bytes, it, label=":easgd",
                                      call=CallSite("allreduce", skew_s=skew))
            yield env.all_of([env.process(self._both_updates(g, it)) for g in ctx.ranks])
            self._tally([0] * ctx.n)
            self.event("done", k).succeed()

    def _both_updates(self, gpu: str, it: int):
        home = self.home(gpu)
        yield from self.update(home, 3 * self.weight_bytes, it, "easgd_elastic_update")
        yield from self.update(home, 3 * self.weight_bytes, it, "easgd_centre_update")

    def coordinator(self):
        ctx, opts = self.ctx, self.opts
        homes = {g: self.home(g) for g in ctx.ranks}
        nodes = [self.centre] + [h for h in dict.fromkeys(homes.values()) if h != self.centre]
        if self.tree:
            nodes = tree_order(nodes)
        worker_at = {h: g for g, h in reversed(list(homes.items()))}  # a worker whose weights live there
        centre_gpu = self.centre if self.centre in ctx.machine.gpus else None

        def gpu_of(a: str, b: str) -> str:
            for node in (a, b):
                if node in ctx.machine.gpus:
                    return node
            return worker_at.get(b) or worker_at.get(a) or ctx.ranks[0]

        for k in range(self.rounds):
            it = (k + 1) * opts.tau - 1
            yield ctx.env.all_of([self.event("arrived", k, g) for g in ctx.ranks])
            # broadcast W~
            if self.tree:
                for pairs in self._tree_rounds(nodes):
                    yield from self._send_all(
                        [(nodes[a], nodes[b], gpu_of(nodes[a], nodes[b])) for a, b in pairs],
                        it,
                        "easgd_broadcast",
                        "broadcast",
                    )
            else:
                for node in nodes[1:]:
                    yield from self.move(self.centre, node, it, "easgd_broadcast", gpu_of(self.centre, node),
                                         call="broadcast")
            # every worker's elastic update, in parallel
            env = ctx.env
            yield env.all_of(
                [
                    env.process(self.update(homes[g], 3 * self.weight_bytes, it, "easgd_elastic_update"))
                    for g in ctx.ranks
                ]
            )
            # reduce sum of W_i to the centre (partial sums added where they arrive)
            if self.tree:
                for pairs in reversed(self._tree_rounds(nodes)):
                    yield from self._send_all(
                        [(nodes[b], nodes[a], gpu_of(nodes[b], nodes[a])) for a, b in pairs],
                        it,
                        "easgd_reduce",
                        "reduce",
                    )
                    yield env.all_of(
                        [
                            env.process(self.update(nodes[a], 3 * self.weight_bytes, it, "easgd_reduce_add"))
                            for a, _b in pairs
                            if nodes[a] in ctx.machine.gpus
                        ]
                    )
            else:
                for node in nodes[1:]:
                    yield from self.move(node, self.centre, it, "easgd_reduce", gpu_of(node, self.centre),
                                         call="reduce")
                    if centre_gpu is not None:
                        yield from self.update(centre_gpu, 3 * self.weight_bytes, it, "easgd_reduce_add")
            reads = (2 if centre_gpu is not None or self.tree else 1 + len(nodes)) * self.weight_bytes
            yield from self.update(
                self.centre,
                reads + self.weight_bytes,
                it,
                "easgd_centre_update",
                host=self.centre_host,
                cores=opts.centre_cores,
            )
            self._tally([0] * ctx.n)  # every worker's contribution used the centre it was just sent
            self.event("done", k).succeed()

    def start(self) -> None:
        ctx, opts = self.ctx, self.opts
        for g in ctx.ranks:
            memory = ctx.machine.gpus[g].memory
            ctx.hold_model(g, grads="backward")
            memory.alloc(ctx.env.now, self.weight_bytes, "buffers")  # W~ as received
        if self.centre in ctx.machine.gpus:
            extra = 2 if opts.variant == "async-momentum" else 1
            ctx.machine.gpus[self.centre].memory.alloc(ctx.env.now, extra * self.weight_bytes, "easgd_centre")
        for g in ctx.ranks:
            ctx.env.process(self.worker(g))
        if opts.variant == "sync":
            ctx.env.process(self.replicated() if opts.centre == "replicated" else self.coordinator())
        ctx.extra["staleness"] = self.summary
        ctx.extra["easgd"] = {
            "variant": opts.variant,
            "tau": opts.tau,
            "centre": self.centre,
            "flat_buffer": opts.flat_buffer,
            "messages_per_exchange": len(self.messages),
            "weight_bytes": int(round(self.weight_bytes)),
            "tree_reduce": self.tree if opts.variant == "sync" else None,
            "weights_on_gpu": opts.weights_on_gpu,
            "overlap": opts.overlap,
        }


def tree_order(nodes: list) -> list:
    """Topology-aware binomial tree: ``nodes`` in hierarchical order (root first, then by socket, switch,
    GPU) placed by bit-reversed position, so the first round spans the two halves and later rounds stay ever
    closer: the most expensive link (e.g. the inter-socket one) carries W once per broadcast, not N/2 times.
    """
    n = len(nodes)
    bits = max(1, (n - 1).bit_length())
    order = []
    for p in range(2 ** bits):
        index = int(format(p, f"0{bits}b")[::-1], 2)
        if index < n:
            order.append(nodes[index])
    return order


def sync_bytes_per_round(workers: int, weight_bytes: float, centre_on_gpu: bool) -> float:
    """Bytes Sync EASGD sends per exchange: W~ to every other node and every node's (partial) sum back,
    whatever the tree: 2 (N - 1) |W| with N = the workers, plus the host when the centre lives there."""
    nodes = workers + (0 if centre_on_gpu else 1)
    return 2 * (nodes - 1) * weight_bytes


@register("easgd")
def run_easgd(ctx: Context) -> None:
    _Easgd(ctx).start()


__all__ = ["EasgdOptions", "VARIANTS", "run_easgd", "sync_bytes_per_round"]
