"""No modelled collective beats the wires: for every preset, collective, algorithm, protocol and size, the
busbw stays at or under the line-rate bound of sim/collectives/limits.py."""

from __future__ import annotations

import pytest

from trainsim.errors import TrainsimError
from trainsim.sim.collectives import limits
from trainsim.sim.collectives.nccl_tuning import PROTOCOLS
from trainsim.sim.collectives.ops import bus_factor, collective_time, feasible_algorithms, simulate_collective
from trainsim.topologies import list_presets, load_topology

SIZES = (2**10, 2**16, 2**20, 2**24, 2**28, 2**30)


def _runs(topo, op, gpus):
    for algo in feasible_algorithms(topo, op, gpus):
        for proto in PROTOCOLS:
            yield algo, proto


@pytest.mark.parametrize("preset", list_presets())
def test_no_collective_exceeds_the_wire_rate(preset):
    topo = load_topology(preset)
    gpus = topo.gpus
    if len(gpus) < 2:
        pytest.skip("one device (e.g. a single KNL node): a collective over one rank moves nothing")
    checked = 0
    for op in limits.BOUNDED:
        for algo, proto in _runs(topo, op, gpus):
            limit = limits.busbw_limit(topo, op, gpus, algo)
            for size in SIZES:
                try:
                    seconds = collective_time(topo, op, gpus, size, algo=algo, proto=proto)
                except TrainsimError:  # a protocol this algorithm cannot run
                    break
                busbw = size / seconds * bus_factor(op, len(gpus))
                assert busbw <= limit * (1 + 1e-9), (preset, op, algo, proto, size, busbw / 1e9, limit / 1e9)
                checked += 1
    assert checked > 0


@pytest.mark.parametrize("preset", ["dgx-a100", "dgx-h100", "dgx1-v100", "pcie-8gpu-2socket"])
def test_the_flow_path_stays_under_the_wire_rate_too(preset):
    topo = load_topology(preset)
    for op in limits.BOUNDED:
        for algo in feasible_algorithms(topo, op, topo.gpus):
            seconds = simulate_collective(topo, op, None, 2**30, algo=algo)["time_s"]
            busbw = 2**30 / seconds * bus_factor(op, len(topo.gpus))
            assert busbw <= limits.busbw_limit(topo, op, topo.gpus, algo)


def test_the_bounds_are_the_wires():
    h100 = load_topology("dgx-h100")
    port = 450e9  # NV18: 18 NVLink 4 links x 25 GB/s per direction
    pcie = h100.edge("gpu0", "sw0")["raw_bandwidth"]
    assert limits.raw_injection(h100, "gpu0") == pytest.approx(port + pcie)
    assert limits.busbw_limit(h100, "allreduce", h100.gpus, "ring") == pytest.approx(port + pcie)
    assert limits.busbw_limit(h100, "allreduce", h100.gpus, "nvls") == pytest.approx(2 * (port + pcie))
    assert limits.busbw_limit(h100, "broadcast", h100.gpus, "ring") is None
    # 32 DGX H100 on NDR: each machine's 8 x 400 Gb/s NICs bound the cross-machine all-gather below the
    # GPUs' own ports; the all-reduce's bound (twice the NICs' share) stays the GPU's
    pod = load_topology("dgx-h100-rail-32node")
    n, m = len(pod.gpus), 32
    nics = 8 * 50e9
    assert limits.busbw_limit(pod, "allgather", pod.gpus, "ring") == pytest.approx(
        nics * m / (m - 1) * (n - 1) / n, rel=0.02)
    assert limits.busbw_limit(pod, "allreduce", pod.gpus, "ring") == pytest.approx(port + pcie)


def test_no_nvls_collective_exceeds_the_switch_engines():
    # 8 H100 on one NVSwitch set whose NVLS engines take in 1000 GB/s: they, not the ports, bind
    topo = load_topology({"generator": "nvswitch", "name": "h100-engine", "gpus": 8, "gpu": "h100-sxm",
                          "memory_gib": 80, "links_per_gpu": 18, "nvlink_generation": 4, "nvls_gbps": 1000})
    assert limits.busbw_limit(topo, "allreduce", topo.gpus, "nvls") == pytest.approx(2 * 1000e9 / 8)
    assert limits.busbw_limit(topo, "reduce_scatter", topo.gpus, "nvls") == pytest.approx(1000e9 / 8)
    # all-gather: the engines take in each shard once (1000 GB/s), more than a GPU can receive
    port = limits.raw_injection(topo, "gpu0")
    assert limits.busbw_limit(topo, "allgather", topo.gpus, "nvls") == pytest.approx(port)
    for op in limits.BOUNDED:
        limit = limits.busbw_limit(topo, op, topo.gpus, "nvls")
        for size in SIZES:
            busbw = size / collective_time(topo, op, None, size, algo="nvls") * bus_factor(op, 8)
            assert busbw <= limit * (1 + 1e-9), (op, size, busbw / 1e9, limit / 1e9)
