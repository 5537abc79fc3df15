"""What a collective holds on each of its GPUs while it runs: SMs (one CTA per NCCL channel) and HBM traffic.

    fp = footprint(topo, "allreduce", gpus, nbytes)      # Footprint(ctas, hbm_bytes, seconds)
    fp.demand                                              # bytes/s of HBM it asks for, per rank

`trainsim.sim.core.interference` turns these into the slow-down of compute kernels that overlap it.

CTAs. NCCL launches one CTA per channel (the real trace ``kineto-a100-ddp2-rank0``: grid [8, 1, 1] for every
all-reduce of 8-31 MB on 2 A100s, [1, 1, 1] for a 53-element broadcast). The channel count is the one the
cost model already decides (`nccl_tuning.channels`: bus bandwidth over NCCL's per-channel speed, 2 to 32),
``NCCL_NVLS_NCHANNELS`` (16) for NVLS and NVLSTree, then NCCL's own cut for small sizes (src/enqueue.cc,
topoGetAlgoInfo, NCCL 2.17-2.21): ``while nBytes < nc x nt x threadThreshold``, drop a channel (down to
one), then halve the threads; thresholds per thread NCCL_LL_THREAD_THRESHOLD 8 (times the ranks for ring
LL), NCCL_LL128_THREAD_THRESHOLD 8, NCCL_SIMPLE_THREAD_THRESHOLD 64 (src/include/comm.h, tuning.cc); threads
per CTA 512 for LL and Simple, 640 for LL128 (NCCL_LL_MAX_NTHREADS, NCCL_SIMPLE_MAX_NTHREADS,
NCCL_LL128_MAX_NTHREADS). CPU ranks (gloo) and devices NCCL does not tune hold no SMs (a CPU rank's
compute is already held while gloo moves its bytes: `Machine.rank_transfer`).

HBM bytes per rank, S the collective's size (nccl-tests' S), n ranks; every byte a rank sends is read from
its memory and every byte it receives is written there (by the peer's stores or its own copy):

- ring / tree all-reduce: sends 2(n-1)/n S, receives 2(n-1)/n S, and its reduction reads its own operand,
  (n-1)/n S: 5(n-1)/n S;
- NVLS / NVLSTree all-reduce: the copy into the NVLS buffer (S read, S written), the switch's reads of the
  GPU's shards (S) and its multicast stores (S), the copy out (2S): 6S (the unregistered path plans.py
  times, `nccl_tuning.pipeline_stages`);
- ring reduce-scatter 3(n-1)/n S (sent, received, the operand), all-gather and all-to-all 2(n-1)/n S;
  NVLS reduce-scatter S + S/n, all-gather S/n + S;
- broadcast 2S (received, forwarded), reduce 3S (and its operand); send/recv S (read on one side, written
  on the other).

The rate: those bytes over the collective's modelled time (`ops.collective_time`), the same on both paths.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

from trainsim.topologies import Topology

from . import nccl_tuning as tune
from . import ops

#: per-thread bytes below which NCCL drops a channel (src/include/comm.h)
THREAD_THRESHOLD = {"ll": 8, "ll128": 8, "simple": 64}
#: threads of a channel's CTA before NCCL halves them for small sizes
THREADS = {"ll": 512, "ll128": 640, "simple": 512}

_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Footprint:
    """Per rank: ``ctas`` SMs held, ``hbm_bytes`` read and written, over ``seconds``."""

    ctas: int
    hbm_bytes: float
    seconds: float

    @property
    def demand(self) -> float:
        """Bytes/s of HBM it asks for while it runs."""
        return self.hbm_bytes / self.seconds if self.seconds > 0 else 0.0


NONE = Footprint(0, 0.0, 0.0)


def hbm_bytes(op: str, algo: str, n: int, nbytes: float) -> float:
    """HBM bytes one rank reads and writes in ``op`` run as ``algo`` over ``n`` ranks (module doc)."""
    if n < 2:
        return 0.0
    part = (n - 1) / n * nbytes
    in_switch = algo in tune.IN_SWITCH
    if op == "allreduce":
        return 6 * nbytes if in_switch else 5 * part
    if op == "reduce_scatter":
        return nbytes + nbytes / n if in_switch else 3 * part
    if op == "allgather":
        return nbytes / n + nbytes if in_switch else 2 * part
    if op == "alltoall":
        return 2 * part
    if op == "broadcast":
        return 2 * nbytes
    if op == "reduce":
        return 3 * nbytes
    return nbytes  # sendrecv


def nccl_ctas(cc: int | None, op: str, algo: str, proto: str, n: int, nbytes: float,
              busbw_gbps: float) -> int:
    """CTAs (channels) NCCL launches per rank (module doc); 0 off NCCL."""
    if cc is None or n < 2:
        return 0
    nc = tune.NVLS_CHANNELS if algo in tune.IN_SWITCH else tune.channels(cc, busbw_gbps)
    threshold = THREAD_THRESHOLD[proto] * (n if algo == "ring" and proto == "ll" else 1)
    threads = THREADS[proto]
    while nbytes < nc * threads * threshold and nc > 1:
        nc -= 1
    return nc


def footprint(topo: Topology, op: str, gpus: Sequence[str], nbytes: float, *, algo: str = "auto",
              proto: str = "auto") -> Footprint:
    """What ``op`` of ``nbytes`` over ``gpus`` holds on each of them (cached per topology and call)."""
    gpus = tuple(gpus)
    key = (op, gpus, float(nbytes), algo, proto)
    cache = _cache.setdefault(topo, {})
    hit = cache.get(key)
    if hit is not None:
        return hit
    if len(gpus) < 2 or nbytes <= 0:
        result = NONE
    else:
        used, how = ops.choose(topo, op, gpus, nbytes, algo=algo, proto=proto)
        cc = ops.compute_capability(topo, gpus)
        busbw = ops.full_rate_busbw(topo, op, gpus, used, how)
        seconds = ops.collective_time(topo, op, gpus, nbytes, algo=used, proto=how)
        ctas = nccl_ctas(cc, op, used, how, len(gpus), nbytes, busbw)
        moved = hbm_bytes(op, used, len(gpus), nbytes) if cc is not None else 0.0
        result = Footprint(ctas, moved, seconds if math.isfinite(seconds) else 0.0)
    cache[key] = result
    return result
