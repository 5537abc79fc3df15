"""Symmetry for pipeline x data parallelism (sim/symmetry.py): simulating the first replica of each class of
copies and mirroring it gives exactly the full simulation (iteration times, per-rank breakdown, utilisation,
memory, every link's bytes, network links included); a replica that is no copy is simulated itself, and
replicas whose flows share a link, or collectives as flows, are not mirrored at all."""

from __future__ import annotations

import pytest
from simtools import assert_same_result, simulate_mirrored

from trainsim.topologies import load_spec

# 2 V100s and a NIC under one PCIe switch; machines on a 2-tier fat-tree of 4-port switches (2 machines per
# leaf), 1 GB/s ports so the stage-to-stage messages take longer than the tiny model's compute
NODE = {"generator": "pcie_tree", "gpus": 2, "gpu": "V100", "gpus_per_switch": 2, "nics_per_switch": 1,
        "nic_generation": "edr"}


def _cluster(nodes: int, **fabric) -> dict:
    return {"generator": "fat_tree", "node": NODE, "nodes": nodes, "radix": 4, "network": "ib",
            "bandwidth_gbps": 1.0, **fabric}


def _scenario(topology, replicas: int, *, schedule="message-driven", offload=True, **strategy) -> dict:
    """4 stages (2 machines) per replica, 4 micro-batches of 2 sequences per replica."""
    return {"schema": "trainsim.scenario/1", "name": "pipe-mirror", "topology": topology,
            "workload": {"name": "gpt", "n_layer": 4, "n_embd": 64, "n_head": 2, "block_size": 64},
            "strategy": {"name": "pipeline", "collectives": "analytic",
                         "pipeline": {"stages": 4, "micro_batches": 4, "schedule": schedule,
                                      "recompute": True},
                         **strategy},
            "batch_size": 8 * replicas, "iterations": 2, "warmup_iterations": 1, "precision": "fp16",
            "optimizer": {"name": "adam"}, "optimizations": {"offload_optimizer_state": offload}}


@pytest.mark.parametrize(("schedule", "offload"), [("message-driven", True), ("1f1b", False)])
def test_mirrored_replicas_give_the_full_simulation_exactly(schedule, offload):
    scenario = _scenario(_cluster(8), 4, schedule=schedule, offload=offload)
    full, mirrored = simulate_mirrored(scenario, False), simulate_mirrored(scenario, True)
    assert (full.stats["simulated_ranks"], mirrored.stats["simulated_ranks"]) == (16, 4)
    assert_same_result(full, mirrored)
    # the check has teeth: a mirrored replica's sends cross its machines' NICs and leaf, and its host links
    # carry its input (and offload) copies
    links = {(x.src, x.dst): x.bytes for x in mirrored.links}
    assert links["n7.nic0", "leaf3"] > 0 and links["leaf3", "n6.nic0"] > 0
    assert links["n6.cpu0", "n6.sw0"] > 0


def test_a_replica_that_differs_is_simulated_itself():
    spec = load_spec(_cluster(8))[0].model_dump(exclude_none=True)
    for link in spec["links"]:
        if (link["a"], link["b"]) == ("n3.sw0", "n3.gpu1"):
            link["lanes"] = 8  # a narrower slot in machine 3 (replica 1's) only
    scenario = _scenario(spec, 4)
    full, mirrored = simulate_mirrored(scenario, False), simulate_mirrored(scenario, True)
    assert mirrored.stats["simulated_ranks"] == 8  # replica 0 for replicas 0, 2 and 3; replica 1 itself
    assert_same_result(full, mirrored)


def test_a_replica_whose_sends_cross_a_leaf_is_no_copy():
    # 3 machines per leaf: replica 1's middle send goes leaf0 -> spine -> leaf1, replica 0's stays on leaf0
    scenario = _scenario(_cluster(4, radix=6, nodes_per_leaf=3), 2)
    full, mirrored = simulate_mirrored(scenario, False), simulate_mirrored(scenario, True)
    assert mirrored.stats["simulated_ranks"] == 8
    assert_same_result(full, mirrored)
    assert any(x.src == "leaf0" and x.dst.startswith("spine") for x in mirrored.links)  # the crossing


def test_replicas_sharing_an_oversubscribed_uplink_are_not_mirrored():
    # one uplink per leaf (2:1); replica 0 on machines 0 and 2, replica 1 on 1 and 3: both replicas' middle
    # sends climb leaf0's one uplink
    shared = _scenario(_cluster(4, oversubscription=2), 2)
    shared["gpus"] = [0, 1, 4, 5, 2, 3, 6, 7]
    result = simulate_mirrored(shared, True)
    assert result.stats["simulated_ranks"] == 8
    # the sharing is real: the same replicas each on their own leaf are faster
    apart = simulate_mirrored(_scenario(_cluster(4, oversubscription=2), 2), True)
    assert apart.stats["simulated_ranks"] == 4
    assert result.iteration_time_s > apart.iteration_time_s


@pytest.mark.parametrize("change", [{"collectives": "flow"}, {"jitter": {"sigma": 0.05}}],
                         ids=["flow collectives", "jitter"])
def test_what_is_not_symmetric_is_not_mirrored(change):
    scenario = _scenario(_cluster(4), 2, **change)
    result = simulate_mirrored(scenario, True)
    assert result.stats["simulated_ranks"] == len(result.gpus)
