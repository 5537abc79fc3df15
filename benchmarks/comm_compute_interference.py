"""How much slower a compute kernel runs while an NCCL kernel is in flight: measured in a real trace, and what
the simulator's interference model (`trainsim.sim.core.interference`) predicts for the same overlap.

The trace: ``kineto-a100-ddp2-rank0.json.gz`` (rank 0 of a 2-GPU DDP run on A100, NCCL 2.17.1, three
profiled steps; the shared traces folder). Kineto records no input shapes there, so "the same kernel" is the
same kernel at the same position of each step: the k-th compute kernel of every step is the same layer's
same launch (the three steps' kernel names agree position by position, which the script checks). DDP's
all-reduces start at the same layers every step but last 2.1-6.0 ms (they wait on the other rank), so some
kernels are overlapped by an all-reduce in one step and not in another: a paired comparison of one kernel
with itself. A kernel counts as overlapped when an all-reduce covers all of it and as alone when none
touches it; kernels partly overlapped are left out.

Modelled: the NCCL kernel holds ``grid`` CTAs (the trace's, 8) of the A100's 108 SMs and asks HBM for 5(n-1)/n
S bytes per rank (ring all-reduce, `trainsim.sim.collectives.footprint`) over its duration; a kernel class's
load (sm, hbm) is (1, 0) for matrix work, (0, 1) for memory-bound work (layout transforms, normalisation,
elementwise, reductions) and (0, 0) for kernels of at most 8 CTAs (a few microseconds: launch and latency,
not throughput). Nothing is fitted to these rows.

Run: python benchmarks/comm_compute_interference.py [TRACE] [--rows]
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import statistics
from pathlib import Path

from trainsim.sim.collectives.footprint import hbm_bytes
from trainsim.sim.core.devices import get_device
from trainsim.sim.core.interference import HBM_STREAM_FRACTION, MATRIX, STREAMING, factor

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "traces" / "kineto-a100-ddp2-rank0.json.gz"
DTYPE_BYTES = {"Float": 4, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4}

CLASSES = [  # (class, pattern on the kernel name), first match wins
    ("reduction", r"reduce"),  # cuDNN's reduce_wgrad helper and split-K reductions: memory-bound
    ("matrix", r"gemm|xmma|wgrad|dgrad|fprop|conv"),
    ("layout", r"nchwToNhwc|nhwcToNchw"),
    ("normalisation", r"bn_fw|bn_bw|batch_norm|layer_norm"),
    ("elementwise", r"elementwise|unrolled|Functor"),
]
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


def load(path: Path):
    doc = json.load(gzip.open(path))
    events = doc["traceEvents"]
    props = (doc.get("deviceProperties") or [{}])[0]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    allreduce = [e for e in kernels if "AllReduce" in e["name"]]
    compute = sorted((e for e in kernels if "nccl" not in e["name"].lower()), key=lambda e: e["ts"])
    starts = sorted(e["ts"] for e in events if e.get("cat") == "gpu_user_annotation"
                    and e["name"].startswith("DistributedDataParallel.forward"))  # one per step, on the GPU
    ends = starts[1:] + [float("inf")]
    steps = [[e for e in compute if a <= e["ts"] < b] for a, b in zip(starts, ends, strict=True)]
    return props, allreduce, steps


def overlap(event: dict, intervals: list[tuple[float, float]]) -> float:
    start, end = event["ts"], event["ts"] + event["dur"]
    covered = sum(max(0.0, min(end, b) - max(start, a)) for a, b in intervals)
    return covered / event["dur"] if event["dur"] > 0 else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", type=Path, default=TRACE)
    parser.add_argument("--rows", action="store_true", help="print every paired kernel")
    args = parser.parse_args()
    props, allreduce, steps = load(args.trace)
    sms = props.get("numSms", 108)
    device = get_device("a100-40gb")  # A100-PG509-200: an A100 SXM4 40 GB board
    intervals = [(e["ts"], e["ts"] + e["dur"]) for e in allreduce]

    # the NCCL kernels: CTAs, threads, and the HBM demand the model gives them
    ctas = statistics.mode(ctas_of(e) for e in allreduce)
    demands = []
    for e in allreduce:
        a = e["args"]
        size = a["In msg nelems"] * DTYPE_BYTES.get(a.get("dtype"), 4)
        demands.append(hbm_bytes("allreduce", "ring", a["Group size"], size) / (e["dur"] * 1e-6))
    h = statistics.median(demands) / (device.memory_bandwidth * HBM_STREAM_FRACTION)
    s = (sms - ctas) / sms
    block = allreduce[0]["args"].get("block")
    print(f"# {args.trace.name}: {len(steps)} steps, {len(allreduce)} NCCL all-reduces "
          f"({allreduce[0]['name'].split('(')[0]})")
    print(f"# NCCL kernel: grid {ctas} CTAs x {block[0]} threads, "
          f"{allreduce[0]['args'].get('registers per thread')} registers/thread, "
          f"{allreduce[0]['args'].get('shared memory')} B shared memory; {sms} SMs")
    print(f"# model state while it runs: s = ({sms} - {ctas}) / {sms} = {s:.3f} of the SMs left; HBM demand "
          f"{statistics.median(demands) / 1e9:.1f} GB/s = h {h:.3f} of {device.name}'s achievable bandwidth")

    n = min(len(step) for step in steps)
    names_agree = all(len({step[k]["name"] for step in steps}) == 1 for k in range(n))
    print(f"# kernels per step {[len(step) for step in steps]}; names agree position by position: "
          f"{names_agree}")
    if not names_agree:
        print("the steps' kernels do not line up: no paired comparison")
        return 1

    rows = []
    for k in range(n):
        same = [step[k] for step in steps]
        fractions = [overlap(e, intervals) for e in same]
        over = [e["dur"] for e, f in zip(same, fractions, strict=True) if f >= 0.99]
        alone = [e["dur"] for e, f in zip(same, fractions, strict=True) if f == 0.0]
        if over and alone:
            klass = kernel_class(same[0]["name"], ctas_of(same[0]))
            rows.append((klass, statistics.mean(over), statistics.mean(alone), same[0]["name"],
                         ctas_of(same[0])))

    modelled = {klass: factor(model_load(klass), (s, h)) for klass in {r[0] for r in rows}}
    if args.rows:
        print(f"\n{'class':<14} {'overlapped us':>13} {'alone us':>9} {'measured':>8} {'model':>6}  "
              "kernel (CTAs)")
        for klass, over, alone, name, n_ctas in sorted(rows, key=lambda r: (r[0], r[1] / r[2])):
            print(f"{klass:<14} {over:>13.1f} {alone:>9.1f} {over / alone:>8.3f} {modelled[klass]:>6.3f}  "
                  f"{name[:70]} ({n_ctas})")

    print(f"\n{'class':<14} {'pairs':>5} {'measured: median':>16} {'p25-p75':>13} {'time-weighted':>13} "
          f"{'modelled':>8}")
    order = ["matrix", "layout", "normalisation", "reduction", "elementwise", "other", "tiny"]
    for klass in [c for c in order if any(r[0] == c for r in rows)] + ["all but tiny"]:
        sel = [r for r in rows if (r[0] == klass if klass != "all but tiny" else r[0] != "tiny")]
        ratios = sorted(r[1] / r[2] for r in sel)
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        weighted = sum(r[1] for r in sel) / sum(r[2] for r in sel)
        model = (sum(modelled[r[0]] * r[2] for r in sel) / sum(r[2] for r in sel))
        print(f"{klass:<14} {len(sel):>5} {statistics.median(ratios):>16.3f} {q[0]:>6.2f}-{q[2]:<6.2f} "
              f"{weighted:>13.3f} {model:>8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
