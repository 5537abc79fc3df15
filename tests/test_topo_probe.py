"""The probed topology of this host and the calibrated figures written into it."""

from pathlib import Path

import pytest

from trainsim.calibrate.measure.alphabeta import AlphaBeta
from trainsim.calibrate.measure.linkbench import LinkClass
from trainsim.calibrate.measure.nvsmi import parse_topo_matrix, to_topology
from trainsim.calibrate.measure.topo_probe import apply_link_fits, cpu_topology, cuda_topology, host_probe
from trainsim.topologies import load_topology

DATA = Path(__file__).parent / "data" / "nvsmi"


def fitted(name, kind, gbps, us, src="a", dst="b"):
    return LinkClass(
        name,
        kind,
        src,
        dst,
        points=[(1024, 1e-6, 0.0)],
        fit=AlphaBeta(alpha_s=us * 1e-6, beta_bytes_per_s=gbps * 1e9, rel_rms=0.0, points=8),
    )


def test_host_probe():
    host = host_probe()
    assert host["cores"] >= 1 and host["sockets"] and host["memory_bytes"] > 0
    assert sum(len(s["cpus"]) for s in host["sockets"]) == host["cores"]


def test_cpu_ranks_topology_loads_and_carries_the_copy_figures():
    host = {
        "cores": 4,
        "sockets": [{"id": 0, "cpus": [0, 1]}, {"id": 1, "cpus": [2, 3]}],
        "memory_bytes": 8 * 2**30,
        "cpu_model": "Test CPU",
        "cpu_vendor": "GenuineIntel",
    }
    doc = cpu_topology(
        host, 4, dram_bandwidth_gbps=40.0, rank_link=fitted("rank_copy", "rank_copy", 11.0, 1.2)
    )
    topo = load_topology(doc)
    assert topo.gpus == ["gpu0", "gpu1", "gpu2", "gpu3"]
    assert topo.cpus == ["cpu0", "cpu1"]
    assert topo.gpu_spec("gpu0") == "cpu" and topo.gpu_memory("gpu0") == 2 * 2**30
    rank_links = [link for link in doc["links"] if link["b"].startswith("gpu")]
    assert [link["a"] for link in rank_links] == ["cpu0", "cpu0", "cpu1", "cpu1"]
    # A rank-to-rank copy is two hops: each carries the copy bandwidth and half its latency.
    assert {link["bandwidth_gbps"] for link in rank_links} == {11.0}
    assert [link["latency_us"] for link in rank_links] == pytest.approx([0.6] * 4)
    route = topo.route("gpu0", "gpu1")
    assert topo.bottleneck(route) == pytest.approx(11e9)
    assert [n for n in doc["nodes"] if n["kind"] == "cpu"][0]["dram_bandwidth_gbps"] == 40.0


def test_apply_link_fits_on_a_dgx1():
    matrix = parse_topo_matrix((DATA / "dgx1-v100.txt").read_text())
    doc = to_topology(matrix, name="dgx1", gpu_specs=["V100"] * 8, pcie_generation=3, inter_socket="qpi")
    links = [
        fitted("h2d_pinned/gpu0", "h2d_pinned", 11.0, 10.0),
        fitted("d2h_pinned/gpu0", "d2h_pinned", 13.0, 12.0),
        fitted("p2p/gpu0-gpu1", "p2p", 45.0, 3.0),
        fitted("p2p/gpu0-gpu5", "p2p", 9.0, 20.0),
    ]
    apply_link_fits(doc, links, p2p=True)
    by_ends = {(link["a"], link["b"]): link for link in doc["links"]}
    assert by_ends[("sw0", "gpu0")]["bandwidth_gbps"] == pytest.approx(12.0)
    assert by_ends[("sw0", "gpu0")]["latency_us"] == pytest.approx(11.0)
    assert "bandwidth_gbps" not in by_ends[("sw0", "gpu1")]  # not measured: the library derives it
    assert by_ends[("gpu0", "gpu1")]["bandwidth_gbps"] == pytest.approx(45.0)
    topo = load_topology(doc)
    assert topo.bottleneck(topo.route("gpu0", "gpu1")) == pytest.approx(45e9)


def test_apply_link_fits_gives_every_socket_the_loader_batch_copy_rate():
    matrix = parse_topo_matrix((DATA / "dgx1-v100.txt").read_text())
    doc = to_topology(matrix, name="dgx1", gpu_specs=["V100"] * 8, pcie_generation=3, inter_socket="qpi")
    links = [fitted("h2d_pageable/gpu0", "h2d_pageable", 19.5, 10.0),  # a warm buffer: not what training sees
             fitted("h2d_batch/gpu0", "h2d_batch", 5.0, 10.0),
             fitted("h2d_batch/gpu4", "h2d_batch", 6.0, 10.0)]
    apply_link_fits(doc, links)
    cpus = [n for n in doc["nodes"] if n["kind"] == "cpu"]
    assert len(cpus) == 2 and all(n["pageable_gbps"] == pytest.approx(5.5) for n in cpus)
    topo = load_topology(doc)
    assert topo.pageable_rate("gpu7") == pytest.approx(5.5e9)


def test_apply_link_fits_through_an_nvswitch():
    matrix = parse_topo_matrix((DATA / "dgx-a100.txt").read_text())
    doc = to_topology(matrix, name="a100", gpu_specs=["A100"] * 8, pcie_generation=4, inter_socket="amd")
    links = [fitted("p2p/gpu0-gpu1", "p2p", 270.0, 4.0), fitted("p2p/gpu0-gpu2", "p2p", 250.0, 4.0)]
    apply_link_fits(doc, links)
    gpu0 = next(link for link in doc["links"] if link["a"] == "gpu0" and link["b"] == "nvswitch0")
    assert gpu0["bandwidth_gbps"] == pytest.approx(260.0)
    assert gpu0["latency_us"] == pytest.approx(2.0)  # half a GPU-GPU copy: two hops through the switch
    load_topology(doc)


def test_cuda_skeleton_from_nvidia_smi_or_fallback(monkeypatch):
    from trainsim.calibrate.measure import nvsmi

    host = {
        "cores": 80,
        "sockets": [],
        "memory_bytes": 2**40,
        "cpu_model": "Xeon",
        "cpu_vendor": "GenuineIntel",
    }
    monkeypatch.setattr(nvsmi, "read_nvidia_smi", lambda: (DATA / "dgx1-v100.txt").read_text())
    monkeypatch.setattr(nvsmi, "nvml_probe", lambda: None)
    names = ["Tesla V100-SXM2-16GB"] * 8
    doc = cuda_topology(host, gpu_names=names, gpu_memory_gib=[16.0] * 8, dram_bandwidth_gbps=100.0)
    topo = load_topology(doc)
    assert topo.gpu_spec("gpu3") == "V100" and len(topo.cpus) == 2
    assert sum(link["kind"] == "nvlink" for link in doc["links"]) == 16
    # CUDA_VISIBLE_DEVICES showing 2 of the 8 GPUs: the table does not apply, one socket with root ports.
    doc = cuda_topology(host, gpu_names=names[:2], gpu_memory_gib=[16.0] * 2, dram_bandwidth_gbps=100.0)
    assert [link["b"] for link in doc["links"]] == ["gpu0", "gpu1"]
    load_topology(doc)
    monkeypatch.setattr(nvsmi, "read_nvidia_smi", lambda: "garbage")
    doc = cuda_topology(host, gpu_names=names[:1], gpu_memory_gib=[16.0], dram_bandwidth_gbps=100.0)
    assert load_topology(doc).gpus == ["gpu0"]


def test_gloo_transport_on_cpu_rank_links():
    from trainsim.calibrate.measure.topo_probe import apply_gloo_transport

    host = {"cores": 2, "sockets": [{"id": 0, "cpus": [0, 1]}], "memory_bytes": 2**30, "cpu_model": "X"}
    copy = fitted("rank_copy", "rank_copy", 11.0, 1.2)
    doc = cpu_topology(host, 2, dram_bandwidth_gbps=20.0, rank_link=copy)
    # busbw per link; no latency: the simulator charges each gloo call its own measured latency
    apply_gloo_transport(doc, busbw_gbps=2.0)
    rank_links = [link for link in doc["links"] if link["b"].startswith("gpu")]
    assert [(link["bandwidth_gbps"], link["latency_us"]) for link in rank_links] == [(2.0, 0.0)] * 2
    # a fit faster than the memory copy (time flat in size on a busy box) is capped at the copy figure
    apply_gloo_transport(doc, busbw_gbps=1e9)
    assert {link["bandwidth_gbps"] for link in rank_links} == {2.0}
    topo = load_topology(doc)
    assert topo.bottleneck(topo.route("gpu0", "gpu1")) == pytest.approx(2e9)
