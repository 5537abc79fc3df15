"""Symmetry (sim/symmetry.py): simulating one machine per class of identical machines and mirroring it gives
exactly the full simulation (iteration times, breakdown, every GPU's utilisation and memory, every link's
bytes); a machine that differs is simulated itself, and what cannot be mirrored exactly is not."""

from __future__ import annotations

import pytest
from simtools import assert_same_result, simulate_mirrored

from trainsim.topologies import load_spec

# 4 GPUs and 2 NICs over 2 PCIe switches and 2 sockets: input copies of a machine's ranks contend on its
# switch uplinks and inter-socket link; 4 machines on a 2-tier fat-tree with several spines.
NODE = {"generator": "pcie_tree", "gpus": 4, "gpu": "V100", "gpus_per_switch": 2, "nics_per_switch": 1,
        "generation": 3, "sockets": 2, "nic_generation": "edr"}
CLUSTER = {"generator": "fat_tree", "node": NODE, "nodes": 4, "radix": 4, "network": "ib"}


def _scenario(topology, **strategy) -> dict:
    return {"schema": "trainsim.scenario/1", "name": "mirror", "topology": topology, "workload": "resnet18",
            "strategy": {"name": "ddp", "collectives": "analytic", **strategy}, "batch_size": 16 * 32,
            "iterations": 2, "warmup_iterations": 1, "precision": "fp32", "optimizer": {"name": "momentum"},
            "host": {"pinned": False, "data_workers": 2}}


def test_mirrored_machines_give_the_full_simulation_exactly():
    scenario = _scenario(CLUSTER)
    full, mirrored = simulate_mirrored(scenario, False), simulate_mirrored(scenario, True)
    assert (full.stats["simulated_ranks"], mirrored.stats["simulated_ranks"]) == (16, 4)
    assert_same_result(full, mirrored)
    # the check has teeth: mirrored machines' PCIe links carry input copies and all-reduce bytes
    links = {(x.src, x.dst): x.bytes for x in mirrored.links}
    assert links["n3.cpu0", "n3.sw0"] > 0 and links["n3.sw0", "n3.nic0"] > 0


def test_a_machine_that_differs_is_simulated_itself():
    spec = load_spec(CLUSTER)[0].model_dump(exclude_none=True)
    for link in spec["links"]:
        if (link["a"], link["b"]) == ("n2.sw1", "n2.gpu3"):
            link["lanes"] = 8  # a narrower slot in machine 2 only
    scenario = _scenario(spec)
    full, mirrored = simulate_mirrored(scenario, False), simulate_mirrored(scenario, True)
    assert mirrored.stats["simulated_ranks"] == 8  # machine 0 for machines 0, 1 and 3; machine 2 itself
    assert_same_result(full, mirrored)


@pytest.mark.parametrize("change", [{"collectives": "flow"}, {"gpus": [0, 1, 2, 3, 4, 5]}],
                         ids=["flow collectives", "half a machine"])
def test_what_is_not_symmetric_is_not_mirrored(change):
    # flows of a collective may share links with other traffic; a machine holding 2 of the ranks is no
    # copy of one holding 4
    scenario = _scenario(CLUSTER)
    if "gpus" in change:
        scenario.update(gpus=change["gpus"], batch_size=6 * 32)
    else:
        scenario["strategy"].update(change)
    result = simulate_mirrored(scenario, True)
    assert result.stats["simulated_ranks"] == len(result.gpus)
