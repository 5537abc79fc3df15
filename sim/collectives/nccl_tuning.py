"""NCCL's cost model for GPU collectives: per algorithm and protocol, a base latency, a per-hop latency per
kind of link and the fraction of the links' bandwidth the protocol reaches, per GPU generation.

Every figure below is NCCL 2.20.3's (NVIDIA/nccl, src/graph/tuning.cc, ``ncclTopoTuneModel``; makefiles
/version.mk 2.20.3); the structure is NCCL's, the code is ours. NCCL predicts t = latency + S / algbw for
each (algorithm, protocol) and runs the smallest; here the bandwidth part is the plan's own links (plans.py)
scaled by `efficiency`, so the flow and the analytic paths keep sharing one plan.

Protocols: LL (8-byte stores carrying 4 bytes of data and a flag: lowest latency, a quarter of the links'
bandwidth), LL128 (128-byte lines with an 8-byte flag: 120/128 of it, NVLink only), Simple (bulk copies and
fences: full bandwidth, highest latency). NVLS and NVLSTree run Simple only.

NVLSTree (all-reduce across machines whose GPUs share an NVSwitch with in-switch reduction): NVLS inside
each machine, a tree between the machines on each GPU's own NIC. NCCL's latency for it is one figure:
hwLat NVLink NVLSTree + 2 log2(nodes) x hwLat NET NVLSTree (no base); its busBw -> algBw ratio is NVLS's.

Collectives on CPU ranks (gloo) or devices without a known compute capability keep the Simple figures the
simulator always had (`LEGACY`); NCCL's model applies to NVIDIA GPUs only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

PROTOCOLS = ("ll", "ll128", "simple")
US = 1e-6

# baseLat[algo][proto] in us (tuning.cc, NCCL 2.20.3): Tree {LL 6.8, LL128 14.0, Simple 0},
# Ring {6.6, 14.0, 8.4}; NVLS and NVLSTree 0 (their latency is all in hwLat).
BASE_LAT = {"tree": {"ll": 6.8, "ll128": 14.0, "simple": 0.0},
            "ring": {"ll": 6.6, "ll128": 14.0, "simple": 8.4},
            "nvls": {"simple": 0.0}, "nvls_tree": {"simple": 0.0}}
# hwLat[hw][algo][proto] in us per step (tuning.cc, NCCL 2.20.3), hw = NVLink / PCI / NET.
HW_LAT = {"nvlink": {"tree": {"ll": 0.6, "ll128": 1.25, "simple": 28.0},
                     "ring": {"ll": 0.6, "ll128": 1.9, "simple": 3.4},
                     "nvls": {"simple": 23.0}, "nvls_tree": {"simple": 23.0}},
          "pcie": {"tree": {"ll": 1.0, "ll128": 1.9, "simple": 28.0},
                   "ring": {"ll": 1.0, "ll128": 2.5, "simple": 5.7},
                   "nvls": {"simple": 0.0}, "nvls_tree": {"simple": 0.0}},
          "network": {"tree": {"ll": 5.0, "ll128": 8.5, "simple": 28.0},
                      "ring": {"ll": 2.7, "ll128": 4.0, "simple": 14.0},
                      "nvls": {"simple": 18.0}, "nvls_tree": {"simple": 14.0}}}
# Per compute capability (Volta / Ampere / Hopper index of tuning.cc), per scale (1 node, 2 nodes, more),
# GB/s of bus bandwidth (tuning.cc, NCCL 2.20.3): llMaxBws (whole-collective cap of LL), and the per-channel
# caps perChMaxRingLL128Bws, perChMaxTreeLL128Bws, perChMaxTreeBws.
LL_MAX_BW = {70: (39.0, 39.0, 20.4), 80: (87.7, 22.5, 19.0), 90: (87.7, 22.5, 19.0)}
PER_CH_MAX_RING_LL128 = {70: (20.0, 20.0, 20.0), 80: (20.0, 20.0, 20.0), 90: (36.7, 36.7, 36.7)}
PER_CH_MAX_TREE_LL128 = {70: (20.0, 20.0, 20.0), 80: (20.0, 20.0, 20.0), 90: (36.7, 36.7, 29.0)}
PER_CH_MAX_TREE = {70: (26.5, 18.5, 10.0), 80: (24.0, 23.6, 17.8), 90: (38.7, 41.4, 36.0)}
# Protocol bandwidth fractions (tuning.cc, NCCL 2.20.3, "various model refinements"):
RING_LL = (1 / 4, 1 / 3)  # all-reduce, reduce or several nodes / otherwise
RING_LL128 = (0.92, 0.7)  # ~120/128; one GPU per node (ppn < 2) / otherwise
TREE = 0.92
TREE_LL = 1 / 3.8
TREE_LL128 = (7 / 9, 120 / 128)  # one node / several
NVLS = 5 / 6  # busBw -> algBw ratio NCCL applies to NVLS and NVLS-tree
IN_SWITCH = ("nvls", "nvls_tree")  # algorithms whose reduction happens in the NVSwitch (Simple only)
# NCCL channels: the ring graph's per-channel speed times the channel count is about the link bandwidth
# (src/graph/search.cc). Modelled: channels = bus bandwidth / this per-channel speed (speedArrayIntra has
# 20 GB/s for SM70/SM80, sm90SpeedArrayIntra 40 GB/s for SM90), at least 2, at most MAXCHANNELS 32.
CHANNEL_SPEED = {70: 20.0, 80: 20.0, 90: 40.0}
MAX_CHANNELS = 32

def table_index(cc: int) -> int:
    """NCCL's compute-capability index into its tables (Volta 70, Ampere 80, Hopper 90)."""
    return 90 if cc >= 90 else 80 if cc >= 80 else 70


@dataclass(frozen=True)
class Tuning:
    """What one (algorithm, protocol) costs: ``base`` seconds per collective, ``hop`` seconds per step by hop
    class (nvlink / pcie / network), and whether the route's own link latency is added (legacy only)."""

    algo: str
    proto: str
    base: float
    hop: dict
    route_latency: bool = False


# The Simple figures the simulator had before NCCL's full model (NCCL's older ring/Simple values,
# docs/hardware-figures.md, "Collectives"):
# kept for CPU ranks (gloo) and unknown devices, with the route's link latency on top.
LEGACY_HOP = {"nvlink": 3.4 * US, "pcie": 5.7 * US, "network": 9.6 * US}
LEGACY = Tuning("any", "simple", 8.4 * US, LEGACY_HOP, route_latency=True)


def tuning(cc: int | None, algo: str, proto: str) -> Tuning:
    """Latencies of ``algo`` / ``proto`` (p2p uses the ring's); LEGACY where ``cc`` is None."""
    if cc is None:
        return LEGACY
    a = "ring" if algo == "p2p" else algo
    return Tuning(algo, proto, BASE_LAT[a][proto] * US,
                  {hw: HW_LAT[hw][a][proto] * US for hw in HW_LAT})


def scale_index(nodes: int) -> int:
    return 0 if nodes <= 1 else 1 if nodes == 2 else 2


def channels(cc: int, busbw_gbps: float) -> int:
    """NCCL channels of a collective whose links allow ``busbw_gbps`` (see CHANNEL_SPEED)."""
    return max(2, min(MAX_CHANNELS, math.ceil(busbw_gbps / CHANNEL_SPEED[table_index(cc)] - 1e-9)))


def efficiency(cc: int | None, op: str, algo: str, proto: str, nodes: int, ppn: float,
               busbw_gbps: float) -> float:
    """Fraction of the plan's link bandwidth ``proto`` reaches (1 for LEGACY): NCCL's factor, then its caps
    (llMaxBw, channels x per-channel maxima) expressed as a fraction of ``busbw_gbps``, the plan's bus
    bandwidth at full link rate."""
    if cc is None or busbw_gbps <= 0:
        return 1.0
    k, s = table_index(cc), scale_index(nodes)
    n_ch = channels(cc, busbw_gbps)
    cap = math.inf
    if algo in IN_SWITCH:
        frac = NVLS
    elif algo == "tree":
        frac = TREE
        cap = n_ch * PER_CH_MAX_TREE[k][s]
        if proto == "ll":
            frac *= TREE_LL
            cap = min(cap * TREE_LL, LL_MAX_BW[k][s])
        elif proto == "ll128":
            frac *= TREE_LL128[0 if nodes == 1 else 1]
            cap = min(cap, n_ch * PER_CH_MAX_TREE_LL128[k][s])
    else:  # ring (and p2p, which NCCL does not tune: the ring's factors)
        frac = 1.0
        if proto == "ll":
            frac = RING_LL[0] if nodes > 1 or op in ("allreduce", "reduce") else RING_LL[1]
            cap = LL_MAX_BW[k][s]
        elif proto == "ll128":
            frac = RING_LL128[1] if ppn < 2 else RING_LL128[0]
            cap = n_ch * PER_CH_MAX_RING_LL128[k][s]
    return min(frac, cap / busbw_gbps)


def ll128_default(cc: int | None, hop_classes: set[str]) -> bool:
    """LL128 runs by default only on SM70/80/90 over NVLink inside one node; elsewhere it must be forced.

    NCCL (tuning.cc 2.20.3) also enables it between nodes whose NICs sit behind the GPUs' PCIe switches
    (typeInter <= PATH_PXB: DGX boxes). The model does not: with NCCL's LL128 figures across the network,
    multi-node all-reduce came out 23-60 % faster than published DGX runs at 1-256 MiB and the median error
    over all published figures grew (benchmarks/nccl_curves.py), so LL128's cost over the network is not
    what those figures say; it stays off until a calibration measures it (a topology's ``nccl`` block)."""
    return cc is not None and table_index(cc) == cc and hop_classes <= {"nvlink"}


# treeCorrectionFactor[proto][log2(S / 64 B)] (tuning.cc, NCCL 2.20.3): trees do not follow the model at
# medium sizes; NCCL scales the tree bandwidth by these, 64 B to 256 MiB (1.0 above).
TREE_CORRECTION = {
    "ll": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0,
           1.0),
    "ll128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0,
              1.0),
    "simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
}


def size_correction(cc: int | None, algo: str, proto: str, nbytes: float) -> float:
    """NCCL's size-dependent factor on the bandwidth of ``algo`` (trees only; 1 elsewhere and off NCCL)."""
    if cc is None or algo != "tree":
        return 1.0
    chunks = int(nbytes) >> 6
    k = chunks.bit_length() - 1 if chunks > 0 else 0  # NCCL's log2i
    table = TREE_CORRECTION[proto]
    return table[k] if k < len(table) else 1.0


# ---- the NVLS pipeline's fill and drain ------------------------------------------------------------------
# NCCL's NVLS kernels are pipelines of warp groups inside each channel's CTA (src/device/all_reduce.h, NCCL
# 2.19-2.21, RunWorkElement NVLS / NVLS_TREE): scatter (sendbuff -> the NVLS buffer's unicast mapping, which
# is the GPU's own memory: src/transport/nvls.cc maps send[1] / recv[1] to ucBuff), reduce
# (multimem.ld_reduce through the switch; then multimem.st, or for NVLSTree a send up the tree), bcast
# (NVLSTree: receive from the tree, multicast and forward to the children), gather (ucBuff -> recvbuff, own
# memory again). NVLSTree's channels alternate between the two trees (src/graph/connect.cc connectNvls:
# treeUp[c % 2]). A chunk passes the stages in turn, so the collective ends the sum of one round's stage
# times after the first round starts plus (rounds - 1) bottleneck rounds: the fill and drain add every
# stage's time but the bottleneck's. NCCL's tuner leaves it out (its time is latency + S/bw, the steady state
# where the stages share the GPU's switch port and NIC). While the pipeline fills and drains one stage of a
# round runs alone, so each stage moves its own bytes at the full rate of the resource it uses.
NVLS_CHANNELS = 16  # NCCL_NVLS_NCHANNELS default (src/transport/nvls.cc; enqueue.cc: "NVLS should not need
#                     more than 16 channels to get peak BW")
SIMPLE_STEP_BYTES = (1 << 22) // 8  # Simple buffer 4 MiB (DEFAULT_BUFFSIZE) / NCCL_STEPS 8: a step, 512 KiB
# Chunk size by size (src/enqueue.cc computeColl, NCCL 2.19-2.21): (largest chunk, [(m, chunk)]): the chunk
# drops to `chunk` where S < m x concurrentOps x the current chunk; concurrentOps = channels x NVLS heads.
NVLS_CHUNKS = {"nvls": (131072, ((64, 65536), (8, 32768), (2, 16384))),
               "nvls_tree": (SIMPLE_STEP_BYTES, ((32, 262144), (16, 131072), (4, 65536), (1, 32768)))}


@dataclass(frozen=True)
class StageRates:
    """Bytes/s a pipeline stage reaches alone on a GPU: ``port`` its switch port per direction, ``nic`` its
    own NIC path (the tree's hop), ``memory`` its HBM (a local copy reads and writes every byte)."""
    port: float
    nic: float
    memory: float


def nvls_chunk(algo: str, nbytes: float, concurrent: int) -> int:
    """NCCL's NVLS / NVLSTree chunk in bytes for an S of ``nbytes`` and ``concurrent`` chunks in flight."""
    chunk, rules = NVLS_CHUNKS[algo]
    for mult, smaller in rules:
        if nbytes < mult * concurrent * chunk and chunk > smaller:
            chunk = smaller
    return chunk


def pipeline_stages(algo: str, nbytes: float, heads: int, machines: int) -> list[tuple[str, float]]:
    """The stages one round of chunks passes on a GPU, in order, as (resource, bytes that resource carries in
    the busier direction). A round is concurrentOps (16 channels x ``heads``) chunks, R bytes of S (or all of
    S where that is less); n = ``heads`` GPUs per machine, each the head of its own chunk:

    - scatter, gather: copies in the GPU's own memory, R read + R written: ("memory", 2R);
    - NVLS reduce + multicast: every head pulls its chunk from each GPU (R up the port) and stores the sum
      to all (R down), plus its own R/n the other way: ("port", R (n+1)/n);
    - NVLSTree: the leaf's reduce (R up, R/n down), then per level of the tree (depth log2(machines), NCCL's
      log2i) a hop of R/(2n) over the NIC (half the channels run each of the two trees) and the parent's
      reduce (the root's adds the multicast: R (n+1)/n); down again per level a hop of R/(2n) and the
      child's receive + multicast (R/n up, R down); then the gather.
    """
    concurrent = NVLS_CHANNELS * heads
    r = min(concurrent * nvls_chunk(algo, nbytes, concurrent), nbytes)
    n = heads
    copy = ("memory", 2 * r)
    if algo == "nvls":
        return [copy, ("port", r * (n + 1) / n), copy]
    depth = machines.bit_length() - 1
    hop = ("nic", r / (2 * n))
    up = [stage for _ in range(depth) for stage in (hop, ("port", r))]
    up[-1] = ("port", r * (n + 1) / n)  # the root reduces and multicasts
    down = [stage for _ in range(depth) for stage in (hop, ("port", r))]
    return [copy, ("port", r), *up, *down, copy]


def pipeline_fill(cc: int | None, op: str, algo: str, nbytes: float, heads: int, machines: int,
                  rates: StageRates) -> float:
    """Seconds the fill and drain add to NCCL's latency + S/bw: the sum of one round's stage times, each at
    its resource's full rate, less the bottleneck stage's (the steady state already counts that round).
    0 off NCCL and for the algorithms this does not model (rings and trees run each step in one warp group:
    their per-step latency is NCCL's hwLat; NVLS reduce-scatter / all-gather are left as they were)."""
    if cc is None or op != "allreduce" or algo not in IN_SWITCH or nbytes <= 0:
        return 0.0
    rate = {"port": rates.port, "nic": rates.nic, "memory": rates.memory}
    times = [nbytes_ / rate[resource] for resource, nbytes_ in pipeline_stages(algo, nbytes, heads, machines)]
    return sum(times) - max(times)
