"""Flat records of a simulated run: one row per op or transfer (pandas-ready CSV).

Columns (`COLUMNS`): ``iteration`` (-1 when a flow's tag names none), ``kind`` (gpu | host | flow),
``resource`` (GPU or cpu socket; the first link's source for flows), ``stream`` (compute, h2d, d2h, comm,
data, cores; for flows the op that started them), ``op``, ``layer``, ``category`` (the breakdown class or
empty), ``start_s``, ``end_s``, ``duration_s``, ``bytes``, ``peer``, ``route`` (``a->b->c``).

``pandas.read_csv(path)`` gives a DataFrame; ``records(result)`` gives the same rows as dicts.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from trainsim.files import write_atomic

COLUMNS = (
    "iteration",
    "kind",
    "resource",
    "stream",
    "op",
    "layer",
    "category",
    "start_s",
    "end_s",
    "duration_s",
    "bytes",
    "peer",
    "route",
)


def _route(route) -> str:
    if not route:
        return ""
    return "->".join([route[0][0], *(edge[1] for edge in route)])


def _num(x: float) -> str:
    return repr(float(x)) if x != int(x) or abs(x) >= 1e16 else str(int(x))


def _tag_parts(tag) -> tuple[int, str]:
    """Flows are tagged "it<N>:<op>..." by the simulator (collectives append their own detail)."""
    text = str(tag)
    head, _, rest = text.partition(":")
    if head.startswith("it") and head[2:].isdigit():
        return int(head[2:]), rest
    return -1, text


def records(result) -> list[dict]:
    """Every op of every GPU and host, then every flow, in time order."""
    machine = result.machine
    if machine is None:
        raise ValueError("the result carries no machine (simulate with record=True)")
    rows = []
    for op in machine.ops:
        rows.append(
            {
                "iteration": op.iteration,
                "kind": "gpu" if op.resource in machine.gpus else "host",
                "resource": op.resource,
                "stream": op.stream,
                "op": op.op,
                "layer": op.layer or "",
                "category": op.category or "",
                "start_s": op.start,
                "end_s": op.end,
                "duration_s": op.end - op.start,
                "bytes": op.nbytes,
                "peer": op.peer or "",
                "route": _route(op.route),
            }
        )
    for rec in machine.net.records or []:
        iteration, what = _tag_parts(rec.tag)
        rows.append(
            {
                "iteration": iteration,
                "kind": "flow",
                "resource": rec.route[0][0] if rec.route else "",
                "stream": what.split(":")[0],
                "op": what,
                "layer": "",
                "category": "",
                "start_s": rec.started,
                "end_s": rec.finished,
                "duration_s": rec.finished - rec.started,
                "bytes": rec.nbytes,
                "peer": "",
                "route": _route(rec.route),
            }
        )
    rows.sort(key=lambda r: (r["start_s"], r["end_s"], r["kind"], r["resource"], r["stream"], r["op"]))
    return rows


def to_csv(result) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in records(result):
        writer.writerow([_num(row[c]) if isinstance(row[c], float) else row[c] for c in COLUMNS])
    return out.getvalue()


def write_records(result, path: str | Path) -> None:
    """Write the CSV atomically."""
    write_atomic(path, to_csv(result).encode())
