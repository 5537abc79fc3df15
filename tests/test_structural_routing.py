"""Routing at cluster scale without a search per pair: network paths by counting (`NetworkPaths`) equal the
listed-and-sorted shortest paths, and machines that copy an earlier one answer with its routes renamed,
exactly as searching them would; a machine that differs is its own class."""

from __future__ import annotations

import pytest

from trainsim.sim.collectives.rings import build_channels
from trainsim.topologies import load_topology
from trainsim.topologies.topology import NETWORK, Topology

NODE = {"generator": "pcie_tree", "gpus": 4, "gpu": "H100", "gpus_per_switch": 2, "nics_per_switch": 1,
        "nic_generation": "ndr", "generation": 5, "sockets": 2}
FABRICS = [
    {"generator": "fat_tree", "node": NODE, "nodes": 12, "radix": 8, "tiers": 3},  # 3 tiers: many equal paths
    {"generator": "fat_tree", "node": NODE, "nodes": 8, "radix": 12, "oversubscription": 2},
    {"generator": "rail_optimised", "node": NODE, "nodes": 9, "radix": 8},
    {"generator": "cluster", "node": NODE, "nodes": 3},
    "dgx-h100-fattree-2to1",
]


def _nics(topo):
    nodes = topo.graph.nodes
    return [n for n in topo.nics if any(nodes[v]["machine"] == NETWORK for v in topo.graph.successors(n))]


@pytest.mark.parametrize("source", FABRICS, ids=lambda s: s if isinstance(s, str) else s["generator"])
def test_counted_network_paths_equal_the_sorted_list(source):
    topo = load_topology(source)
    assert topo._network_paths is not None
    nics = _nics(topo)
    pairs = [(a, b) for i, a in enumerate(nics) for b in nics[i % 7::7] if a != b]  # a spread of pairs
    for a, b in pairs[:400]:
        assert topo._network_path(a, b) == topo._searched_network_path(a, b), (a, b)


class Searched(Topology):
    """The same topology with every machine its own class: every route searched."""

    def representative(self, machine: int) -> int:
        return machine


def test_copies_answer_as_a_search_would():
    source = {"generator": "fat_tree", "node": NODE, "nodes": 4, "radix": 8}
    topo, searched = load_topology(source), load_topology(source)
    searched.__class__ = Searched
    assert [topo.representative(m) for m in topo.machines] == [0, 0, 0, 0]
    for gpu in topo.gpus:
        assert topo.nic_of(gpu) == searched.nic_of(gpu)
        assert topo.host_memory(gpu) == searched.host_memory(gpu)
        for other in topo.gpus[::3]:
            assert topo.route(gpu, other) == searched.route(gpu, other)
    group = topo.gpus[12:16]  # machine 3, in a scrambled order
    group = [group[2], group[0], group[3], group[1]]
    assert build_channels(topo, group) == build_channels(searched, group)


def test_a_machine_that_differs_is_its_own_class():
    loaded = load_topology({"generator": "cluster", "node": NODE, "nodes": 3})
    graph = loaded.graph.copy()
    graph.edges["n2.sw0", "n2.gpu0"]["bandwidth"] /= 2  # a slower slot in machine 2 only
    topo = Topology(loaded.spec, graph)
    assert [topo.representative(m) for m in topo.machines] == [0, 0, 2]
    route = topo.route("n2.nic0", "n2.gpu0")
    assert topo.bottleneck(route) == topo.graph.edges["n2.sw0", "n2.gpu0"]["bandwidth"]
