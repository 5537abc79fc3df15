"""`Topology`: the graph of one machine or cluster, with routing and per-node queries.

Routing rules (one transfer = one route = the list of directed edges it uses):

- NVLink first, then PCIe peer-to-peer through switches, then through the host bridge and the
  inter-socket link: a shortest path on a weight per hop (`HOP_COST`) plus a toll for crossing a cpu.
- No forwarding through another GPU or through a DRAM node (our copies are not relayed by peers).
- Inside one machine a route stays in that machine. Between machines it goes GPU -> (PCIe) -> the NIC
  nearest the GPU -> network -> the NIC nearest the other GPU -> GPU (GPUDirect RDMA); GPUs equally
  near several NICs are spread over them. Across a multi-tier network the equal shortest paths are chosen
  by destination (`_network_path`).
- Without P2P (``p2p: false``) a GPU-to-GPU copy is staged through host memory: `gpu_copy_legs` returns
  the transfers (two in a machine, three between machines) and `route` the legs joined.
"""

from __future__ import annotations

import re
from functools import cached_property

import networkx as nx

from trainsim.errors import TrainsimError, unknown_name

from .machine_classes import machine_classes, prefix, rename
from .network_paths import NetworkPaths
from .schema import TopologySpec

Edge = tuple[str, str]
Route = list[Edge]

HOP_COST = {"nvlink": 1, "pcie": 10, "upi": 40, "ib": 100, "ethernet": 100, "dram": 1}
CPU_TRANSIT_COST = 30  # P2P through the host bridge only when no switch path exists
NETWORK = -1  # the machine number of network switches: outside every machine


_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> list:
    """``name`` as its text and numbers, so that gpu2 sorts before gpu10."""
    return [int(part) if part.isdigit() else part for part in _DIGITS.split(name)]


class Topology:
    """One machine or a cluster: ``graph`` plus routing. Build it with `load_topology`."""

    def __init__(self, spec: TopologySpec, graph: nx.DiGraph, *, source: str | None = None):
        self.spec = spec
        self.graph = graph
        self.name = spec.name
        self.description = spec.description
        self.sources = list(spec.sources)
        self.source = source
        self.p2p = spec.p2p
        self._routes: dict[Edge, tuple[Edge, ...]] = {}
        self._paths: dict[Edge, tuple[Edge, ...]] = {}
        self._nic_paths: dict[Edge, tuple[Edge, ...]] = {}  # NIC -> NIC across the network
        self._out_legs: dict[str, tuple[tuple[Edge, ...], str]] = {}  # node -> (path to its NIC, the NIC)
        self._in_legs: dict[str, tuple[tuple[Edge, ...], str]] = {}  # node -> (path from its NIC, the NIC)
        self._host: dict[str, str] = {}
        self._nic: dict[str, str] = {}
        self._ports: dict[str, dict[str, int]] = {}
        self._port_of: dict[str, int] = {}
        self.memo: dict = {}  # what other modules derive from this topology and keep (collective hops, ...)

    def __repr__(self) -> str:
        return f"Topology({self.name!r}, {len(self.gpus)} GPUs, {self.graph.number_of_nodes()} nodes)"

    # ---- nodes -------------------------------------------------------------------------------------------
    def _of_kind(self, kind: str) -> list[str]:
        nodes = [n for n, k in self.graph.nodes(data="kind") if k == kind]
        return sorted(nodes, key=lambda n: (self.graph.nodes[n]["machine"], natural_key(n)))

    @cached_property
    def _machine(self) -> dict[str, int]:
        """Node -> machine number, for hot loops (routing thousands of pairs): a plain dict lookup."""
        return dict(self.graph.nodes(data="machine"))

    @cached_property
    def gpus(self) -> list[str]:
        """GPU node names by global GPU index: gpu i is ``gpus[i]``."""
        return self._of_kind("gpu")

    @cached_property
    def edge_attrs(self) -> dict[tuple[str, str], dict]:
        """Directed edge -> its attributes (the graph's own dicts), for hot loops over routes: a plain dict
        lookup instead of a networkx view per edge. Besides the graph's links: each NVSwitch's NVLS engine
        where the switch gives it a throughput (`nvls_engine`), a resource that no route but NVLS crosses."""
        attrs = {(u, v): d for u, v, d in self.graph.edges(data=True)}
        for switch, bandwidth in self.graph.nodes(data="nvls_bandwidth"):
            if bandwidth is not None:
                attrs[switch, switch] = {"kind": "nvls", "bandwidth": bandwidth, "raw_bandwidth": bandwidth,
                                         "latency": 0.0, "count": 1, "generation": None, "lanes": None}
        return attrs

    def nvls_engine(self, switch: str) -> Edge | None:
        """The edge that stands for ``switch``'s NVLS engines ((switch, switch)), if the switch gives them a
        throughput of their own (``nvls_gbps``); else None (the ports bind)."""
        return (switch, switch) if (switch, switch) in self.edge_attrs else None

    @cached_property
    def edge_kind(self) -> dict[tuple[str, str], str]:
        """Directed edge -> its kind (pcie, nvlink, ...), for hot loops over routes."""
        return {e: d["kind"] for e, d in self.edge_attrs.items()}

    @cached_property
    def gpu_index(self) -> dict[str, int]:
        """GPU name -> global GPU index (the position in ``gpus``)."""
        return {g: i for i, g in enumerate(self.gpus)}

    @cached_property
    def cpus(self) -> list[str]:
        return self._of_kind("cpu")

    @cached_property
    def nics(self) -> list[str]:
        return self._of_kind("nic")

    @cached_property
    def machines(self) -> list[int]:
        """Machine numbers that hold nodes (network switches, machine -1, left out)."""
        return sorted({m for _, m in self.graph.nodes(data="machine") if m != NETWORK})

    def _node(self, node: str, kind: str | None = None) -> dict:
        if node not in self.graph or (kind and self.graph.nodes[node]["kind"] != kind):
            valid = self.gpus if kind == "gpu" else list(self.graph.nodes)
            raise unknown_name(kind or "node", node, valid, file=self.source)
        return self.graph.nodes[node]

    def machine_of(self, node: str) -> int:
        """The machine (node of a cluster) a graph node is in; 0 on single boxes, -1 for network switches."""
        machine = self._machine.get(node)
        return self._node(node)["machine"] if machine is None else machine  # unknown: _node says so

    def gpu_spec(self, gpu: str) -> str:
        return self._node(gpu, "gpu")["spec"]

    def pageable_rate(self, node: str) -> float:
        """Bytes/s of a pageable copy between a GPU and the host memory of the socket nearest ``node``: the
        rate one core stages it at (the cpu node's ``pageable_gbps``)."""
        dram = self.host_memory(node)
        return self.graph.nodes[self.graph.nodes[dram]["cpu"]]["pageable_rate"]

    def gpu_memory(self, gpu: str) -> int:
        """Device memory in bytes."""
        return self._node(gpu, "gpu")["memory"]

    def edge(self, u: str, v: str) -> dict:
        """The attributes of directed edge u -> v."""
        return self.graph.edges[u, v]

    def host_memory(self, node: str) -> str:
        """The DRAM node of the socket nearest ``node`` (a GPU, a cpu, any node of a machine)."""
        attrs = self._node(node)
        if attrs["kind"] == "dram":
            return node
        if attrs["kind"] == "cpu":
            return attrs["dram"]
        if node not in self._host:
            machine = attrs["machine"]
            first = self.representative(machine)
            if first != machine:  # a copy of an earlier machine: its answer, renamed
                self._host[node] = rename(self.host_memory(rename(node, machine, first)), first, machine)
                return self._host[node]
            dist = self._distances(node, {machine})
            cpus = [c for c in self.cpus if c in dist]
            if not cpus:
                raise TrainsimError(f"{node!r} reaches no cpu socket, so it has no host memory",
                                    file=self.source)
            nearest = min(cpus, key=lambda c: dist[c])
            self._host[node] = self.graph.nodes[nearest]["dram"]
        return self._host[node]

    # ---- machine classes ----------------------------------------------------------------------------------
    @cached_property
    def _classes(self) -> dict[int, int]:
        return machine_classes(self.graph, NETWORK)

    def representative(self, machine: int) -> int:
        """The first machine of ``machine``'s class (`machine_classes`): routes, nearest NICs and host
        memory inside ``machine`` are that machine's, renamed. A machine without copies (or the network) is
        its own."""
        if machine == NETWORK or len(self.machines) < 2:
            return machine
        return self._classes.get(machine, machine)

    def rename(self, node: str, machine: int) -> str:
        """``node`` (in a machine of the class of ``machine``) as the same node of ``machine``."""
        return rename(node, self.machine_of(node), machine)

    # ---- routing ------------------------------------------------------------------------------------------
    def _weight(self, dst: str | None, machines: set[int]):
        nodes = self.graph.nodes

        def weight(u, v, data):
            if v != dst:
                if nodes[v]["kind"] in ("gpu", "dram") or nodes[v]["machine"] not in machines:
                    return None  # no forwarding through GPUs or memory; stay inside the machine(s)
            cost = HOP_COST[data["kind"]]
            if nodes[v]["kind"] == "cpu" and v != dst:
                cost += CPU_TRANSIT_COST
            return cost

        return weight

    def _distances(self, src: str, machines: set[int]) -> dict[str, float]:
        return nx.single_source_dijkstra_path_length(self.graph, src, weight=self._weight(None, machines))

    def _path(self, src: str, dst: str, machines: set[int]) -> tuple[Edge, ...]:
        """The edges from ``src`` to ``dst`` staying inside ``machines``, the machines of ``src`` and ``dst``
        (so kept per pair: read-only, shared)."""
        key = (src, dst)
        path = self._paths.get(key)
        if path is not None:  # cached: cross-machine routes share their GPU -> NIC segments
            return path
        machine = next(iter(machines)) if len(machines) == 1 else NETWORK
        first = self.representative(machine)
        if first != machine:  # inside a copy of an earlier machine: that machine's path, renamed
            here, there = prefix(machine), prefix(first)
            cut, back = len(here), len(there)
            route = self._path(there + src[cut:], there + dst[cut:], {first})
            path = self._paths[key] = tuple((here + u[back:], here + v[back:]) for u, v in route)
        elif machines == {NETWORK}:
            path = self._paths[key] = self._across_network(src, dst)
        else:
            try:
                nodes = nx.dijkstra_path(self.graph, src, dst, weight=self._weight(dst, machines))
            except nx.NetworkXNoPath:
                raise TrainsimError(f"no route from {src!r} to {dst!r}", file=self.source) from None
            path = self._paths[key] = tuple(zip(nodes, nodes[1:], strict=False))
        return path

    def _across_network(self, src: str, dst: str) -> tuple[Edge, ...]:
        """The edges from ``src`` to ``dst`` over network switches only (`_network_path`)."""
        try:
            nodes = self._network_path(src, dst)
        except nx.NetworkXNoPath:
            raise TrainsimError(f"no route from {src!r} to {dst!r}", file=self.source) from None
        return tuple(zip(nodes, nodes[1:], strict=False))

    @cached_property
    def _network_paths(self) -> NetworkPaths | None:
        """The search-free router when every network hop costs the same (else None: networkx per pair)."""
        if not NetworkPaths.uniform(self.graph, NETWORK, lambda d: HOP_COST[d["kind"]]):
            return None
        return NetworkPaths(self.graph, NETWORK, natural_key)

    def _network_path(self, src: str, dst: str) -> list[str]:
        """Between two NICs: one of the equal shortest paths, picked by the destination's port number on its
        leaf switch modulo their number (static destination-based routing, "D-mod-k", as InfiniBand
        fat-tree routing does), so traffic to the NICs under one leaf spreads over the spines."""
        if self._network_paths is not None:
            nodes = self._network_paths.path(src, dst, lambda: self._leaf_port(dst))
            if nodes is None:
                raise nx.NetworkXNoPath
            return nodes
        return self._searched_network_path(src, dst)

    def _searched_network_path(self, src: str, dst: str) -> list[str]:
        """`_network_path` by listing every shortest path (networkx): any link costs, and the reference."""
        paths = sorted(nx.all_shortest_paths(self.graph, src, dst, weight=self._weight(dst, {NETWORK})),
                       key=lambda path: [natural_key(n) for n in path])
        if len(paths) == 1:
            return paths[0]
        return paths[self._leaf_port(dst) % len(paths)]

    def _leaf_port(self, nic: str) -> int:
        """The position of ``nic`` among the NICs on its (first) network switch, in name order."""
        if nic not in self._port_of:  # kept: asked for every path that ends at the NIC
            self._port_of[nic] = self._find_leaf_port(nic)
        return self._port_of[nic]

    def _find_leaf_port(self, nic: str) -> int:
        machine = self._machine  # plain dicts: asked for each of 16k NICs
        leaf = next((v for v in self.graph.successors(nic) if machine[v] == NETWORK), None)
        if leaf is None:
            return 0
        if leaf not in self._ports:
            nodes = self.graph.nodes
            ports = sorted((u for u in self.graph.predecessors(leaf) if nodes[u]["kind"] == "nic"),
                           key=lambda n: (machine[n], natural_key(n)))
            self._ports[leaf] = {n: i for i, n in enumerate(ports)}
        return self._ports[leaf][nic]

    def nic_of(self, node: str) -> str:
        """The network-attached NIC that traffic of ``node`` leaves its machine through."""
        if node not in self._nic:
            machine = self.machine_of(node)
            first = self.representative(machine)
            if first != machine:  # a copy of an earlier machine: its answer, renamed
                self._nic[node] = rename(self.nic_of(rename(node, machine, first)), first, machine)
                return self._nic[node]
            nics = [n for n in self.nics if self.graph.nodes[n]["machine"] == machine
                    and any(self.graph.nodes[x]["machine"] == NETWORK for x in self.graph.successors(n))]
            if self.graph.nodes[node]["kind"] == "gpu":
                self._assign_nics(machine, nics)
            else:
                dist = self._distances(node, {machine})
                near = [n for n in nics if n in dist]
                if near:
                    self._nic[node] = min(near, key=lambda n: dist[n])
            if node not in self._nic:
                raise TrainsimError(f"{node!r} reaches no NIC on a network", file=self.source)
        return self._nic[node]

    def _assign_nics(self, machine: int, nics: list[str]) -> None:
        """Each GPU of a machine gets its nearest NIC; GPUs equally near several NICs share them out."""
        load = dict.fromkeys(nics, 0)
        for gpu in (g for g in self.gpus if self.graph.nodes[g]["machine"] == machine):
            dist = self._distances(gpu, {machine})
            near = [n for n in nics if n in dist]
            if not near:
                continue
            best = min(dist[n] for n in near)
            choice = min((n for n in near if dist[n] == best), key=lambda n: load[n])
            load[choice] += 1
            self._nic[gpu] = choice

    def _direct(self, src: str, dst: str, m_src: int, m_dst: int) -> tuple[Edge, ...]:
        """A single transfer's path (GPUDirect between machines), ignoring the P2P setting; ``m_src`` and
        ``m_dst`` are the machines of ``src`` and ``dst``."""
        if m_src == m_dst or NETWORK in (m_src, m_dst):
            return self._path(src, dst, {m_src, m_dst})
        out, nic_src = self._to_network(src, m_src)
        into, nic_dst = self._from_network(dst, m_dst)
        between = self._nic_paths.get((nic_src, nic_dst))
        if between is None:  # kept apart from `_paths`: no frozenset key per pair of NICs
            between = self._nic_paths[nic_src, nic_dst] = self._across_network(nic_src, nic_dst)
        return out + between + into

    def _to_network(self, node: str, machine: int) -> tuple[tuple[Edge, ...], str]:
        """(the edges from ``node`` to its NIC, that NIC); kept per node: every route that leaves the
        machine from it starts so."""
        leg = self._out_legs.get(node)
        if leg is None:
            nic = self.nic_of(node)
            leg = self._out_legs[node] = (self._path(node, nic, {machine}), nic)
        return leg

    def _from_network(self, node: str, machine: int) -> tuple[tuple[Edge, ...], str]:
        """(the edges from the NIC of ``node`` to it, that NIC); kept per node, as `_to_network`."""
        leg = self._in_legs.get(node)
        if leg is None:
            nic = self.nic_of(node)
            leg = self._in_legs[node] = (self._path(nic, node, {machine}), nic)
        return leg

    def route(self, src: str, dst: str) -> Route:
        """The directed edges a transfer from ``src`` to ``dst`` uses (see the module docstring)."""
        return list(self.route_edges(src, dst))

    def route_edges(self, src: str, dst: str) -> tuple[Edge, ...]:
        """`route` as the kept tuple itself (read-only, shared by every caller): for hot loops that only
        read it, without a copy per call."""
        route = self._routes.get((src, dst))
        if route is None:
            m_src, m_dst = self.machine_of(src), self.machine_of(dst)  # both known, else a one-line error
            if src == dst:
                route = ()
            elif not self.p2p and self._is_gpu(src) and self._is_gpu(dst):
                route = tuple(edge for leg in self.gpu_copy_legs(src, dst) for edge in leg)
            else:
                route = self._direct(src, dst, m_src, m_dst)
            self._routes[src, dst] = route
        return route

    def _is_gpu(self, node: str) -> bool:
        return self.graph.nodes[node]["kind"] == "gpu"

    def gpu_copy_legs(self, a: str, b: str) -> list[Route]:
        """The transfers of a GPU-to-GPU copy: ``[route]`` with P2P, else staged through host memory.

        Without P2P: ``[a -> host memory of a, host memory -> b]`` in one machine; between machines
        ``[a -> its host memory, that -> host memory of b, that -> b]``. A copy within one GPU: ``[]``.
        """
        self._node(a, "gpu")
        self._node(b, "gpu")
        if a == b:
            return []
        if self.p2p:
            return [self.route(a, b)]
        host_a, host_b = self.host_memory(a), self.host_memory(b)
        if self.machine_of(a) == self.machine_of(b):
            legs = [(a, host_a), (host_a, b)]
        else:
            legs = [(a, host_a), (host_a, host_b), (host_b, b)]
        return [list(self._direct(u, v, self.machine_of(u), self.machine_of(v))) for u, v in legs]

    def route_latency(self, route: Route) -> float:
        """Seconds: the sum of the edges' latencies."""
        attrs = self.edge_attrs
        return sum(attrs[e]["latency"] for e in route)

    def bottleneck(self, route: Route) -> float:
        """Bytes/s: the smallest edge bandwidth on the route (infinite for an empty route)."""
        attrs = self.edge_attrs
        return min((attrs[e]["bandwidth"] for e in route), default=float("inf"))

    # ---- checks -------------------------------------------------------------------------------------------
    def check_routes(self) -> None:
        """Raise a TrainsimError naming two GPUs that have no route between them, if any."""
        by_machine: dict[int, list[str]] = {}
        for gpu in self.gpus:
            by_machine.setdefault(self.machine_of(gpu), []).append(gpu)
        infra: dict[int, list[str]] = {}  # each machine's nodes that may carry traffic
        for n, d in self.graph.nodes(data=True):
            if d["kind"] not in ("gpu", "dram"):
                infra.setdefault(d["machine"], []).append(n)
        for machine, gpus in by_machine.items():
            if self.representative(machine) == machine:  # a copy routes as its class's first machine
                self._check_machine(infra.get(machine, []), gpus)
        if len(by_machine) > 1:
            fabric = self.graph.subgraph(
                [n for n, d in self.graph.nodes(data=True) if d["kind"] == "nic" or d["machine"] == NETWORK])
            component = {n: i for i, comp in enumerate(nx.weakly_connected_components(fabric)) for n in comp}
            first = None
            for gpu in self.gpus:
                try:
                    nic = self.nic_of(gpu)
                except TrainsimError:
                    raise TrainsimError(f"{gpu} reaches no NIC on a network, so no route to other machines",
                                        file=self.source, field="links") from None
                if first is None:
                    first = (gpu, component[nic])
                elif component[nic] != first[1]:
                    raise TrainsimError(f"no route between {first[0]} and {gpu}: their NICs' networks are "
                                        "not connected", file=self.source, field="links")

    def _check_machine(self, infra_nodes: list[str], gpus: list[str]) -> None:
        infra = self.graph.subgraph(infra_nodes)
        component = {n: i for i, comp in enumerate(nx.weakly_connected_components(infra)) for n in comp}
        reach = {g: {component[n] for n in self.graph.successors(g) if n in component} for g in gpus}
        if not (gpus and set.intersection(*reach.values())):  # else one fabric every GPU touches: all routes
            for i, a in enumerate(gpus):
                for b in gpus[i + 1:]:
                    if not (reach[a] & reach[b]) and not self.graph.has_edge(a, b):
                        raise TrainsimError(f"no route between {a} and {b}", file=self.source, field="links")
        sockets = {component[c] for c in self.cpus if c in component}
        for g in gpus:
            if not reach[g] & sockets:  # only through other GPUs, if at all: as the simulator would look
                try:
                    self.host_memory(g)
                except TrainsimError as exc:
                    raise TrainsimError(f"{exc.reason} (link it to one, e.g. through a pcie_switch)",
                                        file=self.source, field="links") from None
