"""How much slower a compute kernel runs while an NCCL kernel is in flight: measured in real traces, and what
the simulator's interference model (`trainsim.sim.core.interference`) predicts for the same overlap.

The traces (the shared traces folder, public test data of Meta's HolisticTraceAnalysis):

- ``kineto-a100-ddp2-rank0.json.gz``: rank 0 of a 2-GPU DDP run on A100 (NCCL 2.17.1), 3 profiled steps,
  ring-LL all-reduces of 8 CTAs whose message sizes are recorded;
- ``v100-ddp2-rank1-cudagraph.json.gz``: rank 1 of a 2-GPU DDP job on V100, 6 steps, ring-LL all-reduces and
  Simple send/recv kernels of 2 CTAs, no message sizes.

Kineto records no input shapes there, so "the same kernel" is the same launch in each step: a kernel is
keyed by its name, grid, block and how many times that key came before it in its step (a step's kernels are
those whose launch, found through the correlation id, falls in its ``ProfilerStep``). DDP's collectives start
at the same layers every step but last a different time (they wait on the other rank), so some kernels are
overlapped by an NCCL kernel in one step and not in another: a paired comparison of one kernel with itself.
A kernel counts as overlapped when NCCL kernels cover all of it and as alone when none touches it; kernels
partly overlapped are left out.

Modelled: the NCCL kernels hold their ``grid`` CTAs (the trace's) of the GPU's SMs (its deviceProperties) and
ask HBM for 5(n-1)/n S bytes per rank (ring all-reduce, `trainsim.sim.collectives.footprint`) over their
duration, where S is recorded (else the HBM term is left out and said so); a kernel class's load (sm, hbm)
is (1, 0) for matrix work, (0, 1) for memory-bound work (layout transforms, normalisation, elementwise,
reductions, copies) and (0, 0) for kernels of at most 8 CTAs (a few microseconds: launch and latency, not
throughput). Nothing is fitted to these rows.

Run: python benchmarks/comm_compute_interference.py [TRACE ...] [--rows]
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import statistics
from collections import Counter
from pathlib import Path

from trainsim.sim.collectives.footprint import hbm_bytes
from trainsim.sim.core.devices import get_device, match_cuda_name
from trainsim.sim.core.interference import HBM_STREAM_FRACTION, MATRIX, STREAMING, factor

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
TRACES = [SHARED / "kineto-a100-ddp2-rank0.json.gz", SHARED / "v100-ddp2-rank1-cudagraph.json.gz"]
DTYPE_BYTES = {"Float": 4, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4}

CLASSES = [  # (class, pattern on the kernel name), first match wins
    ("reduction", r"reduce|Scan"),  # cuDNN's reduce_wgrad helper, split-K reductions, scans: memory-bound
    ("matrix", r"gemm|xmma|wgrad|dgrad|fprop|conv"),
    ("layout", r"nchwToNhwc|nhwcToNchw"),
    ("normalisation", r"bn_fw|bn_bw|batch_norm|layer_nor"),
    ("elementwise", r"elementwise|unrolled|Functor|epilogue|Copy"),
]
ORDER = ["matrix", "layout", "normalisation", "reduction", "elementwise", "other", "tiny"]
TINY_CTAS = 8  # kernels of at most this many CTAs: a few microseconds of launch and latency


def kernel_class(name: str, ctas: int) -> str:
    if ctas <= TINY_CTAS:
        return "tiny"
    for klass, pattern in CLASSES:
        if re.search(pattern, name, re.IGNORECASE):
            return klass
    return "other"


def model_load(klass: str):
    return {"matrix": MATRIX, "tiny": (0.0, 0.0)}.get(klass, STREAMING)


def ctas_of(event: dict) -> int:
    grid = event["args"].get("grid", [1, 1, 1])
    return grid[0] * grid[1] * grid[2]


def steps_of(events: list[dict]) -> list[dict]:
    """Per profiled step, its compute kernels keyed (name, grid, block, occurrence in the step)."""
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                   if e.get("name", "").startswith("ProfilerStep#") and e.get("cat") in ("user_annotation",
                                                                                         "cpu_op"))
    launched = {e["args"].get("correlation"): e["ts"] for e in events if e.get("cat") == "cuda_runtime"}
    keyed: list[dict] = [{} for _ in steps]
    seen = [Counter() for _ in steps]
    compute = sorted((e for e in events if e.get("cat") == "kernel" and "nccl" not in e["name"].lower()),
                     key=lambda e: e["ts"])
    for e in compute:
        t = launched.get(e["args"].get("correlation"))
        i = next((i for i, (a, b) in enumerate(steps) if t is not None and a <= t < b), None)
        if i is None:
            continue  # launched outside the profiled steps, or from a CUDA graph with no launch record
        key = (e["name"], tuple(e["args"].get("grid", ())), tuple(e["args"].get("block", ())))
        keyed[i][(*key, seen[i][key])] = e
        seen[i][key] += 1
    return keyed


def overlap(event: dict, intervals: list[tuple[float, float]]) -> float:
    start, end = event["ts"], event["ts"] + event["dur"]
    covered = sum(max(0.0, min(end, b) - max(start, a)) for a, b in intervals)
    return covered / event["dur"] if event["dur"] > 0 else 0.0


def analyse(path: Path, show_rows: bool) -> None:
    doc = json.load(gzip.open(path))
    events = doc["traceEvents"]
    props = (doc.get("deviceProperties") or [{}])[0]
    nccl = [e for e in events if e.get("cat") == "kernel" and "nccl" in e["name"].lower()]
    intervals = [(e["ts"], e["ts"] + e["dur"]) for e in nccl]
    sms = props.get("numSms", 108)
    device = match_cuda_name(props.get("name", ""), props.get("totalGlobalMem")) or get_device("a100-40gb")
    ctas = statistics.mode(ctas_of(e) for e in nccl)
    demands = []
    for e in nccl:
        a = e["args"]
        if "AllReduce" in e["name"] and "In msg nelems" in a:
            size = a["In msg nelems"] * DTYPE_BYTES.get(a.get("dtype"), 4)
            demands.append(hbm_bytes("allreduce", "ring", a["Group size"], size) / (e["dur"] * 1e-6))
    h = statistics.median(demands) / (device.memory_bandwidth * HBM_STREAM_FRACTION) if demands else 0.0
    s = (sms - ctas) / sms
    kinds = Counter(e["name"].split("(")[0] for e in nccl)
    print(f"# {path.name}: {props.get('name', '?')} ({device.name}, {sms} SMs); NCCL kernels "
          + ", ".join(f"{n} x {k}" for k, n in kinds.items()))
    first = nccl[0]["args"]
    print(f"# NCCL CTAs: {ctas} (grid), {first.get('block', ['?'])[0]} threads x "
          f"{first.get('registers per thread')} registers, {first.get('shared memory')} B shared memory each")
    hbm_note = (f"HBM demand {statistics.median(demands) / 1e9:.1f} GB/s = h {h:.3f} of the achievable "
                "bandwidth" if demands else "no message sizes recorded: HBM term left out (h = 0)")
    print(f"# model state while they run: s = ({sms} - {ctas}) / {sms} = {s:.3f} of the SMs left; {hbm_note}")

    keyed = steps_of(events)
    common = set.intersection(*(set(m) for m in keyed)) if keyed else set()
    print(f"# {len(keyed)} steps, {len(common)} kernel launches found in every step")
    rows = []
    for key in sorted(common, key=lambda k: keyed[0][k]["ts"]):
        same = [m[key] for m in keyed]
        fractions = [overlap(e, intervals) for e in same]
        over = [e["dur"] for e, f in zip(same, fractions, strict=True) if f >= 0.99]
        alone = [e["dur"] for e, f in zip(same, fractions, strict=True) if f == 0.0]
        if over and alone and statistics.mean(alone) > 0:
            klass = kernel_class(key[0], ctas_of(same[0]))
            rows.append((klass, statistics.mean(over), statistics.mean(alone), key[0], ctas_of(same[0])))
    if not rows:
        print("no kernel is overlapped in one step and alone in another\n")
        return
    modelled = {klass: factor(model_load(klass), (s, h)) for klass in {r[0] for r in rows}}
    if show_rows:
        print(f"\n{'class':<14} {'overlapped us':>13} {'alone us':>9} {'measured':>8} {'model':>6}  "
              "kernel (CTAs)")
        for klass, over, alone, name, n_ctas in sorted(rows, key=lambda r: (r[0], r[1] / r[2])):
            print(f"{klass:<14} {over:>13.1f} {alone:>9.1f} {over / alone:>8.3f} {modelled[klass]:>6.3f}  "
                  f"{name[:70]} ({n_ctas})")
    print(f"\n{'class':<14} {'pairs':>5} {'measured: median':>16} {'p25-p75':>13} {'time-weighted':>13} "
          f"{'modelled':>8}")
    for klass in [c for c in ORDER if any(r[0] == c for r in rows)] + ["all but tiny"]:
        sel = [r for r in rows if (r[0] == klass if klass != "all but tiny" else r[0] != "tiny")]
        if not sel:
            continue
        ratios = sorted(r[1] / r[2] for r in sel)
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        weighted = sum(r[1] for r in sel) / sum(r[2] for r in sel)
        model = sum(modelled[r[0]] * r[2] for r in sel) / sum(r[2] for r in sel)
        print(f"{klass:<14} {len(sel):>5} {statistics.median(ratios):>16.3f} {q[0]:>6.2f}-{q[2]:<6.2f} "
              f"{weighted:>13.3f} {model:>8.3f}")
    print()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*", type=Path, default=TRACES)
    parser.add_argument("--rows", action="store_true", help="print every paired kernel")
    args = parser.parse_args()
    for path in args.traces:
        if not path.exists():
            print(f"# {path.name}: not found (the shared traces folder); left out\n")
            continue
        analyse(path, args.rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
