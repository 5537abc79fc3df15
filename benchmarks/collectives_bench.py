"""Collectives: modelled bus bandwidth next to published figures, flow vs analytic, and flow-level speed.

(a benchmark, not a test) Run: python benchmarks/collectives_bench.py

1. All-reduce busbw at 1 GiB on dgx-a100, dgx-h100 (ring and NVLS), dgx1-v100 and pcie-8gpu-2socket, from
   the flow simulation and the analytic model, next to the figure docs/hardware-figures.md gives. For
   dgx1-v100 and the PCIe server it has link figures only, so the comparison is with what those links
   allow a ring: 6 NVLinks x NCCL's effective 20 GB/s per V100 GPU, and the Skylake UPI figure (10 GB/s)
   that a ring over both sockets must cross.
2. The largest flow-vs-analytic difference over 1 KiB .. 1 GiB (factor 2) per preset and algorithm, over
   all sizes and over sizes >= 1 MiB.
3. A 64-GPU all-reduce (8 x DGX A100 on one HDR InfiniBand switch) decomposed into flows: wall time,
   flows/s and the time per fair-share recompute, for the ring and the tree.

Nothing here is tuned: the link bandwidths are the topology library's (the link-level figures of
docs/hardware-figures.md).

What sets these figures (every preset now within 2 % of its published or link-derived figure at 1 GiB):

- GPU collectives follow NCCL's cost model (sim/collectives/nccl_tuning.py): the protocol's share of the
  links' bandwidth, its latencies, and NCCL's choice of algorithm and protocol per size. At 1 GiB that is
  Simple on rings; the ring figures are the links' (the NVLink 3 port's 274 GB/s copy-engine P2P figure
  is above what NCCL's SM loads and stores reach, which NCCL's own tuner caps near 235 GB/s).
- dgx-h100 NVLS: NCCL's NVLS efficiency (busBw to algBw, 5/6) on the plan's switch-port bytes. A switch may
  give its NVLS engines a throughput of their own (``nvls_gbps``, a resource all its GPUs share); the preset
  does not, because the published NVLS runs of 5 to 8 GPUs move the same bytes per port, which a shared
  engine would not allow (benchmarks/nccl_curves.py prints the per-port rates).

The flow and analytic paths agree exactly on lone collectives whose phases move equal bytes per flow:
both evaluate the same plan, and max-min fair sharing then finishes the flows of the most loaded edge
last, at that edge's load / bandwidth. They part where flows differ (dgx2-v100 all-to-all: cross-board
routes) and wherever other traffic shares the links, which only the flow path sees.
"""

from __future__ import annotations

import time

from trainsim.sim.collectives.ops import (
    bus_factor,
    collective_time,
    feasible_algorithms,
    plan_collective,
    simulate_collective,
)
from trainsim.topologies import list_presets, load_topology

GIB, MIB = 2**30, 2**20

PUBLISHED = [  # preset, algo, (low, high) GB/s, what docs/hardware-figures.md says
    ("dgx-a100", "ring", (230.0, 235.0), "A100 all-reduce busbw tops out near 230-235 GB/s"),
    ("dgx-h100", "ring", (365.0, 370.0), "8x H100 ring all-reduce busbw ~365-370 GB/s"),
    ("dgx-h100", "nvls", (480.0, 480.0), "8x H100 NVLS all-reduce busbw ~480 GB/s"),
    ("dgx1-v100", "ring", (120.0, 120.0), "link figures only: 6 NVLinks x 20 GB/s NCCL effective"),
    ("pcie-8gpu-2socket", "ring", (10.0, 10.0), "link figures only: Skylake UPI 10 GB/s (NCCL)"),
]


def busbw(size: float, seconds: float, n: int) -> float:
    return size / seconds / 1e9 * bus_factor("allreduce", n)


def published_comparison() -> None:
    print("1. All-reduce busbw at 1 GiB (GB/s) vs published / link-derived figures")
    print(f"   {'preset':<18} {'algo':<5} {'flow':>7} {'analytic':>9} {'published':>11} {'off by':>7}  "
          "source")
    for name, algo, (low, high), source in PUBLISHED:
        topo = load_topology(name)
        n = len(topo.gpus)
        flow = busbw(GIB, simulate_collective(topo, "allreduce", None, GIB, algo=algo)["time_s"], n)
        analytic = busbw(GIB, collective_time(topo, "allreduce", None, GIB, algo=algo), n)
        ref = f"{low:.0f}" if low == high else f"{low:.0f}-{high:.0f}"
        nearest = min(max(flow, low), high)  # off by nothing inside the published range
        off = (flow - nearest) / nearest
        print(f"   {name:<18} {algo:<5} {flow:>7.1f} {analytic:>9.1f} {ref:>11} {off:>+7.1%}  {source}")


def agreement() -> None:
    print("\n2. Flow vs analytic: largest |difference| over 1 KiB .. 1 GiB")
    print(f"   {'preset':<22} {'algo':<5} {'all sizes':>10} {'>= 1 MiB':>9}")
    sizes = [2**k for k in range(10, 31)]
    for name in list_presets():
        topo = load_topology(name)
        for algo in feasible_algorithms(topo, "allreduce", topo.gpus):
            worst = worst_large = 0.0
            for size in sizes:
                flow = simulate_collective(topo, "allreduce", None, size, algo=algo)["time_s"]
                analytic = collective_time(topo, "allreduce", None, size, algo=algo)
                diff = abs(flow - analytic) / analytic
                worst = max(worst, diff)
                if size >= MIB:
                    worst_large = max(worst_large, diff)
            print(f"   {name:<22} {algo:<5} {worst:>10.3%} {worst_large:>9.3%}")
    for name, op in (("dgx2-v100", "alltoall"), ("dgx-a100-2node", "alltoall"), ("dgx1-v100", "broadcast")):
        topo = load_topology(name)
        worst = max(abs(simulate_collective(topo, op, None, s)["time_s"]
                            / collective_time(topo, op, None, s) - 1) for s in sizes if s >= MIB)
        print(f"   {name:<22} {op} (>= 1 MiB): {worst:.3%}")


def scale() -> None:
    print("\n3. 64-GPU all-reduce (8 x dgx-a100, HDR InfiniBand), decomposed into flows")
    topo = load_topology({"generator": "cluster", "node": "dgx-a100", "nodes": 8, "network": "ib",
                          "generation": "hdr"})
    for algo in ("ring", "tree"):
        start = time.perf_counter()
        plan = plan_collective(topo, "allreduce", None, algo)
        planning = time.perf_counter() - start
        for size in (MIB, GIB):
            r = simulate_collective(topo, "allreduce", None, size, algo=algo)
            print(f"   {algo:<4} {size // MIB:>5} MiB: wall {r['wall_s']:.3f} s "
                  f"(+ {planning:.3f} s planning, once), "
                  f"{r['flows']:,} flows ({plan.flows:,} flows before grouping ring steps), "
                  f"{r['flows'] / r['wall_s']:,.0f} flows/s, {r['recomputes']} recomputes at "
                  f"{1e6 * r['recompute_s'] / max(r['recomputes'], 1):.0f} us each; "
                  f"simulated {r['time_s'] * 1e3:.3f} ms, busbw {busbw(size, r['time_s'], 64):.1f} GB/s")
            planning = 0.0


def main() -> None:
    published_comparison()
    agreement()
    scale()


if __name__ == "__main__":
    main()
