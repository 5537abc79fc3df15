"""Wall time and peak memory of importing and replaying a Kineto trace.

    python benchmarks/replay_import.py [TRACE] [--repeat N]

TRACE defaults to the shared A100 trace (../shared/traces beside the repository). ``--repeat N`` also
measures a trace N times longer, made by repeating the trace's events shifted in time (fresh
correlation ids per copy), to show how cost grows with trace size.

Figures: wall time of each phase (without tracing overhead), the peak of Python allocations during
import+replay (tracemalloc, a second run), and the process's peak RSS. The machine's load shows in the
wall times; compare runs on an idle machine.
"""

from __future__ import annotations

import argparse
import gzip
import json
import resource
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from trainsim.formats.kineto import load_trace
from trainsim.sim.replay.engine import replay
from trainsim.sim.replay.trace_graph import build_graph
from trainsim.sim.replay.whatif import WhatIf, collective_check, memcpy_check
from trainsim.traces import load_checked_topology, whatif_model

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces" / "kineto-a100-ddp2-rank0.json.gz"


def phases(path: Path) -> dict:
    t0 = time.perf_counter()
    trace = load_trace(path)
    t1 = time.perf_counter()
    graph = build_graph(trace)
    t2 = time.perf_counter()
    result = replay([graph])
    t3 = time.perf_counter()
    replay([graph], op_time=whatif_model([graph], WhatIf(topology="dgx-a100", gpu="h100-sxm")))
    t4 = time.perf_counter()
    collective_check([graph], load_checked_topology("dgx-a100", "--topology"))
    memcpy_check([graph], load_checked_topology("dgx-a100", "--topology"))
    t5 = time.perf_counter()
    errors = [abs(s.error_pct) for s in result.steps]
    return {"import_s": t1 - t0, "graph_s": t2 - t1, "replay_s": t3 - t2, "total_s": t3 - t0,
            "whatif_s": t4 - t3, "checks_s": t5 - t4,
            "events": len(trace.cpu_events) + len(trace.gpu_events), "steps": len(result.steps),
            "max_step_error_pct": max(errors) if errors else None}


def peak_python_bytes(path: Path) -> int:
    tracemalloc.start()
    replay([build_graph(load_trace(path))])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def repeated(path: Path, copies: int, out: Path) -> Path:
    """The trace's events `copies` times, each copy shifted past the previous one, ids made unique."""
    with gzip.open(path, "rt") if path.name.endswith(".gz") else open(path) as fh:
        doc = json.load(fh)
    events = doc.pop("traceEvents")
    timed = [e for e in events if isinstance(e.get("ts"), int | float)]
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - min(e["ts"] for e in timed)
    out_events = []
    for k in range(copies):
        shift, id_shift = k * (span + 1000.0), k * 10_000_000
        for e in events:
            e2 = dict(e)
            if isinstance(e2.get("ts"), int | float):
                e2["ts"] = e2["ts"] + shift
            if e2.get("ph") in ("s", "f") and isinstance(e2.get("id"), int):
                e2["id"] += id_shift
            if isinstance(e2.get("args"), dict) and "correlation" in e2["args"]:
                e2["args"] = dict(e2["args"], correlation=e2["args"]["correlation"] + id_shift)
            if str(e2.get("name", "")).startswith("ProfilerStep#"):
                e2["name"] = f"ProfilerStep#{int(e2['name'].split('#')[1]) + 100 * k}"
            if k == 0 or e2.get("ph") != "M":
                out_events.append(e2)
    doc["traceEvents"] = out_events
    with gzip.open(out, "wt") as fh:
        json.dump(doc, fh)
    return out


def report(label: str, path: Path) -> None:
    figures = phases(path)
    peak = peak_python_bytes(path)
    size = path.stat().st_size
    print(f"{label}: {size / 1e6:.1f} MB on disk, {figures['events']} events, {figures['steps']} steps")
    print(f"  import {figures['import_s']:.2f} s, graph {figures['graph_s']:.2f} s, replay "
          f"{figures['replay_s']:.2f} s, total {figures['total_s']:.2f} s; what-if replay (dgx-a100, "
          f"h100-sxm) {figures['whatif_s']:.2f} s, checks {figures['checks_s']:.2f} s")
    print(f"  peak Python allocations {peak / 1e6:.1f} MB; "
          f"max step error {figures['max_step_error_pct']:.3f} %")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", type=Path, default=SHARED)
    parser.add_argument("--repeat", type=int, default=0, help="also measure a trace this many times longer")
    args = parser.parse_args()
    if not args.trace.exists():
        sys.exit(f"no trace at {args.trace}")
    report(args.trace.name, args.trace)
    if args.repeat > 1:
        with tempfile.TemporaryDirectory() as tmp:
            big = repeated(args.trace, args.repeat, Path(tmp) / "repeated.json.gz")
            report(f"{args.trace.name} x{args.repeat}", big)
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"peak RSS of this process {rss_kb / 1e3:.0f} MB (includes the --repeat generator)")


if __name__ == "__main__":
    main()
