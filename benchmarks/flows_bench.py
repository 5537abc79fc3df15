"""Speed of the fair-share flow network (a benchmark, not a test).

1. A 64-GPU ring all-reduce decomposed into flows: 2(n-1) steps, each step n concurrent flows of S/n bytes
   on a ring of point-to-point links, each step starting when the previous step's flows are all done.
2. A stress case: 10,000 flows with random sizes and random 2-4 hop routes over 256 links, all in flight
   together, each finishing at its own time (one recompute per completion batch).

Prints wall time, flows/s and the time per water-filling recompute. Run: python benchmarks/flows_bench.py
"""

from __future__ import annotations

import time

import numpy as np
import simpy

from trainsim.sim.core.flows import FlowNetwork


def ring_allreduce(n: int = 64, size: float = 1 << 30, bandwidth: float = 25e9) -> dict:
    env = simpy.Environment()
    links = {(i, (i + 1) % n): bandwidth for i in range(n)}
    net = FlowNetwork(env, links, record_flows=False)

    def run():
        for _ in range(2 * (n - 1)):
            yield simpy.AllOf(env, [net.transfer([(i, (i + 1) % n)], size / n) for i in range(n)])

    t0 = time.perf_counter()
    env.process(run())
    env.run()
    wall = time.perf_counter() - t0
    expected = 2 * (n - 1) * (size / n) / bandwidth
    return {"case": f"ring all-reduce {n} GPUs, {size / 2**30:.0f} GiB", "wall_s": wall,
            "flows": net.stats.flows_finished, "recomputes": net.stats.recomputes,
            "sim_time_s": env.now, "expected_sim_time_s": expected,
            "recompute_us": 1e6 * net.stats.recompute_seconds / max(net.stats.recomputes, 1)}


def stress(n_flows: int = 10_000, n_links: int = 256, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    env = simpy.Environment()
    net = FlowNetwork(env, {i: float(c) for i, c in enumerate(rng.uniform(10e9, 50e9, n_links))},
                      record_flows=False)
    for _ in range(n_flows):
        hops = rng.choice(n_links, size=int(rng.integers(2, 5)), replace=False)
        net.transfer([int(h) for h in hops], float(rng.uniform(1e6, 1e9)))
    t0 = time.perf_counter()
    env.run()
    wall = time.perf_counter() - t0
    return {"case": f"stress {n_flows} flows on {n_links} links", "wall_s": wall,
            "flows": net.stats.flows_finished, "recomputes": net.stats.recomputes, "sim_time_s": env.now,
            "recompute_us": 1e6 * net.stats.recompute_seconds / max(net.stats.recomputes, 1)}


def main() -> None:
    for result in (ring_allreduce(), stress()):
        line = (f"{result['case']}: wall {result['wall_s']:.3f} s, "
                f"{result['flows'] / result['wall_s']:,.0f} flows/s, "
                f"{result['recomputes']} recomputes at {result['recompute_us']:.1f} us each, "
                f"simulated {result['sim_time_s'] * 1e3:.3f} ms")
        if "expected_sim_time_s" in result:
            line += f" (expected {result['expected_sim_time_s'] * 1e3:.3f} ms)"
        print(line)


if __name__ == "__main__":
    main()
