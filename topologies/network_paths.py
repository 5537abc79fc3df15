"""Equal shortest paths across a switched network without a graph search per pair of NICs.

`Topology` routes between two NICs over network switches only, on one of the equal shortest paths: the one
at position ``pick % count`` when all of them are sorted by their nodes' natural names (destination-based
"D-mod-k" routing). Enumerating them per pair (networkx ``all_shortest_paths``, a Dijkstra over the whole
cluster each time) grows with the square of the cluster. Here, when every network link costs the same
(InfiniBand and Ethernet hops both do), the hop distances toward a destination's switches come from one
breadth-first search (numpy, over the switches only) shared by every NIC under those switches, and the
chosen path is read off by counting paths instead of listing them: at each hop, skip the successors (in
natural-name order) whose paths all sort before the wanted one.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Hashable
from itertools import accumulate

import networkx as nx
import numpy as np


class NetworkPaths:
    """Shortest paths between NICs through the switches of ``graph`` whose ``machine`` is ``network``."""

    def __init__(self, graph: nx.DiGraph, network: int, key: Callable[[str], list]):
        self.graph = graph
        nodes = graph.nodes
        self.switches = sorted((n for n, m in nodes(data="machine") if m == network), key=key)
        self.index = {s: i for i, s in enumerate(self.switches)}
        # each switch's rank in natural-name order (equal names' keys, equal ranks): sorting switches by it
        # sorts them by name, ties kept in their order, without making a key per name per sort
        keys = [key(s) for s in self.switches]
        self._rank = list(accumulate(int(i > 0 and k != keys[i - 1]) for i, k in enumerate(keys)))
        # successors among switches, in natural-name order (the order paths are compared in)
        self.succ = [self._by_name(graph.successors(s)) for s in self.switches]
        # predecessors as CSR arrays, for the search backwards from a destination
        preds = [[self.index[u] for u in graph.predecessors(s) if u in self.index] for s in self.switches]
        self._ptr = np.zeros(len(preds) + 1, dtype=np.int64)
        self._ptr[1:] = np.cumsum([len(p) for p in preds])
        self._ind = np.array([u for p in preds for u in p], dtype=np.int64)
        self._dist: dict[Hashable, tuple[list[int], list[int]]] = {}  # per destination: hops, path counts
        self._out: dict[str, set[str]] = {}  # NIC -> its neighbours
        self._first: dict[str, list[int]] = {}  # NIC -> its switches, in natural-name order
        self._entry: dict[str, frozenset[int]] = {}  # NIC -> the switches that reach it
        # per destination: switch -> (its next switches towards it, running totals of their path counts)
        self._steps: dict[Hashable, dict[int, tuple[list[int], list[int]]]] = {}

    def _by_name(self, nodes) -> list[int]:
        """The switches among ``nodes``, as indices in natural-name order."""
        return sorted((self.index[v] for v in nodes if v in self.index), key=self._rank.__getitem__)

    @staticmethod
    def uniform(graph: nx.DiGraph, network: int, cost: Callable[[dict], float]) -> bool:
        """Whether every link touching a network switch costs the same (hop counts then order paths)."""
        switches = [n for n, m in graph.nodes(data="machine") if m == network]
        costs = {cost(d) for _, _, d in graph.out_edges(switches, data=True)}
        costs |= {cost(d) for _, _, d in graph.in_edges(switches, data=True)}
        return len(costs) <= 1

    def path(self, src: str, dst: str, pick: Callable[[], int]) -> list[str] | None:
        """The nodes of the ``pick() % count``-th shortest path from NIC ``src`` to NIC ``dst`` in
        natural-name order (``pick`` is only called when there are several); None when there is none."""
        out = self._out.get(src)
        if out is None:  # kept: a NIC starts paths to thousands of others
            out = self._out[src] = set(self.graph.successors(src))
            self._first[src] = self._by_name(self.graph.successors(src))
        if dst in out:
            return [src, dst]  # one hop: the only shortest path
        entry = self._entry.get(dst)
        if entry is None:
            entry = frozenset(self.index[u] for u in self.graph.predecessors(dst) if u in self.index)
            self._entry[dst] = entry
        if not entry:
            return None
        known = self._dist.get(entry)  # called for every pair of NICs: one lookup when known
        dist, counts = known if known is not None else self._distances(entry)
        candidates = [s for s in self._first[src] if dist[s] > 0]
        if len(candidates) > 1:  # a NIC on several switches: the nearest ones
            hops = min(dist[s] for s in candidates)
            candidates = [s for s in candidates if dist[s] == hops]
        elif not candidates:
            return None
        totals = list(accumulate(counts[s] for s in candidates))
        k = pick() % totals[-1] if totals[-1] > 1 else 0
        steps = self._steps.get(entry)
        if steps is None:
            steps = self._steps[entry] = {}
        switches = self.switches
        nodes = [src]
        while candidates:  # the k-th path (from 0): skip the candidates whose paths all come before it
            if len(candidates) > 1:
                i = bisect_right(totals, k)
                k -= totals[i - 1] if i else 0
                s = candidates[i]
            else:  # one way on: k stays
                s = candidates[0]
            nodes.append(switches[s])
            down = steps.get(s)
            if down is None:  # kept per destination: every NIC's path to it goes down the same switches
                near = [u for u in self.succ[s] if dist[u] == dist[s] - 1 and dist[u] > 0]
                down = steps[s] = (near, list(accumulate(counts[u] for u in near)))
            candidates, totals = down
        nodes.append(dst)
        return nodes

    def _distances(self, entry: frozenset) -> tuple[list[int], list[int]]:
        """Hops from every switch to the destination through ``entry`` (its switches, at 1; -1: none), and
        the number of shortest paths from each switch to it (0: none)."""
        if entry not in self._dist:
            dist = np.full(len(self.switches), -1, dtype=np.int64)
            count = np.zeros(len(self.switches), dtype=np.int64)
            frontier = np.array(sorted(entry), dtype=np.int64)
            dist[frontier] = hops = 1
            count[frontier] = 1
            while frontier.size:
                starts, ends = self._ptr[frontier], self._ptr[frontier + 1]
                sizes = ends - starts
                total = int(sizes.sum())
                if not total:
                    break
                # the predecessors of every frontier switch, gathered in one go
                offsets = np.repeat(starts - (np.cumsum(sizes) - sizes), sizes) + np.arange(total)
                near = self._ind[offsets]
                via = np.repeat(frontier, sizes)  # the frontier switch each predecessor leads to
                hops += 1
                dist[near[dist[near] < 0]] = hops
                frontier = np.flatnonzero(dist == hops)  # sorted, each once (no hashing as np.unique)
                # a switch one hop further has the paths of each of its successors one hop nearer
                further = dist[near] == hops
                np.add.at(count, near[further], count[via[further]])
            self._dist[entry] = (dist.tolist(), count.tolist())
        return self._dist[entry]
