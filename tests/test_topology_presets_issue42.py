"""The presets users asked for (issue 42): DGX-1 with 32 GB V100s, DGX B200, 8x H100 PCIe (with and without
NVLink bridges) and 8x L40S. Each figure checked here follows from the `sources:` of its file."""

import pytest

from trainsim.sim.core.devices import GIB, get_device
from trainsim.topologies import links as phys
from trainsim.topologies import list_presets, load_topology, pcie_tree

GB = 1e9

# preset -> (GPUs, device spec, GiB per GPU)
NEW = {
    "dgx1-v100-32gb": (8, "v100-32gb", 32),
    "dgx-b200": (8, "b200", 180),
    "h100-pcie-8gpu": (8, "h100-pcie", 80),
    "h100-pcie-8gpu-nvlink": (8, "h100-pcie", 80),
    "l40s-8gpu": (8, "l40s", 48),
}


@pytest.fixture(scope="module")
def topos():
    return {name: load_topology(name) for name in NEW}


def nvlink_edges(topo):
    return [(u, v) for u, v, kind in topo.graph.edges(data="kind") if kind == "nvlink"]


def test_the_new_presets_are_built_in():
    assert set(NEW) <= set(list_presets())


@pytest.mark.parametrize("name", NEW)
def test_gpus_spec_and_memory(topos, name):
    gpus, device, gib = NEW[name]
    topo = topos[name]
    assert len(topo.gpus) == gpus and topo.sources
    for gpu in topo.gpus:
        spec = get_device(topo.gpu_spec(gpu))
        assert spec.name == device
        assert topo.gpu_memory(gpu) == gib * GIB == spec.memory_bytes


def test_nvlink5_is_50_gbps_per_link_and_nccls_40_1():
    per_link, share = phys.NVLINK[5]
    assert per_link == 50.0 and per_link * share == pytest.approx(40.1)  # NCCL src/graph/topo.h SM100


def test_dgx_b200(topos):
    topo = topos["dgx-b200"]
    for gpu in topo.gpus:
        port = topo.edge(gpu, "nvsw0")
        assert port["kind"] == "nvlink" and port["count"] == 18
        assert port["raw_bandwidth"] == pytest.approx(900 * GB)  # 1.8 TB/s both ways
        assert port["bandwidth"] == pytest.approx(18 * 40.1 * GB)
    switch = topo.graph.nodes["nvsw0"]
    assert switch["chips"] == 2 and switch["reduce"] is True
    assert topo.route("gpu0", "gpu7") == [("gpu0", "nvsw0"), ("nvsw0", "gpu7")]
    nics = [n for n, kind in topo.graph.nodes(data="kind") if kind == "nic"]
    assert len(nics) == 8 and all(topo.graph.nodes[n]["generation"] == "ndr" for n in nics)
    assert topo.edge("gpu0", "sw0")["generation"] == 5
    assert topo.edge("cpu0", "cpu1")["bandwidth"] == pytest.approx(40 * GB)  # NCCL's Emerald Rapids figure
    assert topo.edge("cpu0", "cpu0.dram")["raw_bandwidth"] == pytest.approx(8 * 5600e6 * 8)


def test_dgx1_v100_32gb_is_dgx1_v100_but_the_memory(topos):
    big, base = topos["dgx1-v100-32gb"], load_topology("dgx1-v100")
    assert set(big.graph.nodes) == set(base.graph.nodes)
    assert set(big.graph.edges) == set(base.graph.edges)
    for u, v in base.graph.edges:
        for key in ("kind", "count", "bandwidth", "raw_bandwidth", "latency"):
            assert big.edge(u, v)[key] == pytest.approx(base.edge(u, v)[key]), (u, v, key)
    assert big.gpu_memory("gpu0") == 2 * base.gpu_memory("gpu0")


def test_h100_pcie_without_and_with_nvlink_bridges(topos):
    plain, bridged = topos["h100-pcie-8gpu"], topos["h100-pcie-8gpu-nvlink"]
    assert not nvlink_edges(plain)
    for topo in (plain, bridged):
        link = topo.edge("sw0", "gpu0")
        assert link["generation"] == 5 and link["raw_bandwidth"] == pytest.approx(63.0e9, rel=1e-3)
    pairs = {tuple(sorted(e)) for e in nvlink_edges(bridged)}
    assert pairs == {("gpu0", "gpu1"), ("gpu2", "gpu3"), ("gpu4", "gpu5"), ("gpu6", "gpu7")}
    bridge = bridged.edge("gpu0", "gpu1")
    assert bridge["count"] == 12 and bridge["raw_bandwidth"] == pytest.approx(300 * GB)  # 600 GB/s both ways
    assert bridged.route("gpu0", "gpu1") == [("gpu0", "gpu1")]
    assert "nvlink" not in {bridged.edge(*e)["kind"] for e in bridged.route("gpu0", "gpu2")}


def test_l40s_has_no_nvlink_and_gen4_cards_behind_gen5_switches(topos):
    topo = topos["l40s-8gpu"]
    assert not nvlink_edges(topo) and topo.p2p
    for gpu in topo.gpus:
        (switch,) = [n for n in topo.graph.predecessors(gpu) if topo.graph.nodes[n]["kind"] == "pcie_switch"]
        link = topo.edge(switch, gpu)
        assert link["generation"] == 4 and link["raw_bandwidth"] == pytest.approx(31.5e9, rel=1e-3)
        assert topo.edge("cpu0" if gpu < "gpu4" else "cpu1", switch)["generation"] == 5
    assert topo.route("gpu0", "gpu1") == [("gpu0", "sw0"), ("sw0", "gpu1")]


def test_pcie_tree_gpu_generation_and_inter_socket_links():
    plain = load_topology(pcie_tree(gpus=4, generation=5, sockets=2))
    assert plain.edge("sw0", "gpu0")["generation"] == 5 and plain.edge("cpu0", "cpu1")["count"] == 1
    mixed = load_topology(pcie_tree(gpus=4, generation=5, gpu_generation=4, sockets=2, inter_socket="qpi",
                                    inter_socket_links=2))
    assert mixed.edge("sw0", "gpu0")["generation"] == 4 and mixed.edge("cpu0", "sw0")["generation"] == 5
    qpi = mixed.edge("cpu0", "cpu1")
    assert qpi["count"] == 2 and qpi["raw_bandwidth"] == pytest.approx(2 * 19.2 * GB)
    assert qpi["bandwidth"] == pytest.approx(6 * GB)  # NCCL's figure for the pair, whatever the count
