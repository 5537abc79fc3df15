"""Which machines of a cluster are renamed copies of one another, so routing inside one serves them all.

The cluster generators copy one machine under the prefix ``n<m>.`` (`machines.copy_machines`). Two
machines are of one class when, with their prefixes stripped, they have the same nodes, the same links and
the same attributes, and the same nodes reach the network; then a route, a nearest NIC or a ring inside
machine m is the one of the class's first machine with the names moved over. Machines whose nodes do not
all carry their prefix are a class of their own.
"""

from __future__ import annotations

import networkx as nx


def prefix(machine: int) -> str:
    return f"n{machine}."


def rename(node: str, source: int, target: int) -> str:
    """``node`` of machine ``source`` as the same node of machine ``target`` (same class)."""
    return prefix(target) + node[len(prefix(source)):]


def machine_classes(graph: nx.DiGraph, network: int) -> dict[int, int]:
    """Each machine -> the first machine of its class (itself when it is the first or has no copies)."""
    nodes = graph.nodes
    members: dict[int, list[str]] = {}
    for n, m in nodes(data="machine"):
        if m != network:
            members.setdefault(m, []).append(n)
    first: dict[tuple, int] = {}
    classes = {}
    for m in sorted(members):
        sig = _signature(graph, m, members[m], network)
        classes[m] = m if sig is None else first.setdefault(sig, m)
    return classes


def _signature(graph: nx.DiGraph, machine: int, names: list[str], network: int) -> tuple | None:
    """The machine with its prefix stripped, as something hashable; None if a node lacks the prefix."""
    pre = prefix(machine)
    cut = len(pre)
    if not all(n.startswith(pre) for n in names):
        return None
    nodes = graph.nodes

    def plain(attrs: dict) -> tuple:
        # in the attributes' own order: copies are built by the same code, so it matches (and a mismatch
        # only makes two classes where one would do)
        return tuple((k, v[cut:] if isinstance(v, str) and v.startswith(pre) else _hashable(v))
                     for k, v in attrs.items() if k != "machine")

    items = []
    for n in names:  # in the graph's order, which copies share
        on_network = any(nodes[v]["machine"] == network for v in graph.successors(n))
        items.append((n[cut:], plain(nodes[n]), on_network))
        for v, attrs in graph.adj[n].items():
            if nodes[v]["machine"] == machine:
                items.append((n[cut:], v[cut:], plain(attrs)))
    return tuple(items)


def _hashable(value):
    if isinstance(value, str | int | float | bool | None):
        return value
    if isinstance(value, list | tuple):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value
