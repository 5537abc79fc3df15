"""Replay Kineto traces in SimPy: CPU threads and GPU streams as processes with dependencies.

A CPU thread walks its points (see ``trace_graph``): each comes ``own`` seconds of CPU time after the
previous one, and no earlier than ``slack`` after whatever it waits for (GPU ops for synchronisations,
another thread for hand-offs). A GPU stream runs its ops in order; an op starts at
``max(launch + launch_latency, ready + queue_gap)``, ready being when the previous op on the stream and
the ops it waits for (event waits) have finished.

Durations are the measured ones unless an ``op_time`` hook says otherwise: it gets ``(env, rank, op)``
and returns seconds, a SimPy event that fires when the op is done (e.g. a transfer on the flow network),
or None for the measured duration. That hook is where what-if models plug in. A hook that also takes a
``ready_shift`` keyword gets, for each op, how much later than measured its own inputs were ready: its
launch (plus launch latency), the ops it waits for on other streams, its stream predecessor unless that
is a collective, and for a collective the last other op its GPU had finished when it started (what a
collective's peers, doing the same work, are taken to share; a collective before it on its stream the
peers ran too, so it does not say when they arrive).

Times are compared per ``ProfilerStep#N`` span; a trace that marks no step is compared as one window,
from its first CPU point or GPU op to its last (step ``None``, shown as ``all``). Beside that CPU-side span
each step has its GPU side: from the first GPU op launched in the step to the last one's end.

It stays one module: the CPU-thread and GPU-stream processes and the bookkeeping that compares their
times with the measurement are one loop.
"""

from __future__ import annotations

import bisect
import gzip
import inspect
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import simpy

from trainsim.errors import TrainsimError
from trainsim.files import write_atomic
from trainsim.sim.replay.trace_graph import LAUNCH_QUEUE, GpuOp, TraceGraph
from trainsim.sim.replay.whatif import WhatIf

OpTime = Callable[[simpy.Environment, int, GpuOp], "float | simpy.Event | None"]

SCHEMA = "trainsim.replay/1"
CATEGORY = {"kernel": "compute", "collective": "communication", "memcpy": "memcpy", "memset": "memset"}


@dataclass
class StepReport:
    """One ProfilerStep of one rank (``step`` None: the whole trace, which marks no step): measured vs
    replayed time and where the GPU time went."""

    rank: int
    step: int | None
    measured_s: float
    replayed_s: float
    measured_breakdown: dict
    replayed_breakdown: dict
    # the step's GPU side: first GPU op launched in the step to the end of its last (None: no GPU op)
    gpu_measured_s: float | None = None
    gpu_replayed_s: float | None = None

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.replayed_s - self.measured_s) / self.measured_s if self.measured_s else 0.0

    def to_dict(self) -> dict:
        return {"rank": self.rank, "step": self.step, "measured_s": self.measured_s,
                "replayed_s": self.replayed_s, "error_pct": self.error_pct,
                "gpu_measured_s": self.gpu_measured_s, "gpu_replayed_s": self.gpu_replayed_s,
                "measured_breakdown": self.measured_breakdown, "replayed_breakdown": self.replayed_breakdown}


@dataclass
class RankReplay:
    """Replayed times of every point and op of one rank."""

    graph: TraceGraph
    point_time: list[float]
    op_start: list[float]
    op_end: list[float]
    steps: list[StepReport] = field(default_factory=list)
    max_in_flight: int = 0            # most launches pending on one stream at once
    # op -> bytes its collective moved, where a what-if changed (compression) or inferred them
    message_bytes: dict[int, float] = field(default_factory=dict)

    def cpu_time(self, thread: int, t: float) -> float:
        """Replayed time of measured instant t on a thread: it moves with the thread's latest point."""
        pts = self.graph.thread_points[thread]
        lo, hi = 0, len(pts)
        while lo < hi:                     # last point with measured time <= t
            mid = (lo + hi) // 2
            if self.graph.points[pts[mid]].t <= t:
                lo = mid + 1
            else:
                hi = mid
        if lo == 0:
            return t
        p = pts[lo - 1]
        return t + self.point_time[p] - self.graph.points[p].t


@dataclass
class ReplayResult:
    ranks: list[RankReplay]

    @property
    def steps(self) -> list[StepReport]:
        return [s for r in self.ranks for s in r.steps]

    def to_dict(self, *, provenance: dict | None = None) -> dict:
        steps = self.steps
        errors = [abs(s.error_pct) for s in steps]
        return {
            "schema": SCHEMA,
            "provenance": provenance or {},
            "traces": [{"path": r.graph.trace.path, "rank": r.graph.rank,
                        "rank_source": r.graph.trace.rank_source,
                        "devices": {str(k): v for k, v in sorted(r.graph.trace.devices.items())},
                        "world_size": r.graph.trace.world_size} for r in self.ranks],
            "steps": [s.to_dict() for s in steps],
            "summary": {
                "steps": len(steps),
                "mean_measured_s": _mean([s.measured_s for s in steps]),
                "mean_replayed_s": _mean([s.replayed_s for s in steps]),
                "max_abs_error_pct": max(errors) if errors else None,
            },
            "graphs": [{"rank": r.graph.rank, **_graph_summary(r.graph)} for r in self.ranks],
        }


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _graph_summary(graph: TraceGraph) -> dict:
    kinds: dict[str, int] = {}
    for o in graph.ops:
        kinds[o.kind] = kinds.get(o.kind, 0) + 1
    return {"cpu_threads": len(graph.threads), "cpu_points": len(graph.points),
            "gpu_streams": [f"{d}:{s}" for d, s in sorted(graph.streams)], "gpu_ops": kinds,
            **{k: graph.stats[k] for k in sorted(graph.stats) if k != "gpu_ops"}}


# ---------------------------------------------------------------- the engine

def _takes_ready_shift(op_time: OpTime) -> bool:
    try:
        return "ready_shift" in inspect.signature(op_time).parameters
    except (TypeError, ValueError):
        return False


class _RankEngine:
    def __init__(self, env: simpy.Environment, graph: TraceGraph, op_time: OpTime | None,
                 launch_queue: int | None, untraced_event_s: float | None = None):
        self.env, self.graph, self.op_time = env, graph, op_time
        self.untraced_event_s = untraced_event_s
        self.wants_ready_shift = op_time is not None and _takes_ready_shift(op_time)
        # The launch queue: each launch call takes one entry per stream it launches on (a CUDA-graph launch
        # takes one for all its kernels there) until its last op on that stream has finished. When a
        # stream's entries are all taken the launching call blocks, so a CPU thread cannot run arbitrarily
        # far ahead of a slow GPU, and waits less when the GPU gets faster.
        self.launch_queue = launch_queue
        self.launches_at: dict[int, dict[tuple, int]] = {}       # point -> stream -> ops it launches there
        for o in graph.ops:
            if o.launch is not None:
                per_stream = self.launches_at.setdefault(o.launch, {})
                per_stream[o.stream_key] = per_stream.get(o.stream_key, 0) + 1
        self.pending = {p: dict(streams) for p, streams in self.launches_at.items()}
        self.in_flight: dict[tuple, int] = dict.fromkeys(graph.streams, 0)
        self.max_in_flight = 0
        self.slot_freed: dict[tuple, simpy.Event | None] = dict.fromkeys(graph.streams)
        self.point_time = [math.nan] * len(graph.points)
        self.op_start = [math.nan] * len(graph.ops)
        self.op_end = [math.nan] * len(graph.ops)
        self.op_done = [env.event() for _ in graph.ops]
        self.progress = self._progress_ops() if self.wants_ready_shift else {}
        referenced = {o.launch for o in graph.ops if o.launch is not None}
        referenced |= {q for p in graph.points for q, _ in p.cpu_waits}
        self.point_done = {i: env.event() for i in referenced}
        for pts in graph.thread_points:
            env.process(self._thread(pts))
        for o in graph.ops:
            env.process(self._op(o))

    def _thread(self, pts: list[int]):
        env, points = self.env, self.graph.points
        for i in pts:
            p = points[i]
            own = p.own if self.untraced_event_s is None else p.untraced_own(self.untraced_event_s)
            target = env.now + own
            if p.gpu_waits or p.cpu_waits:
                pending = [self.op_done[o] for o, _ in p.gpu_waits if not self.op_done[o].triggered]
                pending += [self.point_done[q] for q, _ in p.cpu_waits if not self.point_done[q].triggered]
                if pending:
                    yield env.all_of(pending)
                for o, slack in p.gpu_waits:
                    target = max(target, self.op_end[o] + slack)
                for q, slack in p.cpu_waits:
                    target = max(target, self.point_time[q] + slack)
            if target > env.now:
                yield env.timeout(target - env.now)
            for s in self.launches_at.get(i, ()):
                while self.launch_queue is not None and self.in_flight[s] >= self.launch_queue:
                    if self.slot_freed[s] is None:
                        self.slot_freed[s] = env.event()
                    yield self.slot_freed[s]
                self.in_flight[s] += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight[s])
            self.point_time[i] = env.now
            done = self.point_done.get(i)
            if done is not None:
                done.succeed()

    def _ready_shift(self, o: GpuOp) -> float:
        """Replayed minus measured time at which the op's own inputs were ready (see the module doc)."""
        ops, replayed, measured = self.graph.ops, [], []
        if o.launch is not None:
            replayed.append(self.point_time[o.launch] + o.launch_latency)
            measured.append(self.graph.points[o.launch].t + o.launch_latency)
        inputs = list(o.deps)
        if o.stream_prev is not None and ops[o.stream_prev].kind != "collective":
            inputs.append(o.stream_prev)
        if self.progress.get(o.index) is not None:
            inputs.append(self.progress[o.index])
        for d in inputs:
            end = self.op_end[d]
            replayed.append(self.env.now if math.isnan(end) else end)    # not done yet: at least now
            measured.append(ops[d].event.ts + ops[d].event.dur)
        return max(replayed) - max(measured) if replayed else 0.0

    def _progress_ops(self) -> dict[int, int | None]:
        """For each collective: the last op other than a collective that its GPU had finished when the
        collective started (measured): how far this rank's own work had got."""
        ops = self.graph.ops
        work: dict[int, list[tuple[float, int]]] = {}
        for o in ops:
            if o.kind != "collective":
                work.setdefault(o.event.device, []).append((o.event.ts + o.event.dur, o.index))
        for ends in work.values():
            ends.sort()
        out: dict[int, int | None] = {}
        for o in ops:
            if o.kind == "collective":
                ends = work.get(o.event.device, [])
                k = bisect.bisect_right(ends, (o.event.ts, math.inf)) - 1
                out[o.index] = ends[k][1] if k >= 0 else None
        return out

    def _op(self, o: GpuOp):
        """One GPU op: after its launch, its stream predecessor and the ops it waits for."""
        env, i = self.env, o.index
        if o.launch is not None:
            launched = self.point_done[o.launch]
            if not launched.triggered:
                yield launched
            start = self.point_time[o.launch] + o.launch_latency
        else:
            start = o.launch_latency                 # not launched inside the trace: its earliest start
        preds = ([o.stream_prev] if o.stream_prev is not None else []) + o.deps
        pending = [self.op_done[d] for d in preds if not self.op_done[d].triggered]
        if pending:
            yield env.all_of(pending)
        if preds:
            start = max(start, max(self.op_end[p] for p in preds) + o.queue_gap)
        if start > env.now:
            yield env.timeout(start - env.now)
        self.op_start[i] = env.now
        if self.op_time is None:
            duration = None
        elif self.wants_ready_shift:
            duration = self.op_time(env, self.graph.rank, o, ready_shift=self._ready_shift(o))
        else:
            duration = self.op_time(env, self.graph.rank, o)
        if duration is None:
            duration = o.event.dur
        if isinstance(duration, simpy.Event):
            yield duration
        elif duration > 0:
            yield env.timeout(duration)
        self.op_end[i] = env.now
        self.op_done[i].succeed()
        if o.launch is not None:
            s = o.stream_key
            left = self.pending[o.launch]
            left[s] -= 1
            if left[s] == 0:                         # the launch call's queue entry is free again
                self.in_flight[s] -= 1
                freed, self.slot_freed[s] = self.slot_freed[s], None
                if freed is not None:
                    freed.succeed()


def replay(graphs: Iterable[TraceGraph], *, op_time: OpTime | None = None,
           launch_queue: int | None = LAUNCH_QUEUE, untraced_event_s: float | None = None) -> ReplayResult:
    """Replay the ranks' graphs together; measured durations unless ``op_time`` says otherwise.

    ``launch_queue``: pending launch calls per stream before a launch blocks (`LAUNCH_QUEUE`, CUDA's
    depth), None for unbounded. ``untraced_event_s``: when given, the CPU threads run as without the
    profiler: less the stalls it recorded and this much per host event it recorded
    (`CpuPoint.untraced_own`)."""
    graphs = list(graphs)
    env = simpy.Environment()
    engines = [_RankEngine(env, g, op_time, launch_queue, untraced_event_s) for g in graphs]
    env.run()
    ranks = []
    for eng in engines:
        stuck_ops = sum(1 for t in eng.op_end if math.isnan(t))
        stuck_points = sum(1 for t in eng.point_time if math.isnan(t))
        if stuck_ops or stuck_points:
            raise TrainsimError(f"replay of rank {eng.graph.rank} deadlocked: {stuck_ops} GPU ops and "
                                f"{stuck_points} CPU points never ran (circular dependencies in the trace?)",
                                file=eng.graph.trace.path)
        rr = RankReplay(eng.graph, eng.point_time, eng.op_start, eng.op_end, max_in_flight=eng.max_in_flight)
        rr.steps = _step_reports(rr)
        ranks.append(rr)
    return ReplayResult(ranks)


def replay_graphs(graphs: list[TraceGraph], *, whatif: WhatIf | None = None, home=None, topology=None,
                  checks: bool = True, progress: Callable[[str], None] | None = None) -> ReplayReport:
    """Replay the per-rank graphs of one run (`trainsim.traces.load_graphs` reads them) with the measured
    durations and, when ``whatif`` changes something, again under the what-if; with ``checks`` also compare
    every collective and memcpy with its simulation on ``home``, the topology the trace ran on. ``home`` and
    ``topology`` (the what-if's machine) are loaded topologies (`trainsim.traces.replay_topologies`)."""
    from trainsim.sim.replay.whatif import WhatIfModel, collective_check, memcpy_check

    model = None
    if whatif is not None and whatif.active:
        model = WhatIfModel(graphs, whatif, home=home, topology=topology)
    if progress:
        progress("replaying with the measured durations")
    report = ReplayReport(replay(graphs), whatif_config=whatif)
    if model is not None:
        if progress:
            progress("replaying the what-if")
        report.whatif = replay(graphs, op_time=model, untraced_event_s=whatif.untraced_event_s)
        for rr in report.whatif.ranks:
            rr.message_bytes = model.message_bytes(rr.graph.rank)
        report.notes = model.notes()
        report.nccl = model.nccl.summary()
        report.retimed = model.retimed
        if model.sizes_matter():
            if progress:
                progress("replaying the what-if at the low end of the inferred message sizes")
            low = WhatIfModel(graphs, whatif, home=home, topology=topology, size_bound="low")
            report.whatif_low = replay(graphs, op_time=low, untraced_event_s=whatif.untraced_event_s)
    if checks:
        if progress:
            progress(f"checking collectives and memcpys against {home.name if home else 'the GPU model'}")
        if home is not None:
            algo = whatif.algo if whatif is not None else "auto"
            report.checks["collectives"] = collective_check(graphs, home, algo=algo)
        report.checks["memcpys"] = memcpy_check(graphs, home)
    return report


@dataclass
class ReplayReport:
    """What `trainsim replay` reports: the replay with measured durations, the what-if, the checks."""

    replay: ReplayResult
    whatif: ReplayResult | None = None
    whatif_config: WhatIf | None = None
    checks: dict = field(default_factory=dict)          # name -> whatif.CheckResult
    notes: list[str] = field(default_factory=list)      # what the what-if inferred or kept as measured
    nccl: dict = field(default_factory=dict)            # how the NCCL kernels were split (nccl_split)
    # the what-if with every inferred message size at the low end of its range (the what-if itself runs at
    # the high end): the two give the range of its answer; None when no inferred size changes it
    whatif_low: ReplayResult | None = None
    retimed: dict = field(default_factory=dict)         # (rank, op) -> re-timed collective and its bounds

    def predicted_range(self, i: int) -> tuple[float, float] | None:
        """(low, high) step time of the what-if's i-th step over the inferred sizes' ranges, if any."""
        if self.whatif_low is None or self.whatif is None:
            return None
        a, b = self.whatif.steps[i].replayed_s, self.whatif_low.steps[i].replayed_s
        return min(a, b), max(a, b)

    def retimed_summary(self) -> dict:
        """How many NCCL kernels the what-if re-timed, and how many it held to the wires' floor or to the
        ceiling their measured rate sets (`WhatIfModel._bounds`)."""
        rows = self.retimed.values()
        return {"collectives": len(rows),
                "held_to_floor": sum(1 for r in rows if r["held"] and r["core_s"] < r["floor_s"]),
                "held_to_ceiling": sum(1 for r in rows if r["held"] and r["core_s"] > r["ceiling_s"])}

    def to_dict(self, *, provenance: dict | None = None) -> dict:
        doc = self.replay.to_dict(provenance=provenance)
        if self.whatif is not None:
            steps = []
            for i, (m, w) in enumerate(zip(self.replay.steps, self.whatif.steps, strict=True)):
                row = {"rank": m.rank, "step": m.step, "measured_s": m.measured_s,
                       "predicted_s": w.replayed_s,
                       "change_pct": 100.0 * (w.replayed_s - m.measured_s) / m.measured_s,
                       "gpu_measured_s": m.gpu_measured_s, "gpu_predicted_s": w.gpu_replayed_s,
                       "breakdown": w.replayed_breakdown}
                span = self.predicted_range(i)
                if span is not None:
                    row["predicted_low_s"], row["predicted_high_s"] = span
                steps.append(row)
            doc["whatif"] = {"config": self.whatif_config.to_dict(), "steps": steps,
                             "mean_predicted_s": _mean([s["predicted_s"] for s in steps]),
                             "notes": self.notes, "nccl": self.nccl, "retimed": self.retimed_summary()}
        doc["checks"] = {name: check.to_dict() for name, check in self.checks.items()}
        return doc

    def lines(self) -> list[str]:
        """The report as text."""
        def ms(x: float) -> str:
            return f"{x * 1e3:10.2f}"

        wi = self.whatif
        head = (f"{'rank':>4} {'step':>5} {'measured ms':>12} {'GPU step ms':>12} {'replayed ms':>12} "
                f"{'error %':>8}")
        if wi is not None:
            head += f" {'what-if ms':>11} {'change %':>9} {'GPU step ms':>12}"
            if self.whatif_low is not None:
                head += f" {'range ms':>19}"
        lines = [head]
        if any(s.step is None for s in self.replay.steps):
            lines.append("(no ProfilerStep#N spans in the trace: the whole trace is one window, 'all'; "
                         "torch.profiler's schedule and prof.step() mark steps)")
        def gpu(x: float | None) -> str:
            return "-" if x is None else ms(x)

        for i, s in enumerate(self.replay.steps):
            step = "all" if s.step is None else s.step
            row = (f"{s.rank:>4} {step:>5} {ms(s.measured_s):>12} {gpu(s.gpu_measured_s):>12} "
                   f"{ms(s.replayed_s):>12} {s.error_pct:>8.2f}")
            if wi is not None:
                w = wi.steps[i]
                row += (f" {ms(w.replayed_s):>11} {100 * (w.replayed_s - s.measured_s) / s.measured_s:>9.1f}"
                        f" {gpu(w.gpu_replayed_s):>12}")
                span = self.predicted_range(i)
                if span is not None:
                    row += f" {ms(span[0]).strip():>9}-{ms(span[1]).strip():<9}"
            lines.append(row)
        lines.append("(measured: the CPU-side ProfilerStep span; GPU step: its first GPU op to the end of "
                     "its last)")
        lines.append("")
        lines.append(f"GPU time per step, ms (mean over steps){'':4}{'compute':>10}{'comm':>10}"
                     f"{'comm exp':>10}{'copy exp':>10}{'gpu idle':>10}")
        rows = [("measured", [s.measured_breakdown for s in self.replay.steps]),
                ("replayed", [s.replayed_breakdown for s in self.replay.steps])]
        if wi is not None:
            rows.append(("what-if", [s.replayed_breakdown for s in wi.steps]))
        for label, parts in rows:
            if not parts:
                continue
            mean = {k: sum(p[k] for p in parts) / len(parts) for k in parts[0]}
            lines.append(f"  {label:<41}{ms(mean['compute_s'])}{ms(mean['communication_s'])}"
                         f"{ms(mean['communication_exposed_s'])}{ms(mean['copies_exposed_s'])}{ms(mean['gpu_idle_s'])}")
        if wi is not None:
            cfg = {k: v for k, v in self.whatif_config.to_dict().items() if v not in (None, False, "none")}
            lines.append("what-if: " + ", ".join(f"{k}={v}" for k, v in cfg.items()))
            lines.extend(f"  note: {note}" for note in self.notes)
            held = self.retimed_summary()
            if held["held_to_floor"] or held["held_to_ceiling"]:
                lines.append(f"  note: of {held['collectives']} re-timed NCCL kernels, "
                             f"{held['held_to_floor']} were held to what the wires allow and "
                             f"{held['held_to_ceiling']} to what their measured rate allows")
        for name, check in self.checks.items():
            sm = check.summary
            where = f" on {check.topology}" if check.topology else ""
            if not sm.get("count"):
                lines.append(f"{name} check{where}: nothing to compare")
                continue
            line = (f"{name} check{where}: {sm['count']} ops, simulated vs measured error median "
                    f"{sm['median_error_pct']:.1f} % (p10 {sm['p10_error_pct']:.1f}, "
                    f"p90 {sm['p90_error_pct']:.1f})")
            big = sm.get("at_least_1MiB")
            if big and big.get("count"):
                line += f"; >= 1 MiB: {big['count']} ops, median {big['median_error_pct']:.1f} %"
            lines.append(line)
            lines.append(f"  ({check.note})")
            for r in sm.get("rates", []):
                if r["mismatch"]:
                    kind = ("slower than" if r["measured_gbps"] < r["model_gbps"] else "faster than")
                    lines.append(f"  the trace's fastest {r['collective']} on {r['gpus']} GPUs moved "
                                 f"{r['measured_gbps']:.1f} GB/s, the model of {check.topology} "
                                 f"{r['model_gbps']:.1f} GB/s: the run's links were {kind} {check.topology}'s"
                                 f"{' (peer-to-peer off, or PCIe?)' if kind == 'slower than' else ''}; "
                                 f"set ran_on=TOPOLOGY to the machine it ran on")
        for rr in self.replay.ranks:
            st, g = rr.graph.stats, rr.graph
            lines.append(f"rank {g.rank}: {len(g.ops)} GPU ops on {len(g.streams)} streams, "
                         f"{len(g.threads)} CPU threads, {st.get('event_waits_inferred', 0)} inferred and "
                         f"{st.get('event_waits_exact', 0)} recorded event waits, "
                         f"{st.get('thread_handoffs', 0)} thread hand-offs")
        return lines


# ---------------------------------------------------------------- reports

def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def _minus(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length of union a minus union b (both already merged)."""
    total, j = 0.0, 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                total += b[k][0] - cur
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            total += e - cur
    return total


def breakdown(ops: list[GpuOp], starts: list[float], ends: list[float], window: tuple[float, float]) -> dict:
    """Where the GPU time of a step window went: compute, exposed communication and copies, idle.

    Exposed communication is communication time not hidden under compute; exposed copies are memcpy and
    memset time hidden under neither.
    """
    lo, hi = window
    by_cat: dict[str, list[tuple[float, float]]] = {c: [] for c in set(CATEGORY.values())}
    for o in ops:
        a, b = max(starts[o.index], lo), min(ends[o.index], hi)
        if b > a:
            by_cat[CATEGORY[o.kind]].append((a, b))
    compute = _union(by_cat["compute"])
    comm = _union(by_cat["communication"])
    copies = _union(by_cat["memcpy"] + by_cat["memset"])
    busy = _union(compute + comm + copies)
    return {
        "compute_s": _length(compute),
        "communication_s": _length(comm),
        "communication_exposed_s": _minus(comm, compute),
        "copies_s": _length(copies),
        "copies_exposed_s": _minus(copies, _union(compute + comm)),
        "gpu_idle_s": (hi - lo) - _length(busy),
    }


def _step_reports(rr: RankReplay) -> list[StepReport]:
    """One report per ProfilerStep; a trace that marks none is one window, from its first CPU point or GPU
    op to its last (`_whole_trace`)."""
    g = rr.graph
    measured_start = [o.event.ts for o in g.ops]
    measured_end = [o.event.ts + o.event.dur for o in g.ops]
    if not g.steps:
        if not g.points and not g.ops:
            return []
        m0, m1 = _whole_trace([p.t for p in g.points], measured_start, measured_end)
        r0, r1 = _whole_trace(rr.point_time, rr.op_start, rr.op_end)
        every = [o.index for o in g.ops]
        return [StepReport(rank=g.rank, step=None, measured_s=m1 - m0, replayed_s=r1 - r0,
                           measured_breakdown=breakdown(g.ops, measured_start, measured_end, (m0, m1)),
                           replayed_breakdown=breakdown(g.ops, rr.op_start, rr.op_end, (r0, r1)),
                           gpu_measured_s=_gpu_span(every, measured_start, measured_end),
                           gpu_replayed_s=_gpu_span(every, rr.op_start, rr.op_end))]
    reports = []
    for s in g.steps:
        m0, m1 = g.points[s.start].t, g.points[s.end].t
        r0, r1 = rr.point_time[s.start], rr.point_time[s.end]
        ops = [o.index for o in g.ops if o.step == s.number]
        reports.append(StepReport(
            rank=g.rank, step=s.number, measured_s=s.measured_s, replayed_s=r1 - r0,
            measured_breakdown=breakdown(g.ops, measured_start, measured_end, (m0, m1)),
            replayed_breakdown=breakdown(g.ops, rr.op_start, rr.op_end, (r0, r1)),
            gpu_measured_s=_gpu_span(ops, measured_start, measured_end),
            gpu_replayed_s=_gpu_span(ops, rr.op_start, rr.op_end)))
    return reports


def _gpu_span(ops: list[int], starts: list[float], ends: list[float]) -> float | None:
    """From the first of ``ops`` to start to the last to end (None when there are none)."""
    if not ops:
        return None
    return max(ends[i] for i in ops) - min(starts[i] for i in ops)


def _whole_trace(points: list[float], op_start: list[float], op_end: list[float]) -> tuple[float, float]:
    """(first, last) instant of a trace: its CPU points and its GPU ops' starts and ends."""
    return min([*points, *op_start]), max([*points, *op_end])


# ---------------------------------------------------------------- output files

def chrome_trace(result: ReplayResult, *, provenance: dict | None = None) -> dict:
    """The replay as a Chrome/Perfetto trace: per rank one CPU process (threads) and one per GPU (streams)."""
    events: list[dict] = []
    for rr in result.ranks:
        g = rr.graph
        cpu_pid = 1000 * g.rank
        events.append({"ph": "M", "name": "process_name", "pid": cpu_pid, "tid": 0,
                       "args": {"name": f"rank {g.rank} CPU"}})
        for thread, _ in enumerate(g.threads):
            events.append({"ph": "M", "name": "thread_name", "pid": cpu_pid, "tid": thread,
                           "args": {"name": g.thread_name(thread)}})
        thread_of = {key: i for i, key in enumerate(g.threads)}
        for e in g.trace.cpu_events:
            thread = thread_of[(e.pid, e.tid)]
            a, b = rr.cpu_time(thread, e.ts), rr.cpu_time(thread, e.ts + e.dur)
            events.append({"ph": "X", "cat": e.kind, "name": e.name, "pid": cpu_pid, "tid": thread,
                           "ts": round(a * 1e6, 3), "dur": round(max(b - a, 0.0) * 1e6, 3)})
        for device, stream in sorted(g.streams):
            pid = 1000 * g.rank + 1 + device
            events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                           "args": {"name": f"rank {g.rank} GPU {device}"}})
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": stream,
                           "args": {"name": f"stream {stream}"}})
        for o in g.ops:
            args = {"step": o.step, "layer": o.layer, "measured_ts_us": round(o.event.ts * 1e6, 3),
                    "measured_dur_us": round(o.event.dur * 1e6, 3)}
            if o.event.nbytes is not None:
                args["bytes"] = o.event.nbytes
            if o.collective is not None:
                args["collective"] = o.collective.op
                args["message_bytes"] = rr.message_bytes.get(o.index, o.collective.nbytes)
            pid = 1000 * g.rank + 1 + o.event.device
            events.append({"ph": "X", "cat": o.kind, "name": o.name, "pid": pid,
                           "tid": o.event.stream, "ts": round(rr.op_start[o.index] * 1e6, 3),
                           "dur": round((rr.op_end[o.index] - rr.op_start[o.index]) * 1e6, 3), "args": args})
    return {"schema": "trainsim.replay-trace/1", "provenance": provenance or {}, "displayTimeUnit": "ms",
            "traceEvents": events}


def write_chrome_trace(result: ReplayResult, path: str | Path, *, provenance: dict | None = None) -> None:
    """Write the replay trace (gzip when the name ends in .gz), byte-identical for the same inputs."""
    text = json.dumps(chrome_trace(result, provenance=provenance), separators=(",", ":")).encode()
    if str(path).endswith(".gz"):
        text = gzip.compress(text, mtime=0)
    write_atomic(path, text)
