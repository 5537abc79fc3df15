"""A simulated run as per-rank Kineto traces, the folder HTA reads (`trainsim.formats.kineto_writer`).

Each GPU is one rank (its index). Its file holds what torch.profiler, scheduled to record the measured
iterations, would have written on that rank: ``ProfilerStep#N`` for each measured iteration (warm-up
iterations are not recorded, as a profiler schedule's warm-up steps are not); the GPU's work on its streams
(compute kernels named after their pass and layer on stream 7, host copies on 20 and 21, NCCL collectives
on 22, peer copies on 23), each with a ``cuda_runtime`` launch and an ``ac2g`` flow; the time the training
loop waits for its data loader or for a parameter server as ``cpu_op`` events on the main thread.

The simulator times the GPU's streams, not the CPU thread that launches their work, so a launch is drawn as
a call of zero length at the moment its work starts (no queueing shows between launch and start).

:func:`write_trace` writes a folder of these, or the single Chrome trace of `chrome_trace` when the path
names a file (``.json``, ``.json.gz``, ``.gz``).
"""

from __future__ import annotations

import os

from trainsim.formats.kineto_writer import (
    KINETO_DTYPE,
    LAUNCH_CALL,
    Launch,
    RankTrace,
    is_single_file,
    us,
    write_rank_folder,
)

GPU_STREAM = {"compute": 7, "h2d": 20, "d2h": 21, "comm": 22, "p2p": 23}
CPU_PID_BASE = 100_000   # a rank's CPU process id: base + rank (never a device id)


def _gpu_event(op) -> tuple[str, str, dict]:
    """(category, name, extra args) of a GPU op, in Kineto's words."""
    if op.stream == "compute":
        return "kernel", (f"{op.op}: {op.layer}" if op.layer else op.op), {}
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
    for op in machine.ops:
        rt = by_name.get(op.resource)
        if rt is None or op.iteration < first:
            continue
        ts, dur = us(op.start), round(us(op.end) - us(op.start), 3)
        if op.stream not in GPU_STREAM:          # the training loop waiting (data loader, parameter server)
            rt.cpu("cpu_op", op.op, rt.cpu_pid, ts, dur, {"iteration": op.iteration})
            continue
        cat, name, args = _gpu_event(op)
        if "Collective name" in args:
            size = 2 if dtype in ("Half", "BFloat16") else 4
            args.update({"In msg nelems": int(op.nbytes) // size, "Out msg nelems": int(op.nbytes) // size,
                         "dtype": dtype})
        args.update({"iteration": op.iteration, **({"layer": op.layer} if op.layer else {})})
        if op.peer is not None:
            args["peer"] = op.peer
        device = rt.devices[0]["id"]
        rt.gpu(cat, name, device, GPU_STREAM[op.stream], ts, dur, correlation=rt.new_correlation(),
               args=args, launch=Launch(rt.cpu_pid, ts, 0.0, LAUNCH_CALL[cat]))
    return traces


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
