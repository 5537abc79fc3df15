"""The dependency graph a replay needs, built from one rank's Kineto trace.

Two kinds of nodes:

- **CPU points**: instants on a CPU thread where something happens that the replay must time: a CUDA
  runtime call starts (it may launch GPU work), a blocking call returns, a thread resumes after waiting
  for another thread, a ``ProfilerStep`` starts or ends. Between consecutive points of a thread the CPU
  time is the measured one; a point may also *wait* for GPU ops (synchronisations) or for another
  thread's point (fork/join hand-offs), each with a measured slack.
- **GPU ops**: kernels, NCCL collectives, memcpys, memsets, in order on their stream, each launched by
  a CPU point (correlation id, else the ``ac2g`` flow) and possibly waiting for ops on other streams
  (``cudaStreamWaitEvent``). An NCCL kernel's collective (kind, size, element type, group) is what the
  calls around its launch say, its own name only where they say nothing (`trainsim.formats.collectives`).

Every wait carries two numbers taken from the measurement, chosen so that replaying with the measured
durations reproduces the measured times exactly, and what-if replays move things for physical reasons:
for the constraint that was binding in the measurement the slack is the measured one; for the others it
is a typical value capped so that it cannot bind in the measurement. A GPU op starts at
``max(launch + launch_latency, ready + queue_gap)`` where ready is when its stream and the events it
waits for are free.

Where the trace does not say which stream an event wait or a synchronisation refers to (traces recorded
without ``enable_cuda_sync_events``), it is inferred: an event wait links the op recorded last before the
thread's latest ``cudaEventRecord`` (on another stream) to the next op the thread launches, or, when no
record is visible (NCCL records its own), the op on another stream that ended last before that op
started; a stream or event synchronisation waits for the op whose completion released it. Inferred waits
that contradict the measured times are dropped and counted.

A ``cudaGraphLaunch`` launches every kernel carrying its correlation id; a graph's parallel branches show
on one stream and overlap, so each op follows the latest op of its stream that had ended when it started.
An op that started long after its launch and its stream were ready, just as an op on another stream of
its GPU ended, waited for that op (an event wait the trace does not show, or the SMs that op held).
A launch call that waited for a free entry of CUDA's launch queue (`LAUNCH_QUEUE`) returns when the op
that freed it finished, so that wait shrinks when the GPU gets faster instead of staying CPU time.

The profiler's own time is marked, not removed: each point carries the part of its ``own`` time its thread
stood stalled by a CUPTI buffer request the trace records (``_profiler_stalls`` says which thread waited)
and the number of host events recorded in it, so that a replay can run the threads as without the profiler
(`CpuPoint.untraced_own`).

It stays one module: its passes (points, launches, waits, inferred waits dropped when the measurement
contradicts them) build one graph and share its private indexes.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import defaultdict
from dataclasses import dataclass, field
from statistics import median
from typing import NamedTuple

from trainsim.formats.collectives import merge as merge_collective
from trainsim.formats.kineto import Collective, CpuEvent, GpuEvent, KinetoTrace
from trainsim.sim.replay.op_work import OpWork, op_work

# Calls that return only when the GPU work they refer to has finished.
DEVICE_SYNC = {"cudaDeviceSynchronize", "cuCtxSynchronize"}
TARGETED_SYNC = {"cudaStreamSynchronize", "cudaEventSynchronize", "cuStreamSynchronize", "cuEventSynchronize"}
SYNC_COPIES = {"cudaMemcpy", "cudaMemcpy2D", "cudaMemcpy3D", "cudaMemset", "cudaMemcpyToSymbol",
               "cudaMemcpyFromSymbol", "cuMemcpyDtoH_v2", "cuMemcpyHtoD_v2"}
BLOCKING = DEVICE_SYNC | TARGETED_SYNC | SYNC_COPIES
EVENT_RECORD = {"cudaEventRecord", "cudaEventRecordWithFlags", "cuEventRecord"}
STREAM_WAIT = {"cudaStreamWaitEvent", "cuStreamWaitEvent"}

TOLERANCE_S = 1e-6          # clock jitter allowed between a predecessor's end and its successor's start
BRANCH_LOOKBACK = 64        # ops looked back on a stream for the one a graph branch's kernel ran after
# CUDA queues up to about 1024 pending launches per stream before a launch call blocks (the depth commonly
# measured on recent GPUs; CUDA does not document it). The replay engine enforces it.
LAUNCH_QUEUE = 1024
QUEUE_FULL_SHARE = 0.9      # a launch blocks only on a (nearly) full queue: entries are counted per call
BLOCKED_LAUNCH_MIN_S = 50e-6  # launch calls shorter than this are taken as CPU time
HELD_MIN_S = 50e-6          # an op idle this long after its launch and its stream was held by something
HELD_TOLERANCE_S = 5e-6     # ... by the op on another stream that ended this close before it started


@dataclass(slots=True)
class GpuOp:
    """A GPU op and how it is tied to the rest of the graph."""

    index: int
    event: GpuEvent
    launch: int | None = None        # CPU point that launched it
    stream_prev: int | None = None   # previous op on the same stream
    deps: list[int] = field(default_factory=list)   # ops on other streams it waits for (event waits)
    step: int | None = None          # ProfilerStep number
    layer: str | None = None         # nn.Module when the trace has modules, else the top-level op
    work: OpWork | None = None       # a kernel's: FLOPs and bytes of its matrix op (op_work)
    launch_latency: float = 0.0
    queue_gap: float = 0.0

    @property
    def kind(self) -> str:
        return self.event.kind

    @property
    def name(self) -> str:
        return self.event.name

    @property
    def stream_key(self) -> tuple[int, int]:
        return self.event.device, self.event.stream

    @property
    def collective(self) -> Collective | None:
        return self.event.collective


class _Caller(NamedTuple):
    """What encloses a runtime call on its thread."""

    outer: str | None               # the outermost cpu op
    module: str | None              # the innermost nn.Module
    comms: tuple[Collective, ...]   # the enclosing calls that name a collective, innermost first
    work: OpWork | None             # the innermost matmul, convolution or attention op recorded with shapes


@dataclass(slots=True)
class CpuPoint:
    """An instant on a CPU thread the replay times."""

    index: int
    thread: int
    t: float                         # measured time
    label: str                       # "call" | "return" | "resume" | "idle" | "step"
    own: float = 0.0                 # CPU time since the thread's previous point
    gpu_waits: list[tuple[int, float]] | tuple = ()   # (op, slack)
    cpu_waits: list[tuple[int, float]] | tuple = ()   # (point, slack)
    name: str = ""
    profiler_stall: float = 0.0      # of ``own``: the thread stalled by the profiler's own work
    recorded: int = 0                # host events the profiler recorded on the thread within ``own``

    def untraced_own(self, event_s: float) -> float:
        """``own`` as it would be without the profiler: less its stalls and ``event_s`` of recording per
        host event it recorded (never below zero)."""
        return max(0.0, self.own - self.profiler_stall - self.recorded * event_s)


@dataclass(slots=True)
class StepSpan:
    number: int
    start: int                       # CPU point indices
    end: int
    measured_s: float


@dataclass
class TraceGraph:
    """CPU threads, GPU streams and the waits between them, for one rank."""

    trace: KinetoTrace
    threads: list[tuple]                         # (pid, tid) per thread index
    points: list[CpuPoint]
    thread_points: list[list[int]]               # point indices per thread, in time order
    ops: list[GpuOp]
    streams: dict[tuple[int, int], list[int]]    # (device, stream) -> op indices in order
    steps: list[StepSpan]
    stats: dict = field(default_factory=dict)

    @property
    def rank(self) -> int:
        return self.trace.rank

    def thread_name(self, thread: int) -> str:
        pid, tid = self.threads[thread]
        return self.trace.thread_names.get((pid, tid), f"thread {tid}")

    def to_networkx(self):
        """The graph as a networkx DiGraph: nodes ("cpu", i) and ("gpu", j)."""
        import networkx as nx

        g = nx.DiGraph()
        g.add_nodes_from(("cpu", p.index) for p in self.points)
        g.add_nodes_from(("gpu", o.index) for o in self.ops)
        for pts in self.thread_points:
            g.add_edges_from((("cpu", a), ("cpu", b)) for a, b in zip(pts, pts[1:], strict=False))
        for p in self.points:
            g.add_edges_from((("gpu", o), ("cpu", p.index)) for o, _ in p.gpu_waits)
            g.add_edges_from((("cpu", q), ("cpu", p.index)) for q, _ in p.cpu_waits)
        for o in self.ops:
            if o.launch is not None:
                g.add_edge(("cpu", o.launch), ("gpu", o.index))
            if o.stream_prev is not None:
                g.add_edge(("gpu", o.stream_prev), ("gpu", o.index))
            g.add_edges_from((("gpu", d), ("gpu", o.index)) for d in o.deps)
        return g

    def has_cycle(self) -> bool:
        import networkx as nx

        return not nx.is_directed_acyclic_graph(self.to_networkx())


# ---------------------------------------------------------------- building

def _end(e) -> float:
    return e.ts + e.dur


class _Builder:
    def __init__(self, trace: KinetoTrace, idle_gap_s: float, max_handoff_s: float):
        self.trace = trace
        self.idle_gap_s, self.max_handoff_s = idle_gap_s, max_handoff_s
        self.stats: dict = defaultdict(int)
        self.threads: list[tuple] = []
        self.thread_of: dict[tuple, int] = {}
        self.events_by_thread: list[list[CpuEvent]] = []
        self.marks: list[list[float]] = []       # per thread: every start and end of its events, in order
        # anchors per thread: (t, order, label, payload); turned into points later
        self.anchors: list[list] = []
        self.order = 0
        self.works: dict[int, OpWork | None] = {}   # id(cpu op) -> its work
        self.began: float | None = None              # the trace's first CPU event (set by build)

    # -- CPU threads --------------------------------------------------------------------------------

    def collect_threads(self) -> None:
        by_thread: dict[tuple, list[CpuEvent]] = defaultdict(list)
        for e in self.trace.cpu_events:
            by_thread[(e.pid, e.tid)].append(e)
        for key in sorted(by_thread, key=lambda k: (str(k[0]), str(k[1]))):
            events = sorted(by_thread[key], key=lambda e: (e.ts, -e.dur))
            self.thread_of[key] = len(self.threads)
            self.threads.append(key)
            self.events_by_thread.append(events)
            self.marks.append(sorted({e.ts for e in events} | {_end(e) for e in events}))
            self.anchors.append([])

    def anchor(self, thread: int, t: float, label: str, payload=None, *, ends: bool = False) -> list:
        """Remember an instant to time; at equal times, ends (returns, idles) come before starts, and a
        step's end after the other ends (the step encloses the calls that end with it)."""
        self.order += 1
        prio = (1 if label == "step" else 0) if ends else {"resume": 2, "step": 3}.get(label, 4)
        t = round(t, 12)  # instants a trace writes as equal (ns) stay equal through the float arithmetic
        item = [t, (prio, self.order), label, payload, None]       # last slot: point index once made
        self.anchors[thread].append(item)
        return item

    def stacks(self, thread: int):
        """(runtime call, what encloses it: a `_Caller`) for each runtime call of ``thread``."""
        stack: list[CpuEvent] = []
        for e in self.events_by_thread[thread]:
            while stack and e.ts >= _end(stack[-1]) - 1e-12:
                stack.pop()
            if e.kind == "runtime":
                yield e, _Caller(
                    outer=next((s.name for s in stack if s.kind == "cpu_op"), None),
                    module=next((s.name for s in reversed(stack) if s.name.startswith("nn.Module:")), None),
                    comms=tuple(s.collective for s in reversed(stack) if s.collective is not None),
                    work=next((w for s in reversed(stack) if (w := self._work(s)) is not None), None))
            stack.append(e)

    def _work(self, event: CpuEvent) -> OpWork | None:
        """The FLOPs and bytes of a cpu op recorded with its shapes (`op_work`), once per op."""
        if event.kind != "cpu_op" or event.shapes is None:
            return None
        key = id(event)
        if key not in self.works:
            self.works[key] = op_work(event.name, event.shapes, event.types, event.concrete)
        return self.works[key]

    # -- the whole build ---------------------------------------------------------------------------

    def build(self) -> TraceGraph:
        trace = self.trace
        self.collect_threads()
        ops = [GpuOp(i, g) for i, g in enumerate(sorted(trace.gpu_events, key=lambda g: (g.ts, g.stream)))]
        # One correlation id may launch many ops: a cudaGraphLaunch carries every kernel of its graph.
        launched_by: dict[int, list[GpuOp]] = defaultdict(list)
        for o in ops:
            if o.event.correlation is not None:
                launched_by[o.event.correlation].append(o)
        by_corr = {corr: group[0] for corr, group in launched_by.items()}

        # Runtime calls: launch anchors, links to their GPU ops, layer attribution.
        calls: list[tuple[CpuEvent, int, list]] = []          # (event, thread, start anchor)
        launch_anchor: dict[int, list] = {}                    # op index -> anchor
        launch_time: dict[int, float] = {}
        launch_thread: dict[int, int] = {}
        flow_calls: dict[tuple, list] = defaultdict(list)
        for thread in range(len(self.threads)):
            for call, caller in self.stacks(thread):
                item = self.anchor(thread, call.ts, "call", call)
                calls.append((call, thread, item))
                group = launched_by.get(call.correlation, ()) if call.correlation is not None else ()
                if not group:
                    flow_calls[self.threads[thread]].append((call.ts, _end(call), item, caller))
                    continue
                for op in group:
                    self._link(op, item, thread, call.ts, caller, launch_anchor, launch_time, launch_thread)
                if len(group) > 1:
                    self.stats["graph_launches"] += 1
        self._link_by_flows(ops, flow_calls, launch_anchor, launch_time, launch_thread)
        self.stats["gpu_ops"] = len(ops)
        self.stats["gpu_ops_launched"] = len(launch_anchor)

        # Streams in order.
        streams: dict[tuple[int, int], list[int]] = defaultdict(list)
        for o in ops:
            streams[o.stream_key].append(o.index)
        for idxs in streams.values():
            self._stream_order(idxs, ops)
        self.ops, self.streams = ops, streams
        self.launch_time, self.launch_thread = launch_time, launch_thread
        self._index_launches()

        # Synchronisations and event waits.
        sync_by_corr = {s.correlation: s for s in trace.syncs if s.correlation is not None}
        call_by_corr = {c.correlation: c for c, _, _ in calls if c.correlation is not None}
        last_record: dict[int, float] = {}
        any_record: list[float] = []
        for call, thread, _item in sorted(calls, key=lambda c: c[0].ts):
            name = call.name
            if name in EVENT_RECORD:
                last_record[thread] = call.ts
                any_record.append(call.ts)
            elif name in STREAM_WAIT:
                self._event_wait(call, thread, sync_by_corr.get(call.correlation), call_by_corr,
                                 last_record.get(thread, any_record[-1] if any_record else None))
            elif name in BLOCKING or name == "cudaMemcpyAsync":
                if not self._sync(call, thread, sync_by_corr.get(call.correlation), call_by_corr, by_corr):
                    self._blocked_launch(call, thread, launched_by.get(call.correlation, ()))
            elif call.dur > BLOCKED_LAUNCH_MIN_S:
                self._blocked_launch(call, thread, launched_by.get(call.correlation, ()))

        self.began = min((e.ts for e in self.trace.cpu_events), default=None)
        self._held_by_other_streams(ops, launch_time)
        self._launch_timing(ops, launch_time)
        self._steps_and_handoffs()
        points, thread_points = self._make_points()
        for o in ops:
            if o.index in launch_anchor:
                o.launch = launch_anchor[o.index][4]
        steps = []
        for s, start, end in self.step_anchors:
            steps.append(StepSpan(s.number, start[4], end[4], s.dur))
        graph = TraceGraph(trace, self.threads, points, thread_points, ops, dict(streams), steps,
                           dict(self.stats))
        return graph

    def _link(self, op, item, thread, t, caller: _Caller, launch_anchor, launch_time, launch_thread):
        launch_anchor[op.index] = item
        launch_time[op.index] = t
        launch_thread[op.index] = thread
        op.layer = caller.module or caller.outer
        if op.kind == "kernel":
            op.work = caller.work
        if caller.comms and op.kind == "collective":     # the launching call says what the kernel runs
            op.event.collective = merge_collective(op.event.collective, caller.comms)

    def _stream_order(self, idxs: list[int], ops: list[GpuOp]) -> None:
        """Each op follows the latest earlier op of its stream that had ended when it started.

        Usually that is the previous op. Kernels of a CUDA graph are reported on the stream that launched
        the graph but run on its branches side by side; such an op follows the op its branch ran after.
        """
        latest_end = -math.inf                 # of the ops before the previous one
        for k in range(1, len(idxs)):
            b, prev = ops[idxs[k]], idxs[k - 1]
            start = b.event.ts + TOLERANCE_S
            best = None
            if latest_end <= _op_end(ops[prev]) <= start:
                best = prev                    # the usual case: the previous op ended last, before b
            else:
                for a in reversed(idxs[max(0, k - BRANCH_LOOKBACK):k]):
                    end = _op_end(ops[a])
                    if end <= start and (best is None or end > _op_end(ops[best])):
                        best = a
            latest_end = max(latest_end, _op_end(ops[prev]))
            if best != prev:
                self.stats["ops_beside_previous_on_stream"] += 1
            b.stream_prev = best

    def _link_by_flows(self, ops, flow_calls, launch_anchor, launch_time, launch_thread):
        """Old traces without correlation args: the ac2g flow whose id is the op's correlation."""
        flows = self.trace.flows
        for items in flow_calls.values():
            items.sort(key=lambda x: x[0])
        for o in ops:
            if o.index in launch_anchor or o.event.correlation not in flows:
                continue
            pid, tid, ts = flows[o.event.correlation]
            items = flow_calls.get((pid, tid), [])
            i = bisect.bisect_right([x[0] for x in items], ts + 1e-9) - 1
            if i >= 0 and items[i][0] <= ts <= items[i][1] + 1e-9:
                _, _, item, caller = items[i]
                self._link(o, item, self.thread_of[(pid, tid)], items[i][0], caller, launch_anchor,
                           launch_time, launch_thread)

    def _index_launches(self):
        """Per stream: launch times in order, to answer 'last op launched on s before t'."""
        self.stream_launches: dict[tuple, tuple[list[float], list[int]]] = {}
        for key, idxs in self.streams.items():
            launched = [(self.launch_time[i], i) for i in idxs if i in self.launch_time]
            launched.sort()
            self.stream_launches[key] = ([t for t, _ in launched], [i for _, i in launched])
        per_thread: dict[int, list[tuple[float, int]]] = defaultdict(list)
        for i, t in self.launch_time.items():
            per_thread[self.launch_thread[i]].append((t, i))
        self.thread_launches = {k: ([t for t, _ in sorted(v)], [i for _, i in sorted(v)])
                                for k, v in per_thread.items()}
        self.ops_by_end = sorted(self.ops, key=_op_end)
        self.ends = [_op_end(o) for o in self.ops_by_end]

    def _last_launched_before(self, t: float, stream: tuple | None = None, exclude: tuple | None = None):
        best = None
        for key, (times, idxs) in self.stream_launches.items():
            if (stream is not None and key != stream) or key == exclude:
                continue
            i = bisect.bisect_left(times, t) - 1
            if i >= 0 and (best is None or times[i] > self.launch_time[best]):
                best = idxs[i]
        return best

    def _first_launched_by_thread_after(self, thread: int, t: float):
        times, idxs = self.thread_launches.get(thread, ([], []))
        i = bisect.bisect_right(times, t)
        return idxs[i] if i < len(idxs) else None

    def _event_wait(self, call, thread, sync, call_by_corr, record_t):
        """A GPU-side wait: the next op on the waiting stream starts after the recorded op."""
        if sync is not None and sync.wait_on_stream is not None and sync.wait_on_stream >= 0:
            waiter = self._first_on_stream_after((sync.device, sync.stream), call.ts)
            record = call_by_corr.get(sync.wait_on_record_correlation)
            recorded = (self._last_launched_before(record.ts, stream=(sync.device, sync.wait_on_stream))
                        if record is not None else None)
            source = "exact"
        else:
            waiter = self._first_launched_by_thread_after(thread, _end(call))
            recorded = None
            source = "inferred"
            if waiter is not None and record_t is not None:
                recorded = self._last_launched_before(record_t, exclude=self.ops[waiter].stream_key)
            elif waiter is not None:          # no cudaEventRecord seen (recorded by another library)
                recorded = self._released_by_other_stream(waiter)
                source = "timed"
        if waiter is None or recorded is None:
            self.stats["event_waits_unresolved"] += 1
            return
        if _op_end(self.ops[recorded]) > self.ops[waiter].event.ts + TOLERANCE_S:
            self.stats["event_waits_dropped_inconsistent"] += 1
            return
        same_stream = self.ops[recorded].stream_key == self.ops[waiter].stream_key
        if recorded not in self.ops[waiter].deps and not same_stream:
            self.ops[waiter].deps.append(recorded)
            self.stats[f"event_waits_{source}"] += 1

    def _released_by_other_stream(self, waiter: int):
        """The op on another stream of the waiter's device that ended last between the waiter's launch and
        its start: what a stream wait without a visible event record most likely waited for."""
        w = self.ops[waiter]
        launched = self.launch_time.get(waiter)
        if launched is None:
            return None
        i = bisect.bisect_right(self.ends, w.event.ts + TOLERANCE_S) - 1
        while i >= 0 and self.ends[i] >= launched:
            o = self.ops_by_end[i]
            if o.event.device == w.event.device and o.stream_key != w.stream_key:
                return o.index
            i -= 1
        return None

    def _first_on_stream_after(self, stream, t):
        times, idxs = self.stream_launches.get(stream, ([], []))
        i = bisect.bisect_right(times, t)
        return idxs[i] if i < len(idxs) else None

    def _sync(self, call, thread, sync, call_by_corr, by_corr):
        """A blocking call: its return waits for GPU ops."""
        start, end = call.ts, _end(call)
        name = call.name
        targets: list[int] = []
        if name == "cudaMemcpyAsync" or name in SYNC_COPIES:
            op = by_corr.get(call.correlation)
            if op is None:
                return False
            if name == "cudaMemcpyAsync":     # blocks only for pageable host memory (or when it did)
                if op.event.copy_kind not in ("H2D", "D2H") or _op_end(op) > end + TOLERANCE_S:
                    return False
                if op.event.pinned and _op_end(op) < end - 50e-6:
                    return False
            targets = [op.index]
        elif sync is not None and sync.sync_kind in ("Stream Sync", "Event Sync", "Context Sync"):
            if sync.sync_kind == "Context Sync":
                targets = self._device_targets(start)
            elif sync.sync_kind == "Stream Sync":
                t = self._last_launched_before(start, stream=(sync.device, sync.stream))
                targets = [t] if t is not None else []
            else:
                record = call_by_corr.get(sync.wait_on_record_correlation)
                if record is not None and sync.wait_on_stream is not None:
                    t = self._last_launched_before(record.ts, stream=(sync.device, sync.wait_on_stream))
                    targets = [t] if t is not None else []
        elif name in DEVICE_SYNC:
            targets = self._device_targets(start)
        else:
            released = self._releasing_op(start, end)
            if released is not None:
                targets = [released]
            else:
                times, idxs = self.thread_launches.get(thread, ([], []))
                i = bisect.bisect_left(times, start) - 1
                targets = [idxs[i]] if i >= 0 else []
        targets = [t for t in targets if _op_end(self.ops[t]) <= end + TOLERANCE_S]
        if not targets:
            self.stats["syncs_without_target"] += 1
            return False
        latest = max(_op_end(self.ops[t]) for t in targets)
        binding = latest > start
        self.stats["syncs_binding" if binding else "syncs_not_binding"] += 1
        self.anchor(thread, end, "return", (call, targets, binding, latest), ends=True)
        return True

    def _blocked_launch(self, call, thread, launched: list[GpuOp]) -> None:
        """A launch call that waited for a free launch-queue entry returns when its entry was freed.

        It counts as blocked when it lasted over BLOCKED_LAUNCH_MIN_S, at least QUEUE_FULL_SHARE of
        LAUNCH_QUEUE launches were pending on one of its streams when it began, and an op queued there
        before it finished during the call, at most BLOCKED_LAUNCH_MIN_S before it returned. Its return then
        waits for that op, so the wait shrinks when the GPU gets faster instead of staying CPU time.
        """
        start, end = call.ts, _end(call)
        if end - start <= BLOCKED_LAUNCH_MIN_S:
            return
        release = None
        for key in {o.stream_key for o in launched}:
            if self._pending_launches(key, start) < QUEUE_FULL_SHARE * LAUNCH_QUEUE:
                continue
            times, idxs = self.stream_launches.get(key, ([], []))
            before = idxs[:bisect.bisect_left(times, start)]
            done = [i for i in before[-LAUNCH_QUEUE:] if start < _op_end(self.ops[i]) <= end + TOLERANCE_S]
            if done:
                last = max(done, key=lambda i: _op_end(self.ops[i]))
                if release is None or _op_end(self.ops[last]) > _op_end(self.ops[release]):
                    release = last
        if release is None or end - _op_end(self.ops[release]) > BLOCKED_LAUNCH_MIN_S:
            return
        self.stats["launches_blocked_on_full_queue"] += 1
        self.anchor(thread, end, "return", (call, [release], True, _op_end(self.ops[release])), ends=True)

    def _pending_launches(self, key: tuple, t: float) -> int:
        """Launch calls on stream ``key`` issued before t whose ops there had not all finished at t."""
        times, idxs = self.stream_launches.get(key, ([], []))
        done_by_call: dict[float, float] = {}
        for lt, i in zip(times[:bisect.bisect_left(times, t)], idxs, strict=False):
            done_by_call[lt] = max(done_by_call.get(lt, 0.0), _op_end(self.ops[i]))
        return sum(1 for end in done_by_call.values() if end > t)

    def _device_targets(self, t: float) -> list[int]:
        out = []
        for key in self.stream_launches:
            last = self._last_launched_before(t, stream=key)
            if last is not None:
                out.append(last)
        return out

    def _releasing_op(self, start: float, end: float):
        """The op launched before the call whose completion is latest but not after the call's return."""
        i = bisect.bisect_right(self.ends, end + TOLERANCE_S) - 1
        while i >= 0 and self.ends[i] > start:
            o = self.ops_by_end[i]
            if self.launch_time.get(o.index, float("inf")) < start:
                return o.index
            i -= 1
        return None

    def _held_by_other_streams(self, ops, launch_time) -> None:
        """An op that started over HELD_MIN_S after both its launch and its stream's and events' readiness,
        within HELD_TOLERANCE_S of the end of an op on another stream of its GPU, waited for that op: an
        event wait the trace does not show, or the SMs (or copy engine) that op held. It is made to wait
        for it, so that in a what-if it moves with that op instead of keeping its measured delay."""
        for o in ops:
            launched = launch_time.get(o.index, self.began)
            if launched is None:
                continue
            start, ready = o.event.ts, _ready(o, ops)
            if start - max(launched, ready if ready is not None else launched) <= HELD_MIN_S:
                continue
            i = bisect.bisect_right(self.ends, start + TOLERANCE_S) - 1
            while i >= 0 and self.ends[i] >= start - HELD_TOLERANCE_S:
                a = self.ops_by_end[i]
                if a.event.device == o.event.device and a.stream_key != o.stream_key and a.event.ts < start:
                    o.deps.append(a.index)
                    self.stats["ops_held_by_other_streams"] += 1
                    break
                i -= 1

    def _launch_timing(self, ops, launch_time):
        """Split each op's measured start into launch latency and queueing (see the module doc)."""
        ready = {o.index: _ready(o, ops) for o in ops}
        bound_lat, queue = [], []
        for o in ops:
            lt, r = launch_time.get(o.index), ready[o.index]
            if lt is None:
                continue
            if r is not None and r >= lt:
                queue.append(o.event.ts - r)
            else:
                bound_lat.append(o.event.ts - lt)
        typ_lat = median(bound_lat) if bound_lat else 5e-6
        typ_gap = median(queue) if queue else 1e-6
        self.stats["typical_launch_latency_us"] = round(typ_lat * 1e6, 3)
        self.stats["typical_queue_gap_us"] = round(typ_gap * 1e6, 3)
        began = self.began
        for o in ops:
            lt, r = launch_time.get(o.index), ready[o.index]
            start = o.event.ts
            if lt is None and r is not None and began is not None and r >= began:
                o.launch_latency = began     # launched before the trace began, queued behind its stream's
                o.queue_gap = start - r      # work: an absolute earliest start, and it moves with that work
            elif lt is None:             # launched before the trace began: anchored at its measured start
                o.launch_latency = start
                o.queue_gap = min(start - r, typ_gap) if r is not None else 0.0
            elif r is not None and r >= lt:
                o.queue_gap = start - r
                o.launch_latency = min(start - lt, typ_lat)
            else:
                o.launch_latency = start - lt
                o.queue_gap = min(start - r, typ_gap) if r is not None else 0.0
        # Steps: the step whose span holds the launch (else the op's own start).
        spans = [(s.ts, _end(s), s.number) for s in self.trace.steps]
        for o in ops:
            t = launch_time.get(o.index, o.event.ts)
            o.step = next((n for a, b, n in spans if a <= t < b), None)
            if o.step is None:
                o.step = next((n for a, b, n in spans if a <= o.event.ts < b), None)

    def _steps_and_handoffs(self):
        self.step_anchors = []
        for s in self.trace.steps:
            thread = self.thread_of[(s.pid, s.tid)]
            start = self.anchor(thread, s.ts, "step", f"ProfilerStep#{s.number}")
            end = self.anchor(thread, _end(s), "step", f"ProfilerStep#{s.number} end", ends=True)
            self.step_anchors.append((s, start, end))
        # Bursts of activity per thread: ops and runtime calls are work, annotations are not (a thread
        # blocked inside `backward` shows as an annotation with nothing under it for a while).
        bursts: list[list[list]] = []
        marks = self.marks
        for events in self.events_by_thread:
            runs: list[list] = []
            for e in (e for e in events if e.kind != "annotation"):
                if runs and e.ts - runs[-1][1] < self.idle_gap_s:
                    runs[-1][1] = max(runs[-1][1], _end(e))
                else:
                    runs.append([e.ts, _end(e), None, None])    # start, end, -, end anchor
            bursts.append(runs)
        for y, runs in enumerate(bursts):
            pid = self.threads[y][0]
            for k, run in enumerate(runs):
                g0 = runs[k - 1][1] if k > 0 else 0.0
                g1 = run[0]
                if g1 - g0 < self.idle_gap_s:
                    continue
                best = None
                for x, other in enumerate(bursts):
                    if x == y or self.threads[x][0] != pid:
                        continue
                    for xr in other:
                        xs, xe = xr[0], xr[1]
                        if not (g0 <= xe <= g1) or g1 - xe > self.max_handoff_s:
                            continue
                        if min(xe, g1) - max(xs, g0) < 0.5 * (g1 - g0):
                            continue
                        if best is None or xe > best[1][1]:
                            best = (x, xr)
                if best is None:
                    self._handoff_in_progress(y, g0, g1, bursts, marks)
                    continue
                x, xr = best
                if xr[3] is None:
                    xr[3] = self.anchor(x, xr[1], "idle", "goes idle", ends=True)
                # Y resumes at its first boundary after X went idle (e.g. the end of its `backward`).
                ym = marks[y]
                resume = ym[bisect.bisect_left(ym, xr[1])]
                item = self.anchor(y, resume, "resume", None)
                item[3] = (xr[3], resume - xr[1])
                self.stats["thread_handoffs"] += 1

    def _handoff_in_progress(self, y: int, g0: float, g1: float, bursts, marks) -> None:
        """Y idles while X works through most of the gap and is still working when Y resumes (PyTorch's
        autograd thread handing CPU work back to the thread inside ``backward``): Y resumes when X reaches
        its last event boundary before Y's resumption."""
        pid = self.threads[y][0]
        for x, other in enumerate(bursts):
            if x == y or self.threads[x][0] != pid:
                continue
            for xr in other:
                xs, xe = xr[0], xr[1]
                if not (xs <= g1 < xe) or min(xe, g1) - max(xs, g0) < 0.5 * (g1 - g0):
                    continue
                xm = marks[x]
                i = bisect.bisect_right(xm, g1) - 1
                if i < 0 or g1 - xm[i] > self.max_handoff_s:
                    continue
                source = self.anchor(x, xm[i], "idle", "hands over", ends=True)
                item = self.anchor(y, g1, "resume", None)
                item[3] = (source, g1 - xm[i])
                self.stats["thread_handoffs_in_progress"] += 1
                return

    def _profiler_stalls(self) -> list[list[tuple[float, float]]]:
        """Per thread, the spans it stood stalled by the profiler's own work (merged, in order).

        A CUPTI activity buffer request blocks the thread whose activity record needed the buffer: that
        thread sits inside one of its events (a runtime call, an op, the step's annotation when the
        profiler's step bookkeeping asked) without starting or ending any for about the request's time.
        Each recorded request is charged to the thread whose silence covers at least half of it inside an
        event of its own, the innermost (shortest) such event where several threads qualify (a thread
        blocked in ``backward`` sits in a longer one than the autograd thread that launched). A thread
        between events was idle, not stalled; a request none waited on is charged to no thread.
        """
        stalls: list[list[tuple[float, float]]] = [[] for _ in self.threads]
        if not self.trace.profiler_overheads:
            return stalls
        starts = [[e.ts for e in events] for events in self.events_by_thread]
        reach = [list(itertools.accumulate((_end(e) for e in events), max))
                 for events in self.events_by_thread]
        for ts, dur in self.trace.profiler_overheads:
            a, b = ts, ts + dur
            best = None                                            # (enclosing event's length, thread, span)
            for thread, marks in enumerate(self.marks):
                k = bisect.bisect_right(marks, a) - 1              # the silence that holds ``a``, then on
                while 0 <= k < len(marks) - 1 and marks[k] < b:
                    lo, hi = max(a, marks[k]), min(b, marks[k + 1])
                    if hi - lo >= 0.5 * dur:
                        inner = self._innermost(thread, marks[k], marks[k + 1], starts[thread], reach[thread])
                        if inner is not None and (best is None or inner < best[0]):
                            best = (inner, thread, (lo, hi))
                    k += 1
            if best is not None:
                stalls[best[1]].append(best[2])
                self.stats["profiler_stalls"] += 1
        merged = []
        for spans in stalls:
            out: list[tuple[float, float]] = []
            for lo, hi in sorted(spans):
                if out and lo <= out[-1][1]:
                    out[-1] = (out[-1][0], max(out[-1][1], hi))
                else:
                    out.append((lo, hi))
            merged.append(out)
        return merged

    def _innermost(self, thread: int, lo: float, hi: float, starts: list[float], reach: list[float]):
        """The length of the innermost event of ``thread`` spanning [lo, hi], None if none does: the latest
        to start of those that span it (events nest), looked for backwards only while an earlier event
        still reaches ``hi`` (``reach``: the latest end among the events up to each)."""
        events = self.events_by_thread[thread]
        for i in range(bisect.bisect_right(starts, lo) - 1, -1, -1):
            if reach[i] < hi:
                return None
            if _end(events[i]) >= hi:
                return events[i].dur
        return None

    def _make_points(self):
        points: list[CpuPoint] = []
        thread_points: list[list[int]] = []
        deferred = []
        stalls = self._profiler_stalls()
        # stalled time before each stall's end, per thread: a point's share is a difference of two lookups
        stalled = [list(itertools.accumulate(hi - lo for lo, hi in spans)) for spans in stalls]
        for thread, anchors in enumerate(self.anchors):
            anchors.sort(key=lambda a: (a[0], a[1]))
            starts = sorted(e.ts for e in self.events_by_thread[thread])
            idxs = []
            prev_t = 0.0
            for item in anchors:
                t, _, label, payload, _ = item
                p = CpuPoint(len(points), thread, t, label, own=t - prev_t)
                if stalls[thread]:
                    p.profiler_stall = (_stalled_by(t, stalls[thread], stalled[thread])
                                        - _stalled_by(prev_t, stalls[thread], stalled[thread]))
                p.recorded = bisect.bisect_right(starts, t) - bisect.bisect_right(starts, prev_t)
                prev_t = t
                if label == "call":
                    p.name = payload.name
                elif label == "return":
                    call, targets, binding, latest = payload
                    p.name = call.name
                    release = t - latest                    # measured time from release to return
                    if binding:
                        p.own = min(p.own, max(release, 0.0))
                        p.gpu_waits = [(o, release) for o in targets]
                    else:
                        p.gpu_waits = [(o, min(p.own, release)) for o in targets]
                elif label == "resume":
                    deferred.append((p, payload))
                    p.own = 0.0                             # the gap was spent waiting for the other thread
                    p.name = "resume"
                else:
                    p.name = str(payload or label)
                item[4] = p.index
                points.append(p)
                idxs.append(p.index)
            thread_points.append(idxs)
        for p, (source_item, slack) in deferred:
            p.cpu_waits = [(source_item[4], slack)]
        return points, thread_points


def _stalled_by(t: float, spans: list[tuple[float, float]], cumulative: list[float]) -> float:
    """Stalled time before ``t``, of the disjoint ``spans`` in order (``cumulative``: their running total)."""
    k = bisect.bisect_right(spans, (t, math.inf))        # spans starting at or before t
    if k == 0:
        return 0.0
    lo, hi = spans[k - 1]
    return (cumulative[k - 2] if k >= 2 else 0.0) + min(hi, t) - lo


def _ready(o: GpuOp, ops: list[GpuOp]) -> float | None:
    """When ``o``'s stream predecessor and the ops it waits for had all ended (None: nothing before it)."""
    preds = ([o.stream_prev] if o.stream_prev is not None else []) + o.deps
    return max((_op_end(ops[p]) for p in preds), default=None)


def _op_end(o: GpuOp) -> float:
    return o.event.ts + o.event.dur


def build_graph(trace: KinetoTrace, *, idle_gap_s: float = 1e-3, max_handoff_s: float = 5e-3) -> TraceGraph:
    """The replay graph of one rank.

    ``idle_gap_s``: a CPU thread idle this long is waiting for something; ``max_handoff_s``: the longest
    delay between one thread going idle and another resuming that is taken as a hand-off between them.
    """
    return _Builder(trace, idle_gap_s, max_handoff_s).build()
