"""The Summit presets: one AC922 node (structure, link figures, routes) and 64 nodes on an EDR fat-tree."""

import pytest
from typer.testing import CliRunner

from trainsim.cli import app
from trainsim.topologies import load_topology

GB = 1e9


@pytest.fixture(scope="module")
def node():
    return load_topology("summit")


def test_a_node_has_six_v100s_two_power9s_and_two_edr_ports(node):
    assert node.gpus == [f"gpu{i}" for i in range(6)]
    assert node.cpus == ["cpu0", "cpu1"]
    assert all(node.gpu_spec(g) == "V100" and node.gpu_memory(g) == 16 * 2**30 for g in node.gpus)
    assert all(node.graph.nodes[c]["cores"] == 22 for c in node.cpus)
    assert [node.graph.nodes[n]["generation"] for n in node.nics] == ["edr", "edr"]


def test_each_socket_and_its_gpus_are_joined_pairwise_by_two_nvlink_bricks(node):
    for cpu, gpus in (("cpu0", ["gpu0", "gpu1", "gpu2"]), ("cpu1", ["gpu3", "gpu4", "gpu5"])):
        members = [cpu, *gpus]
        for i, a in enumerate(members):
            for b in members[i + 1:]:
                edge = node.edge(a, b)
                assert (edge["kind"], edge["count"]) == ("nvlink", 2)
                assert edge["raw_bandwidth"] == pytest.approx(50 * GB)  # 2 x 25 GB/s per direction
                assert edge["bandwidth"] == pytest.approx(40 * GB)  # NCCL's 20 GB/s per NVLink 2 link
        for g in gpus:  # no PCIe between a GPU and its host
            assert all(node.edge(g, n)["kind"] == "nvlink" for n in node.graph.successors(g))
    assert not node.graph.has_edge("gpu0", "gpu3")


def test_x_bus_dram_and_nic_links_carry_their_figures(node):
    xbus = node.edge("cpu0", "cpu1")
    assert xbus["kind"] == "upi" and xbus["bandwidth"] == pytest.approx(32 * GB)  # 64 GB/s both ways
    dram = node.edge("cpu0", "cpu0.dram")
    assert dram["raw_bandwidth"] == pytest.approx(8 * 2666e6 * 8)  # 8 channels of DDR4-2666
    for cpu, nic in (("cpu0", "nic0"), ("cpu1", "nic1")):
        pcie = node.edge(cpu, nic)
        assert (pcie["kind"], pcie["generation"], pcie["lanes"]) == ("pcie", 4, 8)


def test_routes_cross_sockets_over_the_x_bus_and_reach_host_memory_over_nvlink(node):
    assert node.route("gpu0", "gpu1") == [("gpu0", "gpu1")]
    assert node.route("gpu0", "gpu4") == [("gpu0", "cpu0"), ("cpu0", "cpu1"), ("cpu1", "gpu4")]
    assert node.host_memory("gpu4") == "cpu1.dram"
    assert node.route("gpu4", "cpu1.dram") == [("gpu4", "cpu1"), ("cpu1", "cpu1.dram")]


def test_the_64_node_cluster_is_a_non_blocking_two_tier_fat_tree():
    topo = load_topology("summit-64node")
    assert len(topo.gpus) == 384 and len(topo.machines) == 64
    switches = [n for n, k in topo.graph.nodes(data="kind") if k == "network_switch"]
    leaves = [s for s in switches if s.startswith("leaf")]
    spines = [s for s in switches if s.startswith("spine")]
    assert (len(leaves), len(spines)) == (8, 6)  # 144 up-links over the fewest spines dividing 18 evenly
    for leaf in leaves:  # at least as many ports up as down
        down = sum(1 for n in topo.graph.predecessors(leaf) if topo.graph.nodes[n]["kind"] == "nic")
        up = sum(topo.edge(leaf, s)["count"] for s in spines if topo.graph.has_edge(leaf, s))
        assert down <= 18 and up == 18  # the last leaf holds the one node left over (64 = 7 x 9 + 1)
    # GPUs of each socket leave the node through that socket's port
    assert topo.nic_of("n5.gpu1") == "n5.nic0" and topo.nic_of("n5.gpu4") == "n5.nic1"


def test_topo_show_summit():
    result = CliRunner().invoke(app, ["topo", "show", "summit"])
    assert result.exit_code == 0, result.output
    assert "xbus" in result.output and "NV2 x6" in result.output
