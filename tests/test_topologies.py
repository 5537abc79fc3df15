"""The topology library: presets, physics of the links, routing, generators, analysis and bad input."""

import itertools

import pytest
import yaml

from trainsim.errors import TrainsimError
from trainsim.topologies import links as phys
from trainsim.topologies import (
    list_presets,
    load_spec,
    load_topology,
    nvlink_mesh,
    nvswitch_system,
    pcie_tree,
    save_topology,
)
from trainsim.topologies.analysis import bisection, describe, injection_bandwidth, path_class, route_report

# REFERENCE.md, "DGX-1 (V100)": NVLinks per GPU pair.
DGX1_LINKS = [[0, 2, 1, 1, 2, 0, 0, 0], [2, 0, 1, 2, 0, 1, 0, 0], [1, 1, 0, 2, 0, 0, 2, 0],
              [1, 2, 2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2, 1, 1], [0, 1, 0, 0, 2, 0, 1, 2],
              [0, 0, 2, 0, 1, 1, 0, 2], [0, 0, 0, 1, 1, 2, 2, 0]]


@pytest.fixture(scope="module")
def presets():
    return {name: load_topology(name) for name in list_presets()}


def kinds(topo, route):
    return [topo.edge(*e)["kind"] for e in route]


def test_required_presets_exist():
    names = set(list_presets())
    assert {"pcie-4gpu-gen3", "pcie-8gpu-2socket", "dgx1-v100", "dgx2-v100", "dgx-a100", "dgx-h100",
            "consumer-2gpu-nop2p"} <= names
    assert any(name.endswith("node") for name in names)  # at least one multi-node cluster


def test_every_preset_loads_with_sources_and_consistent_edges(presets):
    for name, topo in presets.items():
        assert topo.name == name and topo.sources and topo.gpus, name
        for u, v, d in topo.graph.edges(data=True):
            assert topo.graph.has_edge(v, u), (name, u, v)  # full duplex: two directed edges per link
            assert d["bandwidth"] > 0 and d["raw_bandwidth"] >= d["bandwidth"] and d["latency"] >= 0
            assert d["kind"] in phys.EDGE_KINDS and d["count"] >= 1
        for gpu in topo.gpus:
            assert topo.gpu_memory(gpu) > 0 and topo.gpu_spec(gpu)
        for cpu in topo.cpus:
            dram = topo.host_memory(cpu)
            assert topo.graph.nodes[dram]["kind"] == "dram" and topo.edge(cpu, dram)["kind"] == "dram"


def test_every_gpu_pair_has_a_chained_route_without_gpu_forwarding(presets):
    for name, topo in presets.items():
        gpus = topo.gpus if len(topo.gpus) <= 16 else topo.gpus[:9] + topo.gpus[-2:]
        for a, b in itertools.permutations(gpus, 2):
            route = topo.route(a, b)
            assert route[0][0] == a and route[-1][1] == b, (name, a, b)
            assert all(x[1] == y[0] for x, y in itertools.pairwise(route))
            middle = [v for _, v in route[:-1]]
            assert not any(topo.graph.nodes[v]["kind"] == "gpu" for v in middle), (name, a, b)
            if topo.p2p:
                assert not any(topo.graph.nodes[v]["kind"] == "dram" for v in middle), (name, a, b)


def test_dgx1_nvlink_counts_match_reference(presets):
    topo = presets["dgx1-v100"]
    for i, j in itertools.combinations(range(8), 2):
        a, b = topo.gpus[i], topo.gpus[j]
        edge = topo.graph.get_edge_data(a, b)
        assert (edge["count"] if edge else 0) == DGX1_LINKS[i][j], (i, j)
        if edge:
            assert edge["kind"] == "nvlink"
            assert edge["bandwidth"] == pytest.approx(DGX1_LINKS[i][j] * 20e9)  # NCCL: ~20 GB/s per link


def test_dgx1_routes_use_nvlink_else_pcie_and_qpi(presets):
    topo = presets["dgx1-v100"]
    for i, j in itertools.permutations(range(8), 2):
        route = topo.route(topo.gpus[i], topo.gpus[j])
        if DGX1_LINKS[i][j]:
            assert kinds(topo, route) == ["nvlink"]
        else:  # no peer forwarding: across the PCIe tree and QPI (every such pair spans the sockets)
            assert set(kinds(topo, route)) == {"pcie", "upi"}
            assert path_class(topo, topo.gpus[i], topo.gpus[j]) == "SYS"


def test_pcie_4gpu_route_stays_under_the_switch(presets):
    topo = presets["pcie-4gpu-gen3"]
    for a, b in itertools.permutations(topo.gpus, 2):
        assert topo.route(a, b) == [(a, "sw0"), ("sw0", b)]
    h2d = [("cpu0.dram", "cpu0"), ("cpu0", "sw0"), ("sw0", "gpu2")]
    assert topo.route(topo.host_memory("gpu2"), "gpu2") == h2d


def test_pcie_8gpu_2socket_routes(presets):
    topo = presets["pcie-8gpu-2socket"]
    assert kinds(topo, topo.route("gpu0", "gpu7")).count("upi") == 1
    assert path_class(topo, "gpu0", "gpu1") == "PIX"
    same_socket = topo.route("gpu0", "gpu2")  # another switch on the same socket: via the host bridge
    assert "upi" not in kinds(topo, same_socket) and ("sw0", "cpu0") in same_socket
    assert path_class(topo, "gpu0", "gpu2") == "PHB"
    assert topo.host_memory("gpu6") == "cpu1.dram"


def test_consumer_without_p2p_stages_through_host_memory(presets):
    topo = presets["consumer-2gpu-nop2p"]
    assert topo.p2p is False
    legs = topo.gpu_copy_legs("gpu0", "gpu1")
    host = topo.host_memory("gpu0")
    assert host == "cpu0.dram" and len(legs) == 2
    assert legs[0][0][0] == "gpu0" and legs[0][-1][1] == host
    assert legs[1][0][0] == host and legs[1][-1][1] == "gpu1"
    assert topo.route("gpu0", "gpu1") == legs[0] + legs[1]
    assert topo.gpu_copy_legs("gpu1", "gpu1") == []


def test_p2p_copy_is_one_leg(presets):
    topo = presets["dgx-a100"]
    assert topo.gpu_copy_legs("gpu0", "gpu3") == [topo.route("gpu0", "gpu3")]


def test_nvswitch_presets(presets):
    a100, h100 = presets["dgx-a100"], presets["dgx-h100"]
    route = a100.route("gpu0", "gpu5")
    assert route == [("gpu0", "nvsw0"), ("nvsw0", "gpu5")]
    per_link, share = phys.NVLINK[3]
    assert a100.bottleneck(route) == pytest.approx(12 * per_link * share * 1e9)
    assert a100.graph.nodes["nvsw0"]["reduce"] is False and h100.graph.nodes["nvsw0"]["reduce"] is True
    assert a100.graph.nodes["nvsw0"]["chips"] == 6 and h100.graph.nodes["nvsw0"]["chips"] == 4
    dgx2 = presets["dgx2-v100"]
    cross = dgx2.route("gpu0", "gpu15")
    assert kinds(dgx2, cross) == ["nvlink"] * 3 and dgx2.edge("nvsw0", "nvsw1")["count"] == 48


def test_cluster_routes_cross_the_network_through_nearest_nics(presets):
    topo = presets["dgx-a100-2node"]
    assert len(topo.gpus) == 16 and topo.machines == [0, 1]
    assert topo.gpus[8] == "n1.gpu0" and topo.machine_of("n1.gpu0") == 1 and topo.machine_of("netsw0") == -1
    route = topo.route("n0.gpu3", "n1.gpu6")
    assert kinds(topo, route) == ["pcie", "pcie", "ib", "ib", "pcie", "pcie"]
    nic = route[1][1]
    assert topo.graph.has_edge(route[0][1], nic) and route[0][1] == "n0.sw1"  # the NIC on the GPU's switch
    inside = topo.route("n1.gpu0", "n1.gpu1")
    assert all(topo.machine_of(v) == 1 for e in inside for v in e)
    nics = [topo.nic_of(g) for g in topo.gpus[:8]]
    assert len(set(nics)) == 8  # two GPUs and two NICs per switch: one NIC each


def test_host_to_device_route(presets):
    topo = presets["dgx1-v100"]
    route = topo.route(topo.host_memory("gpu5"), "gpu5")
    assert route[0] == ("cpu1.dram", "cpu1") and kinds(topo, route) == ["dram", "pcie", "pcie"]
    assert topo.route_latency(route) == pytest.approx(sum(topo.edge(*e)["latency"] for e in route))
    assert topo.bottleneck(route) == min(topo.edge(*e)["bandwidth"] for e in route)
    assert topo.route("gpu5", "gpu5") == [] and topo.bottleneck([]) == float("inf")


def test_link_physics():
    gen3 = phys.derive_link("pcie", 3, lanes=16)
    assert gen3.raw_bandwidth == pytest.approx(15.754e9, rel=1e-3)
    assert gen3.bandwidth == pytest.approx(gen3.raw_bandwidth * 128 / 152)
    assert phys.derive_link("pcie", 4, lanes=16).raw_bandwidth == pytest.approx(31.5e9, rel=1e-3)
    assert phys.derive_link("pcie", 5, lanes=8).raw_bandwidth == pytest.approx(31.5e9, rel=1e-3)
    assert phys.derive_link("nvlink", 2, count=2).bandwidth == pytest.approx(40e9)
    assert phys.derive_link("ib", "hdr").raw_bandwidth == pytest.approx(25e9)
    assert phys.derive_link("ethernet", 100).raw_bandwidth == pytest.approx(12.5e9)
    assert phys.dram_figures(8, 3200).raw_bandwidth == pytest.approx(204.8e9)
    with pytest.raises(KeyError):
        phys.derive_link("pcie", 9)


def test_measured_bandwidth_overrides_the_table():
    spec = {"name": "m", "nodes": [{"name": "cpu0", "kind": "cpu", "cores": 4, "dram_bandwidth_gbps": 20},
                                   {"name": "gpu0", "kind": "gpu", "spec": "cpu", "memory_gib": 8}],
            "links": [{"a": "cpu0", "b": "gpu0", "kind": "pcie", "bandwidth_gbps": 7.5, "latency_us": 3}]}
    topo = load_topology(spec)
    assert topo.edge("gpu0", "cpu0")["bandwidth"] == 7.5e9 and topo.edge("cpu0", "gpu0")["latency"] == 3e-6
    assert topo.edge("cpu0", "cpu0.dram")["bandwidth"] == 20e9
    assert topo.source is None and topo.gpu_spec("gpu0") == "cpu"


def test_pcie_tree_generator():
    topo = load_topology(pcie_tree(gpus=8, gpus_per_switch=2, generation=4, sockets=2, gpu="A100"))
    switches = [n for n, k in topo.graph.nodes(data="kind") if k == "pcie_switch"]
    assert len(switches) == 4 and len(topo.cpus) == 2 and topo.gpu_spec("gpu7") == "A100"
    for sw in switches:
        assert sum(topo.graph.nodes[n]["kind"] == "gpu" for n in topo.graph.successors(sw)) == 2
    assert topo.route("gpu0", "gpu1") == [("gpu0", "sw0"), ("sw0", "gpu1")]
    assert topo.graph.has_edge("cpu0", "sw1") and topo.graph.has_edge("cpu1", "sw2")
    assert topo.edge("gpu0", "sw0")["generation"] == 4
    rooted = load_topology({"generator": "pcie_tree", "gpus": 2, "gpus_per_switch": 0, "p2p": False})
    assert rooted.graph.has_edge("cpu0", "gpu0") and len(rooted.gpu_copy_legs("gpu0", "gpu1")) == 2


def test_nvlink_mesh_generator_reproduces_the_matrix():
    topo = load_topology(nvlink_mesh(DGX1_LINKS, sockets=2, gpus_per_switch=2))
    for i, j in itertools.combinations(range(8), 2):
        edge = topo.graph.get_edge_data(f"gpu{i}", f"gpu{j}")
        assert (edge["count"] if edge else 0) == DGX1_LINKS[i][j]
    with pytest.raises(TrainsimError, match="symmetric"):
        nvlink_mesh([[0, 1], [2, 0]])


def test_nvswitch_generator():
    topo = load_topology(nvswitch_system(gpus=16, links_per_gpu=6, nvlink_generation=2, boards=2))
    assert topo.edge("nvsw0", "nvsw1")["count"] == 6 * 8
    assert topo.edge("gpu9", "nvsw1")["count"] == 6 and topo.graph.nodes["nvsw0"]["chips"] == 6
    with pytest.raises(TrainsimError, match="boards"):
        nvswitch_system(gpus=9, links_per_gpu=6, boards=2)


def test_cluster_generator_from_a_mapping():
    node = {"generator": "pcie_tree", "gpus": 2, "nics_per_switch": 1, "gpus_per_switch": 2}
    topo = load_topology({"generator": "cluster", "node": node, "nodes": 3, "network": "ethernet",
                          "generation": 100})
    assert len(topo.gpus) == 6 and topo.gpus[-1] == "n2.gpu1" and topo.machine_of("n2.cpu0") == 2
    assert kinds(topo, topo.route("n0.gpu0", "n2.gpu1")).count("ethernet") == 2
    assert topo.host_memory("n1.gpu0") == "n1.cpu0.dram"


def test_analysis_figures_follow_the_graph(presets):
    topo = presets["dgx1-v100"]
    injection = injection_bandwidth(topo)
    out_edges = topo.graph.out_edges("gpu0", data=True)
    assert injection["gpu0"] == pytest.approx(sum(d["bandwidth"] for *_, d in out_edges))
    cut = bisection(topo)
    first = set(cut["from"])
    crossing = sum(d["bandwidth"] for u, v, d in topo.graph.edges(data=True)
                   if d["kind"] == "nvlink" and u in first and v not in first)
    assert cut["bandwidth"] == pytest.approx(crossing + topo.edge("cpu0", "cpu1")["bandwidth"])
    desc = describe(topo)
    assert desc["paths"] == {"NV1": 8, "NV2": 8, "SYS": 12}
    assert len(desc["links"]) == topo.graph.number_of_edges() // 2
    report = route_report(presets["consumer-2gpu-nop2p"], "0", "1")
    assert report["staged_through_host"] and len(report["legs"]) == 2


def test_save_topology_round_trip(tmp_path, presets):
    spec, _ = load_spec("dgx-a100")
    path = save_topology(spec, tmp_path / "a100.yaml")
    again = load_topology(str(path))
    original = presets["dgx-a100"]
    assert sorted(again.graph.edges) == sorted(original.graph.edges)
    assert again.edge("gpu0", "nvsw0") == original.edge("gpu0", "nvsw0")
    assert yaml.safe_load(path.read_text())["schema"] == "trainsim.topology/1"


# ---- bad input: one TrainsimError naming the file and the field --------------------------------------------
def _base():
    return {"schema": "trainsim.topology/1", "name": "t",
            "nodes": [{"name": "cpu0", "kind": "cpu", "cores": 8, "dram_bandwidth_gbps": 50},
                      {"name": "gpu0", "kind": "gpu", "spec": "V100"},
                      {"name": "gpu1", "kind": "gpu", "spec": "V100"}],
            "links": [{"a": "cpu0", "b": "gpu0", "kind": "pcie", "generation": 3},
                      {"a": "cpu0", "b": "gpu1", "kind": "pcie", "generation": 3}]}


def _error(tmp_path, data) -> str:
    path = tmp_path / "bad.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    with pytest.raises(TrainsimError) as info:
        load_topology(str(path))
    message = str(info.value)
    assert message.startswith(str(path)) and "\n" not in message
    return message


def test_base_file_is_valid(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump(_base()))
    assert load_topology(str(path)).gpus == ["gpu0", "gpu1"]


GT0 = "should be greater than 0"


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d["links"][1].update(b="gpu9"), "links[1].b: unknown node 'gpu9'; valid choices: cpu0, gpu0"),
    (lambda d: d["nodes"][1].update(kind="tpu"), "nodes[1].kind: unknown node kind 'tpu'; valid choices:"),
    (lambda d: d["links"][0].update(bandwidth_gbps=0), f"links[0].bandwidth_gbps: {GT0}"),
    (lambda d: d["links"][0].update(bandwidth_gbps=-3), f"links[0].bandwidth_gbps: {GT0}"),
    (lambda d: d["links"][0].update(speed=3), "links[0].speed: unknown field"),
    (lambda d: d["nodes"].append({"name": "gpu0", "kind": "gpu", "spec": "A1"}), "nodes[3].name: duplicate"),
    (lambda d: d["links"].pop(), "links: no route between gpu0 and gpu1"),
    (lambda d: d.update(nodes=d["nodes"] + [{"name": "nvsw0", "kind": "nvswitch", "nvlink_generation": 3}],
                        links=[{"a": g, "b": "nvsw0", "kind": "nvlink", "generation": 3}
                               for g in ("gpu0", "gpu1")]),
     "links: 'gpu0' reaches no cpu socket, so it has no host memory (link it to one"),
    (lambda d: d["links"][0].update(generation=7), "links[0].generation: unknown pcie generation '7'"),
    (lambda d: d["links"][0].pop("generation"), "links[0].generation: give generation"),
    (lambda d: d["nodes"][1].update(spec="Mystery"), "nodes[1].memory_gib: GPU spec 'Mystery' has no"),
    (lambda d: d["nodes"][0].pop("dram_bandwidth_gbps"), "nodes[0]: give dram_bandwidth_gbps"),
    (lambda d: d.update(schema="trainsim.topology/9"), "schema:"),
])
def test_bad_files_name_file_and_field(tmp_path, mutate, expected):
    data = _base()
    mutate(data)
    assert expected in _error(tmp_path, data)


def test_malformed_yaml_names_the_position(tmp_path):
    message = _error(tmp_path, "name: t\nnodes: [\n  {name: a, kind: gpu\nlinks: []\n")
    assert "malformed YAML" in message and "line " in message


def test_unknown_preset_and_generator_list_the_choices(tmp_path):
    with pytest.raises(TrainsimError, match="unknown topology 'dgx-9'; valid choices: .*dgx-a100"):
        load_topology("dgx-9")
    message = _error(tmp_path, {"generator": "torus", "gpus": 4})
    assert ("generator: unknown generator 'torus'; valid choices: cluster, fat_tree, nvlink_mesh, nvswitch, "
            "pcie_tree, rail_optimised") in message
    message = _error(tmp_path, {"generator": "pcie_tree", "gpus": 0})
    assert "gpus: should be greater than 0" in message


def test_route_to_unknown_node_lists_choices(presets):
    with pytest.raises(TrainsimError, match="unknown node 'gpu42'; valid choices"):
        presets["dgx-a100"].route("gpu0", "gpu42")


def test_cluster_without_p2p_stages_on_both_hosts():
    node = {"generator": "pcie_tree", "gpus": 2, "gpus_per_switch": 2, "nics_per_switch": 1, "p2p": False}
    topo = load_topology({"generator": "cluster", "node": node, "nodes": 2})
    legs = topo.gpu_copy_legs("n0.gpu0", "n1.gpu1")
    assert [leg[-1][1] for leg in legs] == ["n0.cpu0.dram", "n1.cpu0.dram", "n1.gpu1"]
    assert kinds(topo, legs[1]).count("ib") == 2


def test_cluster_file_names_its_node_file_relative_to_itself(tmp_path):
    box = pcie_tree(gpus=2, nics_per_switch=1, name="box")
    save_topology(box, tmp_path / "box.yaml")
    (tmp_path / "pair.yaml").write_text("generator: cluster\nnode: box.yaml\nnodes: 2\n")
    topo = load_topology(str(tmp_path / "pair.yaml"))
    assert topo.name == "box-x2" and len(topo.gpus) == 4
    (tmp_path / "nested.yaml").write_text("generator: cluster\nnode: pair.yaml\nnodes: 2\n")
    with pytest.raises(TrainsimError, match="nested.yaml: node: a cluster's node must be a single machine"):
        load_topology(str(tmp_path / "nested.yaml"))
