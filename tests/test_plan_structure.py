"""A collective's plans for different protocols share one structure: the tree's hops are walked once per
group and each protocol's plan differs only in its latencies (and efficiency)."""

from __future__ import annotations

import pytest

from trainsim.sim.collectives import nccl_tuning as tune
from trainsim.sim.collectives import ops as coll
from trainsim.sim.collectives import plans
from trainsim.topologies import load_topology


@pytest.fixture(scope="module")
def two_nodes():
    return load_topology("dgx-a100-2node")


def test_tree_plans_of_each_protocol_share_the_routes_and_shares(two_nodes):
    gpus = two_nodes.gpus
    ll = coll.plan_collective(two_nodes, "allreduce", gpus, "tree", "ll")
    simple = coll.plan_collective(two_nodes, "allreduce", gpus, "tree", "simple")
    assert len(ll.lanes) == len(simple.lanes) == 16  # 8 rails (NICs) x 2 trees
    for lane_ll, lane_simple in zip(ll.lanes, simple.lanes, strict=True):
        (phase_ll,), (phase_simple,) = lane_ll, lane_simple
        assert len(phase_ll.transfers) == len(phase_simple.transfers) == 2 * (2 * 7 + 1)  # up and down
        for a, b in zip(phase_ll.transfers, phase_simple.transfers, strict=True):
            assert a.route is b.route  # the same walk, not a second one
            assert a.share == b.share == 0.5 / 8
    assert plans.tree_lanes(two_nodes, gpus) is plans.tree_lanes(two_nodes, gpus)


@pytest.mark.parametrize("proto", ["ll", "simple"])
def test_each_protocol_takes_its_own_tree_latency(two_nodes, proto):
    """NCCL's tree latency from the protocol's hop latencies: 2 x (7 NVLink steps down the chain of 8 GPUs
    + log2(2 machines) network steps), as tree_plan built it per protocol before sharing the walk."""
    tuning = tune.tuning(80, "tree", proto)
    plan = coll.plan_collective(two_nodes, "allreduce", two_nodes.gpus, "tree", proto)
    expected = 2 * (7 * tuning.hop["nvlink"] + 1 * tuning.hop["network"])
    latencies = {t.latency for lane in plan.lanes for phase in lane for t in phase.transfers}
    assert len(latencies) == 1 and latencies.pop() == pytest.approx(expected, rel=1e-12)
    assert plan.proto == proto and plan.base_latency == tuning.base


def test_a_shared_walk_gives_the_plan_a_fresh_topology_builds(two_nodes):
    gpus = two_nodes.gpus[:12]  # a whole machine and half of the other
    tuning = tune.tuning(80, "tree", "ll")
    fresh = plans.tree_plan(load_topology("dgx-a100-2node"), gpus, tuning)
    plans.tree_plan(two_nodes, gpus, tune.tuning(80, "tree", "simple"))  # the walk kept by another protocol
    assert plans.tree_plan(two_nodes, gpus, tuning) == fresh
