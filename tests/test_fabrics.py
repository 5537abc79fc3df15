"""Fabrics beyond one box: fat-tree and rail-optimised generators, their switch and link counts computed by
hand, bisection and oversubscription in `topo show`, routing on rails, bad inputs, and the presets."""

from __future__ import annotations

import json
import time

import pytest
import yaml
from typer.testing import CliRunner

from trainsim.cli import app
from trainsim.topologies import load_topology
from trainsim.topologies.analysis import describe, fabric
from trainsim.topologies.fabrics import leaf_ports

runner = CliRunner()

# A small machine: 2 H100s and 2 NDR NICs behind one PCIe switch.
NODE = {"generator": "pcie_tree", "gpus": 2, "gpu": "H100", "gpus_per_switch": 2, "nics_per_switch": 2,
        "nic_generation": "ndr", "generation": 5}
NDR = 50e9 * 4096 / (4096 + 26)  # bytes/s per NDR port after headers (topologies/links.py)


def _switches(topo):
    return sorted(n for n, k in topo.graph.nodes(data="kind") if k == "network_switch")


def _network_links(topo):
    """(a, b, count) of each physical link that touches a network switch."""
    out = []
    for u, v, d in topo.graph.edges(data=True):
        kinds = {topo.graph.nodes[u]["kind"], topo.graph.nodes[v]["kind"]}
        if "network_switch" in kinds and u < v:
            out.append((u, v, d["count"]))
    return out


def test_leaf_ports():
    assert leaf_ports(64, 1) == 32  # 32 down + 32 up
    assert leaf_ports(64, 2) == 42  # 42 down + 21 up = 63 <= 64; 43 + 22 > 64
    assert leaf_ports(8, 1) == 4


def test_two_tier_non_blocking_fat_tree_by_hand():
    # 8 machines x 2 NICs = 16 NICs; radix 8, 1:1 -> 4 down + 4 up per leaf, 2 machines per leaf: 4 leaves;
    # 4 leaves x 4 up-links = 16 spine ports = 2 spines of 8; each leaf bonds 2 ports to each spine.
    topo = load_topology({"generator": "fat_tree", "node": NODE, "nodes": 8, "radix": 8})
    assert _switches(topo) == ["leaf0", "leaf1", "leaf2", "leaf3", "spine0", "spine1"]
    links = _network_links(topo)
    nic_links = [x for x in links if ".nic" in x[0] or ".nic" in x[1]]
    trunks = [x for x in links if x not in nic_links]
    assert len(nic_links) == 16 and all(c == 1 for *_, c in nic_links)
    assert len(trunks) == 8 and all(c == 2 for *_, c in trunks)
    assert topo.graph.has_edge("n2.nic0", "leaf1") and topo.graph.has_edge("n3.nic1", "leaf1")
    net = fabric(topo)
    assert [t["switches"] for t in net["tiers"]] == [4, 2]
    assert net["tiers"][0]["oversubscription"] == pytest.approx(1.0)
    assert net["injection"] == pytest.approx(16 * NDR)
    assert net["bisection"] == pytest.approx(net["injection"] / 2)  # non-blocking: half the injection


def test_two_to_one_fat_tree_halves_the_bisection():
    # 4 machines x 2 NICs; radix 6 at 2:1 -> 4 down + 2 up: 2 machines per leaf, 2 leaves; 2 x 2 up-links
    # = 4 ports: one spine, each leaf bonding 2 ports to it.
    topo = load_topology({"generator": "fat_tree", "node": NODE, "nodes": 4, "radix": 6,
                          "oversubscription": 2})
    assert _switches(topo) == ["leaf0", "leaf1", "spine0"]
    trunks = [x for x in _network_links(topo) if "spine0" in x]
    assert sorted(trunks) == [("leaf0", "spine0", 2), ("leaf1", "spine0", 2)]
    net = fabric(topo)
    assert net["tiers"][0]["oversubscription"] == pytest.approx(2.0)
    assert net["tiers"][1]["oversubscription"] is None
    assert net["bisection"] == pytest.approx(net["injection"] / 4)  # half of half the injection
    assert net["bisection"] == pytest.approx(2 * NDR)


def test_three_tier_fat_tree_is_the_classic_k4_tree():
    # Radix 4, 1:1: 2 down + 2 up per leaf, 1 machine (2 NICs) per leaf: 8 leaves; pods of 2 leaves: 4 pods
    # of 2 aggregation switches; aggregation switch j of every pod to core group j of 2: 4 cores.
    topo = load_topology({"generator": "fat_tree", "node": NODE, "nodes": 8, "radix": 4, "tiers": 3})
    switches = _switches(topo)
    assert sum(s.startswith("leaf") for s in switches) == 8
    assert sum(s.startswith("spine") for s in switches) == 8
    assert sum(s.startswith("core") for s in switches) == 4
    links = _network_links(topo)
    assert len([x for x in links if x[0].startswith("leaf") or x[1].startswith("leaf")]) == 16 + 16
    assert len([x for x in links if "core" in x[0] + x[1]]) == 16
    assert all(c == 1 for *_, c in links)
    for switch in switches:  # every switch uses exactly its radix
        assert topo.graph.out_degree(switch) == 4
    net = fabric(topo)
    assert [t["switches"] for t in net["tiers"]] == [8, 8, 4]
    assert [t["oversubscription"] for t in net["tiers"]] == [pytest.approx(1.0), pytest.approx(1.0), None]
    assert net["bisection"] == pytest.approx(net["injection"] / 2)


def test_rail_fabric_by_hand():
    # 4 machines x 2 NICs, radix 8: rails rail0, rail1 with 4 machines each (4 down, 4 up); 8 up-links fit
    # one spine of 8 ports, each rail bonding 4 ports to it.
    topo = load_topology({"generator": "rail_optimised", "node": NODE, "nodes": 4, "radix": 8})
    assert _switches(topo) == ["rail0", "rail1", "spine0"]
    links = _network_links(topo)
    assert sorted(x for x in links if "spine0" in x) == [("rail0", "spine0", 4), ("rail1", "spine0", 4)]
    for m in range(4):
        assert topo.graph.has_edge(f"n{m}.nic0", "rail0") and topo.graph.has_edge(f"n{m}.nic1", "rail1")
    assert len(links) == 8 + 2
    net = fabric(topo)
    assert net["bisection"] == pytest.approx(net["injection"] / 2)


def test_rail_routes_gpu_i_through_rail_i_only():
    topo = load_topology("dgx-h100-rail-32node")
    for i in range(8):
        route = topo.route(f"n0.gpu{i}", f"n17.gpu{i}")
        switches = [v for _, v in route if topo.graph.nodes[v]["kind"] == "network_switch"]
        assert switches == [f"rail{i}"]
        assert (f"n0.nic{i}", f"rail{i}") in route


def test_spine_traffic_spreads_by_destination():
    topo = load_topology("dgx-h100-fattree-2to1")
    spines = {topo.route("n0.gpu0", f"n{m}.gpu{i}")[3][1] for m in (4, 5) for i in range(8)}
    assert spines == {"spine0", "spine1"}


def test_presets_bisection_and_oversubscription_in_show_json():
    rail = describe(load_topology("dgx-h100-rail-32node"))["network"]
    fat = describe(load_topology("dgx-h100-fattree-2to1"))["network"]
    injection = 256 * NDR / 1e9
    assert rail["injection_gbps"] == pytest.approx(injection, abs=0.01)
    assert rail["bisection_gbps"] == pytest.approx(injection / 2, abs=0.01)
    assert [t["switches"] for t in rail["tiers"]] == [8, 4]
    assert fat["bisection_gbps"] == pytest.approx(injection / 4, abs=0.01)
    assert [t["oversubscription"] for t in fat["tiers"]] == [2.0, None]
    assert [t["switches"] for t in fat["tiers"]] == [8, 2]
    result = runner.invoke(app, ["topo", "show", "dgx-h100-fattree-2to1", "--json"])
    assert result.exit_code == 0
    assert json.loads(result.output)["network"]["bisection_gbps"] == fat["bisection_gbps"]
    text = runner.invoke(app, ["topo", "show", "dgx-h100-fattree-2to1"]).output
    assert "network bisection: 3179.816 GB/s" in text and "2:1" in text


def test_one_switch_cluster_reports_its_network():
    net = describe(load_topology("dgx-h100-4node"))["network"]
    assert [t["switches"] for t in net["tiers"]] == [1]
    assert net["bisection_gbps"] == pytest.approx(net["injection_gbps"] / 2, abs=0.01)
    assert describe(load_topology("dgx-h100"))["network"] is None


@pytest.mark.parametrize("params, field", [
    ({"radix": 8}, "radix"),  # 4 down-link ports per leaf, a DGX has 8 NICs
    ({"radix": 16, "nodes": 100}, "radix"),  # 100 leaves of one node: more than a 16-port spine joins
    ({"radix": 64, "oversubscription": 0.5}, "oversubscription"),
    ({"radix": 64, "tiers": 4}, "tiers"),
])
def test_bad_fabric_is_one_line_error(tmp_path, params, field):
    path = tmp_path / "fabric.yaml"
    path.write_text(yaml.safe_dump({"generator": "fat_tree", "node": "dgx-h100", "nodes": 4, **params}))
    result = runner.invoke(app, ["topo", "show", str(path)])
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and field in lines[0] and str(path) in lines[0]


def test_bad_rail_oversubscription_is_one_line_error(tmp_path):
    path = tmp_path / "rail.yaml"
    path.write_text(yaml.safe_dump({"generator": "rail_optimised", "node": "dgx-h100", "nodes": 4,
                                    "radix": 64, "oversubscription": 0}))
    result = runner.invoke(app, ["topo", "show", str(path)])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1 and "oversubscription" in result.output


def test_presets_bench_and_simulate_quickly():
    start = time.perf_counter()
    for preset in ("dgx-h100-rail-32node", "dgx-h100-fattree-2to1"):
        result = runner.invoke(app, ["topo", "bench", preset, "-c", "allreduce", "--sizes", "1G"])
        assert result.exit_code == 0, result.output
        assert "1073741824" in result.output
        result = runner.invoke(app, ["simulate", "ddp-resnet50-64gpu", "--set", f"topology={preset}",
                                     "--set", "gpus=64", "--json"])
        assert result.exit_code == 0, result.output
    assert time.perf_counter() - start < 60


def test_oversubscription_slows_what_crosses_tiers_and_not_what_stays_below():
    """All-to-all over 16 machines, four full leaves of the 2:1 fat-tree: 3/4 of each NIC's bytes leave its
    leaf, whose uplinks carry half the downlinks' rate, so it takes about 2 x 3/4 = 1.5 times as long as
    on the rail pod (NIC-bound). NCCL's rings and trees keep all but a few hops inside a leaf, so there the
    oversubscription barely shows."""
    from trainsim.sim.collectives.ops import collective_time

    rail, fat = load_topology("dgx-h100-rail-32node"), load_topology("dgx-h100-fattree-2to1")
    gib, half = 2**30, len(rail.gpus) // 2
    ratio = (collective_time(fat, "alltoall", fat.gpus[:half], gib)
             / collective_time(rail, "alltoall", rail.gpus[:half], gib))
    assert 1.4 < ratio <= 2.0
    for algo in ("ring", "tree"):
        slowdown = (collective_time(fat, "allreduce", None, gib, algo=algo)
                    / collective_time(rail, "allreduce", None, gib, algo=algo))
        assert slowdown == pytest.approx(1.0, abs=0.05)
