"""What-if replays of Kineto traces: another topology, another GPU, data-movement optimizations.

The replay engine asks an ``op_time`` hook for each GPU op's duration; :class:`WhatIfModel` is that hook.
A what-if changes what it changes and keeps the rest as measured: every time below is the measured one
times the ratio of the models' times for the what-if and for the machine the trace ran on (``ran_on``,
by default the preset its GPU implies), so an identity what-if (that machine, that GPU, no options) gives
the measurement back.

- **Collectives**: each NCCL kernel's kind, size, element type and group are what its launching call says
  (`trainsim.formats.collectives`; an all-reduce NCCL ran in a kernel named ``SendRecv`` is an all-reduce),
  its name only where the trace has no call, and the notes list every kernel whose kind, size or group was
  guessed. Each is split into waiting for peers, protocol latency and transfer (`nccl_split`; a size the
  trace lacks is a range, the what-if run at its high end and again at its low end for the range of the
  answer). A re-timed latency + transfer is held between what the wires of the what-if's machine allow
  and what the kernel's own measured rate allows (`WhatIfModel._bounds`). ``--topology`` re-times latency +
  transfer by the ratio of the collective model's time on the new topology to its time on the machine the
  trace ran on (flows alone, or alpha-beta with
  ``collectives=analytic``; with ``network=shared`` the ratio comes from the transfer run on one flow
  network shared with every other transfer). Ranks replayed together join: the k-th collective of a group
  in a step begins its transfer when the last of them is ready, so a straggler moves every rank. Peers
  not replayed are taken to arrive when the measurement says the last rank did, moved as the replayed
  rank's own inputs moved (its launch and the compute it waits for, the work its peers do too), not as
  the collectives before it on its stream did: a shorter all-reduce before does not make a peer come
  sooner.
- **Host copies** (H2D/D2H) scale by the ratio of their link model (route latency plus bytes over the
  bottleneck, a pageable copy capped at the rate one core stages it, the topology's ``pageable_gbps``,
  unless ``pinned=true``) on the new topology to the same model on the old one.
- **Another GPU** (``--gpu``): matrix kernels (by their function name, not their template arguments:
  gemm but not fbgemm, conv, fprop/dgrad/wgrad, xmma, cutlass, scudnn, hmma, cuBLAS's nvjet, flash/fmha
  attention) are compute-bound unless their op says otherwise; every other kernel, memset and
  on-device copy is memory-bound and scales by the ratio of memory bandwidths. A matrix kernel launched
  by a matmul, convolution or fused attention the trace recorded with its shapes (``record_shapes=True``,
  `op_work`) scales by the ratio of the roofline times of that op's FLOPs and bytes on the two GPUs, so a
  matrix-vector product stays memory-bound; one without shapes by the ratio of peak FLOP/s. The precision
  is the one the name shows (tf32 / s1688 / fp16 / bf16), else the op's dtype, else fp32. With
  ``compute_model=kernels`` a matrix kernel whose op has shapes scales by the kernel model's ratio
  (`kernel_ratio`: the op's GEMM, convolution or attention rebuilt, timed in the precision it ran in and,
  on the what-if GPU, in what PyTorch runs there: TF32 as FP32 on a V100).
- **Compression** (``compression=fp16|bf16``, the parameter compression of docs/techniques.md, section 1, as
  DDP's ``fp16_compress_hook``): 4-byte-float all-reduce and reduce-scatter messages are halved (the transfer
  part shrinks with the bytes at the kernel's own rate; latency stays); the casts cost 6 bytes of memory
  traffic per element each way (read 4 + write 2) at the GPU's memory bandwidth. Where the trace carries no
  sizes they are inferred (`nccl_split`) and the report says so.

The checks compare, op by op, the simulation on the topology the trace ran on with the measurement: every
NCCL kernel of known size, simulated alone, against its latency + transfer (the measured kernel less its
wait for peers); every memcpy against its link (host copies) or the GPU's memory (on-device copies, which
read and write every byte).

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
from trainsim.sim.compute.roofline import kernel_seconds, streaming_seconds
from trainsim.sim.core.devices import DeviceSpec, get_device, match_cuda_name
from trainsim.sim.replay.nccl_split import COLLECTIVE_NAMES as COLLECTIVE_OPS
from trainsim.sim.replay.nccl_split import Member, NcclSplit, Split
from trainsim.sim.replay.trace_graph import GpuOp, TraceGraph
from trainsim.topologies import Topology

COMPRESSIBLE = {"allreduce", "reduce_scatter"}
COMPRESSION = ("none", "fp16", "bf16")
_MATRIX_KERNEL = re.compile(
    r"(?<!fb)gemm|conv(?!ert)|fprop|dgrad|wgrad|xmma|cutlass|scudnn|hmma|nvjet|flash|fmha", re.IGNORECASE)
_TEMPLATE_OR_ARGS = re.compile(r"[<(]")
_PRECISION = [("bf16", re.compile(r"bf16", re.I)),
              ("fp16", re.compile(r"fp16|f16|half|h884|h1688|h16816", re.I)),
              ("tf32", re.compile(r"tf32|s1688|s16816|tensorop_s", re.I))]
ALGORITHMS = ("auto", "ring", "tree", "nvls", "nvls_tree")
SET_KEYS = ("algo", "collectives", "compression", "network", "pinned", "ran_on", "untraced",
            "profiler_event_us", "compute_model")
COMPUTE_MODELS = ("roofline", "kernels")
# Presets a trace's GPU most likely ran in, for the checks when no topology is named.
HOME_TOPOLOGY = {"a100": "dgx-a100", "h100": "dgx-h100", "h200": "dgx-h100", "v100": "dgx1-v100"}


@dataclass
class WhatIf:
    """What to change in a replay (all optional). Validated on creation; errors name the field."""

    topology: str | None = None       # preset name or YAML file: collectives and host copies re-simulated
    gpu: str | None = None            # device spec name: compute rescaled by the compute model's ratio
    compression: str = "none"         # none | fp16 | bf16 on fp32 all-reduce / reduce-scatter payloads
    pinned: bool = False              # host copies as pinned DMA
    collectives: str = "flow"         # flow | analytic
    algo: str = "auto"                # collective algorithm: auto | ring | tree | nvls | nvls_tree
    network: str = "isolated"         # isolated: each transfer alone | shared: one flow network for all
    ran_on: str | None = None         # topology the trace ran on (for the checks); default from its GPU
    untraced: bool = False            # CPU threads without the profiler's own time (CpuPoint.untraced_own)
    profiler_event_us: float = 0.0    # with untraced: the profiler's cost per host event it records
    compute_model: str = "roofline"   # roofline | kernels: how --gpu rescales a matrix kernel with shapes

    def __post_init__(self):
        if self.compression not in COMPRESSION:
            raise unknown_name("compression", self.compression, COMPRESSION, field="--set compression")
        if self.collectives not in ("flow", "analytic"):
            raise unknown_name("collective model", self.collectives, ("flow", "analytic"),
                               field="--set collectives")
        if self.algo not in ALGORITHMS:
            raise unknown_name("algorithm", self.algo, ALGORITHMS, field="--set algo")
        if self.network not in ("isolated", "shared"):
            raise unknown_name("network", self.network, ("isolated", "shared"), field="--set network")
        if self.compute_model not in COMPUTE_MODELS:
            raise unknown_name("compute model", self.compute_model, COMPUTE_MODELS,
                               field="--set compute_model")
        if self.gpu is not None:
            try:
                get_device(self.gpu)
            except TrainsimError as exc:
                raise TrainsimError(exc.reason, field="--gpu") from None
        if not (math.isfinite(self.profiler_event_us) and self.profiler_event_us >= 0):
            raise TrainsimError(f"profiler_event_us must be a number of microseconds >= 0, got "
                                f"{self.profiler_event_us!r}", field="--set profiler_event_us")
        if self.profiler_event_us and not self.untraced:
            raise TrainsimError("profiler_event_us takes the profiler's recording cost out of the CPU "
                                "threads: it needs untraced=true", field="--set profiler_event_us")

    @property
    def active(self) -> bool:
        """Whether anything differs from replaying the measured durations."""
        return bool(self.topology or self.gpu or self.compression != "none" or self.pinned or self.untraced)

    @property
    def untraced_event_s(self) -> float | None:
        """`engine.replay`'s ``untraced_event_s``: None keeps the CPU threads' measured time."""
        return self.profiler_event_us * 1e-6 if self.untraced else None

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
            if key in ("pinned", "untraced"):
                if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise TrainsimError(f"{key} must be true or false, got {value!r}", field=f"--set {key}")
                fields[key] = value.lower() in ("true", "1", "yes")
            elif key == "profiler_event_us":
                try:
                    fields[key] = float(value)
                except ValueError:
                    raise TrainsimError(f"profiler_event_us must be a number of microseconds, got {value!r}",
                                        field="--set profiler_event_us") from None
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


def kernel_function(name: str) -> str:
    """A kernel's function name, without its template arguments and parameters (which may name types of
    any library: ``vectorized_elementwise_kernel<4, fbgemm_gpu::...>``)."""
    return _TEMPLATE_OR_ARGS.split(name.replace("(anonymous namespace)", ""), maxsplit=1)[0]


def is_matrix_kernel(name: str) -> bool:
    """Whether a kernel's function name says matrix products (GEMM, convolution, fused attention)."""
    return bool(_MATRIX_KERNEL.search(kernel_function(name)))


def kernel_precision(name: str) -> str | None:
    """The precision a kernel's name shows (tf32, fp16, bf16), None when it shows none."""
    for precision, pattern in _PRECISION:
        if pattern.search(name):
            return precision
    return None


def matrix_precision(op: GpuOp, *devices: DeviceSpec) -> str:
    """The peak a matrix kernel runs at: the precision its name shows, else its op's dtype's, else fp32
    (also fp32 where one of ``devices`` has no peak for it)."""
    precision = kernel_precision(op.name) or (op.work.precision if op.work else None) or "fp32"
    return precision if all(precision in d.peak_flops for d in devices) else "fp32"


def is_memory_bound(op: GpuOp, device: DeviceSpec) -> bool:
    """Whether a kernel's op, recorded with its shapes, takes longer for its bytes than for its FLOPs on
    ``device`` (False when its op's work is not known)."""
    if op.work is None:
        return False
    precision = matrix_precision(op, device)
    return (kernel_seconds(device, op.work.flops, op.work.nbytes, precision)
            > kernel_seconds(device, op.work.flops, 0.0, precision))


def compute_ratio(op: GpuOp, source: DeviceSpec, target: DeviceSpec, model: str = "roofline") -> float:
    """Target time / measured time of a compute kernel, memset or on-device copy (see the module doc);
    ``model`` ``kernels``: a matrix kernel whose op was recorded with its shapes by the kernel model's ratio
    (`kernel_ratio`)."""
    if op.kind != "kernel" or not is_matrix_kernel(op.name):
        return source.memory_bandwidth / target.memory_bandwidth
    if model == "kernels":
        ratio = kernel_ratio(op, source, target)
        if ratio is not None:
            return ratio
    work, precision = op.work, matrix_precision(op, source, target)
    if work is None:
        return source.peak(precision) / target.peak(precision)
    before = kernel_seconds(source, work.flops, work.nbytes, precision)
    if before <= 0:
        return source.memory_bandwidth / target.memory_bandwidth
    return kernel_seconds(target, work.flops, work.nbytes, precision) / before


def kernel_ratio(op: GpuOp, source: DeviceSpec, target: DeviceSpec) -> float | None:
    """The kernel model's time of a matrix kernel's op on ``target`` over its time on ``source``: the op's
    Gemm, Conv2d or Attention rebuilt from its recorded shapes (`op_work.OpWork.shape`), in the precision its
    name shows on ``source`` (else its dtype's) and in what PyTorch runs on ``target`` where that lacks it
    (TF32 as FP32 on a V100: `kernels.layers.runs_as`). None where the op has no shape or a device is not a
    GPU the kernel model knows."""
    from trainsim.sim.compute.kernels.layers import kernel_estimates, op_kernels

    work = op.work
    if work is None or not work.shape or source.kind != "gpu" or target.kind != "gpu":
        return None
    precision = kernel_precision(op.name) or work.precision or "fp32"
    if precision not in source.peak_flops:
        precision = "fp32"
    kernels = op_kernels(work.shape, precision)
    flags = {"tf32_conv": False, "tf32_matmul": False}  # the precision is the one the kernel ran in
    try:
        before = sum(e.seconds for e in kernel_estimates(kernels, source, **flags))
        after = sum(e.seconds for e in kernel_estimates(kernels, target, **flags))
    except TrainsimError:  # a device spec without the figures the kernel model needs
        return None
    return after / before if before > 0 else None


class WhatIfModel:
    """The ``op_time`` hook of a what-if replay of ``graphs``."""

    def __init__(self, graphs: list[TraceGraph], whatif: WhatIf, *, home: Topology | None = None,
                 topology: Topology | None = None, size_bound: str | None = None):
        """``home``: the machine the trace ran on (``whatif.ran_on``, else the preset its GPU implies:
        `home_topology`); ``topology``: the what-if's machine (``whatif.topology``), both loaded
        (`trainsim.traces.replay_topologies`). ``size_bound``: "low" or "high" runs each inferred message
        size at that end of its range (`nccl_split.Split.size_range`); None at the size the split took (its
        high end)."""
        self.graphs, self.whatif, self.size_bound = graphs, whatif, size_bound
        self.graphs_by_rank = {g.rank: g for g in graphs}
        self.home = home
        self.topology = topology
        if (self.topology is not None or whatif.pinned) and self.home is None:
            gpu = next((n for g in graphs for n in g.trace.devices.values()), None)
            said = f"its GPU {gpu!r} does not say which" if gpu else "it names no GPU (no deviceProperties)"
            raise TrainsimError(f"a what-if re-times transfers relative to the machine the trace ran on, and "
                                f"{said}: name it with --set ran_on=TOPOLOGY", field="--set ran_on")
        self.nccl = NcclSplit(graphs, self.home)
        self.sources = {g.rank: trace_device(g) or self._home_device(g.rank) for g in graphs}
        self.target = get_device(whatif.gpu) if whatif.gpu else None
        if self.target is not None:
            unknown = [g for g in graphs if self.sources[g.rank] is None]
            if unknown:
                name = next(iter(unknown[0].trace.devices.values()), None)
                said = (f"the trace's GPU {name!r} is not a known device spec (see `trainsim device list`)"
                        if name else "the trace names no GPU (no deviceProperties)")
                raise TrainsimError(f"cannot rescale to another GPU: {said}; name the machine it ran on with "
                                    "--set ran_on=TOPOLOGY", file=unknown[0].trace.path, field="--gpu")
        if whatif.compression != "none":
            self._check_compressible()
        self._env: simpy.Environment | None = None
        self._net = None
        self._alone: dict[tuple, float] = {}           # model times by (topology, op, ranks, bytes)
        self._wires: dict[tuple, float | None] = {}    # wire bus bandwidth by (topology, op, ranks)
        # (rank, op) -> the re-timed latency + transfer, its bounds and whether it was held to one of them
        self.retimed: dict[tuple[int, int], dict] = {}
        self._joins: dict[tuple, list] = {}
        self._keys: dict[tuple[int, int], tuple] = {}
        self._present: dict[tuple, int] = defaultdict(int)
        self.unjoined: set[tuple] = set()               # (group, step) whose ranks' collectives disagree
        self._join_keys()

    def _join_keys(self) -> None:
        """Which NCCL kernels of the replayed ranks are one collective: the k-th of each kind in a group and a
        step. Where the ranks' collectives of a group and step do not line up (another kind, another size
        of a collective whose size every rank shares, or another order: traces of different iterations, or
        sampled ones), none of them is joined: each rank keeps its peers as measured."""
        per_rank: dict[tuple, dict[int, list[tuple]]] = defaultdict(lambda: defaultdict(list))
        for g in self.graphs:
            counters: dict[tuple, int] = defaultdict(int)
            for o in sorted((o for o in g.ops if o.kind == "collective"), key=lambda o: o.event.ts):
                c = o.collective
                op = COLLECTIVE_OPS.get(c.op, c.op)
                base = (c.group, op, o.step)
                if c.ranks is None and op == "sendrecv":
                    base = (*base, g.rank)      # peers unknown: no join with the other replayed ranks
                key = (*base, counters[base])
                counters[base] += 1
                self._keys[(g.rank, o.index)] = key
                size = c.array_bytes if op not in ("alltoall", "sendrecv") else None
                per_rank[(c.group, o.step)][g.rank].append((key, size, o.index))
        for where, ranks in per_rank.items():
            sequences = list(ranks.values())
            shared = set.intersection(*({k for k, *_ in seq} for seq in sequences))
            sizes: dict[tuple, set] = defaultdict(set)
            for seq in sequences:
                for k, size, _ in seq:
                    if size is not None:
                        sizes[k].add(size)
            orders = {tuple(k for k, *_ in seq if k in shared) for seq in sequences}
            if len(sequences) > 1 and (len(orders) > 1 or any(len(v) > 1 for v in sizes.values())):
                self.unjoined.add(where)
                for rank, seq in ranks.items():
                    for key, _, index in seq:
                        self._keys[(rank, index)] = (*key, "rank", rank)
        for key in self._keys.values():
            self._present[key] += 1

    def _home_device(self, rank: int) -> DeviceSpec | None:
        """The GPU of the machine named by ran_on, for traces that do not name theirs."""
        if self.home is None or rank >= len(self.home.gpus):
            return None
        gpu = self.home.gpus[rank]
        return match_cuda_name(self.home.gpu_spec(gpu), self.home.gpu_memory(gpu))

    def _check_compressible(self) -> None:
        """Compression needs each all-reduce's size (given or inferred) and the GPU's memory bandwidth."""
        for g in self.graphs:
            for o in g.ops:
                m = self.nccl.member(g.rank, o)
                if m is None or m.op not in COMPRESSIBLE or self.nccl.split(g.rank, o) is not None:
                    continue
                raise TrainsimError(
                    "compression needs the all-reduces' message sizes: the trace's NCCL kernels carry none "
                    "and the machine it ran on is unknown, so they cannot be inferred from their times; "
                    "name the machine with --set ran_on=TOPOLOGY, or record sizes (PyTorch >= 2.1 profiler "
                    "with record_shapes=True)", file=g.trace.path, field="--set compression")
        if self.target is None and None in self.sources.values():
            raise TrainsimError("compression costs its casts at the GPU's memory bandwidth, but the trace's "
                                "GPU is not a known device spec: name one with --gpu, or the machine the "
                                "trace ran on with --set ran_on=TOPOLOGY", field="--gpu")

    def notes(self) -> list[str]:
        """What the reader of the what-if must know: which sizes were inferred, which kernels kept, what
        was taken out as the profiler's own time."""
        out = []
        if self.target is not None:
            out.extend(self._matrix_notes())
        if self.whatif.untraced:
            points = [p for g in self.graphs for p in g.points]
            stalls = sum(p.profiler_stall for p in points)
            recorded = sum(p.recorded for p in points)
            out.append(f"untraced: CPU threads less {stalls * 1e3:.2f} ms of profiler stalls (CUPTI buffer "
                       f"requests they waited on) and {self.whatif.profiler_event_us:g} us per recorded host "
                       f"event ({recorded} events) over the whole trace")
        out.extend(self._collective_notes())
        if self.unjoined:
            out.append(f"the replayed ranks' collectives do not line up in {len(self.unjoined)} (group, "
                       "step) pairs (another kind, size or order: traces of different iterations, or sampled "
                       "ones): there each rank keeps its peers as measured instead of waiting for the others")
        kept = sum(split.wait_s for (rank, index), split in self.nccl.splits.items()
                   if self._present[self._keys[(rank, index)]] == 1)
        if kept > 0:
            out.append(f"{kept * 1e3:.2f} ms of NCCL kernels waiting for peers that are not replayed: they "
                       "are taken to move as this rank's own work does (replay every rank's trace together "
                       "to simulate them)")
        return out

    def _collective_notes(self) -> list[str]:
        """One note per way a collective's kind, size or group was guessed (each kernel is listed in the
        JSON's ``nccl.guessed``), and the kernels named for another collective than their call ran."""
        out = []
        rows = self.nccl.guessed()

        def where(selected: list[dict]) -> str:
            shown = ", ".join(f"rank {r['rank']} step {'-' if r['step'] is None else r['step']} op {r['op']}"
                              for r in selected[:3])
            return shown + (f" and {len(selected) - 3} more" if len(selected) > 3 else "")

        by_name = [r for r in rows if r["kind_from"] == "kernel name"]
        if by_name:
            kinds = ", ".join(sorted({r["collective"] for r in by_name}))
            out.append(f"{len(by_name)} NCCL kernels: kind ({kinds}) read from the kernel name only, no "
                       f"launching call in the trace says which collective ran ({where(by_name)})")
        inferred: dict[str, list[dict]] = defaultdict(list)
        for r in rows:
            if r["size"] != "unknown" and r["size"] != "trace":
                inferred[r["size"]].append(r)
        for source, selected in sorted(inferred.items()):
            low = min(r["bytes_low"] for r in selected)
            high = max(r["bytes_high"] for r in selected)
            out.append(f"{len(selected)} NCCL kernels carry no message size: sizes {source}, each a range "
                       f"(all {_mb(low)} to {_mb(high)}): the what-if runs at the high end, as much as the "
                       f"time allows (a wait for a peer may count as transfer); the low end gives the "
                       f"range of its answer ({where(selected)})")
        unknown = [r for r in rows if r["size"] == "unknown"]
        if unknown:
            out.append(f"{len(unknown)} NCCL kernels of unknown size keep their measured time "
                       f"({where(unknown)})")
        groups = [r for r in rows if r.get("group") == "guessed: the whole world"]
        if groups:
            out.append(f"{len(groups)} NCCL kernels name no process group: taken as the whole world of "
                       f"{self.nccl.world} ranks ({where(groups)})")
        renamed: dict[tuple[str, str], int] = defaultdict(int)
        for (rank, index), m in self.nccl.members.items():
            c = self.graphs_by_rank[rank].ops[index].collective
            named = COLLECTIVE_OPS.get(c.kernel_op) if c.kernel_op else None
            if named and named != m.op:
                renamed[(c.kernel_op, m.op)] += 1
        for (kernel, op), n in sorted(renamed.items()):
            out.append(f"{n} NCCL kernels named {kernel} ran {op} (their launching calls say so): taken as "
                       f"{op}")
        return out

    def _matrix_notes(self) -> list[str]:
        """How the --gpu what-if rescaled the matrix kernels: by their ops' shapes, or by peak FLOP/s."""
        shaped = unshaped = memory_bound = 0
        for g in self.graphs:
            source = self.sources[g.rank]
            for o in g.ops:
                if o.kind != "kernel" or not is_matrix_kernel(o.name):
                    continue
                if o.work is None:
                    unshaped += 1
                    continue
                shaped += 1
                memory_bound += is_memory_bound(o, source)
        out = []
        if shaped and self.whatif.compute_model == "kernels":
            out.append(f"{shaped} matrix kernels rescaled by the kernel model of their ops' recorded shapes "
                       "(each in the precision it ran in, on the what-if GPU in what PyTorch runs there)")
        elif shaped:
            out.append(f"{shaped} matrix kernels rescaled by the roofline of their ops' recorded shapes "
                       f"({memory_bound} of them memory-bound on the trace's GPU)")
        if unshaped:
            out.append(f"{unshaped} matrix kernels rescaled by peak FLOP/s: no matmul, convolution or "
                       "attention shapes recorded behind them (a CUDA graph's, or a trace without "
                       "record_shapes=True)")
        return out

    def message_bytes(self, rank: int) -> dict[int, float]:
        """Op index -> bytes each NCCL kernel of ``rank`` moves in this what-if (compressed, inferred)."""
        out = {}
        for (r, index), split in self.nccl.splits.items():
            if r != rank:
                continue
            split = self._sized(split)
            m = self.nccl.members[(r, index)]
            compress = (self.whatif.compression != "none" and m.op in COMPRESSIBLE
                        and split.element_bytes == 4)
            out[index] = split.nbytes / 2 if compress else split.nbytes
        return out

    def sizes_matter(self) -> bool:
        """Whether an inferred message size changes this what-if: compression or another topology, and a
        kernel whose size the trace does not give."""
        changes = self.whatif.compression != "none" or self.topology is not None
        return changes and any(s.inferred for s in self.nccl.splits.values())

    def _sized(self, split: Split) -> Split:
        """The split at the end of its size range this model runs at (`size_bound`)."""
        if self.size_bound is None or not split.inferred:
            return split
        low, high = split.size_range
        return split.with_size(low if self.size_bound == "low" else high)

    # -- the hook ---------------------------------------------------------------------------------

    def __call__(self, env: simpy.Environment, rank: int, op: GpuOp, ready_shift: float = 0.0):
        if env is not self._env:
            self._env, self._joins = env, {}
            self.retimed = {}
            self._net = None
            if self.topology is not None and self.whatif.network == "shared":
                from trainsim.sim.core.flows import FlowNetwork

                self._net = FlowNetwork.from_topology(env, self.topology, record_flows=False)
        if op.kind == "collective":
            return self._collective(env, rank, op, ready_shift)
        if op.kind == "memcpy" and op.event.copy_kind in ("H2D", "D2H"):
            return self._host_copy(env, rank, op)
        if op.kind in ("kernel", "memset") or (op.kind == "memcpy" and op.event.copy_kind == "D2D"):
            if self.target is not None:
                return op.event.dur * compute_ratio(op, self.sources[rank], self.target,
                                                    self.whatif.compute_model)
        return None

    def _bandwidth(self, rank: int) -> float:
        return (self.target or self.sources[rank]).memory_bandwidth

    def _model(self, topology, m: Member, nbytes: float) -> float:
        """The collective alone on ``topology`` (flows, or alpha-beta with collectives=analytic), cached."""
        from trainsim.sim.collectives.ops import collective_time, simulate_collective

        key = (topology.name, m.op, m.ranks, nbytes)
        if key not in self._alone:
            gpus = self.nccl.gpus(topology, m.ranks)
            if self.whatif.collectives == "analytic":
                t = collective_time(topology, m.op, gpus, nbytes, algo=self._algo(topology, m))
            else:
                t = simulate_collective(topology, m.op, gpus, nbytes, algo=self._algo(topology, m))["time_s"]
            self._alone[key] = t
        return self._alone[key]

    def _algo(self, topology, m: Member) -> str:
        """The algorithm asked for on the what-if's topology; NCCL's choice on the trace's machine."""
        from trainsim.sim.collectives.ops import feasible_algorithms

        if topology is not self.topology or self.whatif.algo == "auto":
            return "auto"
        gpus = self.nccl.gpus(topology, m.ranks)
        return self.whatif.algo if self.whatif.algo in feasible_algorithms(topology, m.op, gpus) else "auto"

    def _retimed(self, rank: int, op: GpuOp, m: Member | None, split: Split | None):
        """(wait, latency + transfer on the what-if, casts, message bytes, bounds) of one NCCL kernel."""
        if split is None:                    # nothing known to re-time: all of it counts as waiting
            return op.event.dur, 0.0, 0.0, None, (0.0, math.inf)
        split = self._sized(split)
        nbytes, casts = split.nbytes, 0.0
        if (self.whatif.compression != "none" and m.op in COMPRESSIBLE and split.element_bytes == 4
                and nbytes > 0):
            nbytes = nbytes / 2
            casts = 2 * (split.nbytes / 4) * 6 / self._bandwidth(rank)      # encode before, decode after
        core = split.core_at(nbytes)
        if self.topology is not None and self._net is None and nbytes > 0:
            old = self._model(self._home_for(m), m, nbytes)
            core *= self._model(self.topology, m, nbytes) / old if old > 0 else 1.0
        return split.wait_s, core, casts, nbytes, self._bounds(op, m, split, nbytes)

    def _home_for(self, m: Member):
        """The machine the trace ran on, which must hold the collective's group to compare with."""
        if not self.nccl.fits(self.home, m):
            raise TrainsimError(f"the machine the trace ran on ({self.home.name}, {len(self.home.gpus)} "
                                f"GPUs) cannot hold its {len(m.ranks)}-rank {m.op} groups, so a re-timing on "
                                "another topology has nothing to compare with: name a machine that can with "
                                "--set ran_on=TOPOLOGY", field="--set ran_on")
        return self.home

    def wire_busbw(self, topology, m: Member) -> float | None:
        """The largest bus bandwidth the wires of ``topology`` allow ``m``'s collective over its group, any
        algorithm it can run as there (`limits.busbw_limit`; the slowest GPU's injection for collectives
        that module does not bound); None when the group does not fit the topology."""
        from trainsim.sim.collectives.limits import busbw_limit, raw_injection
        from trainsim.sim.collectives.ops import feasible_algorithms

        if topology is None or not self.nccl.fits(topology, m):
            return None
        key = (topology.name, m.op, m.ranks)
        if key not in self._wires:
            gpus = self.nccl.gpus(topology, m.ranks)
            limits = [x for algo in feasible_algorithms(topology, m.op, gpus)
                      if (x := busbw_limit(topology, m.op, gpus, algo)) is not None]
            self._wires[key] = max(limits) if limits else min(raw_injection(topology, g) for g in gpus)
        return self._wires[key]

    def model_busbw(self, topology, m: Member) -> float | None:
        """The bus bandwidth the collective model reaches for ``m``'s collective on ``topology`` with a large
        message (1 GiB: its routes and protocol, past the latency); None when the group does not fit."""
        from trainsim.sim.collectives.ops import bus_factor

        if topology is None or not self.nccl.fits(topology, m):
            return None
        key = ("model", topology.name, m.op, m.ranks)
        if key not in self._wires:
            big = float(2**30)
            t = self.nccl.model_time(topology, m, big) - self.nccl.model_time(topology, m, 0.0)
            self._wires[key] = big * bus_factor(m.op, len(m.ranks)) / t if t > 0 else None
        return self._wires[key]

    def _bounds(self, op: GpuOp, m: Member, split: Split, nbytes: float) -> tuple[float, float]:
        """(floor, ceiling) of the re-timed latency + transfer of ``nbytes``: no faster than the wires of the
        what-if's machine carry the bytes (its wire bus bandwidth; as much faster as the kernel was measured
        beating the wires of the machine it ran on, whose description it then proves short), no slower than
        the kernel's own measured rate moves them (all of its measured time after the latency as transfer),
        slowed only by as much as the collective model's bandwidth on the new machine is below the old
        one's (`model_busbw`: the routes the collective takes there), after the new machine's latency."""
        from trainsim.sim.collectives.ops import bus_factor

        if nbytes <= 0:
            return 0.0, math.inf
        factor = bus_factor(m.op, len(m.ranks))
        wires, old = self.wire_busbw(self.topology or self.home, m), self.wire_busbw(self.home, m)
        moving = op.event.dur - split.latency_s
        slower, latency = 1.0, split.latency_s
        if self.topology is not None:
            before, after = self.model_busbw(self.home, m), self.model_busbw(self.topology, m)
            slower = max(1.0, before / after) if before and after else math.inf
            latency = max(latency, self.nccl.model_time(self.topology, m, 0.0))
        if wires and old and split.nbytes > 0 and split.transfer_s > 0:
            # a kernel that beat the home machine's wires says they are faster than its description
            wires *= max(1.0, split.nbytes * factor / split.transfer_s / old)
        floor = nbytes * factor / wires if wires else 0.0
        if split.nbytes <= 0 or moving <= 0:
            return floor, math.inf
        ceiling = latency + nbytes * moving / split.nbytes * slower
        return floor, max(ceiling, floor)

    def _collective(self, env, rank, op, ready_shift: float):
        m, split = self.nccl.member(rank, op), self.nccl.split(rank, op)
        wait, core, casts, nbytes, bounds = self._retimed(rank, op, m, split)
        done = env.event()
        key = self._keys[(rank, op.index)]
        entry = self._joins.setdefault(key, [])
        entry.append((env.now, env.now - op.event.ts, wait, core, casts, done, ready_shift, rank, op.index,
                      bounds))
        if len(entry) == self._present[key]:
            absent = m is None or len(m.ranks) > len(entry)
            env.process(self._finish(env, entry, m, nbytes, absent))
        return done

    def _finish(self, env, entry: list, m: Member | None, nbytes: float | None, absent: bool):
        """All replayed ranks have reached the collective: each ends at its own delayed-and-retimed end.

        The measured moment the last rank arrived moves by ``shift``: a replayed rank that starts the
        kernel d later than measured after having waited w arrives ``d - w`` after that moment; ranks not
        replayed arrived at that moment and move as the replayed ranks' own inputs (their launch and the
        ops they wait for on other streams: the same work the peers do) moved. Each rank then moves the
        new latency + transfer (and casts) after it.
        """
        shift = max(d - w for _, d, w, *_ in entry)
        if absent:
            shift = max(shift, max(e[6] for e in entry))
        ratio = 1.0
        if self._net is not None and m is not None and nbytes:
            from trainsim.sim.collectives.ops import run_collective

            began = env.now
            yield env.process(run_collective(env, self._net, self.topology, m.op,
                                             self.nccl.gpus(self.topology, m.ranks), nbytes,
                                             algo=self._algo(self.topology, m)))
            old = self._model(self._home_for(m), m, nbytes)
            ratio = (env.now - began) / old if old > 0 else 1.0
        for start, d, wait, core, casts, done, _, rank, index, (floor, ceiling) in entry:
            held = min(max(core * ratio, floor), ceiling)
            self.retimed[(rank, index)] = {"core_s": core * ratio, "floor_s": floor, "ceiling_s": ceiling,
                                           "held": held != core * ratio, "new_s": held, "casts_s": casts}
            end = start + wait - d + shift + casts + held
            timer = env.timeout(max(0.0, end - env.now))
            timer.callbacks.append(lambda _, done=done: done.succeed())

    def _copy_model(self, topology, rank: int, op: GpuOp, pinned: bool) -> tuple[list, float, float]:
        """(route, rate cap, seconds alone) of a host copy on ``topology``."""
        gpus = topology.gpus
        if rank >= len(gpus):
            raise TrainsimError(f"topology {topology.name} has {len(gpus)} GPUs; the trace needs rank {rank}",
                                field="--topology")
        gpu = gpus[rank]
        host = topology.host_memory(gpu)
        route = topology.route(host, gpu) if op.event.copy_kind == "H2D" else topology.route(gpu, host)
        cap = math.inf if pinned else topology.pageable_rate(gpu)
        alone = topology.route_latency(route) + op.event.nbytes / min(topology.bottleneck(route), cap)
        return route, cap, alone

    def _host_copy(self, env, rank, op):
        """The measured copy times the ratio of its link model on the new topology to the old one."""
        if op.event.nbytes is None or self.home is None or (self.topology is None and not self.whatif.pinned):
            return None
        measured_pinned = op.event.pinned is not False
        _, _, old = self._copy_model(self.home, rank, op, measured_pinned)
        route, cap, new = self._copy_model(self.topology or self.home, rank, op,
                                           self.whatif.pinned or measured_pinned)
        if self._net is None:
            return op.event.dur * new / old
        # On the shared network the copy's flow carries its bytes times measured / modelled on the old
        # machine: the per-copy overheads the link model lacks take link time in proportion.
        return self._net.transfer(route, op.event.nbytes * op.event.dur / old, max_rate=cap)


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.3g} MB"


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


def _as_it_ran(topo, m: Member, gpus: list[str], nbytes: float, algo: str) -> float:
    """The collective alone on flows, with the algorithm and protocol the kernel ran where the
    topology has them (and ``algo`` is auto), else NCCL's choice."""
    from trainsim.sim.collectives.ops import simulate_collective

    if algo == "auto" and (m.algo, m.proto) != ("auto", "auto"):
        try:
            return simulate_collective(topo, m.op, gpus, nbytes, algo=m.algo, proto=m.proto)["time_s"]
        except TrainsimError:
            pass
    return simulate_collective(topo, m.op, gpus, nbytes, algo=algo)["time_s"]


def collective_check(graphs: list[TraceGraph], topo: Topology, *, algo: str = "auto") -> CheckResult:
    """Each NCCL kernel whose size the trace carries: simulated alone on ``topo`` (flows) vs its
    latency + transfer, the measured kernel less its wait for peers (`nccl_split`)."""
    split = NcclSplit(graphs, topo)
    cache: dict[tuple, float] = {}
    rows, too_big = [], 0
    for g in graphs:
        for o in g.ops:
            m, part = split.member(g.rank, o), split.split(g.rank, o)
            if m is None or part is None or part.inferred:
                continue
            if not split.fits(topo, m):
                too_big += 1
                continue
            gpus = split.gpus(topo, m.ranks)
            key = (m.op, tuple(gpus), part.nbytes, m.algo, m.proto)
            if key not in cache:
                cache[key] = _as_it_ran(topo, m, gpus, part.nbytes, algo)
            sim, core = cache[key], part.core_s
            rows.append({"rank": g.rank, "step": o.step, "collective": m.op, "bytes": part.nbytes,
                         "gpus": len(gpus), "measured_s": o.event.dur, "wait_s": part.wait_s,
                         "latency_s": part.latency_s, "transfer_s": part.transfer_s, "simulated_s": sim,
                         "error_pct": 100.0 * (sim - core) / core if core > 0 else math.nan})
    summary = _spread([r["error_pct"] for r in rows if math.isfinite(r["error_pct"])])
    summary["by_collective"] = {name: _spread([r["error_pct"] for r in rows if r["collective"] == name])
                                for name in sorted({r["collective"] for r in rows})}
    summary["fitted"] = split.summary()
    summary["rates"] = _envelope_rates(rows)
    note = ("compared with each kernel's latency + transfer: its measured time less its wait for peers, the "
            "transfer at the fastest rate the trace shows for that kind of kernel")
    if too_big:
        summary["groups_larger_than_topology"] = too_big
        note += (f"; {too_big} kernels left out: their groups have more ranks than {topo.name} has GPUs "
                 "(name the machine with --set ran_on)")
    return CheckResult(topo.name, rows, summary, note)


# The trace's links and the model's differ in kind, not in detail, beyond this ratio of rates.
RATE_MISMATCH = 2.0


def _envelope_rates(rows: list[dict]) -> list[dict]:
    """Per kind of kernel (collective, GPUs), the fastest measured transfer rate (the fit's envelope) beside
    the model's rate for the same kernel; ``mismatch`` when they differ by over RATE_MISMATCH: then the
    trace ran on links other than the topology's (peer-to-peer off, PCIe instead of NVLink, ...)."""
    best: dict[tuple, dict] = {}
    for r in rows:
        if r["transfer_s"] <= 0 or r["simulated_s"] <= r["latency_s"]:
            continue
        key = (r["collective"], r["gpus"])
        rate = r["bytes"] / r["transfer_s"]
        if key not in best or (rate, r["bytes"]) > (best[key]["rate"], best[key]["bytes"]):
            model = r["bytes"] / (r["simulated_s"] - r["latency_s"])
            best[key] = {"rate": rate, "bytes": r["bytes"], "model": model}
    out = []
    for (op, n), b in sorted(best.items()):
        ratio = b["model"] / b["rate"]
        out.append({"collective": op, "gpus": n, "bytes": b["bytes"], "measured_gbps": b["rate"] / 1e9,
                    "model_gbps": b["model"] / 1e9,
                    "mismatch": ratio > RATE_MISMATCH or ratio < 1 / RATE_MISMATCH})
    return out


def memcpy_check(graphs: list[TraceGraph], topo: Topology | None) -> CheckResult:
    """Each memcpy with bytes: host copies against their link (on ``topo``, the machine the trace ran on)
    alone, on-device copies against the GPU's memory bandwidth (each byte read and written once)."""
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
                                                                                 topo.pageable_rate(gpu))
                sim = topo.route_latency(route) + e.nbytes / rate
                model = "link"
            elif e.copy_kind == "D2D" and spec is not None:
                sim = streaming_seconds(spec, 2 * e.nbytes)
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
