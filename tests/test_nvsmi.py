"""`nvidia-smi topo -m` of four real system designs -> the topology we expect, loadable by the library."""

from pathlib import Path

import pytest

from trainsim.calibrate.measure.nvsmi import count_cpus, parse_topo_matrix, spec_from_name, to_topology
from trainsim.errors import TrainsimError
from trainsim.topologies import load_topology

DATA = Path(__file__).parent / "data" / "nvsmi"

# REFERENCE.md: DGX-1 NVLink 2 links per GPU pair.
DGX1_NVLINKS = [
    [0, 2, 1, 1, 2, 0, 0, 0],
    [2, 0, 1, 2, 0, 1, 0, 0],
    [1, 1, 0, 2, 0, 0, 2, 0],
    [1, 2, 2, 0, 0, 0, 0, 1],
    [2, 0, 0, 0, 0, 2, 1, 1],
    [0, 1, 0, 0, 2, 0, 1, 2],
    [0, 0, 2, 0, 1, 1, 0, 2],
    [0, 0, 0, 1, 1, 2, 2, 0],
]


def build(name, spec, pcie, inter_socket, **kw):
    matrix = parse_topo_matrix((DATA / f"{name}.txt").read_text(), source=name)
    doc = to_topology(
        matrix,
        name=name,
        gpu_specs=[spec] * len(matrix.gpus),
        pcie_generation=pcie,
        inter_socket=inter_socket,
        **kw,
    )
    return matrix, doc, load_topology(doc)


def children(doc, parent):
    """Nodes linked below ``parent`` by PCIe."""
    return sorted(link["b"] for link in doc["links"] if link["a"] == parent and link["kind"] == "pcie")


def kinds(doc, kind):
    return [n["name"] for n in doc["nodes"] if n["kind"] == kind]


def test_dgx1_nvlink_mesh_and_pcie_tree():
    matrix, doc, topo = build("dgx1-v100", "V100", 3, "qpi")
    assert matrix.gpus == [f"GPU{i}" for i in range(8)]
    assert len(matrix.nics) == 4
    counts = {(link["a"], link["b"]): link["count"] for link in doc["links"] if link["kind"] == "nvlink"}
    for i in range(8):
        for j in range(i + 1, 8):
            assert counts.get((f"gpu{i}", f"gpu{j}"), 0) == DGX1_NVLINKS[i][j]
    assert all(link.get("generation") == 2 for link in doc["links"] if link["kind"] == "nvlink")
    # 2 GPUs + 1 NIC per PCIe switch (grouped through the NICs: NV# hides the GPU-GPU PCIe relation).
    assert kinds(doc, "pcie_switch") == ["sw0", "sw1", "sw2", "sw3"]
    assert [children(doc, f"sw{k}") for k in range(4)] == [
        ["gpu0", "gpu1", "nic0"],
        ["gpu2", "gpu3", "nic1"],
        ["gpu4", "gpu5", "nic2"],
        ["gpu6", "gpu7", "nic3"],
    ]
    assert children(doc, "cpu0") == ["sw0", "sw1"] and children(doc, "cpu1") == ["sw2", "sw3"]
    assert [link for link in doc["links"] if link["kind"] == "upi"] == [
        {"a": "cpu0", "b": "cpu1", "kind": "upi", "generation": "qpi"}
    ]
    assert {n["cores"] for n in doc["nodes"] if n["kind"] == "cpu"} == {40}
    # The library routes over NVLink where a link exists.
    assert {topo.graph.edges[e]["kind"] for e in topo.route("gpu0", "gpu1")} == {"nvlink"}


def test_dgx_a100_nvswitch_and_four_numa_domains():
    matrix, doc, topo = build("dgx-a100", "A100", 4, "amd", gpu_memory_gib=[40] * 8)
    assert matrix.nic_names["NIC0"] == "mlx5_0"
    assert kinds(doc, "nvswitch") == ["nvswitch0"]
    to_switch = [link for link in doc["links"] if link["b"] == "nvswitch0"]
    assert len(to_switch) == 8 and {link["count"] for link in to_switch} == {12}
    assert {link["generation"] for link in to_switch} == {3}
    assert not [link for link in doc["links"] if link["kind"] == "nvlink" and link["b"].startswith("gpu")]
    assert len(kinds(doc, "pcie_switch")) == 4
    assert [children(doc, f"sw{k}") for k in range(4)][0] == ["gpu0", "gpu1", "nic0", "nic1"]
    # NUMA affinity groups 1, 3, 5, 7 in numeric order -> cpu0..cpu3; GPU0/1 sit in NUMA node 3.
    assert len(kinds(doc, "cpu")) == 4
    assert children(doc, "cpu1") == ["sw0"]
    assert len([link for link in doc["links"] if link["kind"] == "upi"]) == 6
    route_kinds = {topo.graph.edges[e]["kind"] for e in topo.route("gpu0", "gpu7")}
    assert route_kinds == {"nvlink"}


def test_pcie_server_two_sockets_two_switches_each():
    _, doc, topo = build("pcie-8gpu-2socket", "V100", 3, "skl")
    assert not [link for link in doc["links"] if link["kind"] == "nvlink"]
    assert [children(doc, f"sw{k}") for k in range(4)] == [
        ["gpu0", "gpu1"],
        ["gpu2", "gpu3"],
        ["gpu4", "gpu5"],
        ["gpu6", "gpu7"],
    ]
    assert children(doc, "cpu0") == ["sw0", "sw1"] and children(doc, "cpu1") == ["sw2", "sw3"]
    cross = {topo.graph.edges[e]["kind"] for e in topo.route("gpu0", "gpu4")}
    assert "upi" in cross
    assert {topo.graph.edges[e]["kind"] for e in topo.route("gpu0", "gpu1")} == {"pcie"}


def test_consumer_box_root_ports_no_switch_no_p2p():
    _, doc, topo = build("consumer-2gpu", "RTX4090", 4, None, p2p=False)
    assert kinds(doc, "pcie_switch") == [] and kinds(doc, "cpu") == ["cpu0"]
    assert children(doc, "cpu0") == ["gpu0", "gpu1"]
    assert doc["p2p"] is False and topo.p2p is False
    assert len(topo.gpu_copy_legs("gpu0", "gpu1")) == 2  # staged through host memory


def test_nvml_overrides_names_memory_pcie_and_p2p():
    matrix = parse_topo_matrix((DATA / "consumer-2gpu.txt").read_text())
    nvml = {
        "gpus": [{"spec": "RTX3090", "memory_gib": 24, "pcie_generation": 4, "pcie_width": 8}] * 2,
        "p2p": True,
    }
    doc = to_topology(matrix, name="x", nvml=nvml)
    assert [n["spec"] for n in doc["nodes"] if n["kind"] == "gpu"] == ["RTX3090", "RTX3090"]
    assert {(link["generation"], link["lanes"]) for link in doc["links"]} == {(4, 8)}
    assert doc["p2p"] is True


def test_ansi_codes_and_single_gpu():
    text = "\x1b[4m\tGPU0\tCPU Affinity\tNUMA Affinity\x1b[0m\nGPU0\t X \t0-7\t0\n"
    matrix = parse_topo_matrix(text)
    assert matrix.gpus == ["GPU0"] and matrix.cpu_affinity == {"GPU0": "0-7"}


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("hello\n", "no header row"),
        ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tQQQ\t0-7\nGPU1\tPHB\t X \t0-7\n", "unknown relation 'QQQ'"),
        ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tPHB\t0-7\n", "no row for GPU1"),
        ("\tGPU0\tGPU1\nGPU0\t X\nGPU1\tPHB\t X\n", "has 1 cells"),
    ],
)
def test_malformed_tables_are_one_line_errors(text, match):
    with pytest.raises(TrainsimError, match=match) as err:
        parse_topo_matrix(text, source="topo.txt")
    assert str(err.value).startswith("topo.txt: ")


def test_helpers():
    assert count_cpus("0-19,40-59") == 40 and count_cpus("7") == 1 and count_cpus("N/A") == 0
    assert spec_from_name("Tesla V100-SXM2-16GB") == "V100"
    assert spec_from_name("NVIDIA GeForce RTX 4090") == "RTX4090"
    assert spec_from_name("Mystery GPU") == "Mystery GPU"
