"""What a collective moves where: a `Plan` of transfers, shared by the flow-level and the analytic paths.

A plan is a set of *lanes* (NCCL channels, or the two trees of a double binary tree) that run concurrently;
each lane is a sequence of *phases*; a phase is a set of concurrent transfers (a route, a share of the
collective's size S, a latency) repeated ``repeat`` times, one after another. The flow path starts every
transfer of a phase as a flow and starts the next phase of that lane when they are all done; the analytic
path (`alpha_beta`) sums, phase by phase, the largest latency plus the most loaded edge's bytes over its
bandwidth. Because every transfer of a phase carries the same bytes per lane and fair sharing freezes the
most loaded edge's flows first, the two agree wherever lanes are balanced.

Algorithms (nccl-tests' S = the whole array):

- ring: all-reduce = 2(n-1) steps of S/n per rank per channel; reduce-scatter and all-gather n-1 steps;
  broadcast / reduce = a pipelined chain from / to the root (every hop streams S once: in steady state all
  hops of a pipeline are busy at once, and the last byte lands after the chain's latency).
- tree (all-reduce): NCCL's double binary tree between machines, a chain inside each machine; each tree
  carries S/2 up (reduce) and down (broadcast), pipelined, so every tree edge streams S/2 each way.
- nvls (NVSwitch in-network reduction, all-reduce / reduce-scatter / all-gather): GPU r owns shard r (S/n).
  Reduce-scatter: the switch reads every shard from every GPU (``multimem.ld_reduce``; the owner's own copy
  also goes through the switch), reduces and returns S/n to the owner: per GPU S up, S/n down. All-gather:
  each owner stores its shard once (``multimem.st``), the switch multicasts it to all: S/n up, S down.
  All-reduce pipelines both: S(n+1)/n each way on every GPU's switch link. Where the switch gives its
  NVLS engines a throughput (``nvls_gbps``), every byte sent up also crosses the engine, which all the
  switch's GPUs share: (n+1) S through it in an all-reduce.
- nvls_tree (all-reduce across machines, NCCL's NVLSTree): NVLS inside each machine (S(n+1)/n each way on
  every GPU's switch link, n = GPUs per machine) and, pipelined with it, a double binary tree between the
  machines for each shard: the i-th GPU of every machine owns shard i (S/n) and exchanges it over its own
  NIC with the i-th GPUs of the other machines, each tree carrying half of it up and down.
- p2p: all-to-all = every rank sends S/n to every other at once; send/recv = gpus[i] sends S to gpus[i+1]
  (one flow for two GPUs; a chain of boundary exchanges for more).

Latency (NCCL's cost model, nccl_tuning.py): a base per collective plus, per step, NCCL's per-hop latency of
the algorithm and protocol by hop class (`Tuning`); the LEGACY tuning (CPU ranks, unknown devices) also adds
the route's own link latencies. Bandwidth: a plan's ``efficiency`` is the fraction of the links' rate its
protocol reaches; both paths divide by it (the flow path sends share x S / efficiency bytes).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import NamedTuple

from trainsim.topologies import Topology

from .nccl_tuning import LEGACY, Tuning
from .rings import Channel, build_channels, by_machine, rail_starts

US = 1e-6
BASE_LATENCY = LEGACY.base  # per collective, where NCCL's model does not apply
HOP_LATENCY = LEGACY.hop  # per step, idem

Edge = tuple[str, str]


class Transfer(NamedTuple):
    """One flow of a phase. A named tuple, not a dataclass: plans of thousands of ranks hold about a million
    (a tuple is built in half the time)."""

    route: tuple[Edge, ...]
    share: float  # bytes = share x S
    latency: float  # seconds before the first byte moves


@dataclass(frozen=True)
class Phase:
    transfers: tuple[Transfer, ...]
    repeat: int = 1


@dataclass(frozen=True)
class Plan:
    op: str
    algo: str
    gpus: tuple[str, ...]
    lanes: tuple[tuple[Phase, ...], ...]
    base_latency: float = BASE_LATENCY
    proto: str = "simple"
    efficiency: float = 1.0  # fraction of the links' bandwidth the protocol reaches

    @property
    def flows(self) -> int:
        """Flows one run starts."""
        return sum(len(p.transfers) * p.repeat for lane in self.lanes for p in lane)


def hop_class(topo: Topology, route) -> str:
    """"network" (any IB / Ethernet edge), "nvlink" (only NVLink) or "pcie" (the rest); kept per route."""
    cache = topo.memo.setdefault("hop_classes", {})
    route = tuple(route)
    if route not in cache:
        cache[route] = _classify(topo, route)
    return cache[route]


def _classify(topo: Topology, route: tuple[Edge, ...]) -> str:
    kind = topo.edge_kind
    kinds = {kind[e] for e in route}
    if kinds & {"ib", "ethernet"}:
        return "network"
    if kinds and kinds <= {"nvlink", "nvls"}:  # an NVSwitch's NVLS engine is inside the NVLink fabric
        return "nvlink"
    return "pcie"  # PCIe, the inter-socket link, host memory


def _hop(topo: Topology, a: str, b: str) -> tuple[tuple[Edge, ...], float, str]:
    """(route, wire latency, hop class) from ``a`` to ``b``; kept with the topology, as plans of thousands
    of ranks ask for the same hops again (each ring step, every candidate ring, both trees)."""
    cache = topo.memo.setdefault("collective_hops", {})
    hop = cache.get((a, b))
    if hop is None:
        route = topo.route_edges(a, b)
        hop = cache[a, b] = (route, topo.route_latency(route), hop_class(topo, route))
    return hop


def _transfer(topo: Topology, a: str, b: str, share: float, extra_latency: float = 0.0,
              tuning: Tuning = LEGACY) -> Transfer:
    route, wire, klass = _hop(topo, a, b)
    latency = (wire if tuning.route_latency else 0.0) + tuning.hop[klass] + extra_latency
    return Transfer(route, share, latency)


# ---- ring -------------------------------------------------------------------------------------------------

def ring_plan(topo: Topology, op: str, gpus: list[str], tuning: Tuning = LEGACY) -> Plan:
    n = len(gpus)
    channels = build_channels(topo, gpus)
    lanes = []
    for channel in channels:
        if op in ("allreduce", "reduce_scatter", "allgather"):
            steps = 2 * (n - 1) if op == "allreduce" else n - 1
            hops = [_transfer(topo, a, b, channel.weight / n, tuning=tuning) for a, b in channel.hops()]
            # Pipelined: a chunk crosses the ring's hops in turn, so its steps pay each hop's latency as often
            # as it crosses that hop (NCCL: 2 x nNodes network steps of an all-reduce's 2(n-1)), not the
            # slowest hop's at every step. Each step is charged the mean over the ring.
            mean = sum(t.latency for t in hops) / len(hops)
            lanes.append((Phase(tuple(Transfer(t.route, t.share, mean) for t in hops), steps),))
        else:  # broadcast / reduce: a pipelined chain along the ring, from / to gpus[0]
            lanes.append((Phase(_chain(topo, channel, gpus[0], tuning, to_root=op == "reduce")),))
    return Plan(op, "ring", tuple(gpus), tuple(lanes), tuning.base, tuning.proto)


def _chain(topo: Topology, channel: Channel, root: str, tuning: Tuning, *,
           to_root: bool) -> tuple[Transfer, ...]:
    order = list(channel.order)
    k = order.index(root)
    order = order[k:] + order[:k]  # root first
    if to_root:
        order = order[1:] + order[:1]  # root last: data flows towards it
    transfers = []
    arrived = 0.0  # a hop's first byte leaves once the previous hops delivered theirs
    for a, b in zip(order, order[1:], strict=False):
        t = _transfer(topo, a, b, channel.weight, arrived, tuning)
        arrived = t.latency
        transfers.append(t)
    # The chain finishes when its last byte lands: every hop waits for the whole chain's fill latency,
    # so the phase latency (the largest) is the chain's.
    return tuple(Transfer(t.route, t.share, arrived) for t in transfers)


# ---- tree -------------------------------------------------------------------------------------------------

def btree_parent(rank: int, nranks: int) -> int:
    """Parent of ``rank`` in NCCL's binary tree over 0..nranks-1 (-1 for the root, rank 0)."""
    if rank == 0:
        return -1
    bit = 1
    while not bit & rank:
        bit <<= 1
    up = (rank ^ bit) | (bit << 1)
    return rank ^ bit if up >= nranks else up


def dtree_parents(nranks: int) -> tuple[list[int], list[int]]:
    """NCCL's double binary tree: the second tree mirrors the first (even nranks) or shifts it by one (odd),
    so the leaves of one tree are mostly inner nodes of the other and the load on each rank evens out."""
    first = [btree_parent(r, nranks) for r in range(nranks)]
    if nranks % 2 == 0:
        mirror = [nranks - 1 - r for r in range(nranks)]
        second = [-1] * nranks
        for r in range(nranks):
            p = first[r]
            second[mirror[r]] = -1 if p < 0 else mirror[p]
    else:
        second = [-1] * nranks
        for r in range(nranks):
            p = first[r]
            second[(r + 1) % nranks] = -1 if p < 0 else (p + 1) % nranks
    return first, second


def _chain_order(topo: Topology, gpus: list[str]) -> list[str]:
    return list(build_channels(topo, gpus)[0].order) if len(gpus) > 1 else list(gpus)


@dataclass(frozen=True)
class TreeLane:
    """What one tree of a tree all-reduce moves, whatever the protocol: its routes (child -> parent up, then
    parent -> child down), each carrying ``share``; the (wire latency, hop class) of its hops going up; its
    depth inside a machine (the chain) and between machines (log2 of their number)."""

    routes: tuple[tuple[Edge, ...], ...]
    share: float
    steps: frozenset[tuple[float, str]]
    depth: int
    levels: int

    def latency(self, tuning: Tuning) -> float:
        """NCCL's tree latency: up and down the depth (the chain, then the machines), from the largest step
        latency of each hop class going up."""
        intra = inter = 0.0
        for wire, klass in self.steps:
            step = (wire if tuning.route_latency else 0.0) + tuning.hop[klass]
            if klass == "network":
                inter = max(inter, step)
            else:
                intra = max(intra, step)
        return 2 * (self.depth * intra + self.levels * inter)


def tree_plan(topo: Topology, gpus: list[str], tuning: Tuning = LEGACY) -> Plan:
    lanes = []
    for lane in tree_lanes(topo, gpus):
        latency = lane.latency(tuning)
        lanes.append((Phase(tuple(Transfer(route, lane.share, latency) for route in lane.routes)),))
    return Plan("allreduce", "tree", tuple(gpus), tuple(lanes), tuning.base, tuning.proto)


def tree_lanes(topo: Topology, gpus: list[str]) -> tuple[TreeLane, ...]:
    """The lanes of `tree_plan` for ``gpus``, kept with the topology: the plans of every protocol share them
    (at thousands of ranks, walking the trees' hops is most of a plan's cost)."""
    cache = topo.memo.setdefault("tree_lanes", {})
    key = tuple(gpus)
    if key not in cache:
        cache[key] = _tree_lanes(topo, list(gpus))
    return cache[key]


def _tree_lanes(topo: Topology, gpus: list[str]) -> tuple[TreeLane, ...]:
    groups = by_machine(topo, gpus)
    machines = list(groups)
    # Inside a machine the tree is a chain along the machine's best ring (NVLink hops on a mesh).
    local = [_chain_order(topo, groups[m]) for m in machines]
    # One pair of trees per rail (distinct NIC) between machines, as NCCL runs several tree channels:
    # the chain of rail r starts at its r-th GPU, so every NIC heads a tree.
    rails = rail_starts(topo, local[0]) if len(machines) > 1 else [0]
    levels = math.ceil(math.log2(len(machines)))
    lanes = []
    for start in rails:
        rotated = [lst[start % len(lst):] + lst[:start % len(lst)] for lst in local]
        for t, parents in enumerate(dtree_parents(len(machines))):
            # The second tree enters every machine at the chain's other end (its own NIC) and runs the
            # chain the other way, so the two trees use both directions of the chain links.
            chains = [c if t == 0 else c[::-1] for c in rotated]
            edges = [(c[i + 1], c[i]) for c in chains for i in range(len(c) - 1)]  # child -> parent
            edges += [(chains[m][0], chains[p][0]) for m, p in enumerate(parents) if p >= 0]
            ups = [_hop(topo, a, b) for a, b in edges]
            down = [_hop(topo, b, a)[0] for a, b in edges]
            lanes.append(TreeLane(tuple([route for route, _, _ in ups] + down), 0.5 / len(rails),
                                  frozenset((wire, klass) for _, wire, klass in ups),
                                  max(len(c) for c in chains) - 1, levels))
    return tuple(lanes)


# ---- nvls -------------------------------------------------------------------------------------------------

def nvls_switch(topo: Topology, gpus: list[str]) -> str | None:
    """The NVSwitch with in-switch reduction that every GPU of the group links to directly, if any."""
    common = None
    for g in gpus:
        switches = {s for s in topo.graph.successors(g) if topo.graph.nodes[s]["kind"] == "nvswitch"
                    and topo.graph.nodes[s].get("reduce")}
        common = switches if common is None else common & switches
    return min(common) if common else None


def _into_switch(topo: Topology, gpu: str, switch: str) -> tuple[Edge, ...]:
    """The route of a GPU's NVLS traffic into the switch: its port, then the switch's NVLS engine where the
    switch gives the engine a throughput of its own (every byte a GPU sends up is a ``multimem`` load the
    engine reduces or a store it multicasts)."""
    engine = topo.nvls_engine(switch)
    return ((gpu, switch),) if engine is None else ((gpu, switch), engine)


def nvls_plan(topo: Topology, op: str, gpus: list[str], switch: str, tuning: Tuning = LEGACY) -> Plan:
    """NCCL's NVLS latency is one figure for the whole collective (hwLat NVLink NVLS, no base); LEGACY: a
    trip through the switch per stage."""
    n = len(gpus)
    up, down = {"allreduce": ((n + 1) / n, (n + 1) / n), "reduce_scatter": (1.0, 1 / n),
                "allgather": (1 / n, 1.0)}[op]
    stages = 2 if op == "allreduce" else 1  # reduce then multicast, each a trip through the switch
    transfers = []
    for g in gpus:
        for route, share in (_into_switch(topo, g, switch), up), (((switch, g),), down):
            if tuning.route_latency:
                latency = stages * (topo.route_latency([(g, switch), (switch, g)]) + tuning.hop["nvlink"])
            else:
                latency = tuning.hop["nvlink"]
            transfers.append(Transfer(route, share, latency))
    return Plan(op, "nvls", tuple(gpus), ((Phase(tuple(transfers)),),), tuning.base, tuning.proto)


def nvls_tree_plan(topo: Topology, gpus: list[str], switches: dict[int, str],
                   tuning: Tuning = LEGACY) -> Plan:
    """NCCL's NVLSTree all-reduce; ``switches``: the reducing NVSwitch of each machine. The machines must hold
    the same number of GPUs (shard i's tree joins the i-th GPU of each). NCCL's latency is one figure for the
    whole collective: hwLat NVLink NVLSTree + 2 log2(machines) x hwLat NET NVLSTree (NCCL's log2i: floor)."""
    groups = by_machine(topo, gpus)
    machines = list(groups)
    n = len(groups[machines[0]])
    latency = tuning.hop["nvlink"] + 2 * (len(machines).bit_length() - 1) * tuning.hop["network"]
    transfers = []
    for m in machines:
        for g in groups[m]:
            transfers.append(Transfer(_into_switch(topo, g, switches[m]), (n + 1) / n, latency))
            transfers.append(Transfer(((switches[m], g),), (n + 1) / n, latency))
    share = 0.5 / n  # half of a shard per tree, each way
    for i in range(n):
        for parents in dtree_parents(len(machines)):
            for child, parent in enumerate(parents):
                if parent < 0:
                    continue
                a, b = groups[machines[child]][i], groups[machines[parent]][i]
                transfers.append(Transfer(_hop(topo, a, b)[0], share, latency))  # up: partial sums
                transfers.append(Transfer(_hop(topo, b, a)[0], share, latency))  # down: the result
    return Plan("allreduce", "nvls_tree", tuple(gpus), ((Phase(tuple(transfers)),),), tuning.base,
                tuning.proto)


# ---- point to point ---------------------------------------------------------------------------------------

def p2p_plan(topo: Topology, op: str, gpus: list[str], tuning: Tuning = LEGACY) -> Plan:
    n = len(gpus)
    if op == "alltoall":
        transfers = [_transfer(topo, a, b, 1 / n, tuning=tuning) for a in gpus for b in gpus if a != b]
    else:
        transfers = [_transfer(topo, a, b, 1.0, tuning=tuning) for a, b in zip(gpus, gpus[1:], strict=False)]
    return Plan(op, "p2p", tuple(gpus), ((Phase(tuple(transfers)),),), tuning.base, tuning.proto)


# ---- the analytic path ------------------------------------------------------------------------------------

def alpha_beta(topo: Topology, plan: Plan, beta: float | None = None) -> tuple[float, float]:
    """(alpha seconds, beta seconds per byte of S): t(S) = alpha + beta x S, beta divided by the plan's
    protocol efficiency.

    Phase k of every lane runs at the same time: its latency is the largest of its transfers', and its
    bandwidth term the most loaded edge's (sum of the shares crossing it) / bandwidth, so links shared by
    several ring hops, channels or trees count once per user. ``beta``: `bandwidth_term` when the caller
    has it (plans of one algorithm on one group move the same shares whatever the protocol).
    """
    if not plan.lanes:
        return 0.0, 0.0
    alpha = plan.base_latency
    for phases in _phases(plan):
        repeat = max(p.repeat for p in phases)
        alpha += repeat * max((t.latency for phase in phases for t in phase.transfers), default=0.0)
    if beta is None:
        beta = bandwidth_term(topo, plan)
    return alpha, beta / plan.efficiency


def bandwidth_term(topo: Topology, plan: Plan) -> float:
    """Seconds per byte of S at the links' full rate: per phase, ``repeat`` x the most loaded edge's shares
    over its bandwidth (see `alpha_beta`)."""
    beta = 0.0
    for phases in _phases(plan):
        repeat = max(p.repeat for p in phases)
        load: dict[Edge, float] = defaultdict(float)
        for phase in phases:
            scale = phase.repeat / repeat
            for t in phase.transfers:
                share = t.share * scale  # once per transfer, not per edge
                for e in t.route:
                    load[e] += share
        attrs = topo.edge_attrs
        beta += repeat * max((x / attrs[e]["bandwidth"] for e, x in load.items()), default=0.0)
    return beta


def _phases(plan: Plan) -> list[list[Phase]]:
    """Phase k of every lane, for each k (lanes run side by side); none without lanes."""
    if not plan.lanes:
        return []
    n_phases = {len(lane) for lane in plan.lanes}
    if len(n_phases) != 1:
        raise ValueError("the lanes of a plan must have the same number of phases")
    return [[lane[k] for lane in plan.lanes] for k in range(n_phases.pop())]
