"""The directed graph a topology is, and the searches its routing needs, without networkx.

`DiGraph` keeps the part of networkx's ``DiGraph`` interface the simulator uses (``nodes`` and ``edges``
views, successors, predecessors, adjacency, edge queries, copies and subgraphs), over plain dicts in the same
insertion order networkx keeps; the searches (`dijkstra_path`, `dijkstra_lengths`, `all_shortest_paths`,
`weakly_connected_components`) follow networkx's algorithms step for step, so routes, ties included, come
out as they did with networkx. Importing networkx costs about a tenth of a second that every command would
pay at start-up; the graph also builds and answers faster at cluster scale.

A weight function is ``weight(u, v, attrs) -> cost``, None for an edge that may not be used.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from heapq import heappop, heappush
from itertools import count

Weight = Callable[[str, str, dict], float | None]


class NoPath(Exception):
    """No path joins the two nodes (under the weight function's rules)."""


class DiGraph:
    """Named nodes with attribute dicts, and directed edges with attribute dicts (one per direction)."""

    def __init__(self, name: str = ""):
        self.name = name
        self._node: dict[str, dict] = {}
        self._succ: dict[str, dict[str, dict]] = {}
        self._pred: dict[str, dict[str, dict]] = {}
        self.nodes = NodeView(self._node)
        self.edges = EdgeView(self._succ)

    def __repr__(self) -> str:
        return f"DiGraph({self.name!r}, {len(self._node)} nodes, {self.number_of_edges()} edges)"

    def __contains__(self, node) -> bool:
        return node in self._node

    def __iter__(self) -> Iterator[str]:
        return iter(self._node)

    def __len__(self) -> int:
        return len(self._node)

    # ---- building ---------------------------------------------------------------------------------------
    def add_node(self, node: str, **attrs) -> None:
        if node not in self._node:
            self._node[node] = {}
            self._succ[node] = {}
            self._pred[node] = {}
        self._node[node].update(attrs)

    def add_edge(self, u: str, v: str, **attrs) -> None:
        for node in (u, v):
            if node not in self._node:
                self.add_node(node)
        data = self._succ[u].get(v)
        if data is None:
            data = self._succ[u][v] = self._pred[v][u] = {}
        data.update(attrs)

    def add_edges_from(self, edges: Iterable[tuple]) -> None:
        """Edges as ``(u, v)`` or ``(u, v, attrs)`` (each edge gets a dict of its own with ``attrs``)."""
        node, succ, pred = self._node, self._succ, self._pred
        for u, v, *attrs in edges:  # add_edge inlined: a cluster has 100k+ edges
            for end in (u, v):
                if end not in node:
                    self.add_node(end)
            data = succ[u].get(v)
            if data is None:
                data = succ[u][v] = pred[v][u] = {}
            if attrs:
                data.update(attrs[0])

    def copy(self) -> DiGraph:
        """A copy whose nodes and edges have attribute dicts of their own."""
        out = DiGraph(self.name)
        for node, attrs in self._node.items():
            out.add_node(node, **attrs)
        for u, nbrs in self._succ.items():
            for v, attrs in nbrs.items():
                out.add_edge(u, v, **attrs)
        return out

    def subgraph(self, nodes: Iterable[str]) -> DiGraph:
        """The graph of ``nodes`` and the edges between them (attribute dicts shared, as networkx's views)."""
        keep = {n for n in nodes if n in self._node}
        out = DiGraph(self.name)
        for node, attrs in self._node.items():
            if node in keep:
                out._node[node] = attrs
                out._succ[node] = {v: d for v, d in self._succ[node].items() if v in keep}
                out._pred[node] = {u: d for u, d in self._pred[node].items() if u in keep}
        return out

    # ---- queries ----------------------------------------------------------------------------------------
    @property
    def adj(self) -> dict[str, dict[str, dict]]:
        """node -> {successor: edge attributes} (read it, do not change it)."""
        return self._succ

    succ = adj

    @property
    def pred(self) -> dict[str, dict[str, dict]]:
        """node -> {predecessor: edge attributes} (read it, do not change it)."""
        return self._pred

    def successors(self, node: str) -> Iterator[str]:
        return iter(self._succ[node])

    def predecessors(self, node: str) -> Iterator[str]:
        return iter(self._pred[node])

    def has_edge(self, u: str, v: str) -> bool:
        return u in self._succ and v in self._succ[u]

    def get_edge_data(self, u: str, v: str, default=None):
        return self._succ[u][v] if self.has_edge(u, v) else default

    def number_of_nodes(self) -> int:
        return len(self._node)

    def number_of_edges(self) -> int:
        return sum(len(nbrs) for nbrs in self._succ.values())

    def out_degree(self, node: str) -> int:
        return len(self._succ[node])

    def in_degree(self, node: str) -> int:
        return len(self._pred[node])

    def out_edges(self, nbunch=None, data=False, default=None) -> EdgeData:
        """``(u, v)`` / ``(u, v, attrs)`` / ``(u, v, attrs[data])`` leaving ``nbunch`` (a node, nodes,
        or every node)."""
        return EdgeData(self._succ, _bunch(self._succ, nbunch), data, default)

    def in_edges(self, nbunch=None, data=False, default=None) -> EdgeData:
        """Likewise for the edges entering ``nbunch``."""
        return EdgeData(self._pred, _bunch(self._pred, nbunch), data, default, reverse=True)


def _bunch(adjacency: dict, nbunch) -> Iterable[str]:
    if nbunch is None:
        return adjacency
    if isinstance(nbunch, str):  # one node
        return (nbunch,) if nbunch in adjacency else ()
    return [n for n in nbunch if n in adjacency]


class EdgeData:
    """Edges with their data, made as they are iterated (a cluster has 100k+; a list of them all would
    also wake the garbage collector again and again), as often as asked, like networkx's views."""

    __slots__ = ("_adjacency", "_nodes", "_data", "_default", "_reverse")

    def __init__(self, adjacency: dict, nodes: Iterable[str], data, default, *, reverse: bool = False):
        self._adjacency, self._nodes, self._data = adjacency, nodes, data
        self._default, self._reverse = default, reverse

    def __len__(self) -> int:
        return sum(len(self._adjacency[n]) for n in self._nodes)

    def __iter__(self) -> Iterator[tuple]:
        adjacency, data, default = self._adjacency, self._data, self._default
        if data is True and not self._reverse:  # the common case, without the per-edge tests below
            return ((a, b, attrs) for a in self._nodes for b, attrs in adjacency[a].items())
        return self._iter(adjacency, data, default)

    def _iter(self, adjacency, data, default) -> Iterator[tuple]:
        for a in self._nodes:
            for b, attrs in adjacency[a].items():
                u, v = (b, a) if self._reverse else (a, b)
                if data is True:
                    yield u, v, attrs
                elif data is False:
                    yield u, v
                else:
                    yield u, v, attrs.get(data, default)


class NodeData:
    """``(node, attrs)`` or ``(node, attrs[data])`` pairs, made as they are iterated."""

    __slots__ = ("_node", "_data", "_default")

    def __init__(self, node: dict[str, dict], data, default):
        self._node, self._data, self._default = node, data, default

    def __len__(self) -> int:
        return len(self._node)

    def __iter__(self) -> Iterator[tuple]:
        if self._data is True:
            return iter(self._node.items())
        data, default = self._data, self._default
        return ((n, attrs.get(data, default)) for n, attrs in self._node.items())


class NodeView:
    """``graph.nodes``: iterate names, ``nodes[n]`` for attributes, ``nodes(data=...)`` for pairs."""

    __slots__ = ("_node",)

    def __init__(self, node: dict[str, dict]):
        self._node = node

    def __call__(self, data=False, default=None):
        return self if data is False else NodeData(self._node, data, default)

    def __getitem__(self, node: str) -> dict:
        return self._node[node]

    def __iter__(self) -> Iterator[str]:
        return iter(self._node)

    def __len__(self) -> int:
        return len(self._node)

    def __contains__(self, node) -> bool:
        return node in self._node


class EdgeView:
    """``graph.edges``: iterate ``(u, v)``, ``edges[u, v]`` for attributes, ``edges(data=...)``."""

    __slots__ = ("_succ",)

    def __init__(self, succ: dict[str, dict[str, dict]]):
        self._succ = succ

    def __call__(self, nbunch=None, data=False, default=None) -> EdgeData:
        return EdgeData(self._succ, _bunch(self._succ, nbunch), data, default)

    def __getitem__(self, edge: tuple[str, str]) -> dict:
        u, v = edge
        return self._succ[u][v]

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return ((u, v) for u, nbrs in self._succ.items() for v in nbrs)

    def __len__(self) -> int:
        return sum(len(nbrs) for nbrs in self._succ.values())

    def __contains__(self, edge) -> bool:
        u, v = edge
        return u in self._succ and v in self._succ[u]


# ---- searches (networkx's, step for step: same heap order, same tie-breaking) ------------------------------

def _dijkstra(graph: DiGraph, source: str, weight: Weight, *, target: str | None = None,
              pred: dict[str, list[str]] | None = None, all_preds: bool = False) -> dict[str, float]:
    """Distances from ``source`` in the order nodes are settled; ``pred`` gets each node's predecessor (the
    first found at the shortest distance), or all of them with ``all_preds``."""
    succ = graph.adj
    dist: dict[str, float] = {}
    seen = {source: 0}
    order = count()
    fringe = [(0, next(order), source)]
    while fringe:
        d, _, v = heappop(fringe)
        if v in dist:
            continue
        dist[v] = d
        if v == target:
            break
        for u, attrs in succ[v].items():
            cost = weight(v, u, attrs)
            if cost is None:
                continue
            vu = d + cost
            if u in dist:
                if all_preds and vu == dist[u]:
                    pred[u].append(v)
            elif u not in seen or vu < seen[u]:
                seen[u] = vu
                heappush(fringe, (vu, next(order), u))
                if pred is not None:
                    pred[u] = [v]
            elif all_preds and vu == seen[u]:
                pred[u].append(v)
    return dist


def dijkstra_lengths(graph: DiGraph, source: str, weight: Weight) -> dict[str, float]:
    """Shortest distance from ``source`` to every node it reaches."""
    return _dijkstra(graph, source, weight)


def dijkstra_path(graph: DiGraph, source: str, target: str, weight: Weight) -> list[str]:
    """The nodes of a shortest path (networkx's choice among equal ones); `NoPath` if there is none."""
    pred: dict[str, list[str]] = {}
    dist = _dijkstra(graph, source, weight, target=target, pred=pred)
    if target not in dist:
        raise NoPath(f"no path from {source!r} to {target!r}")
    path = [target]
    while path[-1] != source:
        path.append(pred[path[-1]][0])
    return path[::-1]


def all_shortest_paths(graph: DiGraph, source: str, target: str, weight: Weight) -> list[list[str]]:
    """Every shortest path from ``source`` to ``target``; `NoPath` if there is none."""
    pred: dict[str, list[str]] = {source: []}
    dist = _dijkstra(graph, source, weight, pred=pred, all_preds=True)
    if target not in dist:
        raise NoPath(f"no path from {source!r} to {target!r}")
    paths = []
    stack = [[target]]
    while stack:  # from the target back along every predecessor
        path = stack.pop()
        if path[-1] == source:
            paths.append(path[::-1])
        else:
            stack.extend(path + [p] for p in pred[path[-1]])
    return paths


def weakly_connected_components(graph: DiGraph) -> Iterator[set[str]]:
    """The sets of nodes joined by edges in either direction."""
    seen: set[str] = set()
    for start in graph:
        if start in seen:
            continue
        component = {start}
        frontier = [start]
        while frontier:
            node = frontier.pop()
            for other in (*graph.adj[node], *graph.pred[node]):
                if other not in component:
                    component.add(other)
                    frontier.append(other)
        seen |= component
        yield component
