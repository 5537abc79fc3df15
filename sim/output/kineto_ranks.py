"""A simulated run as per-rank Kineto traces, the folder HTA reads (`trainsim.formats.kineto_writer`).

Each GPU is one rank (its index). Its file holds what torch.profiler, scheduled to record the measured
iterations, would have written on that rank: ``ProfilerStep#N`` for each measured iteration (warm-up
iterations are not recorded, as a profiler schedule's warm-up steps are not); the GPU's work on its streams
(compute kernels named after their pass and layer on stream 7, host copies on 20 and 21, NCCL collectives
on 22, peer copies on 23), each with a ``cuda_runtime`` launch and an ``ac2g`` flow; the time the training
loop waits for its data loader or for a parameter server as ``cpu_op`` events on the main thread.

The main thread's calls (`host_calls`) follow a loop that synchronises once per step: it launches a step's
work in the order the GPU runs it, each call as early as the loop could have made it (zero length, 1 ns
apart), and waits in ``cudaDeviceSynchronize`` until the step's GPU work is done. A launch comes no earlier
than the step's start, the loop's waits before its work and, where the simulator modelled the host's
dispatch of a layer, that dispatch; and no later than its work starts. Work that waited for another stream
(a collective for its bucket's backward, a layer for its batch's copy) follows a ``cudaEventRecord`` and a
``cudaStreamWaitEvent`` with its ``cuda_sync`` event, as DDP and the copy streams make them. So a replay of
the trace (`trainsim replay`) sees the GPU's own critical path: a what-if GPU shortens a GPU-bound step,
not one the host bounds.

:func:`write_trace` writes a folder of these, or the single Chrome trace of `chrome_trace` when the path
names a file (``.json``, ``.json.gz``, ``.gz``).
"""

from __future__ import annotations

import bisect
import math
import os
from dataclasses import dataclass

from trainsim.formats.kineto_writer import (
    CBID,
    KINETO_DTYPE,
    LAUNCH_CALL,
    Launch,
    RankTrace,
    is_single_file,
    us,
    write_rank_folder,
)
from trainsim.sim.output.chrome_trace import compute_kernel_name

GPU_STREAM = {"compute": 7, "h2d": 20, "d2h": 21, "comm": 22, "p2p": 23}
CPU_PID_BASE = 100_000   # a rank's CPU process id: base + rank (never a device id)
#: between two calls of the loop: the trace's resolution (1 ns), so the calls keep their order in any reader
LAUNCH_GAP_S = 1e-9


def _gpu_event(op, precision: str) -> tuple[str, str, dict]:
    """(category, name, extra args) of a GPU op, in Kineto's words."""
    if op.stream == "compute":
        return "kernel", compute_kernel_name(op, precision), {}
    if op.stream == "comm":
        name = f"{op.args.get('kernel', 'ncclDevKernel_' + op.op)}(ncclDevComm*, unsigned long, ncclWork*)"
        return "kernel", name, {"Collective name": op.op, "message_bytes": int(op.nbytes),
                                "Group size": op.args.get("group_size")}
    if op.peer is not None:
        name = "Memcpy PtoP (Device -> Device)"
    else:
        memory = "Pinned" if op.args.get("pinned", True) else "Pageable"
        name = (f"Memcpy HtoD ({memory} -> Device)" if op.stream == "h2d"
                else f"Memcpy DtoH (Device -> {memory})")
    args = {"bytes": int(op.nbytes),
            "memory bandwidth (GB/s)": round(op.nbytes / op.duration / 1e9, 3) if op.duration > 0 else 0}
    return "gpu_memcpy", name, args


def rank_traces(result) -> dict[int, RankTrace]:
    """The measured iterations of ``result`` (simulated with its machine recorded) as one RankTrace per
    GPU, keyed by rank."""
    machine = result.machine
    if machine is None:
        raise ValueError("the result carries no machine (simulate with record=True)")
    ends = result.iteration_ends_s
    first = result.warmup_iterations
    world = len(result.gpus)
    traces: dict[int, RankTrace] = {}
    by_name: dict[str, RankTrace] = {}
    for g in sorted(result.gpus, key=lambda g: g.index):
        gpu = machine.gpus[g.name]
        rt = RankTrace(rank=g.index, world_size=world, cpu_pid=CPU_PID_BASE + g.index,
                       backend="gloo" if gpu.device.kind == "cpu" else "nccl",
                       devices=[{"id": g.index, "name": gpu.device.name,
                                 "totalGlobalMem": int(gpu.memory.capacity)}],
                       distributed={"pg_count": 1, "pg_config": [
                           {"pg_name": "0", "pg_desc": "default_pg", "pg_size": world,
                            "ranks": sorted(x.index for x in result.gpus)}]})
        for it in range(first, len(ends)):
            start = ends[it - 1] if it else 0.0
            rt.step(it, us(start), round(us(ends[it]) - us(start), 3))
        traces[g.index], by_name[g.name] = rt, rt
    dtype = KINETO_DTYPE.get(result.precision, "Float")
    steps = [(ends[it - 1] if it else 0.0, ends[it]) for it in range(first, len(ends))]
    ops = [op for op in machine.ops if op.resource in by_name and op.iteration >= first]
    launched: dict[int, float] = {}
    for resource, rt in by_name.items():
        calls = host_calls([op for op in ops if op.resource == resource], steps)
        launched.update({id(c.op): c.t for c in calls if c.kind == "launch"})
        _write_waits(rt, calls)
        for step_end, last in _step_syncs(calls, steps):  # the loop's wait for each step's GPU work
            rt.cpu("cuda_runtime", "cudaDeviceSynchronize", rt.cpu_pid, us(last),
                   round(us(step_end) - us(last), 3), {"cbid": CBID["cudaDeviceSynchronize"]})
    for op in ops:
        rt = by_name[op.resource]
        ts, dur = us(op.start), round(us(op.end) - us(op.start), 3)
        if op.stream not in GPU_STREAM:          # the training loop waiting (data loader, parameter server)
            rt.cpu("cpu_op", op.op, rt.cpu_pid, ts, dur, {"iteration": op.iteration})
            continue
        cat, name, args = _gpu_event(op, result.precision)
        if "Collective name" in args:
            size = 2 if dtype in ("Half", "BFloat16") else 4
            args.update({"In msg nelems": int(op.nbytes) // size, "Out msg nelems": int(op.nbytes) // size,
                         "dtype": dtype})
        args.update({"iteration": op.iteration, **({"layer": op.layer} if op.layer else {})})
        if op.peer is not None:
            args["peer"] = op.peer
        device = rt.devices[0]["id"]
        rt.gpu(cat, name, device, GPU_STREAM[op.stream], ts, dur, correlation=rt.new_correlation(),
               args=args, launch=Launch(rt.cpu_pid, us(launched[id(op)]), 0.0, LAUNCH_CALL[cat]))
    return traces


@dataclass
class HostCall:
    """A call of a rank's training loop: a ``launch`` of ``op``; a ``record`` of an event after ``op`` on
    its stream; a ``wait`` of ``op``'s stream for the event recorded after ``dep``."""

    kind: str
    t: float
    op: object
    dep: object = None


def host_calls(ops: list, steps: list[tuple[float, float]]) -> list[HostCall]:
    """The calls of one rank's loop that launch its GPU ``ops`` (seconds; see the module docstring), in
    order. A GPU op that started when an op on another stream of its GPU ended, later than its own
    stream's previous op and than its step's start (the step's synchronisation covers what came before),
    waited for it: the loop recorded an event after that op and made the stream wait for it, as DDP's
    hooks and the copy streams do, so a replay keeps the dependency when the times change."""
    gpu = sorted((op for op in ops if op.stream in GPU_STREAM), key=lambda op: op.start)
    waits = sorted(op.end for op in ops if op.stream not in GPU_STREAM)
    ended: dict[float, list] = {}
    for op in gpu:
        ended.setdefault(round(op.end, 12), []).append(op)
    stream_end: dict[str, float] = {}
    deps: dict[int, list] = {}
    for op in gpu:
        begins = round(op.start, 12)
        floor = max(stream_end.get(op.stream, 0.0), _step_start(op.start, steps)) + 1e-12
        deps[id(op)] = [y for y in ended.get(begins, ()) if y.stream != op.stream and y.end > floor
                        and y.start < op.start]
        stream_end[op.stream] = max(stream_end.get(op.stream, 0.0), op.end)
    recorded = {id(y) for ys in deps.values() for y in ys}
    calls: list[HostCall] = []
    host = 0.0
    for op in gpu:
        done = bisect.bisect_right(waits, op.start)  # the loop's waits that ended before the op began
        host = max(host, _step_start(op.start, steps), waits[done - 1] if done else 0.0,
                   op.args.get("dispatched", 0.0))
        for y in deps[id(op)]:
            host += LAUNCH_GAP_S
            calls.append(HostCall("wait", host, op, y))
        host += LAUNCH_GAP_S
        if host > op.start:  # launched by the time it started, yet not before the loop's previous call
            host = max(op.start, calls[-1].t if calls else 0.0)
        calls.append(HostCall("launch", host, op))
        if id(op) in recorded:
            host += LAUNCH_GAP_S
            calls.append(HostCall("record", host, op))
    return calls


def _step_start(t: float, steps: list[tuple[float, float]]) -> float:
    """The start of the step holding ``t`` (``steps`` in time order), 0 before the first."""
    i = bisect.bisect_right(steps, (t, math.inf)) - 1
    return steps[i][0] if i >= 0 else 0.0


def _write_waits(rt: RankTrace, calls: list[HostCall]) -> None:
    """The loop's ``cudaEventRecord`` and ``cudaStreamWaitEvent`` calls, each wait with the ``cuda_sync``
    event CUPTI writes for it (the stream that waits, the stream and record it waits for)."""
    device = rt.devices[0]["id"]
    record_of: dict[int, int] = {}
    for call in calls:
        if call.kind == "record":
            record_of[id(call.op)] = correlation = rt.new_correlation()
            rt.cpu("cuda_runtime", "cudaEventRecord", rt.cpu_pid, us(call.t), 0.0,
                   {"correlation": correlation, "cbid": CBID["cudaEventRecord"]})
        elif call.kind == "wait":
            correlation = rt.new_correlation()
            rt.cpu("cuda_runtime", "cudaStreamWaitEvent", rt.cpu_pid, us(call.t), 0.0,
                   {"correlation": correlation, "cbid": CBID["cudaStreamWaitEvent"]})
            rt.sync(device, GPU_STREAM[call.op.stream], us(call.t), correlation=correlation,
                    wait_on_stream=GPU_STREAM[call.dep.stream], record_correlation=record_of[id(call.dep)])


def _step_syncs(calls: list[HostCall], steps: list[tuple[float, float]]):
    """(step end, call start) of each step's ``cudaDeviceSynchronize``: it runs from just after the step's
    last call to the step's end."""
    times = sorted(c.t for c in calls)
    for start, end in steps:
        i = bisect.bisect_left(times, end) - 1  # the step's last call, if it made one
        yield end, (times[i] if i >= 0 and times[i] >= start else start) + LAUNCH_GAP_S


def write_rank_traces(result, folder: str | os.PathLike, *, provenance: dict | None = None) -> None:
    """Write ``folder/rank-<N>.json.gz`` for every GPU of the simulated run (see the module docstring)."""
    meta = {"schema": "trainsim.trace/1", "scenario": result.scenario, "provenance": provenance or {}}
    write_rank_folder(folder, {rank: rt.encode(meta) for rank, rt in rank_traces(result).items()})


def write_trace(result, path: str | os.PathLike, *, provenance: dict | None = None) -> None:
    """``--trace PATH``: one Chrome trace file when PATH ends in .json, .json.gz or .gz (every GPU, host and
    link in one file, warm-up included), else a folder of per-rank Kineto files in HTA's shape."""
    if is_single_file(path):
        from trainsim.sim.output.chrome_trace import write_chrome_trace

        write_chrome_trace(result, path, provenance=provenance)
    else:
        write_rank_traces(result, path, provenance=provenance)
