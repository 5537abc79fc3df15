"""Split each measured NCCL kernel into waiting for peers, protocol latency and transfer.

An NCCL kernel starts when its rank reaches the collective and ends when the data has moved, so its measured
time is ``wait`` (until the slowest peer has arrived) + ``latency`` (the protocol's fixed cost) + ``transfer``
(the bytes over the rate the collective achieves on that machine). A what-if re-times only the parts it
changes and keeps the rest as measured.

- **Latency** is the collective model's time for an empty message (`ops.collective_time` at 0 bytes, with the
  algorithm and protocol the kernel ran, `kernel_algo_proto`) on the machine the trace ran on; 0 when that
  machine is unknown.
- **Transfer** is fitted from the trace's own kernels: per (collective, group size, protocol), the fastest
  effective rate ``bytes / (time - latency)`` among kernels of known size, i.e. the lower envelope of time
  against size. That kernel waited for nobody; every other kernel's excess over the envelope is its wait.
- **Sizes a trace does not carry** (neither the kernel nor its launching call, `trainsim.formats.collectives`)
  are inferred from the measured time as a range. The high end moves as much as the time allows at the
  trace's own measured rate: the fastest of kernels of the same kind with sizes, else the fastest bus
  bandwidth of any sized collective of the trace; and never more than the collective model of the machine
  the trace ran on allows, capped at the largest message for which NCCL picks the protocol the kernel ran
  (an LL kernel moved a small message whatever it lasted). Any wait then counts as transfer, so the high
  end is an upper bound; the what-if runs at it. The low end is the smallest message for which NCCL picks
  that protocol (0 where the protocol does not tell): the kernel may have waited for the rest of its time.
- **The group** is the kernel's or its call's process group, else its size, else the whole world (a guess
  the report names); a kernel named ``SendRecv`` that ran an all-reduce (its call says so) has no
  algorithm or protocol in its name.

The model's pieces are public functions of `trainsim.sim.collectives.ops`; nothing here changes them.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, replace

from trainsim.errors import TrainsimError
from trainsim.formats.collectives import COLLECTIVE_NAMES
from trainsim.sim.replay.trace_graph import GpuOp, TraceGraph

# ncclKernel_AllReduce_RING_LL_Sum_float(...) and ncclDevKernel_AllReduce_Sum_f32_RING_LL(...)
_ALGO_PROTO = re.compile(r"_(RING|TREE|NVLS|NVLSTREE|COLLNET\w*?)_(LL128|LL|SIMPLE)(?![A-Za-z0-9])")
_FLOAT32 = re.compile(r"_(float|f32)(?![A-Za-z0-9])")
_MODEL_ALGOS = {"RING": "ring", "TREE": "tree", "NVLS": "nvls", "NVLSTREE": "nvls_tree"}
_SIZE_RANGE = (1.0, 2.0**40)      # bytes searched when inverting the model
# NCCL compiles one kernel per collective and algorithm and runs every protocol inside it: up to 2.18 only
# the LL variant is a kernel ("Only generate inline kernels for LL", src/collectives/device/common.h); from
# 2.19 every algorithm but tree runs in the RING_LL kernel (src/device/generate.py, best_kernel). So the LL
# of a name says nothing, and in a 2.19 name (ncclDevKernel_) RING says only "not tree". The protocol shows
# in the launch's threads per block (enqueue.cc, channel and thread tuning): LL runs up to 512 threads and
# LL128 640, halved for small messages while a multiple of 128; Simple adds one warp for sync on a ring.
_RING_THREADS = {512: "ll", 256: "ll", 128: "ll", 640: "ll128", 320: "ll128",
                 544: "simple", 288: "simple", 160: "simple"}


def kernel_algo_proto(name: str, threads: int | None = None) -> tuple[str, str]:
    """(algorithm, protocol) an NCCL kernel ran, in the model's spelling, from its name and its threads per
    block; "auto" where they do not tell (see above: a name's own LL never does)."""
    match = _ALGO_PROTO.search(name)
    if not match:
        return "auto", "auto"
    algo = _MODEL_ALGOS.get(match.group(1), "auto")
    if match.group(2) != "LL":        # SendRecv kernels (always Simple) and builds with exact kernel names
        return algo, match.group(2).lower()
    if algo != "ring":                # the tree's Simple adds four warps: its threads collide with LL/LL128
        return algo, "auto"
    proto = _RING_THREADS.get(threads or 0, "auto")
    if name.startswith("ncclDevKernel_") and proto != "simple":
        return "auto", "auto"         # 2.19 on: 512 or 640 threads may be NVLS or CollNet as well
    return "ring", proto


def kernel_moves_fp32(name: str) -> bool:
    """Whether an NCCL kernel's name says it reduces 4-byte floats (for traces without dtypes)."""
    return bool(_FLOAT32.search(name))


@dataclass(frozen=True)
class Split:
    """One NCCL kernel's measured time in parts (seconds) and the message it moved (bytes, S)."""

    wait_s: float
    latency_s: float
    transfer_s: float
    nbytes: float
    element_bytes: int | None
    size_source: str          # "trace" | "inferred from the trace's rates" | "inferred from the model of ..."
    nbytes_low: float | None = None     # the range of an inferred size (None: both are ``nbytes``)
    nbytes_high: float | None = None

    @property
    def core_s(self) -> float:
        """Latency + transfer: what another machine or another message size changes."""
        return self.latency_s + self.transfer_s

    def core_at(self, nbytes: float) -> float:
        """Latency + transfer for a message of ``nbytes`` at this kernel's rate."""
        if self.nbytes <= 0:
            return self.latency_s
        return self.latency_s + self.transfer_s * nbytes / self.nbytes

    @property
    def inferred(self) -> bool:
        return self.size_source != "trace"

    @property
    def size_range(self) -> tuple[float, float]:
        """(low, high) bytes the kernel may have moved: the size itself where the trace gives it."""
        low = self.nbytes if self.nbytes_low is None else self.nbytes_low
        return low, self.nbytes if self.nbytes_high is None else self.nbytes_high

    def with_size(self, nbytes: float) -> Split:
        """This kernel as having moved ``nbytes`` at the same rate, waiting for the rest of its time."""
        transfer = self.transfer_s * nbytes / self.nbytes if self.nbytes > 0 else 0.0
        return replace(self, wait_s=self.wait_s + self.transfer_s - transfer, transfer_s=transfer,
                       nbytes=nbytes)


@dataclass(frozen=True)
class Member:
    """Where an NCCL kernel sits: its collective (model name), the ranks of its group, its algo/protocol."""

    op: str
    ranks: tuple[int, ...]
    algo: str
    proto: str
    group_guessed: bool = False      # the trace names neither the group nor its size: the whole world

    @property
    def key(self) -> tuple:
        return self.op, len(self.ranks), self.proto


def member(graph: TraceGraph, op: GpuOp, world: int) -> Member | None:
    """The collective of an NCCL kernel, None when its type is unknown or its group is one rank."""
    c = op.collective
    name = COLLECTIVE_NAMES.get(c.op) if c is not None else None
    if name is None:
        return None
    guessed = False
    if c.ranks:
        ranks = tuple(c.ranks)
    elif name == "sendrecv":          # point to point: this rank and a neighbour
        r = graph.rank
        ranks = (r, r + 1) if r + 1 < max(world, 2) else (r - 1, r)
    else:
        size = c.group_size or graph.trace.world_size or world
        guessed = not c.group_size and size > 2        # of two ranks, both are in every group
        ranks = tuple(range(size))
    if len(ranks) < 2:
        return None
    named = COLLECTIVE_NAMES.get(c.kernel_op) if c.kernel_op else name
    # a kernel named for another collective (an all-reduce in a SendRecv kernel) names no algorithm of this
    algo, proto = kernel_algo_proto(op.name, c.threads) if named == name else ("auto", "auto")
    return Member(name, ranks, algo, proto, guessed)


class NcclSplit:
    """The splits of every NCCL kernel of ``graphs``; ``home`` is the Topology the trace ran on (or None)."""

    def __init__(self, graphs: list[TraceGraph], home=None):
        self.graphs, self.home = graphs, home
        self.world = max([g.trace.world_size or 0 for g in graphs] + [len(graphs), 2])
        self.members: dict[tuple[int, int], Member] = {}
        self._latency: dict[tuple, float] = {}
        self._proto_range: dict[tuple, tuple[float, float]] = {}
        self.rates: dict[tuple, float] = {}           # (op, group size, proto) -> bytes/s of the envelope
        self.busbw = 0.0                              # the fastest bus bandwidth of any sized kernel
        self.splits: dict[tuple[int, int], Split] = {}
        sized: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
        for g in graphs:
            for o in g.ops:
                if o.kind != "collective":
                    continue
                m = member(g, o, self.world)
                if m is None:
                    continue
                self.members[(g.rank, o.index)] = m
                nbytes = o.collective.array_bytes
                if nbytes and o.event.dur > 0:
                    sized[m.key].append((float(nbytes), o.event.dur - self.latency(m)))
        for key, points in sized.items():
            rates = [s / t for s, t in points if t > 0]
            if rates:
                self.rates[key] = max(rates)
                self.busbw = max(self.busbw, self.rates[key] * _bus_factor(key[0], key[1]))
        for g in graphs:
            for o in g.ops:
                m = self.members.get((g.rank, o.index))
                if m is not None:
                    split = self._split(o, m)
                    if split is not None:
                        self.splits[(g.rank, o.index)] = split

    # -- the model on the machine the trace ran on ------------------------------------------------------

    def gpus(self, topology, ranks: tuple[int, ...]) -> list[str]:
        """Global rank r is the topology's r-th GPU."""
        gpus = topology.gpus
        if max(ranks) >= len(gpus):
            raise TrainsimError(f"topology {topology.name} has {len(gpus)} GPUs; the trace's collectives "
                                f"need rank {max(ranks)}", field="--topology")
        return [gpus[r] for r in ranks]

    def fits(self, topology, m: Member) -> bool:
        """Whether ``topology`` has a GPU for every rank of the collective's group."""
        return topology is not None and max(m.ranks) < len(topology.gpus)

    def model_time(self, topology, m: Member, nbytes: float, *, pinned_choice: bool = True) -> float:
        """The collective model's time on ``topology``: with the kernel's algorithm and protocol where the
        topology supports them (``pinned_choice``), else NCCL's own choice."""
        from trainsim.sim.collectives.ops import collective_time

        gpus = self.gpus(topology, m.ranks)
        if pinned_choice and (m.algo, m.proto) != ("auto", "auto"):
            try:
                return collective_time(topology, m.op, gpus, nbytes, algo=m.algo, proto=m.proto)
            except TrainsimError:
                pass
        return collective_time(topology, m.op, gpus, nbytes)

    def latency(self, m: Member) -> float:
        """The model's time for an empty message on the home machine (0 when its group does not fit it)."""
        if not self.fits(self.home, m):
            return 0.0
        if m.key not in self._latency:
            self._latency[m.key] = self.model_time(self.home, m, 0.0)
        return self._latency[m.key]

    def _protocol_range(self, m: Member) -> tuple[float, float]:
        """(smallest, largest) message for which NCCL (the model) picks the kernel's protocol: (0, inf) where
        the protocol is unknown or the group does not fit the home machine."""
        from trainsim.sim.collectives.ops import choose

        if m.key not in self._proto_range:
            low, high = 0.0, math.inf
            if m.proto != "auto" and self.fits(self.home, m):
                gpus = self.gpus(self.home, m.ranks)
                sizes = [2.0**k for k in range(10, 41)]
                try:
                    chosen = [choose(self.home, m.op, gpus, s, algo=m.algo)[1] == m.proto for s in sizes]
                except TrainsimError:
                    chosen = []
                if any(chosen):
                    picked = [s for s, c in zip(sizes, chosen, strict=True) if c]
                    if not chosen[-1]:
                        high = max(picked)
                    if not chosen[0]:        # the largest size below the first picked one: not this protocol
                        low = picked[0] / 2
            self._proto_range[m.key] = (low, high)
        return self._proto_range[m.key]

    def _invert_model(self, m: Member, seconds: float) -> float:
        """The message size whose model time on the home machine is ``seconds`` (bisection in log size)."""
        lo, hi = _SIZE_RANGE
        if self.model_time(self.home, m, lo) >= seconds:
            return 0.0
        if self.model_time(self.home, m, hi) <= seconds:
            return hi
        for _ in range(60):
            mid = math.sqrt(lo * hi)
            if self.model_time(self.home, m, mid) < seconds:
                lo = mid
            else:
                hi = mid
            if hi / lo < 1.001:
                break
        return lo

    def measured_rate(self, m: Member) -> float | None:
        """The fastest rate (algorithm bytes/s) the trace's own sized kernels show for ``m``'s kind: its
        class's envelope, else the fastest bus bandwidth of any sized kernel as this collective's; None
        when the trace has no sized kernel."""
        if m.key in self.rates:
            return self.rates[m.key]
        return self.busbw / _bus_factor(m.op, len(m.ranks)) if self.busbw > 0 else None

    # -- one kernel ------------------------------------------------------------------------------------

    def _split(self, o: GpuOp, m: Member) -> Split | None:
        dur = o.event.dur
        c = o.collective
        latency = min(self.latency(m), dur)
        element = c.element_bytes if c is not None and c.element_bytes else (
            4 if kernel_moves_fp32(o.name) else None)
        nbytes = c.array_bytes if c is not None else None
        if nbytes is not None:
            rate = self.rates.get(m.key)
            transfer = min(nbytes / rate, dur - latency) if rate else dur - latency
            return Split(dur - latency - transfer, latency, transfer, float(nbytes), element, "trace")
        rate = self.measured_rate(m)
        transfer = dur - latency
        by_rate = transfer * rate if rate else math.inf
        by_model = math.inf
        low, cap = self._protocol_range(m)
        if self.fits(self.home, m):
            by_model = min(self._invert_model(m, dur), cap)
        if math.isinf(by_rate) and math.isinf(by_model):
            return None
        if by_rate <= by_model:        # the trace's own rate: all of the time after latency moves data
            high = min(by_rate, cap)
            return Split(0.0, latency, transfer, high, element, "inferred from the trace's rates",
                         nbytes_low=min(low, high), nbytes_high=high)
        core = min(self.model_time(self.home, m, by_model), dur)
        return Split(dur - core, latency, max(core - latency, 0.0), by_model, element,
                     f"inferred from the model of {self.home.name}", nbytes_low=min(low, by_model),
                     nbytes_high=by_model)

    def split(self, rank: int, op: GpuOp) -> Split | None:
        return self.splits.get((rank, op.index))

    def member(self, rank: int, op: GpuOp) -> Member | None:
        return self.members.get((rank, op.index))

    def summary(self) -> dict:
        """Counts, the fitted rates and where each kernel's kind, size and group came from, for the report."""
        sources: dict[str, int] = defaultdict(int)
        for s in self.splits.values():
            sources[s.size_source] += 1
        unsplit = len(self.members) - len(self.splits)
        return {"kernels": len(self.members), "split": len(self.splits), "unsplit": unsplit,
                "size_sources": dict(sources),
                "rates_gbps": {f"{op}/{n}/{proto}": round(r / 1e9, 3)
                               for (op, n, proto), r in sorted(self.rates.items())},
                "guessed": self.guessed()}

    def guessed(self) -> list[dict]:
        """Every NCCL kernel whose collective, size or group the trace does not give: what was taken."""
        out = []
        for g in self.graphs:
            for o in g.ops:
                if o.kind != "collective":
                    continue
                key = (g.rank, o.index)
                c, m, s = o.collective, self.members.get(key), self.splits.get(key)
                kind_guessed = c.kind_from == "kernel name"
                size_guessed = s is None or s.inferred
                group_guessed = m is not None and m.group_guessed
                if not (kind_guessed or size_guessed or group_guessed):
                    continue
                row = {"rank": g.rank, "op": o.index, "step": o.step, "kernel": o.name[:80],
                       "collective": m.op if m is not None else c.op, "kind_from": c.kind_from,
                       "size": "unknown" if s is None else s.size_source}
                if s is not None and s.inferred:
                    row["bytes_low"], row["bytes_high"] = s.size_range
                if m is not None:
                    row["group"] = "guessed: the whole world" if m.group_guessed else len(m.ranks)
                out.append(row)
        return out


def _bus_factor(op: str, n: int) -> float:
    from trainsim.sim.collectives.ops import bus_factor

    return bus_factor(op, n)
