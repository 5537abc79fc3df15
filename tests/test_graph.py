"""topologies/graph.py: the topology graph and its searches agree with networkx, which they replace."""

import random

import networkx as nx
import pytest

from trainsim.topologies import load_topology
from trainsim.topologies.graph import (
    DiGraph,
    NoPath,
    all_shortest_paths,
    dijkstra_lengths,
    dijkstra_path,
    weakly_connected_components,
)


def random_pair(seed: int, nodes: int = 30, edges: int = 90) -> tuple[DiGraph, nx.DiGraph]:
    """The same random graph with small integer costs (many ties) in both libraries, in the same order."""
    rng = random.Random(seed)
    ours, theirs = DiGraph("g"), nx.DiGraph()
    for i in range(nodes):
        ours.add_node(f"v{i}", kind="x")
        theirs.add_node(f"v{i}", kind="x")
    for _ in range(edges):
        u, v = rng.sample(range(nodes), 2)
        cost = rng.choice([1, 1, 2, 3])
        ours.add_edge(f"v{u}", f"v{v}", cost=cost)
        theirs.add_edge(f"v{u}", f"v{v}", cost=cost)
    return ours, theirs


def weight(u, v, d):
    return None if d["cost"] == 3 and u.endswith("7") else d["cost"]  # some edges barred, as routing does


@pytest.mark.parametrize("seed", range(8))
def test_searches_match_networkx_ties_included(seed):
    ours, theirs = random_pair(seed)
    for src in list(ours)[:10]:
        assert dijkstra_lengths(ours, src, weight) == nx.single_source_dijkstra_path_length(theirs, src,
                                                                                             weight=weight)
        for dst in ours:
            try:
                expected = nx.dijkstra_path(theirs, src, dst, weight=weight)
            except nx.NetworkXNoPath:
                with pytest.raises(NoPath):
                    dijkstra_path(ours, src, dst, weight)
                continue
            assert dijkstra_path(ours, src, dst, weight) == expected
            assert sorted(all_shortest_paths(ours, src, dst, weight)) == sorted(
                nx.all_shortest_paths(theirs, src, dst, weight=weight))


@pytest.mark.parametrize("seed", range(3))
def test_weak_components_match_networkx(seed):
    ours, theirs = random_pair(seed, nodes=40, edges=30)
    assert sorted(map(sorted, weakly_connected_components(ours))) == sorted(
        map(sorted, nx.weakly_connected_components(theirs)))


def test_views_answer_as_networkx_does():
    topo = load_topology("dgx-a100")
    graph = topo.graph
    theirs = nx.DiGraph()
    theirs.add_nodes_from(graph.nodes(data=True))
    theirs.add_edges_from(graph.edges(data=True))
    assert list(graph.nodes) == list(theirs.nodes)
    assert list(graph.nodes(data="kind")) == list(theirs.nodes(data="kind"))
    assert list(graph.edges) == list(theirs.edges)
    assert list(graph.edges(data="kind")) == list(theirs.edges(data="kind"))
    assert list(graph.out_edges("gpu0", data=True)) == list(theirs.out_edges("gpu0", data=True))
    assert list(graph.in_edges(["gpu0", "gpu1"])) == list(theirs.in_edges(["gpu0", "gpu1"]))
    assert len(graph.edges(data=True)) == theirs.number_of_edges() == graph.number_of_edges()
    assert list(graph.successors("gpu0")) == list(theirs.successors("gpu0"))
    assert list(graph.predecessors("gpu0")) == list(theirs.predecessors("gpu0"))
    assert graph.out_degree("gpu0") == theirs.out_degree("gpu0")
    assert graph.edges["gpu0", "nvsw0"] is graph.adj["gpu0"]["nvsw0"]
    assert ("gpu0", "nvsw0") in graph.edges and "gpu0" in graph and "gpu99" not in graph
    assert graph.get_edge_data("gpu0", "gpu1") is None


def test_copies_own_their_attributes_and_subgraphs_share_them():
    graph = load_topology("dgx-a100").graph
    copy = graph.copy()
    copy.edges["gpu0", "nvsw0"]["bandwidth"] /= 2
    copy.nodes["gpu0"]["memory"] = 1
    assert graph.edges["gpu0", "nvsw0"]["bandwidth"] == 2 * copy.edges["gpu0", "nvsw0"]["bandwidth"]
    assert graph.nodes["gpu0"]["memory"] != 1
    sub = graph.subgraph(["gpu0", "nvsw0", "cpu0"])
    assert set(sub) == {"gpu0", "nvsw0", "cpu0"}
    assert set(sub.edges) == {e for e in graph.edges if set(e) <= {"gpu0", "nvsw0", "cpu0"}}
    assert sub.edges["gpu0", "nvsw0"] is graph.edges["gpu0", "nvsw0"]


def test_edges_can_be_iterated_again():
    graph = load_topology("dgx-a100").graph
    edges = graph.edges(data=True)
    assert list(edges) == list(edges)
