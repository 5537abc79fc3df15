"""A simulated run as a Chrome/Perfetto trace, shaped like a PyTorch profiler (Kineto) trace.

Open the ``.json.gz`` in ui.perfetto.dev (or chrome://tracing). Layout:

- one process per GPU (``pid`` = its global index, like Kineto's device id) with its streams as threads:
  compute (stream 7, ``cat: kernel``), H2D and D2H copy engines (``cat: gpu_memcpy``, names such as
  ``Memcpy HtoD (Pinned -> Device)``), the communication channel (NCCL kernels, names beginning
  ``ncclDevKernel_`` with the collective's message size in ``args``), and the data-loader wait; a counter
  track of the GPU's memory in use;
- one process per host socket: ``ProfilerStep#N`` spans (``cat: user_annotation``) and its cores' work,
  one track per concurrently busy core;
- one process per link that carried bytes: every flow on it (each on its own track, since the format cannot
  show overlapping slices on one track) and a counter track of the link's bandwidth in GB/s.

Top-level keys follow Kineto (``traceEvents``, ``deviceProperties``, ``distributedInfo``,
``displayTimeUnit``); times are µs. One file holds every GPU, so tools that read one Kineto file per rank
(HTA) take the folder `trainsim.sim.output.kineto_ranks` writes instead (``--trace DIR``).
The output is deterministic: events are sorted, JSON is compact, and the gzip header carries mtime 0.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from trainsim.files import write_atomic
from trainsim.sim.core.memory import GIB

STREAM_TID = {"compute": 7, "h2d": 20, "d2h": 21, "comm": 22, "data": 1, "wait": 2}
STREAM_NAME = {
    "compute": "stream 7 (compute)",
    "h2d": "stream 20 (H2D copy engine)",
    "d2h": "stream 21 (D2H copy engine)",
    "comm": "stream 22 (NCCL)",
    "data": "data loader wait",
    "wait": "waiting for the parameter server",
}
HOST_PID, LINK_PID = 100, 1000


def _us(t: float) -> float:
    return round(t * 1e6, 3)


def _dur(start: float, end: float) -> float:
    return round(_us(end) - _us(start), 3)


def _lanes(intervals: list[tuple[float, float]]) -> list[int]:
    """Greedy interval partitioning: the lowest-numbered track free at each interval's start."""
    order = sorted(range(len(intervals)), key=lambda i: (intervals[i][0], intervals[i][1], i))
    ends: list[float] = []
    lane_of = [0] * len(intervals)
    for i in order:
        start, end = intervals[i]
        for lane, busy_until in enumerate(ends):
            if busy_until <= start:
                ends[lane] = end
                lane_of[i] = lane
                break
        else:
            lane_of[i] = len(ends)
            ends.append(end)
    return lane_of


def _meta(pid: int, tid: int, kind: str, name: str) -> dict:
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": {"name": name}}


#: what a layer kind's kernels are called where it is not the kind itself: a linear layer runs cuBLAS GEMMs,
#: attention's time is its batched matrix multiplies (a reader tells compute-bound kernels by these words)
KERNEL_KIND = {"linear": "gemm", "attention": "attention gemm"}
#: the kinds whose kernels run on tensor cores at the run's precision, which their names say (tf32, bf16)
TENSOR_CORE_KINDS = ("conv2d", "linear", "attention")


def compute_kernel_name(op, precision: str = "fp32") -> str:
    """A compute op's kernel name: its pass, what its layer computes (``Layer.kind``: conv2d, gemm,
    batchnorm, ...) when the op is one layer, with the run's ``precision`` for the kinds that run it on
    tensor cores, and the layer: ``forward conv2d tf32: layer1.0.conv1``, as a profiler's kernel names say
    convolution or matrix multiply and the precision."""
    kind = op.args.get("kind")
    what = op.op
    if kind:
        what += f" {KERNEL_KIND.get(kind, kind)}"
        if kind in TENSOR_CORE_KINDS and precision != "fp32":
            what += f" {precision}"
    return f"{what}: {op.layer}" if op.layer else what


def _gpu_event(op, gpu_index: int, correlation: int, precision: str) -> dict:
    tid = STREAM_TID.get(op.stream, 0)
    args = {"device": gpu_index, "stream": tid, "correlation": correlation, "iteration": op.iteration}
    if op.stream == "compute":
        name = compute_kernel_name(op, precision)
        cat = "kernel"
    elif op.stream == "comm":
        name = f"{op.args.get('kernel', 'ncclDevKernel_' + op.op)}(ncclDevComm*, unsigned long, ncclWork*)"
        cat = "kernel"
        args.update(
            {
                "Collective name": op.op,
                "message_bytes": int(op.nbytes),
                "Group size": op.args.get("group_size"),
                "method": op.args.get("method"),
                "algo": op.args.get("algo"),
            }
        )
    elif op.stream in ("h2d", "d2h"):
        cat = "gpu_memcpy"
        pinned = op.args.get("pinned", True)
        if op.peer is not None:
            name = "Memcpy PtoP (Device -> Device)"
        elif op.stream == "h2d":
            name = f"Memcpy HtoD ({'Pinned' if pinned else 'Pageable'} -> Device)"
        else:
            name = f"Memcpy DtoH (Device -> {'Pinned' if pinned else 'Pageable'})"
        args.update(
            {
                "bytes": int(op.nbytes),
                "op": op.op,
                "memory bandwidth (GB/s)": round(op.nbytes / op.duration / 1e9, 3) if op.duration > 0 else 0,
            }
        )
        if op.peer is not None:
            args["peer"] = op.peer
    else:
        cat, name = "wait", op.op
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": gpu_index,
        "tid": tid,
        "ts": _us(op.start),
        "dur": _dur(op.start, op.end),
        "args": args,
    }


def chrome_trace(result, *, provenance: dict | None = None) -> dict:
    """The trace as a dict (see the module docstring)."""
    machine = result.machine
    if machine is None:
        raise ValueError("the result carries no machine (simulate with record=True)")
    topo = machine.topology
    ranks = [g.name for g in result.gpus]
    events: list[dict] = []
    gpu_index = {name: machine.gpus[name].index for name in ranks}
    for name in ranks:
        pid = gpu_index[name]
        gpu = machine.gpus[name]
        events.append(_meta(pid, 0, "process_name", f"GPU {pid} ({name}, {gpu.device.name})"))
        events.append(
            {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}}
        )
        for stream, tid in STREAM_TID.items():
            events.append(_meta(pid, tid, "thread_name", STREAM_NAME[stream]))
        for ev in gpu.memory.timeline:
            events.append(
                {
                    "ph": "C",
                    "name": "GPU memory",
                    "pid": pid,
                    "tid": 0,
                    "ts": _us(ev.time),
                    "args": {"GiB": round(ev.in_use / GIB, 6)},
                }
            )
    host_ops: dict[str, list] = {}
    correlation = 0
    for op in machine.ops:
        if op.resource in gpu_index:
            correlation += 1
            events.append(_gpu_event(op, gpu_index[op.resource], correlation, result.precision))
        elif op.resource in machine.hosts:
            host_ops.setdefault(op.resource, []).append(op)
    ends = _iteration_spans(result)
    for h, cpu in enumerate(topo.cpus):
        pid = HOST_PID + h
        events.append(_meta(pid, 0, "process_name", f"host {cpu}"))
        events.append(
            {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}}
        )
        events.append(_meta(pid, 0, "thread_name", "iterations"))
        if h == 0:
            for it, (start, end) in enumerate(ends):
                events.append(
                    {
                        "ph": "X",
                        "cat": "user_annotation",
                        "name": f"ProfilerStep#{it}",
                        "pid": pid,
                        "tid": 0,
                        "ts": _us(start),
                        "dur": _dur(start, end),
                        "args": {"warmup": it < result.warmup_iterations},
                    }
                )
        ops = host_ops.get(cpu, [])
        lanes = _lanes([(op.start, op.end) for op in ops])
        for lane in sorted(set(lanes)):
            events.append(_meta(pid, 1 + lane, "thread_name", f"core track {lane}"))
        for op, lane in zip(ops, lanes, strict=True):
            events.append(
                {
                    "ph": "X",
                    "cat": "cpu_op",
                    "name": op.op,
                    "pid": pid,
                    "tid": 1 + lane,
                    "ts": _us(op.start),
                    "dur": _dur(op.start, op.end),
                    "args": {"iteration": op.iteration, "bytes": int(op.nbytes), **op.args},
                }
            )
    events.extend(_link_events(machine))
    events.sort(key=lambda e: (e["ph"] != "M", e["pid"], e["tid"], e.get("ts", 0.0), e["name"]))
    world = len(ranks)
    return {
        "schemaVersion": 1,
        "deviceProperties": [
            {
                "id": gpu_index[n],
                "name": machine.gpus[n].device.name,
                "totalGlobalMem": int(machine.gpus[n].memory.capacity),
            }
            for n in ranks
        ],
        "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": world, "pg_count": 1},
        "trainsim": {
            "schema": "trainsim.trace/1",
            "scenario": result.scenario,
            "provenance": provenance or {},
        },
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": 0,
        "traceEvents": events,
    }


def _iteration_spans(result) -> list[tuple[float, float]]:
    ends = result.iteration_ends_s
    return [(ends[i - 1] if i else 0.0, ends[i]) for i in range(len(ends))]


def _link_events(machine) -> list[dict]:
    net = machine.net
    events: list[dict] = []
    index = {link: i for i, link in enumerate(net.links)}
    per_link: dict[int, list] = {}
    for rec in net.records or []:
        for link in rec.route:
            per_link.setdefault(index[link], []).append(rec)
    rates: dict[int, list] = {}
    for change in net.link_rate_changes or []:
        rates.setdefault(index[change.link], []).append(change)
    for i in sorted(set(per_link) | set(rates)):
        pid = LINK_PID + i
        u, v = net.links[i]
        events.append(_meta(pid, 0, "process_name", f"link {u}->{v}"))
        events.append(
            {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}}
        )
        recs = per_link.get(i, [])
        lanes = _lanes([(r.started, r.finished) for r in recs])
        for lane in sorted(set(lanes)):
            events.append(_meta(pid, 1 + lane, "thread_name", f"flow track {lane}"))
        for rec, lane in zip(recs, lanes, strict=True):
            events.append(
                {
                    "ph": "X",
                    "cat": "flow",
                    "name": str(rec.tag),
                    "pid": pid,
                    "tid": 1 + lane,
                    "ts": _us(rec.started),
                    "dur": _dur(rec.started, rec.finished),
                    "args": {
                        "bytes": int(rec.nbytes),
                        "route": "->".join([rec.route[0][0]] + [e[1] for e in rec.route]),
                    },
                }
            )
        for change in rates.get(i, []):
            events.append(
                {
                    "ph": "C",
                    "name": "bandwidth",
                    "pid": pid,
                    "tid": 0,
                    "ts": _us(change.time),
                    "args": {"GB/s": round(change.rate / 1e9, 6)},
                }
            )
    return events


def write_chrome_trace(result, path: str | Path, *, provenance: dict | None = None) -> None:
    """Write the trace (gzip when the name ends in .gz), byte-identical for the same inputs."""
    data = json.dumps(chrome_trace(result, provenance=provenance), separators=(",", ":")).encode()
    if str(path).endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    write_atomic(path, data)
