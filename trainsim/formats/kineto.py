"""Read PyTorch profiler (Kineto) Chrome traces into compact records.

One file per rank, plain JSON or gzip. Traces can be hundreds of MB, so the ``traceEvents`` array is
decoded one event at a time from a bounded text buffer and each event is turned into a small slotted
record at once: the raw JSON text and a parsed copy of the whole document are never held together.

Times in the records are seconds since the earliest complete event of the file (``origin_us`` keeps the
Kineto microsecond origin, ``base_time_ns`` the offset that turns Kineto times into Unix time).

It stays one module: the streaming decoder and the slotted record types it fills change together.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import re
import sys
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from trainsim.errors import TrainsimError
from trainsim.formats.collectives import (  # noqa: F401  (Collective, DTYPE_BYTES: read from here too)
    DTYPE_BYTES,
    Collective,
    call_collective,
    collective_from_args,
)

# Kineto category names, new (lower_case) and old (PyTorch <= 1.9 Title case) spellings.
_CPU_OP = {"cpu_op", "operator"}
_RUNTIME = {"cuda_runtime", "runtime", "cuda_driver"}
_ANNOTATION = {"user_annotation", "python_function"}
_KERNEL = {"kernel"}
_MEMCPY = {"gpu_memcpy", "memcpy"}
_MEMSET = {"gpu_memset", "memset"}
_SYNC = {"cuda_sync"}
_OVERHEAD = {"overhead"}     # the profiler's own work, e.g. CUPTI's "Activity Buffer Request"
_ANNOTATION = {"user_annotation", "python_function"}
_USED = _CPU_OP | _RUNTIME | _KERNEL | _MEMCPY | _MEMSET | _SYNC | _OVERHEAD | _ANNOTATION

_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
_RANK_IN_NAME_RE = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
_COPY_KIND_RE = re.compile(r"\b(HtoD|DtoH|DtoD|PtoP|HtoH)\b")
_COPY_KIND = {"HtoD": "H2D", "DtoH": "D2H", "DtoD": "D2D", "PtoP": "P2P", "HtoH": "H2H"}
_CHUNK_CHARS = 1 << 20
UNIX_US_MIN = 1e15      # Kineto times this large are Unix microseconds already (after September 2001)
#: bounds on an event's time (Kineto's microseconds): ts within 0 to 2^63 ns (Unix time fits until 2262), no
#: event and no trace longer than a day (a profiler records seconds to minutes). Beyond them a time is damage
#: (ts 1e30, a duration of 1e18), which would otherwise shift every other time or make the replay run for ever
MAX_TS_US = 2**63 / 1e3
MAX_SPAN_US = 86_400e6
#: the launch that runs several GPU ops under one correlation id: a CUDA (or HIP) graph's
_GRAPH_LAUNCH_RE = re.compile(r"(?:cuda|cu|hip)GraphLaunch")


@dataclass(slots=True)
class CpuEvent:
    """A complete ('X') event on a CPU thread: an op, an annotation or a CUDA runtime call."""

    kind: str            # "cpu_op" | "runtime" | "annotation"
    name: str
    pid: int | str
    tid: int | str
    ts: float            # seconds since the trace origin
    dur: float           # seconds
    correlation: int | None = None
    collective: Collective | None = None
    shapes: list | None = None       # cpu ops recorded with record_shapes: args "Input Dims"
    types: list | None = None        # ... "Input type"
    concrete: list | None = None     # ... "Concrete Inputs" (scalar arguments as text; newer PyTorch)


@dataclass(slots=True)
class GpuEvent:
    """A kernel, memcpy or memset on a GPU stream."""

    kind: str            # "kernel" | "collective" | "memcpy" | "memset"
    name: str
    device: int
    stream: int
    ts: float
    dur: float
    correlation: int | None = None
    nbytes: int | None = None
    copy_kind: str | None = None     # "H2D" | "D2H" | "D2D" | "P2P" | "H2H" for memcpys
    pinned: bool | None = None       # host side pinned (True) or pageable (False); None if not a host copy
    collective: Collective | None = None


@dataclass(slots=True)
class SyncEvent:
    """A CUDA synchronisation seen by CUPTI (traces recorded with ``enable_cuda_sync_events``)."""

    sync_kind: str                   # "Stream Wait Event" | "Event Sync" | "Stream Sync" | "Context Sync"
    device: int
    stream: int
    correlation: int | None
    wait_on_stream: int | None = None
    wait_on_record_correlation: int | None = None


@dataclass(slots=True)
class Step:
    """A ``ProfilerStep#N`` span on a CPU thread."""

    number: int
    pid: int | str
    tid: int | str
    ts: float
    dur: float


@dataclass
class KinetoTrace:
    """One rank's trace, reduced to what a replay needs."""

    path: str
    rank: int
    rank_source: str                 # "distributedInfo" | "file name" | "assumed"
    world_size: int | None
    origin_us: float
    base_time_ns: int | None
    devices: dict[int, str]
    device_memory: dict[int, int]                # bytes, from deviceProperties.totalGlobalMem
    nccl_version: str | None
    process_groups: list[dict]
    cpu_events: list[CpuEvent]
    gpu_events: list[GpuEvent]
    syncs: list[SyncEvent]
    steps: list[Step]
    thread_names: dict[tuple, str] = field(default_factory=dict)
    flows: dict[int, tuple] = field(default_factory=dict)   # ac2g flow id -> (pid, tid, ts) of its start
    span_s: float = 0.0
    # (ts, dur) of the profiler's own work the trace records ("overhead" events: CUPTI activity buffer
    # requests), which stalls the thread whose activity needed the buffer
    profiler_overheads: list[tuple[float, float]] = field(default_factory=list)
    # the ``trainsim`` block of a trace trainsim wrote (its scenario and provenance: the run it came from)
    writer: dict | None = None

    def wall_origin_us(self) -> float | None:
        """The trace's time 0 in Unix microseconds: from ``baseTimeNanoseconds``, or the Kineto times
        themselves when they already are Unix times; None when the trace does not say."""
        if self.base_time_ns is not None:
            return self.base_time_ns / 1e3 + self.origin_us
        return self.origin_us if self.origin_us >= UNIX_US_MIN else None

    def wall_window_ns(self) -> tuple[float, float] | None:
        """(start, end) of the trace in Unix nanoseconds, when the trace carries its time base."""
        origin = self.wall_origin_us()
        if origin is None:
            return None
        return origin * 1e3, origin * 1e3 + self.span_s * 1e9

    def shift(self, seconds: float) -> None:
        """Move time 0 ``seconds`` earlier: every time grows by ``seconds``."""
        for e in self.cpu_events:
            e.ts += seconds
        for g in self.gpu_events:
            g.ts += seconds
        for s in self.steps:
            s.ts += seconds
        self.profiler_overheads = [(ts + seconds, dur) for ts, dur in self.profiler_overheads]
        self.flows = {k: (pid, tid, ts + seconds) for k, (pid, tid, ts) in self.flows.items()}
        self.span_s += seconds
        self.origin_us -= seconds * 1e6


# ---------------------------------------------------------------- streaming JSON reading

class _TextStream:
    """Decode one JSON value at a time from a text stream, keeping a bounded buffer."""

    def __init__(self, fh: io.TextIOBase, name: str):
        self.fh, self.name = fh, name
        self.buf, self.pos, self.eof, self.consumed = "", 0, False, 0
        self.decoder = json.JSONDecoder()

    def _fill(self, want: int = _CHUNK_CHARS) -> bool:
        if self.eof:
            return False
        if self.pos > _CHUNK_CHARS:          # drop what was consumed, so the buffer stays bounded
            self.consumed += self.pos
            self.buf, self.pos = self.buf[self.pos:], 0
        chunk = self.fh.read(want)
        if not chunk:
            self.eof = True
            return False
        self.buf += chunk
        return True

    def peek(self) -> str:
        """The next non-blank character ('' at the end of the input)."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in " \t\r\n":
                self.pos += 1
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._fill():
                return ""

    def expect(self, chars: str, what: str) -> str:
        ch = self.peek()
        if ch == "" or ch not in chars:
            found = "the end of the file" if ch == "" else repr(ch)
            raise TrainsimError(f"not a Kineto trace: expected {what}, found {found} at character "
                                f"{self.consumed + self.pos} (truncated or not a trace?)", file=self.name)
        self.pos += 1
        return ch

    def value(self):
        """Decode the next JSON value; read more input while it is incomplete."""
        self.peek()
        while True:
            try:
                obj, end = self.decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                if self._fill(max(_CHUNK_CHARS, len(self.buf))):
                    continue
                raise TrainsimError(f"not valid JSON near character {self.consumed + exc.pos}: {exc.msg} "
                                    "(truncated file?)", file=self.name) from None
            except RecursionError:  # nested deeper than Python's decoder goes (thousands of brackets)
                raise TrainsimError(f"not read: a value nested thousands of levels deep near character "
                                    f"{self.consumed + self.pos}; the trace is damaged",
                                    file=self.name) from None
            # A number at the very end of the buffer may continue in the next chunk.
            if end == len(self.buf) and self._fill():
                continue
            self.pos = end
            return obj


def _open_text(path: Path) -> io.TextIOBase:
    with open(path, "rb") as raw:
        magic = raw.read(2)
    if magic == b"\x1f\x8b":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")


def _read_document(path: Path, on_event: Callable[[int, dict], None]) -> dict:
    """Stream the top-level object: call on_event(index, event) for each trace event that is an object
    (``index`` its position in traceEvents), return the other keys."""
    name = str(path)
    meta: dict = {}
    saw_events = False
    try:
        with _open_text(path) as fh:
            stream = _TextStream(fh, name)
            stream.expect("{", "a JSON object with 'traceEvents'")
            if stream.peek() == "}":
                stream.pos += 1
            else:
                while True:
                    key = stream.value()
                    if not isinstance(key, str):
                        raise TrainsimError("not valid JSON: object key is not a string", file=name)
                    stream.expect(":", "':'")
                    if key == "traceEvents":
                        saw_events = True
                        stream.expect("[", "the traceEvents array")
                        if stream.peek() == "]":
                            stream.pos += 1
                        else:
                            index = 0
                            while True:
                                event = stream.value()
                                if isinstance(event, dict):
                                    on_event(index, event)
                                index += 1
                                if stream.expect(",]", "',' or ']' in traceEvents") == "]":
                                    break
                    else:
                        meta[key] = stream.value()
                    if stream.expect(",}", "',' or '}'") == "}":
                        break
            if stream.peek() != "":
                raise TrainsimError("not valid JSON: extra data after the trace object", file=name)
    except FileNotFoundError:
        raise TrainsimError("no such file", file=name) from None
    except IsADirectoryError:
        raise TrainsimError("is a directory, not a trace file", file=name) from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise TrainsimError(f"truncated or corrupt gzip file ({exc})", file=name) from None
    except UnicodeDecodeError:
        raise TrainsimError("not a Kineto trace: not UTF-8 text (a binary file?)", file=name) from None
    except OSError as exc:
        raise TrainsimError(f"cannot read the file ({exc.strerror or exc})", file=name) from None
    if not saw_events:
        raise TrainsimError("not a Kineto trace: the JSON object has no 'traceEvents'", file=name)
    return meta


# ---------------------------------------------------------------- event conversion

def _as_int(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class _Collector:
    """Turns raw event dicts into records as they stream past. A complete event of a kind the replay uses
    with a time that is not one (``ts`` not a finite number within 0 to 2^63 ns, ``dur`` missing, negative,
    not finite or longer than a day), a copy whose ``bytes`` is not a whole number >= 0, or a launch whose
    correlation id another launch has (`check_correlations`) is an error naming the file and the event."""

    def __init__(self, file: str):
        self.file = file
        self.index = 0                                    # the event's position in traceEvents
        self.cpu: list[CpuEvent] = []
        self.gpu: list[GpuEvent] = []
        self.syncs: list[SyncEvent] = []
        self.steps: list[Step] = []
        self.overheads: list[tuple[float, float]] = []
        self.thread_names: dict[tuple, str] = {}
        self.flows: dict[int, tuple] = {}
        self.flow_ends: dict[tuple, int] = {}             # (pid, tid, ts) of an ac2g flow's end -> its id
        self.unlinked: list[tuple[GpuEvent, tuple]] = []  # GPU events without a correlation arg
        self.min_ts = float("inf")
        self.max_end = float("-inf")
        self.first = self.last = 0                        # indices of the events that start and end it
        self.launches: dict[tuple[str, int], tuple[int, str]] = {}  # (cat, correlation) -> (index, name)
        self.gpu_ids: dict[int, int] = {}                 # a GPU op's correlation id -> the first op's index
        self.shared_ids: list[tuple[int, int, str]] = []  # (correlation, index, name) of the GPU ops after it

    def __call__(self, index: int, ev: dict) -> None:
        self.index = index
        ph = ev.get("ph")
        if ph == "X":
            self._complete(ev)
        elif ph == "s" and ev.get("cat") == "ac2g":
            flow_id = _as_int(ev.get("id"))
            if flow_id is not None:
                self.flows[flow_id] = (ev.get("pid"), ev.get("tid"), ev.get("ts"))
        elif ph == "f" and ev.get("cat") == "ac2g":
            flow_id = _as_int(ev.get("id"))
            if flow_id is not None:
                self.flow_ends[(ev.get("pid"), ev.get("tid"), ev.get("ts"))] = flow_id
        elif ph == "M" and ev.get("name") == "thread_name":
            name = (ev.get("args") or {}).get("name")
            if name:
                self.thread_names[(ev.get("pid"), ev.get("tid"))] = str(name).strip()

    def _complete(self, ev: dict) -> None:
        cat = str(ev.get("cat", "")).lower()
        if cat not in _USED:
            return
        ts, dur = self._time(ev, "ts"), self._time(ev, "dur")
        args = ev.get("args") or {}
        name = sys.intern(str(ev.get("name", "")))     # the same op and kernel names recur thousands of times
        kind = None
        if cat in _KERNEL:
            collective = collective_from_args(args, name) if name.startswith("nccl") else None
            kind = "collective" if collective else "kernel"
            self.gpu.append(self._gpu(kind, ev, args, name, ts, dur, collective=collective))
        elif cat in _MEMCPY:
            match = _COPY_KIND_RE.search(name)
            copy_kind = _COPY_KIND[match.group(1)] if match else None
            pinned = None
            if copy_kind in ("H2D", "D2H"):
                pinned = "Pinned" in name if ("Pinned" in name or "Pageable" in name) else None
            self.gpu.append(self._gpu("memcpy", ev, args, name, ts, dur, copy_kind=copy_kind, pinned=pinned))
            kind = "memcpy"
        elif cat in _MEMSET:
            self.gpu.append(self._gpu("memset", ev, args, name, ts, dur))
            kind = "memset"
        elif cat in _SYNC:
            self.syncs.append(SyncEvent(
                sync_kind=str(args.get("cuda_sync_kind", name)), device=_as_int(args.get("device")) or 0,
                stream=_as_int(args.get("stream")) or 0, correlation=_as_int(args.get("correlation")),
                wait_on_stream=_as_int(args.get("wait_on_stream")),
                wait_on_record_correlation=_as_int(args.get("wait_on_cuda_event_record_corr_id"))))
            return
        elif cat in _OVERHEAD:
            self.overheads.append((ts, dur))
            return
        elif cat in _RUNTIME or cat in _CPU_OP or cat in _ANNOTATION:
            kind = "runtime" if cat in _RUNTIME else "cpu_op" if cat in _CPU_OP else "annotation"
            collective = call_collective(name, args) if kind != "runtime" else None
            shapes = args.get("Input Dims") if kind == "cpu_op" else None
            self.cpu.append(CpuEvent(kind, name, ev.get("pid"), ev.get("tid"), ts, dur,
                                     correlation=_as_int(args.get("correlation")), collective=collective,
                                     shapes=shapes if isinstance(shapes, list) else None,
                                     types=args.get("Input type") if shapes else None,
                                     concrete=args.get("Concrete Inputs") if shapes else None))
            match = _STEP_RE.match(name)
            if match:
                self.steps.append(Step(int(match.group(1)), ev.get("pid"), ev.get("tid"), ts, dur))
            if kind == "runtime":
                self._launch(cat, name, self.cpu[-1].correlation)
        if kind is not None:
            if ts < self.min_ts:
                self.min_ts, self.first = ts, self.index
            if ts + dur > self.max_end:
                self.max_end, self.last = ts + dur, self.index

    def _time(self, ev: dict, key: str) -> float:
        if key not in ev:
            raise self._error(ev, f"{key} is missing")
        value = ev[key]
        if not _is_number(value) or not math.isfinite(value):
            raise self._error(ev, f"{key} {value!r} is not a finite number")
        if value < 0:
            raise self._error(ev, f"{key} {value!r} is negative")
        if key == "ts" and value > MAX_TS_US:
            raise self._error(ev, f"ts {value!r} us is past 2^63 ns")
        if key == "dur" and value > MAX_SPAN_US:
            raise self._error(ev, f"dur {value!r} us is longer than a day")
        return value

    def _launch(self, cat: str, name: str, correlation: int | None) -> None:
        """A runtime (or driver) call: its correlation id, which links it to the GPU ops it launched, is its
        own (CUPTI numbers every call)."""
        if correlation is None:
            return
        first = self.launches.setdefault((cat, correlation), (self.index, name))
        if first[0] != self.index:
            raise TrainsimError(f"correlation id {correlation} of {name[:60]!r} is also that of "
                                f"traceEvents[{first[0]}] ({first[1][:60]!r}): each launch has its own, "
                                "which links it to its GPU work; the trace is damaged", file=self.file,
                                field=f"traceEvents[{self.index}].args.correlation")

    def check_correlations(self) -> None:
        """GPU ops that share a correlation id must come from one CUDA graph launch (its kernels all carry
        its id); any other sharing is damage (a trace whose every event has id 1 would tie every op to one
        launch)."""
        launches = {correlation: name for (_, correlation), (_, name) in self.launches.items()}
        for correlation, index, name in self.shared_ids:
            launch = launches.get(correlation)
            if launch is None or not _GRAPH_LAUNCH_RE.search(launch):
                but = (f"its launch {launch[:60]!r} is not a CUDA graph's" if launch is not None
                       else "no launch in the trace has it")
                raise TrainsimError(f"the GPU op {name[:60]!r} has correlation id {correlation}, as "
                                    f"traceEvents[{self.gpu_ids[correlation]}] does, but {but} (only a graph "
                                    "launch runs several ops under one id); the trace is damaged",
                                    file=self.file, field=f"traceEvents[{index}].args.correlation")
        if self.max_end - self.min_ts > MAX_SPAN_US:
            days = (self.max_end - self.min_ts) / 86_400e6
            raise TrainsimError(f"its events span {days:.3g} days, from traceEvents[{self.first}] to the end "
                                f"of traceEvents[{self.last}]; a profiler trace covers at most a day: the "
                                "trace is damaged", file=self.file, field=f"traceEvents[{self.last}].ts")

    def _error(self, ev: dict, what: str) -> TrainsimError:
        label = f"a {ev.get('cat')} event {str(ev.get('name', ''))[:60]!r}"
        return TrainsimError(f"{label}: {what}; the trace is damaged", file=self.file,
                             field=f"traceEvents[{self.index}]")

    def link_flows(self) -> None:
        """Old traces without correlation args: take the id of the ac2g flow that ends on the op."""
        for g, key in self.unlinked:
            g.correlation = self.flow_ends.get(key)
        self.unlinked.clear()
        self.flow_ends.clear()

    def _gpu(self, kind, ev, args, name, ts, dur, **extra) -> GpuEvent:
        device = _as_int(args.get("device"))
        if device is None:
            device = _as_int(ev.get("pid")) or 0
        stream = _as_int(args.get("stream"))
        if stream is None:
            stream = _as_int(ev.get("tid")) or 0
        nbytes = args.get("bytes")
        if nbytes is not None:
            if not _is_number(nbytes) or nbytes < 0 or not float(nbytes).is_integer():
                raise self._error(ev, f"args.bytes {nbytes!r} is not a whole number >= 0")
            nbytes = int(nbytes)
        g = GpuEvent(kind, name, device, stream, ts, dur, correlation=_as_int(args.get("correlation")),
                     nbytes=nbytes, **extra)
        if g.correlation is None:
            self.unlinked.append((g, (ev.get("pid"), ev.get("tid"), ts)))
        elif self.gpu_ids.setdefault(g.correlation, self.index) != self.index:
            self.shared_ids.append((g.correlation, self.index, name))
        return g


def _rank_of(path: Path, meta: dict, single_file: bool) -> tuple[int, str, int | None]:
    info = meta.get("distributedInfo")
    if isinstance(info, dict) and "rank" in info:
        world_size = _whole(info, "world_size", path, least=1) if "world_size" in info else None
        return _whole(info, "rank", path, least=0), "distributedInfo", world_size
    match = _RANK_IN_NAME_RE.search(path.name)
    if match:
        return int(match.group(1)), "file name", None
    if single_file:
        return 0, "assumed", None
    raise TrainsimError("cannot tell which rank this trace is: it has no distributedInfo and the file name "
                        "has no 'rank<N>' in it (rename it, e.g. trace_rank3.json.gz)", file=str(path))


def _whole(info: dict, key: str, path: Path, *, least: int) -> int:
    value = info[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise TrainsimError(f"should be a whole number >= {least}, got {value!r}", file=str(path),
                            field=f"distributedInfo.{key}")
    return value


def load_trace(path: str | Path, *, single_file: bool = True) -> KinetoTrace:
    """Read one Kineto trace file (plain JSON or gzip).

    The rank comes from ``distributedInfo``, else from ``rank<N>`` in the file name; a lone file without
    either is taken as rank 0, several such files are an error.
    """
    path = Path(path)
    collect = _Collector(str(path))
    meta = _read_document(path, collect)
    collect.link_flows()
    collect.check_correlations()
    name = str(path)
    if not collect.gpu:
        raise TrainsimError("the trace has no GPU events (kernels, memcpys, memsets): record it with "
                            "ProfilerActivity.CUDA", file=name)
    rank, rank_source, world_size = _rank_of(path, meta, single_file)
    if world_size is not None and rank >= world_size:
        raise TrainsimError(f"rank {rank} is outside world size {world_size}", file=name,
                            field="distributedInfo.rank")
    origin = collect.min_ts

    def rel(t: float) -> float:
        return (t - origin) * 1e-6

    for e in collect.cpu:
        e.ts, e.dur = rel(e.ts), e.dur * 1e-6
    for g in collect.gpu:
        g.ts, g.dur = rel(g.ts), g.dur * 1e-6
    for s in collect.steps:
        s.ts, s.dur = rel(s.ts), s.dur * 1e-6
    flows = {k: (pid, tid, rel(ts)) for k, (pid, tid, ts) in collect.flows.items()
             if isinstance(ts, int | float)}
    info = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    devices, device_memory = {}, {}
    for prop in meta.get("deviceProperties") or []:
        if isinstance(prop, dict) and _as_int(prop.get("id")) is not None:
            devices[_as_int(prop["id"])] = str(prop.get("name", ""))
            if _as_int(prop.get("totalGlobalMem")) is not None:
                device_memory[_as_int(prop["id"])] = _as_int(prop["totalGlobalMem"])
    base = _as_int(meta.get("baseTimeNanoseconds"))
    return KinetoTrace(
        path=name, rank=rank, rank_source=rank_source, world_size=world_size, origin_us=origin,
        base_time_ns=base, devices=devices, device_memory=device_memory,
        nccl_version=info.get("nccl_version"),
        process_groups=list(info.get("pg_config") or []),
        cpu_events=collect.cpu, gpu_events=collect.gpu, syncs=collect.syncs,
        steps=sorted(collect.steps, key=lambda s: s.ts), thread_names=collect.thread_names, flows=flows,
        span_s=rel(collect.max_end),
        profiler_overheads=sorted((rel(ts), dur * 1e-6) for ts, dur in collect.overheads),
        writer=meta["trainsim"] if isinstance(meta.get("trainsim"), dict) else None)


def load_traces(paths: Iterable[str | Path]) -> list[KinetoTrace]:
    """Read the per-rank files of one run, sorted by rank, and check that they belong together. A folder
    stands for the trace files in it (``*.json``, ``*.json.gz``), as HTA reads a run's folder."""
    paths = [f for p in paths for f in _trace_files(Path(p))]
    if not paths:
        raise TrainsimError("no trace files given")
    traces = [load_trace(p, single_file=len(paths) == 1) for p in paths]
    check_same_run(traces)
    align_clocks(traces)
    return sorted(traces, key=lambda t: t.rank)


def _trace_files(path: Path) -> list[Path]:
    if not path.is_dir():
        return [path]
    files = sorted(f for f in path.iterdir()
                   if f.is_file() and not f.name.startswith(".") and f.name.endswith((".json", ".json.gz")))
    if not files:
        raise TrainsimError("the folder has no trace files (*.json, *.json.gz)", file=str(path))
    return files


def align_clocks(traces: list[KinetoTrace]) -> None:
    """Put the ranks of one run on one time axis (the earliest rank's time 0), when every file carries
    wall-clock time; otherwise each rank keeps its own time 0."""
    origins = [t.wall_origin_us() for t in traces]
    if len(traces) < 2 or None in origins:
        return
    first = min(origins)
    for t, origin in zip(traces, origins, strict=True):
        if origin > first:
            t.shift((origin - first) * 1e-6)


def check_same_run(traces: list[KinetoTrace]) -> None:
    """Several files must be distinct ranks of one run, profiled at the same time."""
    if len(traces) < 2:
        return
    seen: dict[int, str] = {}
    for t in traces:
        if t.rank in seen:
            raise TrainsimError(f"rank {t.rank} appears twice ({seen[t.rank]} and {t.path}): traces from "
                                "different runs mixed together?", file=t.path)
        seen[t.rank] = t.path
    sizes = {t.world_size for t in traces if t.world_size is not None}
    if len(sizes) > 1:
        raise TrainsimError(f"traces from different runs mixed together: world sizes {sorted(sizes)}",
                            file=traces[-1].path)
    writers = {json.dumps(t.writer, sort_keys=True, default=str) if t.writer else None for t in traces}
    if len(writers) > 1:
        raise TrainsimError("traces from different runs mixed together: " + (
            "some were written by trainsim and some by a profiler" if None in writers else
            "they were written by different trainsim runs (their `trainsim` blocks differ)"),
            file=traces[-1].path)
    numbers = [sorted({s.number for s in t.steps}) for t in traces]
    if all(numbers) and not set.intersection(*map(set, numbers)):
        spans = ", ".join(f"rank {t.rank}: {n[0]}-{n[-1]}" for t, n in zip(traces, numbers, strict=True))
        raise TrainsimError(f"traces from different runs mixed together: no ProfilerStep number is in every "
                            f"file ({spans})", file=traces[-1].path)
    gpus = {name for t in traces for name in t.devices.values() if name}
    if len(gpus) > 1:
        raise TrainsimError(f"traces from different runs mixed together: GPUs {sorted(gpus)}",
                            file=traces[-1].path)
    nccl = {t.nccl_version for t in traces if t.nccl_version}
    if len(nccl) > 1:
        raise TrainsimError(f"traces from different runs mixed together: NCCL versions {sorted(nccl)}",
                            file=traces[-1].path)
    windows = [(t, t.wall_window_ns()) for t in traces]
    windows = [(t, w) for t, w in windows if w is not None]
    if len(windows) > 1:
        start = max(w[0] for _, w in windows)
        end = min(w[1] for _, w in windows)
        if start > end:
            late = max(windows, key=lambda tw: tw[1][0])[0]
            raise TrainsimError("traces from different runs mixed together: their recording windows do not "
                                "overlap in time", file=late.path)
