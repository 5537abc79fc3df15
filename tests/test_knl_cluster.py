"""The Cori KNL presets: one self-hosted Xeon Phi node, and 64 of them on Aries, as machines the simulator
runs (a KNL rank computes in its MCDRAM; its batch needs no host-to-device copy)."""

import pytest
from typer.testing import CliRunner

from trainsim.cli import app
from trainsim.formats.scenario import Scenario
from trainsim.resolve import resolve
from trainsim.sim.output.records import records
from trainsim.sim.simulation import Simulation
from trainsim.topologies import load_topology


def test_knl_node_has_mcdram_device_ddr4_host_and_an_aries_nic_on_pcie():
    topo = load_topology("knl-7250-node")
    assert topo.gpus == ["gpu0"] and topo.gpu_spec("gpu0") == "knl-7250"
    assert topo.gpu_memory("gpu0") == 16 * 2**30
    dram = topo.host_memory("cpu0")
    assert topo.edge("cpu0", dram)["bandwidth"] == pytest.approx(6 * 2400e6 * 8 * 160 / 204.8)  # ~90 GB/s
    assert topo.edge("cpu0", "nic0")["raw_bandwidth"] == pytest.approx(16 * 8e9 * 128 / 130 / 8)  # Gen3 x16


def test_cori_cluster_routes_between_nodes_over_aries():
    topo = load_topology("cori-knl-64node")
    assert len(topo.gpus) == 64 and len(topo.machines) == 64
    route = topo.route("n0.gpu0", "n63.gpu0")
    network = [topo.edge(*e) for e in route if topo.edge(*e)["kind"] == "ib"]
    assert len(network) == 2 and all(e["bandwidth"] == 8e9 and e["latency"] == pytest.approx(1e-6)
                                      for e in network)


def test_topo_show_on_the_cluster():
    result = CliRunner().invoke(app, ["topo", "show", "cori-knl-64node"])
    assert result.exit_code == 0, result.output
    assert "64 gpu" in result.output and "knl-7250" in result.output


def test_a_knl_rank_trains_without_a_host_to_device_copy_of_its_batch():
    scenario = Scenario.model_validate({
        "topology": {"generator": "cluster", "node": "knl-7250-node", "nodes": 2, "network": "ib",
                     "bandwidth_gbps": 8, "latency_us": 1.0},
        "workload": {"name": "tiny-cnn"}, "strategy": {"name": "ddp"}, "batch_size": 64,
        "iterations": 1, "warmup_iterations": 0})
    result = Simulation(resolve(scenario)).run()
    assert result.iteration_time_s > 0 and result.breakdown_s["exposed_transfer"] == 0
    assert not [r for r in records(result) if r["stream"] == "h2d"]  # the batch is already in its memory
    assert {g.device for g in result.gpus} == {"knl-7250"}
