"""The machine: streams overlap, copies are flows, pageable copies take a core and the CPU's copy rate."""

import pytest
from simtools import tiny_topology

from trainsim.errors import TrainsimError
from trainsim.sim.core.machine import PAGEABLE_COPY_RATE, build_machine
from trainsim.topologies import load_topology


def _h2d_route(machine, gpu="gpu0"):
    topo = machine.topology
    return topo.route(topo.host_memory(gpu), gpu)


def test_compute_and_a_copy_on_different_streams_overlap():
    machine = build_machine(load_topology(tiny_topology(gpus=1, nvlink=False)))
    env = machine.env
    env.process(machine.run("gpu0", "compute", 0.5, op="forward", iteration=0))
    env.process(machine.h2d("gpu0", 1e9, iteration=0))  # 1 GB at 10 GB/s: 0.1 s
    env.run()
    transfer = 1e9 / 10e9 + machine.topology.route_latency(_h2d_route(machine))
    assert env.now == pytest.approx(max(0.5, transfer))
    assert {op.op for op in machine.ops} == {"forward", "h2d_input"}


def test_work_on_one_stream_is_serial():
    machine = build_machine(load_topology(tiny_topology(gpus=1, nvlink=False)))
    env = machine.env
    for _ in range(3):
        env.process(machine.run("gpu0", "compute", 0.25, op="forward", iteration=0))
    env.run()
    assert env.now == pytest.approx(0.75)


def test_pinned_copy_runs_at_the_link_and_pageable_at_the_cpu_copy_rate_holding_a_core():
    topo = load_topology(tiny_topology(gpus=1, nvlink=False, pcie_gbps=25.0))
    pinned = build_machine(topo)
    pinned.env.process(pinned.h2d("gpu0", 1e9, iteration=0, pinned=True))
    pinned.env.run()
    latency = topo.route_latency(_h2d_route(pinned))
    assert pinned.env.now == pytest.approx(1e9 / 25e9 + latency)

    pageable = build_machine(topo)
    env = pageable.env
    env.process(pageable.h2d("gpu0", 1e9, iteration=0, pinned=False))
    host = pageable.hosts["cpu0"]
    seen = []
    env.process(_watch(env, host, seen))
    env.run()
    assert env.now == pytest.approx(1e9 / PAGEABLE_COPY_RATE + latency)
    assert seen == [1]  # one core busy staging the copy half-way through
    staging = [op for op in pageable.ops if op.resource == "cpu0"]
    assert len(staging) == 1 and staging[0].op == "h2d_input_staging"


def test_a_pageable_copy_runs_at_the_topologys_pageable_rate():
    doc = tiny_topology(gpus=1, nvlink=False, pcie_gbps=25.0)
    doc["nodes"][0]["pageable_gbps"] = 5.0  # what `trainsim calibrate` wrote for loader batches
    topo = load_topology(doc)
    machine = build_machine(topo)
    assert machine.hosts["cpu0"].pageable_rate == pytest.approx(5e9) == topo.pageable_rate("gpu0")
    machine.env.process(machine.h2d("gpu0", 1e9, iteration=0, pinned=False))
    machine.env.run()
    assert machine.env.now == pytest.approx(1e9 / 5e9 + topo.route_latency(_h2d_route(machine)))
    assert load_topology(tiny_topology(gpus=1)).pageable_rate("gpu0") == PAGEABLE_COPY_RATE  # none given
    with pytest.raises(TrainsimError, match=r"nodes\[0\]\.pageable_gbps"):
        load_topology({**doc, "nodes": [{**doc["nodes"][0], "pageable_gbps": 0}, *doc["nodes"][1:]]})


def _watch(env, host, seen):
    yield env.timeout(0.05)
    seen.append(host.cores.count)


def test_copies_that_share_a_link_share_its_bandwidth():
    topo = load_topology(tiny_topology(gpus=2, nvlink=False, pcie_gbps=10.0, uplink_gbps=10.0))
    machine = build_machine(topo)
    for gpu in ("gpu0", "gpu1"):
        machine.env.process(machine.h2d(gpu, 1e9, iteration=0))
    machine.env.run()
    latency = topo.route_latency(_h2d_route(machine))
    assert machine.env.now == pytest.approx(2e9 / 10e9 + latency)  # both through the one uplink


def test_host_work_holds_cores():
    machine = build_machine(load_topology(tiny_topology(gpus=1, nvlink=False, cores=2)))
    host = machine.hosts["cpu0"]
    for _ in range(3):
        machine.env.process(machine.host_work(host, 1.0, op="data_prep", iteration=0))
    machine.env.run()
    assert machine.env.now == pytest.approx(2.0)  # two cores: the third job waits for one
