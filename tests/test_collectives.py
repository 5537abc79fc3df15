"""Collectives: hand-computable cases, nccl-tests factors, flow vs analytic agreement, contention, errors."""

from __future__ import annotations

import pytest
import simpy

from trainsim.errors import TrainsimError
from trainsim.sim.collectives import nccl_tuning as tune
from trainsim.sim.collectives import ops as coll
from trainsim.sim.collectives.ops import (
    COLLECTIVES,
    bench,
    bus_factor,
    choose_algorithm,
    collective_time,
    parse_sizes,
    run_collective,
    simulate_collective,
)
from trainsim.sim.collectives.plans import dtree_parents
from trainsim.sim.collectives.rings import Channel, build_channels, ring_cost
from trainsim.sim.core.flows import FlowNetwork
from trainsim.topologies import list_presets, load_topology

MIB, GIB = 2**20, 2**30


@pytest.fixture(scope="module")
def presets():
    return {name: load_topology(name) for name in list_presets()}


def two_gpus(bandwidth_gbps=10.0, latency_us=1.0):
    """Two GPUs joined by one NVLink of known bandwidth and latency (plus their PCIe to a socket)."""
    return load_topology({
        "name": "two-gpus", "nodes": [
            {"name": "cpu0", "kind": "cpu", "cores": 4, "dram_bandwidth_gbps": 100},
            {"name": "gpu0", "kind": "gpu", "spec": "V100"}, {"name": "gpu1", "kind": "gpu", "spec": "V100"}],
        "links": [
            {"a": "cpu0", "b": "gpu0", "kind": "pcie", "generation": 3},
            {"a": "cpu0", "b": "gpu1", "kind": "pcie", "generation": 3},
            {"a": "gpu0", "b": "gpu1", "kind": "nvlink", "bandwidth_gbps": bandwidth_gbps,
             "latency_us": latency_us}]})


def flow_time(topo, op, gpus, nbytes, algo="auto", **kwargs):
    env = simpy.Environment()
    net = FlowNetwork.from_topology(env, topo)
    env.process(run_collective(env, net, topo, op, gpus, nbytes, algo=algo, **kwargs))
    env.run()
    return env.now, net


# ---- hand-computable cases ---------------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["flow", "analytic"])
def test_two_gpu_allreduce_is_the_textbook_formula(method):
    topo, size = two_gpus(), 64 * MIB
    n, bandwidth = 2, 10e9
    # NCCL ring / Simple: its base plus 2(n-1) steps of its NVLink hop latency (which includes the wire's).
    base, hop = tune.BASE_LAT["ring"]["simple"] * 1e-6, tune.HW_LAT["nvlink"]["ring"]["simple"] * 1e-6
    expected = base + 2 * (n - 1) * hop + 2 * (n - 1) / n * size / bandwidth
    got = flow_time(topo, "allreduce", None, size)[0] if method == "flow" else collective_time(
        topo, "allreduce", None, size)
    assert got == pytest.approx(expected, rel=1e-9)


def test_two_gpu_broadcast_and_sendrecv_move_the_array_once():
    topo, size = two_gpus(), 8 * MIB
    base, hop = tune.BASE_LAT["ring"]["simple"] * 1e-6, tune.HW_LAT["nvlink"]["ring"]["simple"] * 1e-6
    expected = base + hop + size / 10e9
    for op in ("broadcast", "reduce", "sendrecv"):
        t, net = flow_time(topo, op, None, size)
        assert t == pytest.approx(expected, rel=1e-9)
        assert collective_time(topo, op, None, size) == pytest.approx(expected, rel=1e-9)
    _, net = flow_time(topo, "sendrecv", ["gpu0", "gpu1"], size)
    assert len(net.records) == 1 and net.records[0].route == (("gpu0", "gpu1"),)


def test_nvswitch_ring_allreduce_matches_alpha_beta(presets):
    topo = presets["dgx-a100"]
    n, size = len(topo.gpus), GIB
    link = topo.edge("gpu0", "nvsw0")["bandwidth"]  # every GPU's port into the switch
    hop = tune.HW_LAT["nvlink"]["ring"]["simple"] * 1e-6
    expected = tune.BASE_LAT["ring"]["simple"] * 1e-6 + 2 * (n - 1) * hop + 2 * (n - 1) / n * size / link
    assert collective_time(topo, "allreduce", None, size, algo="ring") == pytest.approx(expected, rel=1e-9)
    assert flow_time(topo, "allreduce", None, size, algo="ring")[0] == pytest.approx(expected, rel=1e-9)


def test_nvls_moves_n_plus_one_shards_each_way(presets):
    topo = presets["dgx-h100"]
    n, size = len(topo.gpus), GIB
    link = topo.edge("gpu0", "nvsw0")["bandwidth"]
    t = flow_time(topo, "allreduce", None, size, algo="nvls")[0]
    latency = tune.HW_LAT["nvlink"]["nvls"]["simple"] * 1e-6  # NCCL's one NVLS latency, no base
    # reduce-scatter then multicast: S/n shards x (n reads + 1 multicast store) each way, at NCCL's NVLS
    # efficiency (5/6) of the link rate. The 3-stage pipeline (scatter, reduce + multicast, gather) fills and
    # drains: a round is 16 channels x 8 heads x 128 KiB chunks (NCCL's chunk at 1 GiB); its reduce +
    # multicast (9/8 of it through the port at 309 GB/s) is the bottleneck the steady state counts, and
    # scatter and gather each copy it in the GPU's own memory (read + write at H100's 3.35 TB/s) on top
    round_ = 16 * 8 * 131072
    fill = 2 * 2 * round_ / 3.35e12
    assert t == pytest.approx(latency + (n + 1) / n * size / link / tune.NVLS + fill, rel=1e-9)
    assert choose_algorithm(topo, "allreduce", None, GIB) == "nvls"
    assert choose_algorithm(presets["dgx-a100"], "allreduce", None, GIB) != "nvls"  # no in-switch reduction


def test_single_gpu_group_costs_nothing(presets):
    topo = presets["dgx-a100"]
    assert collective_time(topo, "allreduce", ["gpu3"], GIB) == 0.0
    assert flow_time(topo, "allreduce", ["gpu3"], GIB)[0] == 0.0


# ---- bus bandwidth factors ------------------------------------------------------------------------

def test_bus_factors_are_nccl_tests():
    assert bus_factor("allreduce", 8) == pytest.approx(2 * 7 / 8)
    for op in ("reduce_scatter", "allgather", "alltoall"):
        assert bus_factor(op, 8) == pytest.approx(7 / 8)
    for op in ("broadcast", "reduce", "sendrecv"):
        assert bus_factor(op, 8) == 1.0


def test_bench_rows_report_algbw_and_busbw(presets):
    rows = bench(presets["pcie-4gpu-gen3"], "allgather", [MIB, 16 * MIB])
    assert [(r["size_bytes"], r["method"]) for r in rows] == [
        (MIB, "flow"), (MIB, "analytic"), (16 * MIB, "flow"), (16 * MIB, "analytic")]
    for r in rows:
        assert r["algbw_gbps"] == pytest.approx(r["size_bytes"] / r["time_s"] / 1e9)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * 3 / 4)
        assert r["algo"] == "ring"


# ---- rings follow the hardware --------------------------------------------------------------------

def test_dgx1_rings_cover_every_nvlink(presets):
    topo = presets["dgx1-v100"]
    channels = build_channels(topo, topo.gpus)
    # 24 NVLinks / 8 per Hamiltonian cycle = 3 cycles, each run both ways: 6 rings, each hop a direct NVLink
    assert len(channels) == 6
    for ch in channels:
        assert all(topo.route(a, b) == [(a, b)] for a, b in ch.hops())
    per_link = topo.edge("gpu0", "gpu2")["bandwidth"]  # a single NVLink 2
    t = flow_time(topo, "allreduce", None, GIB, algo="ring")[0]
    busbw = GIB / t * bus_factor("allreduce", 8)
    assert busbw == pytest.approx(6 * per_link, rel=0.02)  # every GPU sends on its 6 NVLinks at once


def test_pcie_ring_keeps_neighbours_under_one_switch(presets):
    topo = presets["pcie-8gpu-2socket"]
    interleaved = ["gpu0", "gpu2", "gpu1", "gpu3"]  # as given, every hop would cross a switch uplink
    forced = ring_cost(topo, (Channel(tuple(interleaved), 1.0),))
    chosen = build_channels(topo, interleaved)
    assert ring_cost(topo, chosen) == pytest.approx(forced / 2)  # one ring hop per uplink direction, not two


def test_cross_socket_link_bounds_the_pcie_server(presets):
    topo = presets["pcie-8gpu-2socket"]
    t = flow_time(topo, "allreduce", None, GIB, algo="ring")[0]
    busbw = GIB / t * bus_factor("allreduce", 8)
    assert busbw == pytest.approx(topo.edge("cpu0", "cpu1")["bandwidth"], rel=0.02)


def test_shared_uplink_slows_the_collective_in_the_flow_model(presets):
    topo = presets["pcie-4gpu-gen3"]
    size = 256 * MIB
    alone = flow_time(topo, "allreduce", None, size)[0]

    def with_traffic(dst):
        env = simpy.Environment()
        net = FlowNetwork.from_topology(env, topo)
        for _ in range(4):  # host-to-device copies through the switch's single uplink
            net.transfer(topo.route("cpu0.dram", dst), size)
        proc = env.process(run_collective(env, net, topo, "allreduce", None, size))
        env.run(until=proc)
        return env.now

    assert with_traffic("gpu0") > 1.3 * alone  # the copies share sw0 -> gpu0 with a ring hop
    assert with_traffic("cpu0") == pytest.approx(alone, rel=1e-9)  # host-only traffic shares nothing
    assert collective_time(topo, "allreduce", None, size) == pytest.approx(alone, rel=1e-9)


def test_double_binary_tree_is_two_trees():
    for n in (2, 3, 4, 7, 8):
        for parents in dtree_parents(n):
            assert sorted(parents).count(-1) == 1
            for r in range(n):  # following parents reaches the root without a cycle
                seen, x = set(), r
                while parents[x] >= 0:
                    assert x not in seen
                    seen.add(x)
                    x = parents[x]
        if n > 2:
            first, second = dtree_parents(n)
            leaves = [set(range(n)) - set(p) for p in (first, second)]
            assert leaves[0] != leaves[1]


# ---- the two paths agree --------------------------------------------------------------------------

@pytest.mark.parametrize("name,op,algo", [
    ("dgx-a100", "allreduce", "ring"), ("dgx-a100", "allreduce", "tree"), ("dgx-h100", "allreduce", "nvls"),
    ("dgx1-v100", "allreduce", "ring"), ("dgx1-v100", "allgather", "ring"),
    ("pcie-8gpu-2socket", "allreduce", "ring"), ("pcie-8gpu-2socket", "broadcast", "ring"),
    ("consumer-2gpu-nop2p", "allreduce", "ring"), ("dgx-a100-2node", "allreduce", "ring"),
    ("dgx-a100-2node", "allreduce", "tree"), ("dgx2-v100", "alltoall", "p2p")])
def test_flow_and_analytic_agree_from_1_mib(presets, name, op, algo):
    topo = presets[name]
    for size in (MIB, 64 * MIB, GIB):
        flow = simulate_collective(topo, op, None, size, algo=algo)["time_s"]
        assert flow == pytest.approx(collective_time(topo, op, None, size, algo=algo), rel=0.05)


def test_grouping_ring_steps_keeps_the_time(presets):
    topo = presets["dgx-a100-2node"]
    exact, net_exact = flow_time(topo, "allreduce", None, 64 * MIB, algo="ring", max_flows=10**9)
    grouped, net_grouped = flow_time(topo, "allreduce", None, 64 * MIB, algo="ring", max_flows=500)
    assert net_grouped.stats.flows_finished < net_exact.stats.flows_finished / 4
    assert grouped == pytest.approx(exact, rel=1e-6)


@pytest.mark.slow
def test_every_collective_runs_on_every_preset(presets):
    for name, topo in presets.items():
        if len(topo.gpus) < 2:  # one device (a KNL node): a collective over one rank takes no time
            assert collective_time(topo, "allreduce", None, 64 * 1024) == 0, name
            continue
        for op in COLLECTIVES:
            t = simulate_collective(topo, op, None, 64 * 1024)["time_s"]
            assert 0 < t < 0.01, (name, op)
            assert collective_time(topo, op, None, 64 * 1024) > 0


def test_subgroups_and_indices(presets):
    topo = presets["dgx1-v100"]
    by_index = collective_time(topo, "allreduce", [0, 1, 2, 3], GIB)
    by_name = collective_time(topo, "allreduce", ["gpu0", "gpu1", "gpu2", "gpu3"], GIB)
    assert by_index == by_name
    assert simulate_collective(topo, "allreduce", [0, 5], MIB)["time_s"] > 0  # no NVLink: PCIe and QPI


# ---- bad input ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,match", [
    ({"op": "allsum"}, "unknown collective 'allsum'.*allreduce"),
    ({"algo": "butterfly"}, "unknown algorithm 'butterfly'.*ring"),
    ({"op": "broadcast", "algo": "tree"}, "broadcast cannot run as 'tree'"),
    ({"gpus": ["gpu0", "gpu99"]}, "unknown GPU 'gpu99'"),
    ({"gpus": [0, 12]}, "out of range"),
    ({"gpus": ["gpu0", "gpu0"]}, "twice"),
    ({"nbytes": -1}, "nbytes"),
])
def test_bad_input_is_a_trainsim_error(presets, kwargs, match):
    args = {"op": "allreduce", "gpus": None, "nbytes": MIB, "algo": "auto"} | kwargs
    with pytest.raises(TrainsimError, match=match):
        collective_time(presets["dgx-a100"], args["op"], args["gpus"], args["nbytes"], algo=args["algo"])


def test_nvls_without_switch_reduction_is_refused(presets):
    with pytest.raises(TrainsimError, match="reduce: true"):
        collective_time(presets["dgx-a100"], "allreduce", None, MIB, algo="nvls")


def h100_box(nvls_gbps=None, reduce=None):
    """8 H100 on one NVSwitch set (NVLink 4, 18 links per GPU), its NVLS engines at ``nvls_gbps``."""
    spec = {"generator": "nvswitch", "name": "h100-engine", "gpus": 8, "gpu": "h100-sxm", "memory_gib": 80,
            "links_per_gpu": 18, "nvlink_generation": 4}
    if nvls_gbps is not None:
        spec["nvls_gbps"] = nvls_gbps
    if reduce is not None:
        spec["reduce"] = reduce
    return load_topology(spec)


def test_nvls_engine_is_a_resource_all_the_switch_gpus_share():
    fast, slow = h100_box(), h100_box(nvls_gbps=1000)
    n, size = 8, GIB
    assert fast.nvls_engine("nvsw0") is None and slow.nvls_engine("nvsw0") == ("nvsw0", "nvsw0")
    # the ports bind without an engine figure: (n+1)/n S each way per port
    port = fast.edge("gpu0", "nvsw0")["bandwidth"]
    base = tune.HW_LAT["nvlink"]["nvls"]["simple"] * 1e-6
    t_fast = collective_time(fast, "allreduce", None, size, algo="nvls")
    fill_fast = coll._fill(fast, "allreduce", tuple(fast.gpus), "nvls", "simple", size)
    assert t_fast == pytest.approx(base + (n + 1) / n * size / port / tune.NVLS + fill_fast, rel=1e-9)
    # 1000 GB/s of engine for 8 GPUs (125 GB/s each) binds before the 370.8 GB/s ports: every GPU's
    # (n+1)/n S up goes through it, (n+1) S in all, at NCCL's NVLS efficiency like the links
    t_slow = collective_time(slow, "allreduce", None, size, algo="nvls")
    fill_slow = coll._fill(slow, "allreduce", tuple(slow.gpus), "nvls", "simple", size)
    assert t_slow == pytest.approx(base + (n + 1) * size / 1000e9 / tune.NVLS + fill_slow, rel=1e-9)
    assert flow_time(slow, "allreduce", None, size, algo="nvls")[0] == pytest.approx(t_slow, rel=1e-6)
    moved = coll.collective_link_bytes(slow, "allreduce", None, size, algo="nvls")
    assert moved["nvsw0", "nvsw0"] == pytest.approx((n + 1) * size / tune.NVLS)
    # the fill's stage through the switch runs at a GPU's share of the engine (125 GB/s), not the port's
    rates = coll._stage_rates(slow, "allreduce", tuple(slow.gpus), "nvls", "simple")[0]
    assert rates.port == pytest.approx(1000e9 / n * tune.NVLS)
    # reduce-scatter sends S up per GPU: n S through the engine, which binds
    t = collective_time(slow, "reduce_scatter", None, size, algo="nvls")
    assert t == pytest.approx(base + n * size / 1000e9 / tune.NVLS, rel=1e-9)
    assert flow_time(slow, "reduce_scatter", None, size, algo="nvls")[0] == pytest.approx(t, rel=1e-6)
    # all-gather sends S/n up per GPU (S through the engine) but S down each port: the ports still bind
    t = collective_time(slow, "allgather", None, size, algo="nvls")
    assert t == pytest.approx(collective_time(fast, "allgather", None, size, algo="nvls"), rel=1e-12)
    assert t == pytest.approx(base + size / port / tune.NVLS, rel=1e-9)
    # other algorithms never cross it
    assert collective_time(slow, "allreduce", None, size, algo="ring") == pytest.approx(
        collective_time(fast, "allreduce", None, size, algo="ring"))


def test_nvls_engine_needs_a_reducing_switch():
    with pytest.raises(TrainsimError, match=r"nvls_gbps needs a switch that reduces") as err:
        h100_box(nvls_gbps=1000, reduce=False)
    assert err.value.field.endswith("nvls_gbps")
    with pytest.raises(TrainsimError, match="nvls_gbps"):
        h100_box(nvls_gbps=0)


def test_nvls_tree_is_nvls_in_each_machine_and_a_tree_of_shards_between(presets):
    topo = presets["dgx-h100-4node"]
    gpus = topo.gpus[:16]  # two machines
    n = 8  # GPUs per machine: shard i travels between the machines on GPU i's own NIC
    t_flow = flow_time(topo, "allreduce", gpus, GIB, algo="nvls_tree")[0]
    t_analytic = collective_time(topo, "allreduce", gpus, GIB, algo="nvls_tree")
    assert t_flow == pytest.approx(t_analytic, rel=1e-6)
    moved = coll.collective_link_bytes(topo, "allreduce", gpus, GIB, algo="nvls_tree")
    plan = coll.plan_collective(topo, "allreduce", gpus, "nvls_tree")
    assert plan.efficiency == pytest.approx(tune.NVLS)
    switch = coll.nvls_switch(topo, list(gpus[:8]))
    assert moved[gpus[0], switch] == pytest.approx((n + 1) / n * GIB / tune.NVLS)
    nic_out = [(a, b) for (a, b) in moved if topo.graph.nodes[a]["kind"] == "nic"
               and topo.graph.nodes[b]["kind"] == "network_switch"]
    assert len(nic_out) == 16  # every NIC of both machines sends
    # two trees over two machines, half a shard each, up in one and down in the other: S/n per NIC
    assert all(moved[e] == pytest.approx(GIB / n / tune.NVLS) for e in nic_out)
    # NCCL: hwLat NVLink NVLSTree 23 us + 2 log2(2) x hwLat NET NVLSTree 14 us, no base
    assert plan.lanes[0][0].transfers[0].latency == pytest.approx((23 + 2 * 14) * 1e-6)
    assert choose_algorithm(topo, "allreduce", gpus, GIB) == "nvls_tree"


@pytest.mark.parametrize("name, gpus", [("dgx-a100-2node", None), ("dgx-h100", None)])
def test_nvls_tree_needs_nvswitch_machines(presets, name, gpus):
    with pytest.raises(TrainsimError, match="nvls_tree needs .*valid choices: auto, ring, tree"):
        collective_time(presets[name], "allreduce", gpus, MIB, algo="nvls_tree")
    assert "nvls_tree" not in coll.feasible_algorithms(presets[name], "allreduce", presets[name].gpus)


def test_nvls_chunks_follow_nccl_sizes():
    # concurrentOps = 16 NVLS channels x 8 heads = 128 (enqueue.cc's thresholds, worked by hand)
    assert [tune.nvls_chunk("nvls", s, 128) for s in (MIB, 16 * MIB, 256 * MIB, GIB)] == [
        16384, 32768, 65536, 131072]
    assert [tune.nvls_chunk("nvls_tree", s, 128) for s in (4 * MIB, 16 * MIB, GIB, 4 * GIB)] == [
        32768, 65536, 262144, 524288]


def test_nvls_pipeline_stages_follow_the_kernel():
    # a round: 128 chunks, or all of S where that is less; scatter and gather copy it in the GPU's memory
    # (read + write), NVLS's reduce + multicast moves 9/8 of it through the port (8 pulls + its own store)
    r = 128 * 131072
    copy = ("memory", 2 * r)
    assert tune.pipeline_stages("nvls", GIB, 8, 1) == [copy, ("port", r * 9 / 8), copy]
    assert tune.pipeline_stages("nvls", MIB, 8, 1)[0] == ("memory", 2 * MIB)  # 128 x 16 KiB = 2 MiB > S
    # NVLSTree, 2 machines (depth 1): leaf reduce, hop up, root reduce + multicast, hop down, receive +
    # multicast; a hop carries the GPU's chunks of half the channels (one of the two trees): R / 16
    r = 128 * 262144
    copy, hop = ("memory", 2 * r), ("nic", r / 16)
    assert tune.pipeline_stages("nvls_tree", GIB, 8, 2) == [
        copy, ("port", r), hop, ("port", r * 9 / 8), hop, ("port", r), copy]
    leaf, root = ("port", r), ("port", r * 9 / 8)
    # depth 2: a reduce per level up, a receive + multicast per level down
    assert tune.pipeline_stages("nvls_tree", GIB, 8, 4) == [
        copy, leaf, hop, leaf, hop, root, hop, leaf, hop, leaf, copy]
    # fill and drain: every stage alone at its resource's rate, less the bottleneck (the root's reduce here)
    rates = tune.StageRates(port=300e9, nic=50e9, memory=3e12)
    expected = 2 * (2 * r / 3e12) + 2 * (r / 300e9) + 2 * (r / 16 / 50e9)
    assert tune.pipeline_fill(90, "allreduce", "nvls_tree", GIB, 8, 2, rates) == pytest.approx(expected)
    assert tune.pipeline_fill(90, "allreduce", "ring", GIB, 8, 1, rates) == 0.0
    assert tune.pipeline_fill(None, "allreduce", "nvls", GIB, 8, 1, rates) == 0.0


def test_sizes_parse_like_nccl_tests():
    assert parse_sizes("1K:8K") == [1024, 2048, 4096, 8192]
    assert parse_sizes("1M:1G:32") == [MIB, 32 * MIB, GIB]
    assert parse_sizes("4096,1M") == [4096, MIB]
    for bad in ("1Q", "8K:1K", "1K:1G:1", "0:1K"):
        with pytest.raises(TrainsimError):
            parse_sizes(bad)


def test_module_exports():
    assert set(coll.ALGORITHMS) >= {"auto", "ring", "tree", "nvls"}
