"""Replay graphs as Chakra execution traces (ET), and Chakra ETs as replay graphs.

**Out** (`rank_et`): one ET per replayed rank, every CPU point and GPU op of its graph (`trace_graph`) a node,
at the times of the replay (the what-if's, if any): ASTRA-sim and Chakra's tools read the standard fields:

- a CPU point is a ``COMP_NODE`` with ``is_cpu_op`` true whose duration is the CPU time before it; a kernel,
  memcpy or memset a ``COMP_NODE`` on the GPU (``num_ops``: the FLOPs of its matmul or convolution where
  the trace recorded shapes; ``tensor_size``: a copy's bytes); an NCCL collective a ``COMM_COLL_NODE`` with
  ``comm_type``, ``comm_size`` (the bytes it moved) and ``pg_name``; a point-to-point kernel whose peer the
  trace does not name a ``COMP_NODE`` of its time;
- ``data_deps``: a point depends on its thread's previous point and on what it waited for, an op on the
  point that launched it, its stream's previous op and the ops it waited for on other streams;
- ``start_time_micros`` and ``duration_micros`` in whole microseconds from the trace's first instant; the
  CPU thread (``tid``) and the GPU ``device`` and ``stream`` as int64 attributes.

Each node and the metadata also carry, as one string attribute ``trainsim`` (JSON, which Chakra's tools
leave alone), the graph's exact parameters: times to the float, waits with their slacks, launch latency and
queueing, streams, the collective's arguments. `graph_from_et` rebuilds the very graph from them, so a
replay of an ET trainsim wrote gives the replay it came from.

**In** (`graph_from_et`, `graph_from_nodes`): an ET from elsewhere (Chakra's converter, ASTRA-sim's
examples, `trainsim.formats.pytorch_et` linking PyTorch's execution trace to its Kineto trace) becomes a
graph as `trace_graph` builds one from Kineto: CPU nodes (``is_cpu_op``, Chakra's default) are spans on
their thread (``tid`` attribute, else one thread), each a start and an end point; GPU nodes are ops on
streams (``stream`` attribute, else compute on one and communication on another, in the order of their
start times); a GPU op is launched by the CPU node it depends on; other dependencies are waits, with the
measured slack where the ET has start times (a wait that explains the measured start binds, the others do
not) and none where it has not (then every node starts as soon as what it depends on is done).
``ProfilerStep#N`` CPU nodes are steps.

It stays one module: the two directions share the node vocabulary and must stay each other's inverse.
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path

from trainsim.errors import TrainsimError
from trainsim.formats import chakra
from trainsim.formats.chakra import EtNode
from trainsim.formats.collectives import Collective
from trainsim.formats.kineto import CpuEvent, GpuEvent, KinetoTrace, Step
from trainsim.sim.replay.op_work import OpWork
from trainsim.sim.replay.trace_graph import CpuPoint, GpuOp, StepSpan, TraceGraph

SCHEMA = "trainsim.chakra/1"
# trainsim.sim.collectives names -> Chakra's CollectiveCommType
COMM_TYPE = {"allreduce": "ALL_REDUCE", "reduce": "REDUCE", "allgather": "ALL_GATHER",
             "broadcast": "BROADCAST", "alltoall": "ALL_TO_ALL", "reduce_scatter": "REDUCE_SCATTER"}
KINETO_NAME = {"ALL_REDUCE": "allreduce", "REDUCE": "reduce", "ALL_GATHER": "allgather",
               "BROADCAST": "broadcast", "ALL_TO_ALL": "alltoall", "REDUCE_SCATTER": "reducescatter",
               "REDUCE_SCATTER_BLOCK": "reducescatter", "BARRIER": "barrier", "GATHER": "gather",
               "SCATTER": "scatter"}
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
_RANK_RE = re.compile(r"\.(\d+)\.et(?:\.gz)?$")
_TENSOR_TYPE_RE = re.compile(r"Tensor\(([^)]*)\)")
CPU_STREAM, COMM_STREAM = 7, 22           # streams of GPU nodes that name none (compute, communication)
PREFIX = "trainsim"


# ---------------------------------------------------------------- out

def _us(seconds: float) -> int:
    return max(0, round(seconds * 1e6))


def _collective_dict(c: Collective | None) -> dict | None:
    return None if c is None else {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(c).items()}


def rank_et(rr, *, world_size: int, untraced_event_s: float | None = None, message_bytes: dict | None = None,
            provenance: dict | None = None) -> tuple[object, list]:
    """(GlobalMetadata, nodes) of one replayed rank (``rr``: an `engine.RankReplay`) at its replayed times.

    ``untraced_event_s``: the replay ran the CPU threads without the profiler (their points' own time is
    then `CpuPoint.untraced_own`); ``message_bytes``: op -> bytes its collective moved in the replay."""
    s = chakra.schema()
    g = rr.graph
    message_bytes = message_bytes or rr.message_bytes or {}
    npoints = len(g.points)

    def pid(i: int) -> int:            # node id of a point
        return i + 1

    def oid(i: int) -> int:            # node id of an op
        return npoints + i + 1

    nodes = []
    prev_on_thread: dict[int, int] = {}
    for pts in g.thread_points:
        for a, b in zip(pts, pts[1:], strict=False):
            prev_on_thread[b] = a
    for p in g.points:
        own = p.own if untraced_event_s is None else p.untraced_own(untraced_event_s)
        t = rr.point_time[p.index]
        node = s.Node(id=pid(p.index), name=p.name or p.label, type=s.node_types["COMP_NODE"],
                      start_time_micros=_us(t - own), duration_micros=_us(own))
        deps = ([pid(prev_on_thread[p.index])] if p.index in prev_on_thread else [])
        deps += [oid(o) for o, _ in p.gpu_waits] + [pid(q) for q, _ in p.cpu_waits]
        node.data_deps.extend(dict.fromkeys(deps))
        chakra.add_attr(node, "is_cpu_op", True)
        chakra.add_attr(node, "tid", p.thread)
        chakra.add_attr(node, "trainsim", json.dumps({
            "thread": p.thread, "t": t, "label": p.label, "own": own,
            "gpu_waits": [[oid(o), slack] for o, slack in p.gpu_waits],
            "cpu_waits": [[pid(q), slack] for q, slack in p.cpu_waits],
            "profiler_stall": p.profiler_stall if untraced_event_s is None else 0.0,
            "recorded": p.recorded if untraced_event_s is None else 0}, separators=(",", ":")))
        nodes.append(node)
    from trainsim.sim.replay.nccl_split import member

    for o in g.ops:
        e = o.event
        start, end = rr.op_start[o.index], rr.op_end[o.index]
        m = member(g, o, world_size) if o.kind == "collective" else None
        comm = COMM_TYPE.get(m.op) if m is not None else None
        kind = "COMM_COLL_NODE" if comm else "COMP_NODE"
        node = s.Node(id=oid(o.index), name=e.name, type=s.node_types[kind],
                      start_time_micros=_us(start), duration_micros=_us(end - start))
        deps = ([pid(o.launch)] if o.launch is not None else [])
        deps += ([oid(o.stream_prev)] if o.stream_prev is not None else []) + [oid(d) for d in o.deps]
        node.data_deps.extend(dict.fromkeys(deps))
        chakra.add_attr(node, "is_cpu_op", False)
        chakra.add_attr(node, "device", e.device)
        chakra.add_attr(node, "stream", e.stream)
        if comm:
            nbytes = message_bytes.get(o.index, o.collective.array_bytes) or 0
            chakra.add_attr(node, "comm_type", s.comm_types[comm])
            chakra.add_attr(node, "comm_size", int(nbytes))
            if o.collective.dtype is not None:
                node.inputs.types = f"['Tensor({o.collective.dtype.lower()})']"
            if o.collective.group is not None:
                chakra.add_attr(node, "pg_name", str(o.collective.group))
        elif o.work is not None:
            chakra.add_attr(node, "num_ops", int(o.work.flops))
        if e.nbytes is not None:
            chakra.add_attr(node, "tensor_size", int(e.nbytes), "uint64_val")
        chakra.add_attr(node, "trainsim", json.dumps({
            "kind": e.kind, "device": e.device, "stream": e.stream, "ts": start, "dur": end - start,
            "correlation": e.correlation, "nbytes": e.nbytes, "copy_kind": e.copy_kind, "pinned": e.pinned,
            "collective": _collective_dict(e.collective),
            "launch": pid(o.launch) if o.launch is not None else None,
            "stream_prev": oid(o.stream_prev) if o.stream_prev is not None else None,
            "deps": [oid(d) for d in o.deps], "step": o.step, "layer": o.layer,
            "work": asdict(o.work) if o.work is not None else None,
            "launch_latency": o.launch_latency, "queue_gap": o.queue_gap}, separators=(",", ":")))
        nodes.append(node)
    trace = g.trace
    meta = s.GlobalMetadata(version=chakra.SCHEMA_VERSION)
    chakra.add_attr(meta, "rank", g.rank)
    chakra.add_attr(meta, "world_size", world_size)
    chakra.add_attr(meta, "trainsim", json.dumps({
        "schema": SCHEMA, "rank": g.rank, "world_size": world_size, "path": trace.path,
        "devices": {str(k): v for k, v in trace.devices.items()},
        "device_memory": {str(k): v for k, v in trace.device_memory.items()},
        "nccl_version": trace.nccl_version, "process_groups": trace.process_groups,
        "threads": [list(t) for t in g.threads],
        "thread_names": [[pid_, tid, name]
                         for (pid_, tid), name in sorted(trace.thread_names.items(), key=str)],
        "steps": [[st.number, pid(st.start), pid(st.end),
                   rr.point_time[st.end] - rr.point_time[st.start]] for st in g.steps],
        "origin_us": trace.origin_us, "base_time_ns": trace.base_time_ns, "stats": g.stats,
        "provenance": provenance or {}}, separators=(",", ":"), default=str))
    nodes.sort(key=lambda n: (n.start_time_micros, n.id))
    return meta, nodes


def check_chakra_folder(path: str | os.PathLike, option: str | None = "--chakra") -> Path:
    """Refuse a folder ``--chakra`` cannot write, before any work: a file in the way, a missing or read-only
    parent, or a folder holding anything but Chakra ET files (it is replaced as a whole)."""
    from trainsim.files import check_output_folder

    path = check_output_folder(path, option)
    if path.is_dir():
        foreign = sorted(p.name for p in path.iterdir() if not chakra.is_chakra_file(p.name))
        if foreign:
            raise TrainsimError(f"the folder holds files that are not Chakra traces ({', '.join(foreign[:3])}"
                                f"{', ...' if len(foreign) > 3 else ''}); give a new or empty folder",
                                file=str(path), field=option)
    return path


def write_et_folder(folder: str | os.PathLike, files: dict[int, bytes], prefix: str = PREFIX) -> None:
    """``folder/<prefix>.<rank>.et`` for each rank, replacing the folder whole (complete or unchanged). A
    symbolic link to a folder is written through: the folder it names is replaced, the link stays."""
    import shutil
    import tempfile

    folder = Path(os.path.realpath(folder))
    check_chakra_folder(folder, None)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.", suffix=".tmp"))
    except OSError as exc:
        raise TrainsimError(f"cannot write the Chakra folder ({exc.strerror or exc})",
                            file=str(folder)) from None
    old = None
    try:
        for rank, data in sorted(files.items()):
            (tmp / f"{prefix}.{rank}.et").write_bytes(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)
        for f in tmp.iterdir():
            os.chmod(f, 0o666 & ~umask)
        if folder.exists():
            old = folder.with_name(tmp.name[:-len(".tmp")] + ".old")
            os.rename(folder, old)
        os.rename(tmp, folder)
    except BaseException as exc:
        if old is not None and not folder.exists():
            os.rename(old, folder)
            old = None
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise TrainsimError(f"cannot write the Chakra folder ({exc.strerror or exc})",
                                file=str(folder)) from None
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def write_replay_et(report, folder: str | os.PathLike, *, provenance: dict | None = None) -> None:
    """``--chakra DIR`` of `trainsim replay`: the what-if's replay if there is one, else the replay of the
    measured durations, one ET per rank."""
    result = report.whatif or report.replay
    untraced = None
    if report.whatif is not None and report.whatif_config is not None:
        untraced = report.whatif_config.untraced_event_s
    world = max([r.graph.trace.world_size or 0 for r in result.ranks] + [len(result.ranks)])
    files = {}
    for rr in result.ranks:
        meta, nodes = rank_et(rr, world_size=world, untraced_event_s=untraced, provenance=provenance)
        files[rr.graph.rank] = chakra.encode_et(meta, nodes)
    write_et_folder(folder, files)


# ---------------------------------------------------------------- in: an ET trainsim wrote

def _ids(values) -> list[int]:
    return [int(v) for v in values]


def _exact_graph(f: chakra.ChakraFile, meta: dict) -> TraceGraph:
    """The graph an ET trainsim wrote holds, as it was (see the module doc)."""
    by_id = {n.id: n for n in f.nodes}
    info = {n.id: json.loads(chakra.attrs(n).get("trainsim") or "{}") for n in f.nodes}
    point_ids = sorted(i for i, d in info.items() if "thread" in d)
    op_ids = sorted(i for i, d in info.items() if "kind" in d)
    if len(point_ids) + len(op_ids) != len(f.nodes):
        raise TrainsimError("a node of this trainsim ET lacks its trainsim attribute (edited by another "
                            "tool?)",
                            file=f.path)
    pindex = {nid: k for k, nid in enumerate(point_ids)}
    oindex = {nid: k for k, nid in enumerate(op_ids)}
    threads = [tuple(t) for t in meta["threads"]]
    points, thread_points = [], [[] for _ in threads]
    for nid in point_ids:
        d = info[nid]
        p = CpuPoint(pindex[nid], d["thread"], d["t"], d["label"], own=d["own"],
                     gpu_waits=[(oindex[o], slack) for o, slack in d["gpu_waits"]],
                     cpu_waits=[(pindex[q], slack) for q, slack in d["cpu_waits"]], name=by_id[nid].name,
                     profiler_stall=d["profiler_stall"], recorded=d["recorded"])
        points.append(p)
        thread_points[p.thread].append(p.index)
    for pts in thread_points:
        pts.sort(key=lambda i: (points[i].t, i))
    ops, gpu_events = [], []
    streams: dict[tuple[int, int], list[int]] = defaultdict(list)
    for nid in op_ids:
        d = info[nid]
        c = d["collective"]
        collective = None if c is None else Collective(**{k: (tuple(v) if k == "ranks" and v else v)
                                                          for k, v in c.items()})
        e = GpuEvent(d["kind"], by_id[nid].name, d["device"], d["stream"], d["ts"], d["dur"],
                     correlation=d["correlation"], nbytes=d["nbytes"], copy_kind=d["copy_kind"],
                     pinned=d["pinned"], collective=collective)
        o = GpuOp(oindex[nid], e, launch=pindex[d["launch"]] if d["launch"] is not None else None,
                  stream_prev=oindex[d["stream_prev"]] if d["stream_prev"] is not None else None,
                  deps=[oindex[x] for x in d["deps"]], step=d["step"], layer=d["layer"],
                  work=OpWork(**d["work"]) if d["work"] else None, launch_latency=d["launch_latency"],
                  queue_gap=d["queue_gap"])
        ops.append(o)
        gpu_events.append(e)
    for o in ops:
        streams[o.stream_key].append(o.index)
    steps = [StepSpan(n, pindex[a], pindex[b], measured) for n, a, b, measured in meta["steps"]]
    trace = _shell(f.path, meta, threads, points, ops, gpu_events, steps)
    return TraceGraph(trace, threads, points, thread_points, ops, dict(streams), steps, dict(meta["stats"]))


def _shell(path: str, meta: dict, threads: list[tuple], points: list[CpuPoint], ops: list[GpuOp],
           gpu_events: list[GpuEvent], steps: list[StepSpan]) -> KinetoTrace:
    """The KinetoTrace a graph read from an ET hangs on: its GPU events, and as CPU events the launching
    calls and the steps (what the trace writers show)."""
    cpu_events = []
    for o in ops:
        if o.launch is not None and o.event.correlation is not None:
            p = points[o.launch]
            pid, tid = threads[p.thread]
            cpu_events.append(CpuEvent("runtime", p.name or "cudaLaunchKernel", pid, tid, p.t, 0.0,
                                       correlation=o.event.correlation))
    kineto_steps = []
    for st in steps:
        pid, tid = threads[points[st.start].thread]
        a, b = points[st.start].t, points[st.end].t
        kineto_steps.append(Step(st.number, pid, tid, a, b - a))
        cpu_events.append(CpuEvent("annotation", f"ProfilerStep#{st.number}", pid, tid, a, b - a))
    ends = [p.t for p in points] + [o.event.ts + o.event.dur for o in ops]
    return KinetoTrace(
        path=path, rank=int(meta["rank"]), rank_source="chakra", world_size=meta.get("world_size"),
        origin_us=float(meta.get("origin_us") or 0.0), base_time_ns=meta.get("base_time_ns"),
        devices={int(k): v for k, v in (meta.get("devices") or {}).items()},
        device_memory={int(k): v for k, v in (meta.get("device_memory") or {}).items()},
        nccl_version=meta.get("nccl_version"), process_groups=list(meta.get("process_groups") or []),
        cpu_events=cpu_events, gpu_events=gpu_events, syncs=[], steps=kineto_steps,
        thread_names={(p, t): n for p, t, n in meta.get("thread_names") or []},
        span_s=max(ends, default=0.0), writer={"chakra": True})


# ---------------------------------------------------------------- in: any ET

def _schedule(nodes: list[EtNode]) -> None:
    """Start times for an ET that has none: each node as soon as its dependencies, and the previous node of
    its thread or stream (in id order), are done."""
    by_id = {n.id: n for n in nodes}
    lanes: dict = {}
    indegree = {n.id: 0 for n in nodes}
    after: dict[int, list[int]] = defaultdict(list)
    order = sorted(nodes, key=lambda n: n.id)
    prev_in_lane: dict[int, int] = {}
    for n in order:
        lane = ("cpu", n.thread) if n.cpu else ("gpu", n.device, _stream_of(n))
        if lane in lanes:
            prev_in_lane[n.id] = lanes[lane]
        lanes[lane] = n.id
    for n in order:
        preds = {d for d in n.deps if d in by_id} | ({prev_in_lane[n.id]} if n.id in prev_in_lane else set())
        indegree[n.id] = len(preds)
        for d in preds:
            after[d].append(n.id)
    ready = [n.id for n in order if indegree[n.id] == 0]
    end: dict[int, float] = {}
    done = 0
    while ready:
        nid = ready.pop()
        n = by_id[nid]
        preds = {d for d in n.deps if d in by_id} | ({prev_in_lane[nid]} if nid in prev_in_lane else set())
        n.start = max((end[d] for d in preds), default=0.0)
        end[nid] = n.start + n.dur
        done += 1
        for m in after[nid]:
            indegree[m] -= 1
            if indegree[m] == 0:
                ready.append(m)
    if done != len(nodes):
        raise TrainsimError(f"the ET's dependencies go round in a circle: {len(nodes) - done} nodes can "
                            "never start")


def _stream_of(n: EtNode) -> int:
    return n.stream if n.stream is not None else (COMM_STREAM if n.kind == "collective" else CPU_STREAM)


def graph_from_nodes(nodes: list[EtNode], *, path: str, rank: int, world_size: int | None,
                     devices: dict[int, str] | None = None, tolerance_s: float = 1e-6) -> TraceGraph:
    """A replay graph of one rank's ET nodes (see the module doc, "In"). ``tolerance_s``: how far a node may
    start before what it depends on ended, as the times' resolution allows, before the dependency is taken
    as contradicted by the times and dropped."""
    if not nodes:
        raise TrainsimError("the execution trace has no nodes", file=path)
    if any(n.start is None for n in nodes):
        _schedule(nodes)
    by_id = {n.id: n for n in nodes}
    step_nodes = {n.id: int(m.group(1)) for n in nodes if n.cpu and (m := _STEP_RE.match(n.name))}
    cpu = [n for n in nodes if n.cpu and n.id not in step_nodes]
    gpu = sorted((n for n in nodes if not n.cpu), key=lambda n: (n.start, n.id))
    threads = sorted({n.thread for n in nodes if n.cpu}, key=lambda k: (str(k[0]), str(k[1])))
    thread_of = {t: i for i, t in enumerate(threads)}

    # CPU points: a start and an end per CPU node, a start and an end per step, in time order per thread
    anchors: dict[int, list] = defaultdict(list)
    for n in cpu + [by_id[i] for i in step_nodes]:
        th = thread_of[n.thread]
        step = n.id in step_nodes
        anchors[th].append([n.start, (3 if step else 4), "step" if step else "call", n, "start"])
        anchors[th].append([n.start + n.dur, (1 if step else 0), "step" if step else "return", n, "end"])
    points: list[CpuPoint] = []
    thread_points: list[list[int]] = []
    start_point: dict[int, int] = {}
    end_point: dict[int, int] = {}
    for th in range(len(threads)):
        idxs, prev_t = [], 0.0
        for t, _, label, n, which in sorted(anchors[th], key=lambda a: (a[0], a[1], a[3].id)):
            p = CpuPoint(len(points), th, t, label, own=t - prev_t,
                         name=n.name if which == "start" else f"{n.name} end")
            prev_t = t
            (start_point if which == "start" else end_point)[n.id] = p.index
            points.append(p)
            idxs.append(p.index)
        thread_points.append(idxs)

    ops: list[GpuOp] = []
    op_of: dict[int, int] = {}
    gpu_events = []
    for n in gpu:
        collective = n.collective
        e = GpuEvent("collective" if collective is not None else n.kind, n.name, n.device, _stream_of(n),
                     n.start, n.dur, correlation=n.correlation if n.correlation is not None else n.id,
                     nbytes=n.nbytes, copy_kind=n.copy_kind, collective=collective)
        op = GpuOp(len(ops), e)
        op_of[n.id] = op.index
        ops.append(op)
        gpu_events.append(e)
    streams: dict[tuple[int, int], list[int]] = defaultdict(list)
    for o in ops:
        if streams[o.stream_key]:
            o.stream_prev = streams[o.stream_key][-1]
        streams[o.stream_key].append(o.index)

    def end_of(nid: int) -> float:
        return by_id[nid].start + by_id[nid].dur

    stats: dict = defaultdict(int)
    # waits of CPU nodes on what they depend on (other threads' CPU nodes, GPU nodes)
    for n in cpu:
        p = points[start_point[n.id]]
        prev = thread_points[p.thread].index(p.index)
        prev_t = points[thread_points[p.thread][prev - 1]].t if prev > 0 else 0.0
        gpu_waits, cpu_waits = [], []
        for d in n.deps:
            if d not in by_id or d in step_nodes:
                continue
            slack = n.start - end_of(d)
            if slack < -tolerance_s:
                stats["dependencies_contradicted_by_times"] += 1
                continue
            slack = max(slack, 0.0)
            if d in op_of:
                gpu_waits.append((op_of[d], slack))
            elif by_id[d].cpu and thread_of[by_id[d].thread] != p.thread:
                cpu_waits.append((end_point[d], slack))
            else:
                continue
            if end_of(d) > prev_t:            # it ended after the thread's previous instant: it bound
                p.own = min(p.own, slack)
        p.gpu_waits, p.cpu_waits = gpu_waits, cpu_waits
    # GPU ops: launched by the CPU node they depend on, waiting for the GPU nodes on other streams
    for n in gpu:
        o = ops[op_of[n.id]]
        launchers = [d for d in n.deps if d in start_point and d not in step_nodes]
        if launchers:
            o.launch = start_point[max(launchers, key=lambda d: (by_id[d].start, d))]
        for d in n.deps:
            if d in op_of and ops[op_of[d]].stream_key != o.stream_key:
                if end_of(d) > n.start + tolerance_s:
                    stats["dependencies_contradicted_by_times"] += 1
                    continue
                o.deps.append(op_of[d])
        preds = ([o.stream_prev] if o.stream_prev is not None else []) + o.deps
        ready = max((ops[q].event.ts + ops[q].event.dur for q in preds), default=None)
        launched = points[o.launch].t if o.launch is not None else None
        if launched is None:                    # anchored at its start unless it waits for something
            o.launch_latency = n.start if ready is None else 0.0
            o.queue_gap = max(n.start - ready, 0.0) if ready is not None else 0.0
        elif ready is not None and ready >= launched:
            o.queue_gap = max(n.start - ready, 0.0)
        else:
            o.launch_latency = max(n.start - launched, 0.0)
    steps = []
    for nid, number in sorted(step_nodes.items(), key=lambda kv: by_id[kv[0]].start):
        steps.append(StepSpan(number, start_point[nid], end_point[nid], by_id[nid].dur))
    for o in ops:                               # the step whose span holds the op's launch, else its start
        t = points[o.launch].t if o.launch is not None else o.event.ts
        o.step = next((st.number for st in steps if points[st.start].t <= t < points[st.end].t), None)
        if o.launch is not None:
            o.layer = points[o.launch].name
    meta = {"rank": rank, "world_size": world_size, "thread_names": [],
            "devices": {str(k): v for k, v in (devices or {}).items()}}
    trace = _shell(path, meta, threads, points, ops, gpu_events, steps)
    for n in cpu:
        pid, tid = n.thread
        trace.cpu_events.append(CpuEvent("cpu_op", n.name, pid, tid, n.start, n.dur))
    stats["gpu_ops"] = len(ops)
    stats["et_nodes"] = len(nodes)
    return TraceGraph(trace, threads, points, thread_points, ops, dict(streams), steps, dict(stats))


def _node_of(n, s: chakra.Schema, types: dict[int, str]) -> EtNode:
    """An EtNode of a Chakra protobuf node."""
    a = chakra.attrs(n)
    kind_name = types.get(n.type, "COMP_NODE")
    comm = kind_name in ("COMM_COLL_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE")
    cpu = bool(a.get("is_cpu_op", True)) and not comm
    node = EtNode(int(n.id), n.name, cpu, n.duration_micros * 1e-6,
                  start=n.start_time_micros * 1e-6, deps=_ids(n.data_deps) + _ids(n.ctrl_deps))
    if cpu:
        node.thread = (0, int(a.get("tid", 0) or 0))
        return node
    node.device = int(a.get("device", 0) or 0)
    node.stream = int(a["stream"]) if a.get("stream") is not None else None
    if comm:
        comm_name = {v: k for k, v in s.comm_types.items()}.get(int(a.get("comm_type", 0) or 0))
        op = "sendrecv" if kind_name != "COMM_COLL_NODE" else KINETO_NAME.get(comm_name, "allreduce")
        size = int(a.get("comm_size", 0) or 0)
        dtype = None
        match = _TENSOR_TYPE_RE.search(n.inputs.types or "")
        if match:
            dtype = match.group(1)
        from trainsim.formats.collectives import DTYPE_BYTES

        elem = DTYPE_BYTES.get((dtype or "").lower())
        if elem is None:
            dtype, elem = "uint8", 1
        node.kind = "collective"
        node.collective = Collective(op, nelems=size // elem, dtype=dtype,
                                     group=a.get("pg_name") or None, kind_from="call",
                                     size_from="call")
    elif n.name.startswith("Memcpy"):
        node.kind = "memcpy"
        node.nbytes = int(a["tensor_size"]) if a.get("tensor_size") is not None else None
        for word, copy in (("HtoD", "H2D"), ("DtoH", "D2H"), ("DtoD", "D2D"), ("PtoP", "P2P")):
            if word in n.name:
                node.copy_kind = copy
    elif n.name.startswith("Memset"):
        node.kind = "memset"
    return node


def graph_from_et(f: chakra.ChakraFile, *, rank: int, world_size: int) -> TraceGraph:
    """The replay graph of one Chakra ET file: exact when trainsim wrote it, else by `graph_from_nodes`."""
    s = chakra.schema()
    meta_attrs = chakra.attrs(f.metadata)
    if meta_attrs.get("trainsim"):
        try:
            meta = json.loads(meta_attrs["trainsim"])
        except json.JSONDecodeError:
            meta = {}
        if meta.get("schema") == SCHEMA:
            return _exact_graph(f, meta)
    types = {v: k for k, v in s.node_types.items()}
    nodes = _steps_of_instants([_node_of(n, s, types) for n in f.nodes
                                if types.get(n.type) != "METADATA_NODE"])
    if all(n.start == 0 for n in nodes):
        for n in nodes:
            n.start = None
    world = meta_attrs.get("world_size") if isinstance(meta_attrs.get("world_size"), int) else world_size
    # whole microseconds: a start and an end each rounded, so a dependency may seem to end 1.5 us late
    return graph_from_nodes(nodes, path=f.path, rank=rank, world_size=world, tolerance_s=2e-6)


def _steps_of_instants(nodes: list[EtNode]) -> list[EtNode]:
    """Steps as trainsim writes them without its attributes: a ``ProfilerStep#N`` node ending where the
    step starts and a ``ProfilerStep#N end`` node ending where it ends, made one step spanning the two."""
    ends = {n.name[:-len(" end")]: n for n in nodes if n.cpu and n.name.endswith(" end")
            and _STEP_RE.match(n.name[:-len(" end")])}
    out, drop = [], set()
    for n in nodes:
        if n.cpu and n.name in ends and n.start is not None:
            e = ends[n.name]
            a, b = n.start + n.dur, e.start + e.dur
            out.append(EtNode(n.id, n.name, True, b - a, start=a, thread=n.thread))
            drop.add(e.id)
        elif n.id not in drop:
            out.append(n)
    return [n for n in out if n.id not in drop]


def rank_of_file(path: str, f: chakra.ChakraFile | None = None) -> int | None:
    """A Chakra file's rank: its metadata's ``rank`` attribute, else ``<prefix>.<rank>.et``."""
    if f is not None:
        rank = chakra.attrs(f.metadata).get("rank")
        if isinstance(rank, int):
            return rank
    match = _RANK_RE.search(str(path))
    return int(match.group(1)) if match else None
