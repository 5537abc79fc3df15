"""What-if replays of Kineto traces: another topology, another GPU, data-movement optimizations.

The replay engine asks an ``op_time`` hook for each GPU op's duration; :class:`WhatIfModel` is that hook.

- **Collectives** whose type and size the trace carries run on the chosen topology among their group's
  GPUs (global rank r is the topology's r-th GPU), decomposed into flows (or alpha-beta with
  ``collectives=analytic``). With ``network=isolated`` (the default) each collective is simulated alone on
  a fresh flow network (cached by size); with ``network=shared`` all of them and the host copies share one
  flow network for the whole replay, so concurrent transfers contend. Ranks replayed together join:
  the k-th collective of a group in a step starts when every replayed rank has reached it; ranks without
  a trace are taken to arrive together with them (symmetric data parallelism). Collectives of unknown
  size keep their measured duration.
- **Host copies** (H2D/D2H) are flows between the GPU and its host memory (alone: route latency plus bytes
  over the bottleneck link); a pageable copy is capped at one core's staging rate
  (``machine.PAGEABLE_COPY_RATE``) unless ``pinned=true``.
- **Another GPU** (``--gpu``): a trace has no FLOP counts per kernel, so the rule is by kernel kind.
  Kernels whose names say matrix multiply or convolution (gemm, conv, fprop/dgrad/wgrad, xmma, cutlass,
  scudnn) are taken as compute-bound and scale by the ratio of peak FLOP/s at the precision the name
  shows (tf32 / s1688 / fp16 / bf16, else fp32); every other kernel, memset and on-device copy is taken
  as memory-bound and scales by the ratio of memory bandwidths.
- **Compression** (``compression=fp16|bf16``, TECHNIQUES.md's parameter compression as DDP's
  ``fp16_compress_hook``): 4-byte-float all-reduce and reduce-scatter payloads are halved; the casts cost
  6 bytes of memory traffic per element each way (read 4 + write 2) at the GPU's memory bandwidth.

The checks compare, op by op, the simulation on the topology the trace ran on with the measurement: every
NCCL kernel of known size, simulated alone, against its measured duration; every memcpy against its link
(host copies) or the GPU's memory (on-device copies, which read and write every byte).

It stays one module: each hook changes one resource (collectives, host copies, compute) of the same
replay, and they compose.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from statistics import median

import simpy

from trainsim.errors import TrainsimError, unknown_name
from trainsim.sim.core.devices import DeviceSpec, get_device, match_cuda_name
from trainsim.sim.replay.trace_graph import GpuOp, TraceGraph

# Kineto's collective names (lower case, separators removed) -> trainsim.sim.collectives.ops names.
COLLECTIVE_NAMES = {
    "allreduce": "allreduce", "allreducecoalesced": "allreduce", "broadcast": "broadcast", "reduce": "reduce",
    "allgather": "allgather", "allgatherbase": "allgather", "allgatherintotensorcoalesced": "allgather",
    "reducescatter": "reduce_scatter", "reducescatterbase": "reduce_scatter",
    "reducescattertensorcoalesced": "reduce_scatter", "alltoall": "alltoall", "alltoallbase": "alltoall",
    "sendrecv": "sendrecv", "send": "sendrecv", "recv": "sendrecv",
}
COMPRESSIBLE = {"allreduce", "reduce_scatter"}
COMPRESSION = ("none", "fp16", "bf16")
_COMPUTE_BOUND = re.compile(r"gemm|conv|fprop|dgrad|wgrad|xmma|cutlass|scudnn|hmma", re.IGNORECASE)
_PRECISION = [("bf16", re.compile(r"bf16", re.I)),
              ("fp16", re.compile(r"fp16|f16|half|h884|h1688|h16816", re.I)),
              ("tf32", re.compile(r"tf32|s1688|s16816|tensorop_s", re.I))]
ALGORITHMS = ("auto", "ring", "tree", "nvls")
SET_KEYS = ("algo", "collectives", "compression", "network", "pinned", "ran_on")
# Presets a trace's GPU most likely ran in, for the checks when no topology is named.
HOME_TOPOLOGY = {"a100": "dgx-a100", "h100": "dgx-h100", "h200": "dgx-h100", "v100": "dgx1-v100"}


@dataclass
class WhatIf:
    """What to change in a replay (all optional). Validated on creation; errors name the field."""

    topology: str | None = None       # preset name or YAML file: collectives and host copies re-simulated
    gpu: str | None = None            # device spec name: compute rescaled by the roofline ratio
    compression: str = "none"         # none | fp16 | bf16 on fp32 all-reduce / reduce-scatter payloads
    pinned: bool = False              # host copies as pinned DMA
    collectives: str = "flow"         # flow | analytic
    algo: str = "auto"                # collective algorithm: auto | ring | tree | nvls
    network: str = "isolated"         # isolated: each transfer alone | shared: one flow network for all
    ran_on: str | None = None         # topology the trace ran on (for the checks); default from its GPU

    def __post_init__(self):
        if self.compression not in COMPRESSION:
            raise unknown_name("compression", self.compression, COMPRESSION, field="compression")
        if self.collectives not in ("flow", "analytic"):
            raise unknown_name("collective model", self.collectives, ("flow", "analytic"),
                               field="collectives")
        if self.algo not in ALGORITHMS:
            raise unknown_name("algorithm", self.algo, ALGORITHMS, field="algo")
        if self.network not in ("isolated", "shared"):
            raise unknown_name("network", self.network, ("isolated", "shared"), field="network")
        if self.gpu is not None:
            get_device(self.gpu)

    @property
    def active(self) -> bool:
        """Whether anything differs from replaying the measured durations."""
        return bool(self.topology or self.gpu or self.compression != "none" or self.pinned)

    @classmethod
    def from_options(cls, *, topology: str | None = None, gpu: str | None = None,
                     sets: Iterable[str] = ()) -> WhatIf:
        """From CLI options; ``sets`` are ``key=value`` strings for the other fields."""
        fields: dict = {"topology": topology, "gpu": gpu}
        for item in sets:
            key, sep, value = item.partition("=")
            key = key.strip().replace("-", "_")
            if not sep or not value.strip():
                raise TrainsimError(f"expected key=value, got {item!r}", field="--set")
            if key not in SET_KEYS:
                raise unknown_name("--set key", key, SET_KEYS, field="--set")
            value = value.strip()
            if key == "pinned":
                if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise TrainsimError(f"pinned must be true or false, got {value!r}", field="--set pinned")
                fields[key] = value.lower() in ("true", "1", "yes")
            else:
                fields[key] = value
        return cls(**fields)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("topology", "gpu", *SET_KEYS)}


def trace_device(graph: TraceGraph) -> DeviceSpec | None:
    """The built-in spec of the GPU the rank ran on (from the trace's deviceProperties), if known."""
    devices = {o.event.device for o in graph.ops}
    device = min(devices) if devices else 0
    name = graph.trace.devices.get(device)
    if not name:
        return None
    return match_cuda_name(name, graph.trace.device_memory.get(device))


def home_topology(graphs: list[TraceGraph]) -> str | None:
    """The preset the trace most likely ran in, from its GPU model (None when unknown)."""
    for g in graphs:
        spec = trace_device(g)
        if spec is not None:
            for token, preset in HOME_TOPOLOGY.items():
                if spec.name.startswith(token):
                    return preset
    return None


def kernel_precision(name: str) -> str:
    for precision, pattern in _PRECISION:
        if pattern.search(name):
            return precision
    return "fp32"


def compute_ratio(op: GpuOp, source: DeviceSpec, target: DeviceSpec) -> float:
    """Target time / measured time of a compute kernel, memset or on-device copy (see the module doc)."""
    if op.kind == "kernel" and _COMPUTE_BOUND.search(op.name):
        precision = kernel_precision(op.name)
        if precision not in source.peak_flops or precision not in target.peak_flops:
            precision = "fp32"
        return source.peak(precision) / target.peak(precision)
    return source.memory_bandwidth / target.memory_bandwidth


def _load_topology(source: str):
    from trainsim.topologies import load_topology

    return load_topology(source)


@dataclass
class _Group:
    op: str                # trainsim collective name
    gpus: list[str]
    array_bytes: int
    nelems: int | None
    element_bytes: int | None


class WhatIfModel:
    """The ``op_time`` hook of a what-if replay of ``graphs``."""

    def __init__(self, graphs: list[TraceGraph], whatif: WhatIf):
        self.graphs, self.whatif = graphs, whatif
        topology = whatif.topology
        if topology is None and whatif.compression != "none":
            topology = whatif.ran_on or home_topology(graphs)
            if topology is None:
                raise TrainsimError("compression re-simulates the all-reduces on a topology: name one with "
                                    "--topology (the trace's GPU does not say which machine it ran in)",
                                    field="--topology")
        self.topology = _load_topology(topology) if topology else None
        self.sources = {g.rank: trace_device(g) for g in graphs}
        self.target = get_device(whatif.gpu) if whatif.gpu else None
        if self.target is not None:
            unknown = [g.trace.devices.get(0, "?") for g in graphs if self.sources[g.rank] is None]
            if unknown:
                raise TrainsimError(f"cannot rescale to another GPU: the trace's GPU {unknown[0]!r} is not a "
                                    "known device spec (see `trainsim device list`)", field="--gpu")
        if whatif.compression != "none" and self.target is None and None in self.sources.values():
            raise TrainsimError("compression costs its casts at the GPU's memory bandwidth, but the trace's "
                                "GPU is not a known device spec: name one with --gpu", field="--gpu")
        self._env: simpy.Environment | None = None
        self._net = None
        self._alone: dict[tuple, float] = {}           # isolated collectives: seconds by (op, gpus, bytes)
        self._joins: dict[tuple, list] = {}
        self._keys: dict[tuple[int, int], tuple] = {}
        self._present: dict[tuple, int] = defaultdict(int)
        for g in graphs:
            counters: dict[tuple, int] = defaultdict(int)
            for o in sorted((o for o in g.ops if o.kind == "collective"), key=lambda o: o.event.ts):
                c = o.collective
                base = (c.group, c.op, o.step)
                key = (*base, counters[base])
                counters[base] += 1
                self._keys[(g.rank, o.index)] = key
                self._present[key] += 1

    # -- topology mapping --------------------------------------------------------------------------

    def gpu_of(self, rank: int) -> str:
        gpus = self.topology.gpus
        if rank >= len(gpus):
            raise TrainsimError(f"topology {self.topology.name} has {len(gpus)} GPUs; the trace needs "
                                f"rank {rank}", field="--topology")
        return gpus[rank]

    def group(self, rank: int, op: GpuOp) -> _Group | None:
        """The collective of op on the topology, None when its type or size is unknown."""
        c = op.collective
        name = COLLECTIVE_NAMES.get(c.op) if c is not None else None
        if name is None or c.array_bytes is None or self.topology is None:
            return None
        graph = next(g for g in self.graphs if g.rank == rank)
        ranks = c.ranks or tuple(range(c.group_size or graph.trace.world_size or len(self.graphs)))
        if len(ranks) < 2:
            return None
        return _Group(name, [self.gpu_of(r) for r in ranks], c.array_bytes, c.nelems, c.element_bytes)

    # -- the hook ---------------------------------------------------------------------------------

    def __call__(self, env: simpy.Environment, rank: int, op: GpuOp):
        if env is not self._env:
            self._env, self._joins = env, {}
            self._net = None
            if self.topology is not None and self.whatif.network == "shared":
                from trainsim.sim.core.flows import FlowNetwork

                self._net = FlowNetwork.from_topology(env, self.topology, record_flows=False)
        if op.kind == "collective":
            return self._collective(env, rank, op)
        if op.kind == "memcpy" and op.event.copy_kind in ("H2D", "D2H") and self.topology is not None:
            return self._host_copy(rank, op)
        if op.kind in ("kernel", "memset") or (op.kind == "memcpy" and op.event.copy_kind == "D2D"):
            if self.target is not None:
                return op.event.dur * compute_ratio(op, self.sources[rank], self.target)
        return None

    def _bandwidth(self, rank: int) -> float:
        return (self.target or self.sources[rank]).memory_bandwidth

    def _collective(self, env, rank, op):
        grp = self.group(rank, op)
        if grp is None:
            return None
        payload, cast_s = float(grp.array_bytes), 0.0
        if (self.whatif.compression != "none" and grp.op in COMPRESSIBLE and grp.element_bytes == 4
                and grp.nelems is not None):
            payload /= 2
            cast_s = grp.nelems * 6 / self._bandwidth(rank)      # encode before, decode after
        key = self._keys[(rank, op.index)]
        entry = self._joins.get(key)
        if entry is None:
            entry = self._joins[key] = [0, env.event()]
        entry[0] += 1
        if entry[0] == self._present[key]:
            env.process(self._run_collective(env, grp, payload, cast_s, entry[1]))
        return entry[1]

    def _run_collective(self, env, grp: _Group, payload: float, cast_s: float, done: simpy.Event):
        from trainsim.sim.collectives.ops import collective_time, run_collective

        if cast_s:
            yield env.timeout(cast_s)
        if self.whatif.collectives == "analytic":
            yield env.timeout(collective_time(self.topology, grp.op, grp.gpus, payload,
                                              algo=self.whatif.algo))
        elif self._net is None:
            from trainsim.sim.collectives.ops import simulate_collective

            key = (grp.op, tuple(grp.gpus), payload)
            if key not in self._alone:
                self._alone[key] = simulate_collective(self.topology, grp.op, grp.gpus, payload,
                                                       algo=self.whatif.algo)["time_s"]
            yield env.timeout(self._alone[key])
        else:
            yield env.process(run_collective(env, self._net, self.topology, grp.op, grp.gpus, payload,
                                             algo=self.whatif.algo))
        if cast_s:
            yield env.timeout(cast_s)
        done.succeed()

    def _host_copy(self, rank, op):
        from trainsim.sim.core.machine import PAGEABLE_COPY_RATE

        if op.event.nbytes is None:
            return None
        gpu = self.gpu_of(rank)
        host = self.topology.host_memory(gpu)
        src, dst = (host, gpu) if op.event.copy_kind == "H2D" else (gpu, host)
        route = self.topology.route(src, dst)
        pinned = self.whatif.pinned or op.event.pinned is not False
        cap = math.inf if pinned else PAGEABLE_COPY_RATE
        if self._net is None:                   # a flow alone: latency, then the bottleneck rate
            rate = min(self.topology.bottleneck(route), cap)
            return self.topology.route_latency(route) + op.event.nbytes / rate
        return self._net.transfer(route, op.event.nbytes, max_rate=cap)


# ---------------------------------------------------------------- checks

def _spread(errors: list[float]) -> dict:
    if not errors:
        return {"count": 0}
    xs = sorted(errors)

    def pct(q: float) -> float:
        return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]
    return {"count": len(xs), "median_error_pct": median(xs), "p10_error_pct": pct(0.1),
            "p90_error_pct": pct(0.9), "min_error_pct": xs[0], "max_error_pct": xs[-1]}


@dataclass
class CheckResult:
    topology: str | None
    rows: list[dict] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    note: str = ""

    def to_dict(self) -> dict:
        return {"topology": self.topology, "summary": self.summary, "note": self.note, "ops": self.rows}


def collective_check(graphs: list[TraceGraph], topology: str, *, algo: str = "auto") -> CheckResult:
    """Each NCCL kernel of known size: simulated alone on ``topology`` (flows) vs its measured duration."""
    from trainsim.sim.collectives.ops import simulate_collective

    model = WhatIfModel(graphs, WhatIf(topology=topology, algo=algo))
    cache: dict[tuple, float] = {}
    rows = []
    for g in graphs:
        for o in g.ops:
            if o.kind != "collective":
                continue
            grp = model.group(g.rank, o)
            if grp is None:
                continue
            key = (grp.op, tuple(grp.gpus), grp.array_bytes)
            if key not in cache:
                cache[key] = simulate_collective(model.topology, grp.op, grp.gpus, grp.array_bytes,
                                                 algo=algo)["time_s"]
            sim = cache[key]
            rows.append({"rank": g.rank, "step": o.step, "collective": grp.op, "bytes": grp.array_bytes,
                         "gpus": len(grp.gpus), "measured_s": o.event.dur, "simulated_s": sim,
                         "error_pct": 100.0 * (sim - o.event.dur) / o.event.dur if o.event.dur else math.nan})
    summary = _spread([r["error_pct"] for r in rows if math.isfinite(r["error_pct"])])
    summary["by_collective"] = {name: _spread([r["error_pct"] for r in rows if r["collective"] == name])
                                for name in sorted({r["collective"] for r in rows})}
    note = ("a measured NCCL kernel also contains the time it waits for its slowest peer and its protocol's "
            "overheads; the simulation is the transfer alone")
    return CheckResult(model.topology.name, rows, summary, note)


def memcpy_check(graphs: list[TraceGraph], topology: str | None) -> CheckResult:
    """Each memcpy with bytes: host copies against their link alone, on-device copies against the GPU's
    memory bandwidth (each byte read and written once)."""
    from trainsim.sim.core.machine import PAGEABLE_COPY_RATE

    topo = _load_topology(topology) if topology else None
    rows = []
    for g in graphs:
        spec = trace_device(g)
        for o in g.ops:
            e = o.event
            if e.kind != "memcpy" or not e.nbytes or not e.dur:
                continue
            if e.copy_kind in ("H2D", "D2H") and topo is not None and g.rank < len(topo.gpus):
                gpu = topo.gpus[g.rank]
                host = topo.host_memory(gpu)
                route = topo.route(host, gpu) if e.copy_kind == "H2D" else topo.route(gpu, host)
                rate = topo.bottleneck(route) if e.pinned is not False else min(topo.bottleneck(route),
                                                                                 PAGEABLE_COPY_RATE)
                sim = topo.route_latency(route) + e.nbytes / rate
                model = "link"
            elif e.copy_kind == "D2D" and spec is not None:
                sim = 2 * e.nbytes / spec.memory_bandwidth
                model = "gpu memory"
            else:
                continue
            rows.append({"rank": g.rank, "step": o.step, "copy": e.copy_kind, "model": model,
                         "bytes": e.nbytes, "measured_s": e.dur, "simulated_s": sim,
                         "measured_gbps": e.nbytes / e.dur / 1e9, "error_pct": 100.0 * (sim - e.dur) / e.dur})
    summary = _spread([r["error_pct"] for r in rows])
    summary["by_copy"] = {k: _spread([r["error_pct"] for r in rows if r["copy"] == k])
                          for k in sorted({r["copy"] for r in rows})}
    summary["at_least_1MiB"] = _spread([r["error_pct"] for r in rows if r["bytes"] >= 2**20])
    note = ("small copies are dominated by fixed per-copy overheads the bandwidth model leaves out; "
            "see at_least_1MiB")
    return CheckResult(topo.name if topo is not None else None, rows, summary, note)
