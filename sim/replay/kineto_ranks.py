"""A replay as per-rank Kineto traces, the folder HTA reads (`trainsim.formats.kineto_writer`).

Each replayed rank becomes the trace its profiler would have written had the run gone as replayed: every
CPU event of the measured trace (operators, annotations such as ``ProfilerStep#N``, CUDA runtime calls)
on its own process and thread, moved to its replayed time; every GPU op on its device and stream at its
replayed start and duration, keeping its correlation id, its collective's arguments and its bytes; the
runtime call that launched it linked by an ``ac2g`` flow. Timestamps keep the measured trace's time base, so
the ranks of one run stay aligned. ``External id`` ties a runtime call to the innermost operator or
annotation around it on its thread, and GPU work to its launch's, as Kineto does.

:func:`write_trace` writes a folder of these, or the single Chrome trace of the engine when the path names a
file (``.json``, ``.json.gz``, ``.gz``).
"""

from __future__ import annotations

import os

from trainsim.formats.kineto import CpuEvent, KinetoTrace
from trainsim.formats.kineto_writer import Launch, RankTrace, is_single_file, write_rank_folder
from trainsim.sim.replay.engine import RankReplay, ReplayReport

CPU_CATEGORY = {"cpu_op": "cpu_op", "runtime": "cuda_runtime", "annotation": "user_annotation"}
GPU_CATEGORY = {"kernel": "kernel", "collective": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset"}


def _external_ids(events: list[CpuEvent]) -> list[int]:
    """Kineto's ``External id`` of each CPU event: operators and annotations are numbered in time order; a
    runtime call takes the number of the innermost one around it on its thread (its own if none is)."""
    ids = [0] * len(events)
    order = sorted(range(len(events)), key=lambda i: (str(events[i].pid), str(events[i].tid), events[i].ts,
                                                      -events[i].dur))
    stack: list[tuple[float, int]] = []      # (end, id) of the open operators on the current thread
    thread = None
    next_id = 1
    for i in order:
        e = events[i]
        if (e.pid, e.tid) != thread:
            thread, stack = (e.pid, e.tid), []
        while stack and stack[-1][0] <= e.ts:
            stack.pop()
        if e.kind == "runtime" and stack:
            ids[i] = stack[-1][1]
            continue
        ids[i], next_id = next_id, next_id + 1
        if e.kind != "runtime":
            stack.append((e.ts + e.dur, ids[i]))
    return ids


def _collective_args(collective) -> dict:
    args = {"Collective name": collective.op}
    if collective.nelems is not None:
        args["In msg nelems"] = collective.nelems
    if collective.out_nelems is not None:
        args["Out msg nelems"] = collective.out_nelems
    if collective.group_size is not None:
        args["Group size"] = collective.group_size
    if collective.dtype is not None:
        args["dtype"] = collective.dtype
    if collective.group is not None:
        args["Process Group Name"] = collective.group
    if collective.ranks is not None:
        args["Process Group Ranks"] = str(list(collective.ranks))
    if collective.channels is not None:
        args["grid"] = [collective.channels, 1, 1]
    if collective.threads is not None:
        args["block"] = [collective.threads, 1, 1]
    return args


def _main_pid(trace: KinetoTrace) -> int:
    """The process the profiler ran in: the one with the ProfilerSteps, else the one with most events."""
    if trace.steps and isinstance(trace.steps[0].pid, int):
        return trace.steps[0].pid
    counts: dict = {}
    for e in trace.cpu_events:
        counts[e.pid] = counts.get(e.pid, 0) + 1
    ints = [p for p in counts if isinstance(p, int)]
    return max(ints, key=lambda p: (counts[p], -p)) if ints else 0


def rank_trace(rr: RankReplay, *, world_size: int, gpu_name: str | None = None) -> RankTrace:
    """One replayed rank as a RankTrace; ``gpu_name`` renames its devices (a what-if on another GPU)."""
    g, trace = rr.graph, rr.graph.trace
    origin = trace.origin_us

    def ts(t: float) -> float:
        return round(origin + t * 1e6, 3)

    devices = [{"id": d, "name": gpu_name or name, **({"totalGlobalMem": trace.device_memory[d]}
                                                      if d in trace.device_memory and not gpu_name else {})}
               for d, name in sorted(trace.devices.items())]
    distributed = ({"pg_count": len(trace.process_groups), "pg_config": trace.process_groups}
                   if trace.process_groups else {})
    if trace.nccl_version:
        distributed["nccl_version"] = trace.nccl_version
    rt = RankTrace(rank=g.rank, world_size=world_size, cpu_pid=_main_pid(trace), devices=devices,
                   distributed=distributed, base_time_ns=trace.base_time_ns or 0)
    for (pid, tid), name in sorted(trace.thread_names.items(), key=str):
        rt.thread(pid, tid, name)
    thread_of = {key: i for i, key in enumerate(g.threads)}
    external = _external_ids(trace.cpu_events)
    launches: dict[int, tuple[CpuEvent, int, float, float]] = {}
    gpu_correlations = {o.event.correlation for o in g.ops if o.event.correlation is not None}
    for e, ext in zip(trace.cpu_events, external, strict=True):
        thread = thread_of[(e.pid, e.tid)]
        a, b = rr.cpu_time(thread, e.ts), rr.cpu_time(thread, e.ts + e.dur)
        start, dur = ts(a), round(max(b - a, 0.0) * 1e6, 3)
        if e.kind == "runtime" and e.correlation in gpu_correlations:
            launches[e.correlation] = (e, ext, start, dur)     # written with the GPU work it launched
            continue
        args = {"External id": ext}
        if e.correlation is not None:
            args["correlation"] = e.correlation
        if e.collective is not None:
            args.update(_collective_args(e.collective))
        rt.cpu(CPU_CATEGORY[e.kind], e.name, e.tid, start, dur, args, pid=e.pid)
    rt.reserve_correlations(max(gpu_correlations, default=0))
    for o in g.ops:
        ev = o.event
        args = {}
        if ev.nbytes is not None:
            args["bytes"] = ev.nbytes
        if o.collective is not None:
            args.update(_collective_args(o.collective))
        correlation = ev.correlation if ev.correlation is not None else rt.new_correlation()
        launch, external_id = None, None
        if ev.correlation in launches:
            call, external_id, call_ts, call_dur = launches[ev.correlation]
            launch = Launch(call.tid, call_ts, call_dur, call.name, pid=call.pid)
        start = ts(rr.op_start[o.index])
        rt.gpu(GPU_CATEGORY[o.kind], ev.name, ev.device, ev.stream, start,
               round(ts(rr.op_end[o.index]) - start, 3), correlation=correlation, external_id=external_id,
               args=args, launch=launch)
    return rt


def write_rank_traces(report: ReplayReport, folder: str | os.PathLike, *,
                      provenance: dict | None = None) -> None:
    """Write ``folder/rank-<N>.json.gz`` for every replayed rank: the what-if's replay if there is one,
    else the replay of the measured durations."""
    result = report.whatif or report.replay
    gpu = report.whatif_config.gpu if report.whatif is not None and report.whatif_config is not None else None
    if gpu is not None:
        from trainsim.sim.core.devices import get_device

        gpu = get_device(gpu).name
    world = max([r.graph.trace.world_size or 0 for r in result.ranks] + [len(result.ranks)])
    meta = {"schema": "trainsim.replay-trace/2", "provenance": provenance or {}}
    files = {rr.graph.rank: rank_trace(rr, world_size=world, gpu_name=gpu).encode(meta)
             for rr in result.ranks}
    write_rank_folder(folder, files)


def write_trace(report: ReplayReport, path: str | os.PathLike, *, provenance: dict | None = None) -> None:
    """``--trace PATH``: one Chrome trace file when PATH ends in .json, .json.gz or .gz, else a folder of
    per-rank Kineto files in HTA's shape (see the module docstring)."""
    if is_single_file(path):
        from trainsim.sim.replay.engine import write_chrome_trace

        write_chrome_trace(report.whatif or report.replay, path, provenance=provenance)
    else:
        write_rank_traces(report, path, provenance=provenance)
