"""Physical upper bounds on a collective's bus bandwidth, from the wires alone (raw line rate per
direction), whatever the algorithm, protocol or model: the figures no prediction may exceed.

Per GPU (n GPUs, S = the whole array, nccl-tests' conventions):
- all-gather / reduce-scatter: every GPU must receive (gather) or send (scatter) the (n-1)/n of S that it
  does not hold, so algbw <= injection x n/(n-1), i.e. busbw <= the GPU's injection rate.
- all-reduce: every other GPU's result depends on every element of this GPU's array, and a GPU can keep at
  most its own share unsent, so it sends and receives at least (n-1)/n of S even with in-switch reduction
  (NVLS): busbw <= 2 x injection. Algorithms without in-network reduction (ring, tree) send 2(n-1)/n of S
  per GPU: busbw <= injection.
Per machine, across m machines: the same arguments over each machine's network injection (its NICs) with
m in place of n: algbw <= NIC injection x m/(m-1) for all three collectives.

Injection is the raw line rate of the GPU's (or the machine's NICs') outgoing links, per direction.

In-switch reduction (nvls, nvls_tree) through an NVSwitch whose NVLS engines have a throughput E of their own
(``nvls_gbps``): the engines take in at least the (n-1)/n of S that each of the switch's n GPUs must send,
(n-1) S in all for all-reduce and reduce-scatter, and each shard once for all-gather ((n-1)/n S): busbw <=
2E/n, E/n and E.
"""

from __future__ import annotations

from collections import defaultdict

from trainsim.topologies import Topology

IN_NETWORK = ("nvls", "nvls_tree")  # algorithms whose switches reduce: all-reduce's per-GPU bound doubles
BOUNDED = ("allreduce", "allgather", "reduce_scatter")


def raw_injection(topo: Topology, node: str) -> float:
    """Raw bytes/s a node can send at once (its outgoing links' line rate, one direction)."""
    return sum(d["raw_bandwidth"] for _, _, d in topo.graph.out_edges(node, data=True))


def _network_injection(topo: Topology, nodes: list[str]) -> float:
    """Raw bytes/s the NICs of ``nodes``' machine push into the network (edges to network switches)."""
    machine = topo.machine_of(nodes[0])
    kinds = topo.graph.nodes
    return sum(d["raw_bandwidth"] for nic in topo.nics if topo.machine_of(nic) == machine
               for _, v, d in topo.graph.out_edges(nic, data=True) if kinds[v]["kind"] == "network_switch")


def busbw_limit(topo: Topology, op: str, gpus: list[str], algo: str) -> float | None:
    """Largest busbw (bytes/s, nccl-tests' definition) the wires allow ``op`` over ``gpus`` run as
    ``algo``; None for collectives this module does not bound (broadcast, reduce, all-to-all, p2p)."""
    if op not in BOUNDED or len(gpus) < 2:
        return None
    n = len(gpus)
    per_gpu = min(raw_injection(topo, g) for g in gpus)
    limit = 2 * per_gpu if op == "allreduce" and algo in IN_NETWORK else per_gpu
    if algo in IN_NETWORK:
        limit = min(limit, _engine_limit(topo, op, gpus))
    by_machine: dict[int, list[str]] = defaultdict(list)
    for g in gpus:
        by_machine[topo.machine_of(g)].append(g)
    m = len(by_machine)
    if m > 1:
        network = min(_network_injection(topo, members) for members in by_machine.values())
        algbw = network * m / (m - 1)
        factor = 2 * (n - 1) / n if op == "allreduce" else (n - 1) / n
        limit = min(limit, algbw * factor)
    return limit


def _engine_limit(topo: Topology, op: str, gpus: list[str]) -> float:
    """busbw bound of in-switch reduction from the NVLS engines of the GPUs' switches (inf without)."""
    limit = float("inf")
    users: dict[str, int] = defaultdict(int)  # a reducing switch -> its GPUs in the group
    for g in gpus:
        for s in topo.graph.successors(g):
            if topo.nvls_engine(s) is not None:
                users[s] += 1
    for switch, n in users.items():
        engine = topo.edge_attrs[switch, switch]["raw_bandwidth"]
        limit = min(limit, {"allreduce": 2 * engine / n, "reduce_scatter": engine / n}.get(op, engine))
    return limit
