"""Write traces in the shape PyTorch's profiler (Kineto) writes them: a folder with one file per rank.

Trace-analysis tools written for Kineto (Meta's HolisticTraceAnalysis, HTA) take a folder of per-rank
files and key everything on Kineto's vocabulary, so a trace folder here is exactly that:

- one ``rank-<N>.json.gz`` per rank, whose ``distributedInfo`` names the rank, the world size and the
  backend; ``deviceProperties`` lists the rank's GPU; ``traceEvents`` holds the events; times are
  microseconds (``ts``, ``dur``), as Kineto writes them;
- on the rank's CPU process (``pid``, main thread ``tid == pid``): ``ProfilerStep#N`` spans
  (``cat: user_annotation``), operators (``cpu_op``) and CUDA runtime calls (``cuda_runtime``:
  ``cudaLaunchKernel``, ``cudaMemcpyAsync``, ``cudaMemsetAsync``, ...) with ``args.correlation`` and
  ``args["External id"]``;
- on the GPU (``pid`` = the device id, ``tid`` = the stream): ``kernel``, ``gpu_memcpy`` and
  ``gpu_memset`` events with ``args.device``, ``args.stream``, ``args.correlation``, NCCL kernels with
  their collective's arguments (``Collective name``, ``In msg nelems``, ``Group size``, ``dtype``);
- an ``ac2g`` flow from each launch to the GPU work it launched (``s`` on the call, ``f`` with
  ``bp: e`` on the kernel), as Kineto links them;
- GPU events HTA reads with no negative length (`hta_safe`): it rounds times to whole microseconds.

HTA finds a file's rank with the pattern ``"rank":\\s+(\\d+)`` on the first line that has one, so the
file is laid out as Kineto's are: ``distributedInfo`` comes first, keys and values separated by ``": "``,
one event per line, and trainsim's own metadata (``trainsim``) after the events.

Output is deterministic (sorted events, gzip mtime 0) and a folder is either complete or absent: the
files are written into a temporary folder beside it, which then takes its place.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from trainsim.errors import TrainsimError

RANK_FILE_RE = re.compile(r"^rank-(\d+)\.json\.gz$")
SINGLE_FILE_SUFFIXES = (".json", ".json.gz", ".gz")

# The runtime call that launches each kind of GPU work, and CUPTI's callback id for it (Kineto's "cbid").
LAUNCH_CALL = {"kernel": "cudaLaunchKernel", "gpu_memcpy": "cudaMemcpyAsync", "gpu_memset": "cudaMemsetAsync"}
CBID = {"cudaLaunchKernel": 211, "cudaLaunchKernelExC": 430, "cudaMemcpyAsync": 41, "cudaMemsetAsync": 51,
        "cudaEventRecord": 135, "cudaStreamWaitEvent": 147, "cudaStreamSynchronize": 131,
        "cudaEventSynchronize": 137, "cudaDeviceSynchronize": 165, "cudaGraphLaunch": 311}
# Kineto's names for the element types of NCCL messages.
KINETO_DTYPE = {"fp32": "Float", "tf32": "Float", "fp16": "Half", "bf16": "BFloat16"}


def _id_order(value) -> tuple:
    """Sort key for a pid or tid: Kineto writes numbers, a few tools write names; numbers first."""
    return (0, value, "") if isinstance(value, int | float) else (1, 0, str(value))


def rank_file_name(rank: int) -> str:
    return f"rank-{rank}.json.gz"


def is_single_file(path: str | os.PathLike) -> bool:
    """Whether ``--trace PATH`` asks for one Chrome trace file (a name ending in .json, .json.gz or .gz)
    rather than a folder of per-rank Kineto files."""
    return str(path).endswith(SINGLE_FILE_SUFFIXES)


def us(seconds: float) -> float:
    """Seconds as Kineto's microseconds, to the nanosecond."""
    return round(seconds * 1e6, 3)


def hta_safe(ts: float, dur: float) -> tuple[float, float]:
    """A GPU event's (ts, dur) in microseconds, to the nanosecond, as HTA reads them without a negative
    length. HTA takes a trace whose times have fractions of a microsecond to whole microseconds, rounding
    each event's start up and its end (``ts + dur``, summed in floating point) down, and its temporal
    breakdown fails on the -1 us that gives an event lying inside one microsecond (a sub-microsecond
    kernel, common after a what-if on a faster GPU) or ending on a whole microsecond that the sum misses by
    a rounding error. The second is written 1 ns longer; the first moves to start or to end on the nearer
    whole microsecond (by under half a microsecond, its length kept): both then read as 0 us or more."""
    ts, dur = round(ts, 3), round(max(dur, 0.0), 3)
    for start, length in ((ts, dur), (ts, round(dur + 0.001, 3))):
        if math.ceil(start) <= math.floor(start + length):      # as HTA computes it
            return start, length
    later = round(math.ceil(ts) - dur, 3)                        # ending on the next whole microsecond
    if later - ts < ts - math.floor(ts) and math.ceil(later) <= math.floor(later + dur):
        return later, dur
    return float(math.floor(ts)), dur


@dataclass(frozen=True)
class Launch:
    """The CUDA runtime call that launched some GPU work: its thread, start and length (µs), its name."""

    tid: int
    ts: float
    dur: float
    call: str
    pid: int | None = None           # None: the rank's own process


@dataclass
class RankTrace:
    """The events of one rank's Kineto file, added in Kineto's vocabulary (times in microseconds)."""

    rank: int
    world_size: int
    cpu_pid: int
    devices: list[dict]                  # deviceProperties entries: id, name, totalGlobalMem
    backend: str = "nccl"
    distributed: dict = field(default_factory=dict)   # more distributedInfo keys (pg_config, nccl_version)
    base_time_ns: int = 0
    events: list[dict] = field(default_factory=list)
    _threads: dict[tuple, str] = field(default_factory=dict)
    _gpu_pids: set[int] = field(default_factory=set)
    _launched: set[int] = field(default_factory=set)
    _next_correlation: int = 1

    def new_correlation(self) -> int:
        """A correlation id not used yet in this file."""
        self._next_correlation += 1
        return self._next_correlation - 1

    def reserve_correlations(self, used: int) -> None:
        """Ids up to ``used`` are taken (a trace's own ids kept as they were)."""
        self._next_correlation = max(self._next_correlation, used + 1)

    def thread(self, pid: int, tid: int, name: str) -> None:
        self._threads.setdefault((pid, tid), name)

    def cpu(self, cat: str, name: str, tid: int, ts: float, dur: float, args: dict | None = None, *,
            pid: int | None = None) -> None:
        """A CPU event (``cpu_op``, ``user_annotation``, ``cuda_runtime``) on thread ``tid`` of the rank's
        process (or of process ``pid``)."""
        pid = self.cpu_pid if pid is None else pid
        self.thread(pid, tid, "python main thread" if tid == pid else f"thread {tid}")
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid,
                            "ts": ts, "dur": max(dur, 0.0), "args": args or {}})

    def step(self, number: int, ts: float, dur: float, tid: int | None = None) -> None:
        """A ``ProfilerStep#N`` span (on the main thread unless ``tid`` says otherwise)."""
        self.cpu("user_annotation", f"ProfilerStep#{number}", self.cpu_pid if tid is None else tid, ts, dur)

    def sync(self, device: int, stream: int, ts: float, *, correlation: int, wait_on_stream: int,
             record_correlation: int) -> None:
        """The ``cuda_sync`` event CUPTI writes for a ``cudaStreamWaitEvent`` (correlation ``correlation``):
        ``stream`` of ``device`` waits for the event recorded by call ``record_correlation`` on
        ``wait_on_stream``."""
        self.thread(device, stream, f"stream {stream} ")
        self._gpu_pids.add(device)
        self.events.append({"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": device,
                            "tid": stream, "ts": ts, "dur": 0.0,
                            "args": {"cuda_sync_kind": "Stream Wait Event", "device": device,
                                     "stream": stream, "correlation": correlation,
                                     "wait_on_stream": wait_on_stream,
                                     "wait_on_cuda_event_record_corr_id": record_correlation}})

    def gpu(self, cat: str, name: str, device: int, stream: int, ts: float, dur: float, *,
            correlation: int, external_id: int | None = None, args: dict | None = None,
            launch: Launch | None = None) -> None:
        """GPU work (``kernel``, ``gpu_memcpy``, ``gpu_memset``) on ``stream`` of ``device``; ``launch``, the
        runtime call that launched it, is written as a ``cuda_runtime`` event with the same correlation and
        an ``ac2g`` flow from it to the work."""
        external_id = correlation if external_id is None else external_id
        ts, dur = hta_safe(ts, dur)
        self.thread(device, stream, f"stream {stream} ")
        self._gpu_pids.add(device)
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": device, "tid": stream, "ts": ts,
                            "dur": max(dur, 0.0),
                            "args": {"External id": external_id, "device": device, "stream": stream,
                                     "correlation": correlation, **(args or {})}})
        if launch is None:
            return
        pid = self.cpu_pid if launch.pid is None else launch.pid
        if correlation not in self._launched:     # a CUDA graph's one launch runs many kernels
            self._launched.add(correlation)
            call_args = {"External id": external_id, "correlation": correlation}
            if launch.call in CBID:
                call_args["cbid"] = CBID[launch.call]
            self.cpu("cuda_runtime", launch.call, launch.tid, launch.ts, launch.dur, call_args, pid=pid)
            self.events.append({"ph": "s", "id": correlation, "pid": pid, "tid": launch.tid, "ts": launch.ts,
                                "cat": "ac2g", "name": "ac2g"})
        self.events.append({"ph": "f", "id": correlation, "pid": device, "tid": stream, "ts": ts,
                            "cat": "ac2g", "name": "ac2g", "bp": "e"})

    def _metadata_events(self) -> list[dict]:
        def meta(pid: int, kind: str, args: dict) -> dict:
            return {"name": kind, "ph": "M", "pid": pid, "tid": 0, "args": args}

        out = [meta(self.cpu_pid, "process_name", {"name": f"rank {self.rank}"}),
               meta(self.cpu_pid, "process_labels", {"labels": "CPU"})]
        for dev in sorted(self._gpu_pids):
            out.append(meta(dev, "process_name", {"name": f"GPU {dev}"}))
            out.append(meta(dev, "process_labels", {"labels": f"GPU {dev}"}))
        for (pid, tid), name in sorted(self._threads.items(), key=lambda kv: tuple(map(_id_order, kv[0]))):
            out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
        return out

    def document(self, trainsim: dict | None = None) -> dict:
        """The file's JSON object, keys in Kineto's order (``distributedInfo`` first, see the module doc)."""
        events = sorted(self.events, key=lambda e: (_id_order(e["pid"]), _id_order(e["tid"]), e["ts"],
                                                    e["ph"] != "X", -e.get("dur", 0.0), e["name"]))
        return {
            "schemaVersion": 1,
            "distributedInfo": {"backend": self.backend, "rank": self.rank, "world_size": self.world_size,
                                **self.distributed},
            "deviceProperties": self.devices,
            "displayTimeUnit": "ms",
            "baseTimeNanoseconds": self.base_time_ns,
            "traceEvents": self._metadata_events() + events,
            "trainsim": trainsim or {},
        }

    def encode(self, trainsim: dict | None = None) -> bytes:
        """The gzip file: one top-level key per line, one event per line, byte-identical for the same
        events."""
        doc = self.document(trainsim)
        lines = ["{"]
        keys = list(doc)
        for i, key in enumerate(keys):
            comma = "," if i < len(keys) - 1 else ""
            if key == "traceEvents":
                lines.append('  "traceEvents": [')
                events = doc[key]
                lines.extend("  " + json.dumps(e) + ("," if j < len(events) - 1 else "")
                             for j, e in enumerate(events))
                lines.append("  ]" + comma)
            else:
                lines.append(f"  {json.dumps(key)}: {json.dumps(doc[key])}{comma}")
        lines.append("}")
        return gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0)


# ---------------------------------------------------------------- the folder

def check_trace_output(path: str | os.PathLike, option: str | None = "--trace", inputs=()) -> Path:
    """Check ``--trace PATH`` before any work: a writable file where PATH names one (`is_single_file`),
    else a folder `check_trace_folder` accepts; neither one of the command's ``inputs``
    (`trainsim.files.check_not_input`)."""
    from trainsim.files import check_output

    return (check_output(path, option, inputs) if is_single_file(path)
            else check_trace_folder(path, option, inputs))


def check_trace_folder(path: str | os.PathLike, option: str | None = None, inputs=()) -> Path:
    """Refuse a trace folder that cannot be written, before any work: a file in the way, a missing or
    read-only parent, a folder that is or holds one of the command's ``inputs``, or a folder holding
    anything but ``rank-<N>.json.gz`` files (a trace folder is replaced as a whole, so it must not hold
    other files). Nothing is created."""
    from trainsim.files import check_output_folder

    path = check_output_folder(path, option, inputs, whole=True)
    if path.is_dir():
        foreign = sorted(p.name for p in path.iterdir() if not RANK_FILE_RE.match(p.name))
        if foreign:
            raise TrainsimError(f"the folder holds files that are not rank traces ({', '.join(foreign[:3])}"
                                f"{', ...' if len(foreign) > 3 else ''}); give a new or empty folder",
                                file=str(path), field=option)
    return path


def write_rank_folder(folder: str | os.PathLike, files: dict[int, bytes]) -> None:
    """Write ``rank-<N>.json.gz`` for each rank into ``folder``, replacing what a previous trace left
    there; the folder is complete or unchanged, never half-written. A symbolic link to a folder is written
    through: the folder it names is replaced, the link stays."""
    folder = Path(os.path.realpath(folder))
    check_trace_folder(folder)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.", suffix=".tmp"))
    except OSError as exc:
        raise TrainsimError(f"cannot write the trace folder ({exc.strerror or exc})",
                            file=str(folder)) from None
    old = None
    try:
        for rank, data in sorted(files.items()):
            (tmp / rank_file_name(rank)).write_bytes(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)            # mkdtemp makes 0700; give the folder the usual mode
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
            raise TrainsimError(f"cannot write the trace folder ({exc.strerror or exc})",
                                file=str(folder)) from None
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
