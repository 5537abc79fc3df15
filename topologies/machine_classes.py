"""Which machines of a cluster are renamed copies of one another, so routing inside one serves them all.

The cluster generators copy one machine under the prefix ``n<m>.`` (`machines.copy_machines`). Two
machines are of one class when, with their prefixes stripped, they have the same nodes in the same order,
the same links, the same node attributes (a string naming one of the machine's own nodes compared without
its prefix) and link attributes (links name no nodes), and the same nodes reach the network; then a route,
a nearest NIC or a ring inside machine m is the one of the class's first machine with the names moved over.
Machines whose nodes do not all carry their prefix are a class of their own.
"""

from __future__ import annotations

import networkx as nx


def prefix(machine: int) -> str:
    return f"n{machine}."


def rename(node: str, source: int, target: int) -> str:
    """``node`` of machine ``source`` as the same node of machine ``target`` (same class)."""
    return prefix(target) + node[len(prefix(source)):]


def machine_classes(graph: nx.DiGraph, network: int) -> dict[int, int]:
    """Each machine -> the first machine of its class (itself when it is the first or has no copies).

    Each machine is compared with the first machines of the classes whose node names (prefix stripped)
    it shares: a comparison of dicts, far cheaper than hashing every attribute of a 16,384-GPU cluster."""
    machine_of = dict(graph.nodes(data="machine"))
    members: dict[int, list[str]] = {}
    for n, m in machine_of.items():  # in the graph's order, which copies share
        if m != network:
            members.setdefault(m, []).append(n)
    on_network = {u for v, m in machine_of.items() if m == network for u in graph.predecessors(v)}
    firsts: dict[tuple[str, ...], list[int]] = {}  # stripped node names -> first machines of classes
    classes = {}
    for m in sorted(members):
        pre = prefix(m)
        if not all(n.startswith(pre) for n in members[m]):
            classes[m] = m
            continue
        names = tuple(n[len(pre):] for n in members[m])
        candidates = firsts.setdefault(names, [])
        same = next((r for r in candidates if _same(graph, machine_of, on_network, members, m, r)), None)
        if same is None:
            candidates.append(m)
        classes[m] = m if same is None else same
    return classes


def _same(graph: nx.DiGraph, machine_of: dict, on_network: set, members: dict, m: int, r: int) -> bool:
    """Whether machine ``m`` is a renamed copy of machine ``r`` (their stripped node names are equal)."""
    pm, pr = prefix(m), prefix(r)
    cut_m, cut_r = len(pm), len(pr)
    # networkx's own node and adjacency dicts, read only: its views cost a call per item, and a cluster of
    # 2,048 machines has 100k items to compare
    nodes, succ = graph._node, graph._succ
    for x, y in zip(members[m], members[r], strict=True):
        if (x in on_network) != (y in on_network) or not _same_attrs(nodes[x], nodes[y], pm, pr):
            return False
        out_x = [(v[cut_m:], d) for v, d in succ[x].items() if machine_of[v] == m]
        out_y = [(v[cut_r:], d) for v, d in succ[y].items() if machine_of[v] == r]
        if out_x != out_y:  # names and attributes, compared as dicts
            return False
    return True


def _same_attrs(a: dict, b: dict, pa: str, pb: str) -> bool:
    """Node attributes equal, besides the machine number, with own-node names compared without prefix."""
    if a.keys() != b.keys():
        return False
    for k, va in a.items():
        if k == "machine":
            continue
        vb = b[k]
        own_a = isinstance(va, str) and va.startswith(pa)
        own_b = isinstance(vb, str) and vb.startswith(pb)
        if own_a != own_b or (va[len(pa):] != vb[len(pb):] if own_a else va != vb):
            return False
    return True
