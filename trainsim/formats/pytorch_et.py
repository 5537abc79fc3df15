"""PyTorch execution traces (the JSON ``ExecutionTraceObserver`` writes) linked to their Kineto traces.

An execution trace (ET) records every operator a process ran, its parent (``ctrl_deps``), its input and
output tensors (by id: data dependencies) and its record-function id (attribute ``rf_id``); it has no
durations and no GPU work. The profiler's Kineto trace of the same run has both: each operator and
annotation carries the same id as ``args["Record function id"]``, and the GPU work links to the runtime
call that launched it by its ``correlation``. Linking the two is Chakra's ``chakra_trace_link`` and the
place its users most often trip: recorded with ``torch.profiler.profile(execution_trace_observer=...)``
both cover the same steps and the ids match.

`link` pairs each ET operator with the Kineto operator of its ``rf_id`` (where the Kineto trace has no such
ids, older PyTorch, with the next Kineto operator of the same name on the same thread), and refuses two
traces of different runs: other process ids, or operators whose ids name other operators, or too few that
link. The result is one rank's nodes for `trainsim.sim.replay.chakra_graph.graph_from_nodes`:

- a CPU node per top-level operator (a child of a ``ProfilerStep#N`` or of a thread), at its Kineto time,
  depending on the earlier top-level operators whose outputs (or their children's) it reads;
- a step per ``ProfilerStep#N``;
- a GPU node per kernel, memcpy and memset, on its stream, depending on the top-level operator whose
  runtime call launched it.
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from trainsim.errors import TrainsimError
from trainsim.formats.chakra import EtNode
from trainsim.formats.collectives import collective_from_args

_SCHEMA_RE = re.compile(rb'"schema"\s*:\s*"([^"]*chakra[^"]*)"')
_STEP_RE = re.compile(r"^ProfilerStep#\d+$")
_RANK_RE = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
LINKED_SHARE = 0.9          # of the ET's top-level operators that must find their Kineto operator
_ROOTS = ("[pytorch|profiler|execution_trace|process]", "[pytorch|profiler|execution_trace|thread]")
_GPU_KIND = {"kernel": "kernel", "gpu_memcpy": "memcpy", "memcpy": "memcpy", "gpu_memset": "memset",
             "memset": "memset"}
_COPY = {"HtoD": "H2D", "DtoH": "D2H", "DtoD": "D2D", "PtoP": "P2P"}


def _head(path: Path, size: int = 4096) -> bytes:
    try:
        with open(path, "rb") as fh:
            raw = fh.read(2)
        opener = gzip.open if raw == b"\x1f\x8b" else open
        with opener(path, "rb") as fh:
            return fh.read(size)
    except (OSError, EOFError):
        return b""


def is_pytorch_et(path: str | Path) -> bool:
    """Whether ``path`` is a PyTorch execution trace (its ``schema`` names Chakra: ``1.1.1-chakra.0.0.4``)."""
    path = Path(path)
    return path.is_file() and _SCHEMA_RE.search(_head(path)) is not None


def load_et(path: str | Path) -> dict:
    """The ET's JSON object, checked for what linking needs: ``nodes`` with ids and ``rf_id``s."""
    path = Path(path)
    try:
        opener = gzip.open if _head(path, 2) == b"\x1f\x8b" else open
        with opener(path, "rt", encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TrainsimError(f"not a PyTorch execution trace: {exc}", file=str(path)) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
        raise TrainsimError("not a PyTorch execution trace: no 'nodes' list", file=str(path))
    for i, n in enumerate(doc["nodes"]):
        if not isinstance(n, dict) or not isinstance(n.get("id"), int) or not isinstance(n.get("name"), str):
            raise TrainsimError("a node without a whole-number id or a name: the trace is damaged",
                                file=str(path), field=f"nodes[{i}]")
    return doc


def _attr(node: dict, name: str):
    for a in node.get("attrs") or []:
        if isinstance(a, dict) and a.get("name") == name:
            return a.get("value")
    return node.get(name)


@dataclass
class KinetoSide:
    """What linking needs of a Kineto trace (times in microseconds as written)."""

    path: str
    ops: list[dict] = field(default_factory=list)          # cpu_op and user_annotation events
    calls: dict[int, dict] = field(default_factory=dict)    # correlation -> runtime call
    gpu: list[dict] = field(default_factory=list)
    meta: dict = field(default_factory=dict)


def read_kineto(path: str | Path) -> KinetoSide:
    """The operators, runtime calls and GPU events of a Kineto trace, for linking."""
    from trainsim.formats.kineto import _read_document

    side = KinetoSide(str(path))

    def on_event(_index: int, ev: dict) -> None:
        if ev.get("ph") != "X" or not isinstance(ev.get("ts"), int | float):
            return
        cat = str(ev.get("cat", "")).lower()
        args = ev.get("args") or {}
        if cat in ("cpu_op", "operator", "user_annotation"):
            side.ops.append(ev)
        elif cat in ("cuda_runtime", "runtime", "cuda_driver") and args.get("correlation") is not None:
            side.calls[args["correlation"]] = ev
        elif cat in _GPU_KIND:
            side.gpu.append(ev)

    side.meta = _read_document(Path(path), on_event)
    return side


@dataclass
class Linked:
    """One rank's linked trace: the nodes `graph_from_nodes` replays."""

    path: str
    rank: int
    world_size: int | None
    nodes: list
    devices: dict[int, str]
    linked: int                     # top-level ET operators with their Kineto times
    unlinked: int


def _tensor_ids(io: dict) -> set:
    """Tensor ids among an ET node's inputs or outputs (a tensor's value is [id, storage, offset, numel,
    itemsize, device]; lists of tensors hold several)."""
    out = set()
    values, types = io.get("values") or [], io.get("types") or []
    for value, kind in zip(values, types, strict=False):
        if not isinstance(kind, str) or "Tensor" not in kind:
            continue
        items = value if kind.startswith("GenericList") else [value]
        for v in items:
            if isinstance(v, list) and len(v) == 6 and isinstance(v[0], int):
                out.add((v[0], v[1]))
    return out


def link(et_path: str | Path, kineto_path: str | Path) -> Linked:
    """One rank's ET and Kineto trace, linked (see the module doc); errors name the file and what is wrong."""
    et_path, kineto_path = Path(et_path), Path(kineto_path)
    doc = load_et(et_path)
    side = read_kineto(kineto_path)
    nodes = doc["nodes"]
    by_id = {n["id"]: n for n in nodes}
    parent = {n["id"]: n.get("ctrl_deps") for n in nodes}
    kineto_pids = {ev.get("pid") for ev in side.ops if isinstance(ev.get("pid"), int)}
    if isinstance(doc.get("pid"), int) and kineto_pids and doc["pid"] not in kineto_pids:
        raise TrainsimError(f"the execution trace and the Kineto trace {kineto_path} are of different runs: "
                            f"process {doc['pid']} here, {sorted(kineto_pids)} there", file=str(et_path))
    roots = {n["id"] for n in nodes if n["name"] in _ROOTS}
    steps = [n for n in nodes if _STEP_RE.match(n["name"])]
    step_ids = {n["id"] for n in steps}
    top = [n for n in nodes if n["id"] not in roots and n["id"] not in step_ids
           and (parent.get(n["id"]) in roots or parent.get(n["id"]) in step_ids)]
    if not top:
        raise TrainsimError("the execution trace holds no operator", file=str(et_path))

    # link by record-function id, else by name in order per thread
    by_rf: dict = {}
    for ev in side.ops:
        rf = (ev.get("args") or {}).get("Record function id")
        if rf is not None:
            by_rf[rf] = ev
    kineto_of: dict[int, dict] = {}
    wanted = top + steps
    if by_rf:
        mismatched = []
        for n in wanted:
            ev = by_rf.get(_attr(n, "rf_id"))
            if ev is None:
                continue
            if ev.get("name") != n["name"]:
                mismatched.append((n, ev))
            else:
                kineto_of[n["id"]] = ev
        if mismatched:
            n, ev = mismatched[0]
            raise TrainsimError(
                f"the execution trace and the Kineto trace {kineto_path} are of different runs: "
                f"record-function id {_attr(n, 'rf_id')} is {n['name']!r} here and {ev.get('name')!r} there "
                f"({len(mismatched)} such operators)", file=str(et_path))
    else:
        queues: dict[str, list[dict]] = defaultdict(list)
        for ev in sorted(side.ops, key=lambda e: e["ts"]):
            queues[ev.get("name")].append(ev)
        used: dict[str, int] = defaultdict(int)
        for n in sorted(wanted, key=lambda n: n["id"]):
            q = queues.get(n["name"], [])
            if used[n["name"]] < len(q):
                kineto_of[n["id"]] = q[used[n["name"]]]
                used[n["name"]] += 1
    linked_top = [n for n in top if n["id"] in kineto_of]
    if len(linked_top) < LINKED_SHARE * len(top):
        raise TrainsimError(
            f"the execution trace and the Kineto trace {kineto_path} are of different runs (or of different "
            f"steps): only {len(linked_top)} of the execution trace's {len(top)} top-level operators have a "
            "Kineto operator with their record-function id and name; record both in one "
            "torch.profiler.profile(execution_trace_observer=...)", file=str(et_path))

    origin = min([kineto_of[n["id"]]["ts"] for n in linked_top]
                 + [ev["ts"] for ev in side.gpu], default=0.0)

    def sec(us: float) -> float:
        return (us - origin) * 1e-6

    # the top-level operator each ET node belongs to; data dependencies through tensors
    top_of: dict[int, int] = {}
    top_ids = {n["id"] for n in linked_top}
    for n in nodes:
        k, seen = n["id"], 0
        while k is not None and k not in top_ids and seen < 10_000:
            nxt = parent.get(k)
            k, seen = (None if nxt == k else nxt), seen + 1
        if k in top_ids:
            top_of[n["id"]] = k
    produced: dict = {}
    deps: dict[int, set] = defaultdict(set)
    for n in sorted(nodes, key=lambda n: n["id"]):
        owner = top_of.get(n["id"])
        if owner is None:
            continue
        for t in _tensor_ids(n.get("inputs") or {}):
            src = produced.get(t)
            if src is not None and src != owner:
                deps[owner].add(src)
        for t in _tensor_ids(n.get("outputs") or {}):
            produced.setdefault(t, owner)
    out: list = []
    spans: dict[tuple, list[tuple[float, float, int]]] = defaultdict(list)
    for n in linked_top + [s for s in steps if s["id"] in kineto_of]:
        ev = kineto_of[n["id"]]
        thread = (ev.get("pid"), ev.get("tid"))
        node = EtNode(n["id"], n["name"], True, ev.get("dur", 0.0) * 1e-6, start=sec(ev["ts"]),
                      deps=sorted(d for d in deps.get(n["id"], ()) if d in kineto_of
                                  and kineto_of[d]["ts"] <= ev["ts"]), thread=thread)
        out.append(node)
        if n["id"] in top_ids:
            spans[thread].append((ev["ts"], ev["ts"] + ev.get("dur", 0.0), n["id"]))
    for lst in spans.values():
        lst.sort()
    next_id = max(by_id) + 1
    devices = {}
    for prop in side.meta.get("deviceProperties") or []:
        if isinstance(prop, dict) and isinstance(prop.get("id"), int):
            devices[prop["id"]] = str(prop.get("name", ""))
    for ev in sorted(side.gpu, key=lambda e: e["ts"]):
        args = ev.get("args") or {}
        call = side.calls.get(args.get("correlation"))
        launcher = None
        if call is not None:
            lst = spans.get((call.get("pid"), call.get("tid")), [])
            k = bisect.bisect_right(lst, (call["ts"], float("inf"), 0)) - 1
            if k >= 0 and lst[k][0] <= call["ts"] <= lst[k][1]:
                launcher = lst[k][2]
        cat = str(ev.get("cat", "")).lower()
        name = str(ev.get("name", ""))
        collective = collective_from_args(args, name) if name.startswith("nccl") else None
        copy = next((c for w, c in _COPY.items() if w in name), None)
        node = EtNode(next_id, name, False, ev.get("dur", 0.0) * 1e-6, start=sec(ev["ts"]),
                      deps=[launcher] if launcher is not None else [],
                      device=int(args.get("device", 0) or 0), stream=int(args.get("stream", 0) or 0),
                      kind="collective" if collective else _GPU_KIND[cat], collective=collective,
                      nbytes=args.get("bytes"), copy_kind=copy, correlation=args.get("correlation"))
        next_id += 1
        out.append(node)
    info = side.meta.get("distributedInfo") if isinstance(side.meta.get("distributedInfo"), dict) else {}
    rank = info.get("rank")
    if not isinstance(rank, int):
        match = _RANK_RE.search(kineto_path.name) or _RANK_RE.search(et_path.name)
        rank = int(match.group(1)) if match else 0
    return Linked(str(et_path), rank, info.get("world_size"), out, devices, len(linked_top),
                  len(top) - len(linked_top))


def link_files(ets: list[Path], kinetos: list[Path]) -> list[Linked]:
    """Each ET with its Kineto trace (by process id where there are several), one rank each, by rank."""
    if not kinetos:
        raise TrainsimError("a PyTorch execution trace has no durations and no GPU work: give its Kineto "
                            "trace too (the profiler's trace of the same run)", file=str(ets[0]))
    if len(ets) != len(kinetos):
        raise TrainsimError(f"{len(ets)} execution trace(s) and {len(kinetos)} Kineto trace(s): give one of "
                            "each per rank", file=str(ets[0]))
    pairs = list(zip(ets, kinetos, strict=True))
    if len(ets) > 1:
        pids = {}
        for k in kinetos:
            side = read_kineto(k)
            for ev in side.ops:
                if isinstance(ev.get("pid"), int):
                    pids[ev["pid"]] = k
                    break
        pairs = []
        for e in ets:
            pid = load_et(e).get("pid")
            if pid not in pids:
                raise TrainsimError(f"no Kineto trace given is of this execution trace's process {pid}",
                                    file=str(e))
            pairs.append((e, pids[pid]))
    linked = [link(e, k) for e, k in pairs]
    seen: dict[int, str] = {}
    for r in linked:
        if r.rank in seen:
            raise TrainsimError(f"rank {r.rank} appears twice ({seen[r.rank]} and {r.path})", file=r.path)
        seen[r.rank] = r.path
    return sorted(linked, key=lambda r: r.rank)
