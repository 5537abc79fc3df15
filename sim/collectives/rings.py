"""Ring channels for collectives: which GPU order each NCCL-like "channel" follows, and its share of bytes.

NCCL runs a collective on several rings ("channels") at once so that all of a GPU's links carry data, and
splits the bytes across them. Here a channel is a ring order plus a weight (its share of the bytes); the
weights of a set sum to 1. Candidate sets are built per kind of machine and the one whose busiest link
finishes first is kept (`ring_cost`: the per-edge load of one ring step, divided by the edge bandwidth —
the same per-edge accounting the flow model produces):

- NVLink mesh (direct GPU-GPU NVLink, e.g. the DGX-1 hybrid cube-mesh): the bonded links are packed with
  edge-disjoint Hamiltonian cycles (a link of ``count`` k can carry k cycles); every cycle runs in both
  directions, so each link carries one ring per direction per NVLink. Bytes are split by each ring's
  bottleneck bandwidth per NVLink.
- Anything else in one machine (NVSwitch, PCIe tree, staged copies): one ring. On an NVSwitch every order
  is equal; on a PCIe tree the GPU index order keeps neighbours under one switch so only the switch uplinks
  and the inter-socket link see ring traffic; a greedy "nearest next GPU" order is tried as well.
- Several machines: one ring per distinct NIC (rail-aligned, as NCCL does): channel c enters every machine
  at a GPU whose NIC no other channel enters by, so all NICs carry traffic.
"""

from __future__ import annotations

import itertools
import weakref
from collections import defaultdict
from dataclasses import dataclass

from trainsim.errors import TrainsimError
from trainsim.topologies import Topology

MAX_CYCLES = 20_000  # Hamiltonian cycles enumerated per mesh (8 GPUs have at most 2,520)
MAX_PACKING_NODES = 200_000  # search nodes when packing cycles onto the links

_channels: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # topology -> {gpus: channels}


@dataclass(frozen=True)
class Channel:
    """One ring: GPUs in ring order (each sends to the next, the last to the first) and its byte share."""

    order: tuple[str, ...]
    weight: float

    def hops(self) -> list[tuple[str, str]]:
        n = len(self.order)
        return [(self.order[i], self.order[(i + 1) % n]) for i in range(n)] if n > 1 else []


def ring_cost(topo: Topology, channels: tuple[Channel, ...]) -> float:
    """Seconds per byte of per-rank chunk for one ring step of all channels: max over edges of
    (sum of the shares of the hops crossing it) / bandwidth."""
    load: dict[tuple[str, str], float] = defaultdict(float)
    for channel in channels:
        for a, b in channel.hops():
            for edge in topo.route_edges(a, b):
                load[edge] += channel.weight
    attrs = topo.edge_attrs
    return max((share / attrs[e]["bandwidth"] for e, share in load.items()), default=0.0)


def build_channels(topo: Topology, gpus: list[str]) -> tuple[Channel, ...]:
    """The ring channels for a group of GPUs (see the module docstring); cached per topology and group.
    A group inside one machine that copies an earlier one (`Topology.representative`) gets the channels of
    the same GPUs there, renamed."""
    cache = _channels.setdefault(topo, {})
    key = tuple(gpus)
    if key not in cache:
        machines = {topo.machine_of(g) for g in gpus}
        machine = machines.pop() if len(machines) == 1 else None
        first = topo.representative(machine) if machine is not None else None
        if first is not None and first != machine:
            channels = build_channels(topo, [topo.rename(g, first) for g in gpus])
            cache[key] = tuple(Channel(tuple(topo.rename(g, machine) for g in c.order), c.weight)
                               for c in channels)
        else:
            cache[key] = _build_channels(topo, gpus)
    return cache[key]


def _build_channels(topo: Topology, gpus: list[str]) -> tuple[Channel, ...]:
    if len(gpus) < 2:
        return ()
    if len(gpus) == 2:
        return (Channel(tuple(gpus), 1.0),)  # one ring uses both directions of every path between them
    machines = sorted({topo.machine_of(g) for g in gpus})
    candidates = [(Channel(tuple(gpus), 1.0),)]  # the GPUs in the order given
    if len(machines) > 1:
        candidates.append(_rail_channels(topo, gpus, machines))
        candidates.append(_spread_machine_rings(topo, gpus, machines))
    else:
        candidates.append((Channel(_greedy_order(topo, gpus), 1.0),))
        mesh = _mesh_channels(topo, gpus)
        if mesh:
            candidates.append(mesh)
    return min((c for c in candidates if c), key=lambda chans: ring_cost(topo, chans))


# ---- several machines ------------------------------------------------------------------------------------

def by_machine(topo: Topology, gpus: list[str]) -> dict[int, list[str]]:
    """The GPUs of each machine in the order given, machines in number order."""
    groups: dict[int, list[str]] = {}
    for g in gpus:
        groups.setdefault(topo.machine_of(g), []).append(g)
    return {m: groups[m] for m in sorted(groups)}


def _rail_channels(topo: Topology, gpus: list[str], machines: list[int]) -> tuple[Channel, ...]:
    # Inside each machine the ring follows that machine's own best ring (NVLink hops on a mesh).
    local = by_machine(topo, gpus)
    local = {m: list(build_channels(topo, lst)[0].order) if len(lst) > 1 else lst for m, lst in local.items()}
    channels = []
    for start in rail_starts(topo, local[machines[0]]):
        order: list[str] = []
        for m in machines:
            ring = local[m]
            k = start % len(ring)
            order.extend(ring[k:] + ring[:k])
        channels.append(order)
    return tuple(Channel(tuple(o), 1.0 / len(channels)) for o in channels)


def _spread_machine_rings(topo: Topology, gpus: list[str], machines: list[int]) -> tuple[Channel, ...]:
    """Every ring of a machine (e.g. a mesh's NVLink cycles) chained across the machines, each entering and
    leaving a machine by the NICs the other rings use least, so NVLinks and NICs both share the load."""
    local = list(by_machine(topo, gpus).values())
    rings = [build_channels(topo, lst) if len(lst) > 1 else (Channel(tuple(lst), 1.0),) for lst in local]
    count = min(len(r) for r in rings)
    if count < 2:
        return ()
    into: dict = defaultdict(int)
    out: dict = defaultdict(int)
    channels = []
    for c in range(count):
        first = rings[0][c].order
        # enter by first[pos], leave by the GPU before it in the ring
        def crowding(p: int, first=first) -> tuple[int, int]:
            return into[_nic(topo, first[p])] + out[_nic(topo, first[p - 1])], p

        pos = min(range(len(first)), key=crowding)
        into[_nic(topo, first[pos])] += 1
        out[_nic(topo, first[pos - 1])] += 1
        order: list[str] = []
        for machine_rings in rings:
            ring = machine_rings[c].order
            k = pos % len(ring)
            order.extend(ring[k:] + ring[:k])
        channels.append(Channel(tuple(order), rings[0][c].weight))
    total = sum(ch.weight for ch in channels)
    return tuple(Channel(ch.order, ch.weight / total) for ch in channels)


def _nic(topo: Topology, gpu: str) -> str | None:
    try:
        return topo.nic_of(gpu)
    except TrainsimError:
        return None


def rail_starts(topo: Topology, chain: list[str]) -> list[int]:
    """Positions in a machine's GPU list of the first GPU behind each distinct NIC (its "rails")."""
    starts, seen = [], set()
    for i, gpu in enumerate(chain):
        nic = _nic(topo, gpu)  # None without a NIC on a network: a single rail
        if nic not in seen:
            seen.add(nic)
            starts.append(i)
    return starts


# ---- one machine ------------------------------------------------------------------------------------------

def _greedy_order(topo: Topology, gpus: list[str]) -> tuple[str, ...]:
    """Start at the first GPU; go next to the unvisited GPU with the widest, then shortest, route."""
    order = [gpus[0]]
    left = list(gpus[1:])
    while left:
        here = order[-1]
        best = max(left, key=lambda g: (topo.bottleneck(topo.route(here, g)), -len(topo.route(here, g))))
        order.append(best)
        left.remove(best)
    return tuple(order)


def _nvlink_counts(topo: Topology, gpus: list[str]) -> dict[frozenset, int]:
    members = set(gpus)
    counts = {}
    for u in gpus:  # the group's own links, not the whole cluster's
        for v, d in topo.graph.adj[u].items():
            if v in members and d["kind"] == "nvlink":
                counts[frozenset((u, v))] = int(d.get("count") or 1)
    return counts


def _mesh_channels(topo: Topology, gpus: list[str]) -> tuple[Channel, ...]:
    """Both directions of a maximum packing of Hamiltonian cycles onto the direct NVLinks."""
    counts = _nvlink_counts(topo, gpus)
    if not counts:
        return ()
    cycles = _hamiltonian_cycles(gpus, counts)
    packing = _pack_cycles(cycles, counts)
    if not packing:
        return ()
    rings = [c for cycle in packing for c in (cycle, (cycle[0], *reversed(cycle[1:])))]
    # Each ring gets, on every edge, that edge's bandwidth per NVLink; it moves bytes at its slowest one.
    speeds = []
    for ring in rings:
        hops = zip(ring, ring[1:] + ring[:1], strict=True)
        speeds.append(min(topo.graph.edges[a, b]["bandwidth"] / counts[frozenset((a, b))] for a, b in hops))
    total = sum(speeds)
    return tuple(Channel(tuple(r), s / total) for r, s in zip(rings, speeds, strict=True))


def _hamiltonian_cycles(gpus: list[str], counts: dict[frozenset, int]) -> list[tuple[str, ...]]:
    """Undirected Hamiltonian cycles of the NVLink graph, each once (fixed start, second < last)."""
    neighbours = defaultdict(list)
    for pair in counts:
        a, b = tuple(pair)
        neighbours[a].append(b)
        neighbours[b].append(a)
    index = {g: i for i, g in enumerate(gpus)}
    for g in neighbours:
        neighbours[g].sort(key=index.get)
    n = len(gpus)
    start = gpus[0]
    found: list[tuple[str, ...]] = []
    path = [start]
    visited = {start}

    def extend() -> None:
        if len(found) >= MAX_CYCLES:
            return
        here = path[-1]
        if len(path) == n:
            if start in neighbours[here] and index[path[1]] < index[path[-1]]:
                found.append(tuple(path))
            return
        for nxt in neighbours[here]:
            if nxt not in visited:
                visited.add(nxt)
                path.append(nxt)
                extend()
                path.pop()
                visited.discard(nxt)

    if all(len(neighbours[g]) >= 2 for g in gpus):
        extend()
    return found


def _pack_cycles(cycles: list[tuple[str, ...]], counts: dict[frozenset, int]) -> list[tuple[str, ...]]:
    """The most cycles that fit on the links together (a link of count k carries k cycles)."""
    uses = [[frozenset(p) for p in zip(c, c[1:] + c[:1], strict=True)] for c in cycles]
    capacity = sum(counts.values())
    per_cycle = len(cycles[0]) if cycles else 1
    bound = capacity // per_cycle
    left = dict(counts)
    best: list[int] = []
    chosen: list[int] = []
    explored = itertools.count()

    def search(first: int) -> bool:
        nonlocal best
        if len(chosen) > len(best):
            best = list(chosen)
            if len(best) >= bound:
                return True
        for i in range(first, len(cycles)):
            if next(explored) > MAX_PACKING_NODES:
                return True
            if all(left[p] > 0 for p in uses[i]):
                for p in uses[i]:
                    left[p] -= 1
                chosen.append(i)
                done = search(i)  # the same cycle again if its links allow
                chosen.pop()
                for p in uses[i]:
                    left[p] += 1
                if done:
                    return True
        return False

    search(0)
    return [cycles[i] for i in best]
