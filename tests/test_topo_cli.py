"""`trainsim topo list/show/route`: output, JSON, drawing, and one-line errors for bad input."""

import json

import pytest
import yaml
from typer.testing import CliRunner

from trainsim.cli import app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, ["topo", *args])


def test_list():
    result = invoke("list")
    assert result.exit_code == 0
    assert "dgx1-v100" in result.output and "consumer-2gpu-nop2p" in result.output
    rows = {r["name"]: r for r in json.loads(invoke("list", "--json").output)}
    assert rows["dgx-a100"]["gpus"] == 8 and rows["dgx-a100"]["gpu"] == "A100"
    assert rows["dgx-a100-2node"]["gpus"] == 16 and rows["dgx-a100-2node"]["machines"] == 2


def test_show_text_json_and_png(tmp_path):
    result = invoke("show", "dgx1-v100")
    assert result.exit_code == 0
    assert "bisection:" in result.output and "injection GB/s" in result.output and "SYS x12" in result.output
    png = tmp_path / "dgx1.png"
    result = invoke("show", "pcie-8gpu-2socket", "--json", "--png", str(png))
    assert result.exit_code == 0, result.output
    desc = json.loads(result.output)
    assert desc["name"] == "pcie-8gpu-2socket" and len(desc["gpus"]) == 8
    assert desc["bisection"]["from"] == [f"gpu{i}" for i in range(4)]
    assert desc["bisection"]["bandwidth_gbps"] == 10.0  # the Skylake UPI link is the cut
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("name", ["drawing.jpg", "drawing.svg", "drawing"])
def test_a_drawing_named_as_another_format_is_refused(tmp_path, name):
    result = invoke("show", "dgx1-v100", "--png", str(tmp_path / name))
    assert result.exit_code == 2 and "--png" in result.output and "ending in .png" in result.output
    assert list(tmp_path.iterdir()) == []


def test_show_a_file(tmp_path):
    path = tmp_path / "tree.yaml"
    tree = {"generator": "pcie_tree", "name": "tree", "gpus": 4, "gpus_per_switch": 4}
    path.write_text(yaml.safe_dump(tree))
    result = invoke("show", str(path), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["paths"] == {"PIX": 6}


def test_show_the_nvls_engine_and_refuse_it_on_a_switch_without_reduction(tmp_path):
    path = tmp_path / "h100.yaml"
    box = {"generator": "nvswitch", "name": "h100", "gpus": 8, "gpu": "h100-sxm", "memory_gib": 80,
           "links_per_gpu": 18, "nvlink_generation": 4, "nvls_gbps": 1000}
    path.write_text(yaml.safe_dump(box))
    result = invoke("show", str(path))
    assert result.exit_code == 0, result.output
    assert "NVLS engines (in-switch reduction and multicast" in result.output
    assert "nvsw0 1000.0 GB/s" in result.output
    nodes = json.loads(invoke("show", str(path), "--json").output)["nodes"]
    switch = [n for n in nodes if n["name"] == "nvsw0"]
    assert switch[0]["nvls_gbps"] == 1000.0 and "nvls_bandwidth" not in switch[0]
    path.write_text(yaml.safe_dump({**box, "reduce": False}))
    result = invoke("show", str(path))
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert "nvls_gbps needs a switch that reduces in the network" in result.output


def test_route_text_and_json():
    result = invoke("route", "dgx-a100-2node", "n0.gpu0", "n1.gpu5")
    assert result.exit_code == 0
    assert "ib" in result.output and "bottleneck:" in result.output
    report = json.loads(invoke("route", "consumer-2gpu-nop2p", "0", "1", "--json").output)
    assert report["staged_through_host"] and len(report["legs"]) == 2
    assert report["legs"][0]["edges"][-1]["to"] == "cpu0.dram"


def _bad_file(tmp_path, data):
    path = tmp_path / "dgx.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return str(path)


GOOD = {"name": "t",
        "nodes": [{"name": "cpu0", "kind": "cpu", "cores": 8, "dram_bandwidth_gbps": 50},
                  {"name": "gpu0", "kind": "gpu", "spec": "V100"},
                  {"name": "gpu1", "kind": "gpu", "spec": "V100"}],
        "links": [{"a": "cpu0", "b": "gpu0", "kind": "pcie", "generation": 3},
                  {"a": "cpu0", "b": "gpu1", "kind": "pcie", "generation": 3}]}


@pytest.mark.parametrize("data, expected", [
    ("name: t\nnodes: [\n  {name: a\nlinks: []\n", "malformed YAML"),
    ({**GOOD, "nodes": [*GOOD["nodes"], {"name": "x", "kind": "tpu"}]},
     "nodes[3].kind: unknown node kind 'tpu'; valid choices: cpu, gpu, network_switch, nic, nvswitch"),
    ({**GOOD, "links": [*GOOD["links"], {"a": "cpu0", "b": "gpu9", "kind": "pcie", "generation": 3}]},
     "links[2].b: unknown node 'gpu9'"),
    ({**GOOD, "links": [{**GOOD["links"][0], "bandwidth_gbps": 0}, GOOD["links"][1]]},
     "links[0].bandwidth_gbps: should be greater than 0"),
    ({**GOOD, "links": [{**GOOD["links"][0], "bandwidth_gbps": -1}, GOOD["links"][1]]},
     "links[0].bandwidth_gbps: should be greater than 0"),
    ({**GOOD, "links": GOOD["links"][:1]}, "links: no route between gpu0 and gpu1"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, data, expected):
    path = _bad_file(tmp_path, data)
    for command in (["show", path], ["route", path, "0", "1"]):
        result = invoke(*command)
        assert result.exit_code == 2
        assert "Traceback" not in result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {path}: ")
        assert expected in lines[0]
        if "line" in expected or expected == "malformed YAML":
            assert "line 4" in lines[0]


def test_unknown_preset_and_node_list_the_choices():
    result = invoke("show", "dgx-9000")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "unknown topology 'dgx-9000'; valid choices:" in result.output and "dgx1-v100" in result.output
    result = invoke("route", "dgx-a100", "gpu0", "gpu42")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "dgx-a100.yaml: DST: unknown node 'gpu42'; valid choices:" in result.output
    result = invoke("show", "missing.yaml")
    assert result.exit_code == 2 and "missing.yaml: file not found" in result.output
