"""Write small Kineto-format traces by hand: known-answer examples for the replay and its tests.

Times are in microseconds, as in Kineto files. Each launch creates the runtime call on a CPU thread, the
GPU op on a stream, and links them by a correlation id (plus the ``ac2g`` flow, as Kineto writes it).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

PID = 1000


class TraceBuilder:
    def __init__(self, *, rank: int | None = 0, world_size: int = 1,
                 base_time_ns: int | None = 1_700_000_000_000_000_000, device: int = 0,
                 distributed_info: bool = True, correlation_args: bool = True,
                 device_name: str = "Synthetic GPU"):
        self.rank, self.world_size, self.base_time_ns = rank, world_size, base_time_ns
        self.device, self.distributed_info, self.correlation_args = device, distributed_info, correlation_args
        self.device_name = device_name
        self.events: list[dict] = []
        self._corr = 100

    def _next_corr(self) -> int:
        self._corr += 1
        return self._corr

    def cpu_op(self, tid: int, name: str, ts: float, dur: float, **args) -> dict:
        ev = {"ph": "X", "cat": "cpu_op", "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": dur,
              "args": {"External id": self._corr, **args}}
        self.events.append(ev)
        return ev

    def annotation(self, tid: int, name: str, ts: float, dur: float, **args) -> dict:
        ev = {"ph": "X", "cat": "user_annotation", "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": dur,
              "args": dict(args)}
        self.events.append(ev)
        return ev

    def step(self, number: int, tid: int, ts: float, dur: float) -> dict:
        return self.annotation(tid, f"ProfilerStep#{number}", ts, dur)

    def runtime(self, tid: int, name: str, ts: float, dur: float) -> int:
        corr = self._next_corr()
        args = {"correlation": corr} if self.correlation_args else {}
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": PID, "tid": tid, "ts": ts,
                            "dur": dur, "args": {"cbid": 0, **args}})
        return corr

    def launch(self, tid: int, ts: float, dur: float, *, stream: int, gpu_ts: float, gpu_dur: float,
               name: str = "kernel", kind: str = "kernel", call: str | None = None, **gpu_args) -> int:
        """A runtime call on thread tid launching a kernel / memcpy / memset on a stream."""
        call = call or {"kernel": "cudaLaunchKernel", "gpu_memcpy": "cudaMemcpyAsync",
                        "gpu_memset": "cudaMemsetAsync"}[kind]
        corr = self.runtime(tid, call, ts, dur)
        args = {"device": self.device, "stream": stream, **gpu_args}
        if self.correlation_args:
            args["correlation"] = corr
        self.events.append({"ph": "X", "cat": kind, "name": name, "pid": self.device, "tid": stream,
                            "ts": gpu_ts, "dur": gpu_dur, "args": args})
        flow = {"id": corr, "cat": "ac2g", "name": "ac2g"}
        self.events.append({"ph": "s", "pid": PID, "tid": tid, "ts": ts, **flow})
        self.events.append({"ph": "f", "pid": self.device, "tid": stream, "ts": gpu_ts, "bp": "e", **flow})
        return corr

    def graph_launch(self, tid: int, ts: float, dur: float, *, stream: int,
                     kernels: list[tuple[float, float, str]]) -> int:
        """A cudaGraphLaunch on thread tid whose kernels ``(gpu_ts, gpu_dur, name)`` all carry its
        correlation id, as CUPTI reports the kernels of a CUDA graph."""
        corr = self.runtime(tid, "cudaGraphLaunch", ts, dur)
        for gpu_ts, gpu_dur, name in kernels:
            args = {"device": self.device, "stream": stream}
            if self.correlation_args:
                args["correlation"] = corr
            self.events.append({"ph": "X", "cat": "kernel", "name": name, "pid": self.device, "tid": stream,
                                "ts": gpu_ts, "dur": gpu_dur, "args": args})
        return corr

    def profiler_overhead(self, ts: float, dur: float, name: str = "Activity Buffer Request") -> dict:
        """The profiler's own work as Kineto records it (CUPTI's buffer requests), on no thread of ours."""
        ev = {"ph": "X", "cat": "overhead", "name": name, "pid": -1, "tid": 0, "ts": ts, "dur": dur}
        self.events.append(ev)
        return ev

    def to_dict(self) -> dict:
        doc: dict = {"schemaVersion": 1,
                     "deviceProperties": [{"id": self.device, "name": self.device_name}]}
        if self.distributed_info and self.rank is not None:
            doc["distributedInfo"] = {"backend": "nccl", "rank": self.rank, "world_size": self.world_size,
                                      "nccl_version": "2.17.1"}
        doc["traceEvents"] = list(self.events)
        if self.base_time_ns is not None:
            doc["baseTimeNanoseconds"] = self.base_time_ns
        return doc

    def write(self, path: str | Path) -> Path:
        """Write the trace; gzip when the name ends in .gz."""
        path = Path(path)
        text = json.dumps(self.to_dict()).encode()
        path.write_bytes(gzip.compress(text) if path.name.endswith(".gz") else text)
        return path
