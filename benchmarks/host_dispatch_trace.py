"""The simulator's host-dispatch model (`sim/compute/dispatch.py`) against a real GPU step's own timeline.

    python benchmarks/host_dispatch_trace.py [--chunks 1,4,16,64,0] [--json]

`simulate` times a rank's passes with the host's dispatch of each layer and the GPU's work for it
(`dispatch.gpu_spans`): a layer starts once the GPU is free and its dispatch has begun, and ends no earlier
than its dispatch. This checks that rule, and the coarseness of one figure per layer, on the two H200 steps
kept in `tests/data/traces-h200` (ResNet-50, whose traced step the host bounds, and GPT-2 small, which the GPU
bounds):

- the units are the top-level ops of the forward (the training loop's thread, up to the first op of
  autograd's thread) and of the backward (autograd's thread), between the batch's load and the optimizer step;
- a unit's host time runs from the end of the unit before it to its own end (the Python between ops
  included), its GPU time is the kernels, memsets and copies launched inside it;
- ``gpu_spans`` over the units, ``--chunks`` at a time (a layer stands for several ops; 0: one chunk per
  pass), from when the first unit starts and the GPU is free, gives the end of the passes' GPU work, which
  the trace records (the last of those kernels to end). Beside it, the GPU's work alone, back to back, as
  `simulate` charged it before it modelled the host.

The figures are the traced step's: the profiler slows the host (`benchmarks/replay_untraced.py`), and the
check is whether the rule reproduces the timeline the host and the GPU made together.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from trainsim.formats.kineto import KinetoTrace, load_traces
from trainsim.sim.compute.dispatch import gpu_spans

ROOT = Path(__file__).resolve().parent.parent
TRACES = {"resnet50": ROOT / "tests/data/traces-h200/resnet50-fp32-step.json.gz",
          "gpt2-small": ROOT / "tests/data/traces-h200/gpt2-small-fp32-step.json.gz"}


def _top_level(events: list) -> list:
    """The events not nested inside another of the list (sorted by start)."""
    out, end = [], float("-inf")
    for e in sorted(events, key=lambda e: (e.ts, -e.dur)):
        if e.ts >= end:
            out.append(e)
            end = e.ts + e.dur
    return out


def units(trace: KinetoTrace) -> tuple[list[dict], float, float]:
    """The passes' units in host order (pass, host s, GPU s, GPU end), when the forward's first op starts,
    and when the GPU is free of the work launched before it."""
    main = trace.steps[0].tid
    notes = {e.name.split("#")[0]: e for e in trace.cpu_events if e.kind == "annotation"}
    begin = notes["enumerate(DataLoader)"].ts + notes["enumerate(DataLoader)"].dur
    stop = notes["Optimizer.step"].ts
    ops = [e for e in trace.cpu_events if e.kind == "cpu_op" and begin <= e.ts < stop]
    backward_tid = next(e.tid for e in sorted(ops, key=lambda e: e.ts) if e.tid != main)
    first_backward = min(e.ts for e in ops if e.tid == backward_tid)
    forward = _top_level([e for e in ops if e.tid == main and e.ts + e.dur <= first_backward])
    backward = _top_level([e for e in ops if e.tid == backward_tid])
    runtime = [e for e in trace.cpu_events if e.kind == "runtime" and e.correlation is not None]
    gpu = {g.correlation: g for g in trace.gpu_events if g.correlation is not None}
    out, host_end = [], forward[0].ts
    for name, unit_ops in (("forward", forward), ("backward", backward)):
        for op in unit_ops:
            launched = [gpu[r.correlation] for r in runtime
                        if r.tid == op.tid and op.ts <= r.ts < op.ts + op.dur and r.correlation in gpu]
            end = op.ts + op.dur
            out.append({"pass": name, "host": end - host_end, "gpu": sum(g.dur for g in launched),
                        "gpu_end": max((g.ts + g.dur for g in launched), default=None)})
            host_end = end
    before = [g.ts + g.dur for g in trace.gpu_events if g.ts < forward[0].ts]
    return out, forward[0].ts, max([forward[0].ts, *before])


def predicted_end(unit_list: list[dict], start: float, gpu_free: float, chunk: int) -> float:
    """The end of the passes' GPU work by `gpu_spans`, ``chunk`` units per step (0: one per pass)."""
    host, work = [], []
    for name in ("forward", "backward"):
        part = [u for u in unit_list if u["pass"] == name]
        size = chunk or len(part)
        for i in range(0, len(part), size):
            host.append(sum(u["host"] for u in part[i:i + size]))
            work.append(sum(u["gpu"] for u in part[i:i + size]))
    spans, _ = gpu_spans(gpu_free, start, work, host)
    return spans[-1][1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", default="1,4,16,64,0", help="units per step of the model (0: per pass)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    chunks = [int(c) for c in args.chunks.split(",")]
    rows = []
    for model, path in TRACES.items():
        unit_list, begin, gpu_free = units(load_traces([path])[0])
        measured = max(u["gpu_end"] for u in unit_list if u["gpu_end"] is not None)
        passes = ("forward", "backward")
        rows.append({
            "model": model, "units": len(unit_list),
            "host_ms": {p: 1e3 * sum(u["host"] for u in unit_list if u["pass"] == p) for p in passes},
            "gpu_ms": {p: 1e3 * sum(u["gpu"] for u in unit_list if u["pass"] == p) for p in passes},
            "measured_ms": 1e3 * (measured - begin),
            "predicted_ms": {str(c): 1e3 * (predicted_end(unit_list, begin, gpu_free, c) - begin)
                             for c in chunks},
            # what simulate charged before it modelled the host: the GPU's work back to back
            "gpu_alone_ms": 1e3 * (gpu_free - begin + sum(u["gpu"] for u in unit_list))})
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for row in rows:
        print(f"{row['model']}: {row['units']} units; host forward {row['host_ms']['forward']:.2f} ms, "
              f"backward {row['host_ms']['backward']:.2f} ms; GPU forward {row['gpu_ms']['forward']:.2f} ms, "
              f"backward {row['gpu_ms']['backward']:.2f} ms")
        print(f"  the passes' GPU work ends (traced) {row['measured_ms']:8.2f} ms after the forward's 1st op")
        for chunk, value in row["predicted_ms"].items():
            label = "one step per pass" if chunk == "0" else f"{chunk} op(s) per step"
            error = 100 * (value - row["measured_ms"]) / row["measured_ms"]
            print(f"  model, {label:>17}: {value:8.2f} ms ({error:+.1f} %)")
        error = 100 * (row["gpu_alone_ms"] - row["measured_ms"]) / row["measured_ms"]
        print(f"  the GPU's work alone:    {row['gpu_alone_ms']:8.2f} ms ({error:+.1f} %)")


if __name__ == "__main__":
    main()
