"""How a replay's --gpu what-if rescales the matrix kernels of real traces, with and without their shapes.

    python benchmarks/replay_matrix_kernels.py [--gpus h100-sxm,a100-80gb,v100-32gb] [--json]

For each real trace with GPU kernels (../shared/traces and tests/data/traces-h200) it prints the matrix
kernels (GEMM, convolution, fused attention: `whatif.is_matrix_kernel`), how many of them sit under a
matmul or convolution recorded with its shapes (`op_work`), and how many of those are memory-bound on the
trace's GPU by their roofline. Then, per what-if GPU, the kernel time of the trace (every kernel's measured
time times its `compute_ratio`) with the shapes and with them left out (every matrix kernel by peak
FLOP/s), and the difference. There is no ground truth here (no trace of the same job on two GPUs): the
figures say how much the rule by shapes moves a what-if, and on which traces.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from trainsim.formats.kineto import load_trace
from trainsim.sim.core.devices import get_device
from trainsim.sim.replay.trace_graph import build_graph
from trainsim.sim.replay.whatif import compute_ratio, is_matrix_kernel, is_memory_bound, trace_device

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "traces"
#: trace -> the GPU it ran on where the trace does not name it
TRACES = {
    SHARED / "a100-128rank-sampled-rank0.json.gz": "a100-40gb",
    SHARED / "kineto-a100-ddp2-rank0.json.gz": None,
    SHARED / "v100-ddp2-rank1-cudagraph.json.gz": None,
    ROOT / "tests" / "data" / "traces-h200" / "resnet50-fp32-step.json.gz": None,
    ROOT / "tests" / "data" / "traces-h200" / "gpt2-small-fp32-step.json.gz": None,
}


def measure(path: Path, ran_on: str | None, gpus: list[str], compute_model: str = "roofline") -> dict:
    graph = build_graph(load_trace(path))
    source = trace_device(graph) or get_device(ran_on)
    kernels = [o for o in graph.ops if o.kind == "kernel"]
    matrix = [o for o in kernels if is_matrix_kernel(o.name)]
    shaped = [o for o in matrix if o.work is not None]
    memory_bound = [o for o in shaped if is_memory_bound(o, source)]
    row = {"trace": path.name, "gpu": source.name, "kernels": len(kernels),
           "kernel_ms": sum(o.event.dur for o in kernels) * 1e3,
           "matrix": len(matrix), "matrix_ms": sum(o.event.dur for o in matrix) * 1e3,
           "shaped": len(shaped), "memory_bound": len(memory_bound),
           "memory_bound_ms": sum(o.event.dur for o in memory_bound) * 1e3, "whatif": {}}
    for name in gpus:
        target = get_device(name)
        if (target.peak_flops, target.memory_bandwidth) == (source.peak_flops, source.memory_bandwidth):
            continue                        # the same GPU (V100 16 and 32 GB): nothing to rescale
        with_shapes = sum(o.event.dur * compute_ratio(o, source, target, compute_model) for o in kernels)
        works = {o.index: o.work for o in kernels}
        for o in kernels:
            o.work = None
        by_peak = sum(o.event.dur * compute_ratio(o, source, target) for o in kernels)
        for o in kernels:
            o.work = works[o.index]
        row["whatif"][target.name] = {"with_shapes_ms": with_shapes * 1e3, "by_peak_ms": by_peak * 1e3,
                                      "change_pct": 100.0 * (with_shapes - by_peak) / by_peak}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", default="h100-sxm,a100-80gb,v100-32gb", help="what-if GPUs, comma list")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--compute-model", choices=("roofline", "kernels"), default="roofline",
                        help="how a matrix kernel with shapes is rescaled (default roofline)")
    args = parser.parse_args()
    gpus = [g.strip() for g in args.gpus.split(",") if g.strip()]
    rows = [measure(path, ran_on, gpus, args.compute_model) for path, ran_on in TRACES.items()
            if path.exists()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'trace':38} {'gpu':10} {'kernel ms':>9} {'matrix':>7} {'ms':>7} {'shaped':>6} {'mem-bound':>9} "
          f"{'ms':>7}")
    for r in rows:
        print(f"{r['trace']:38} {r['gpu']:10} {r['kernel_ms']:9.2f} {r['matrix']:7d} {r['matrix_ms']:7.2f} "
              f"{r['shaped']:6d} {r['memory_bound']:9d} {r['memory_bound_ms']:7.2f}")
    print(f"\n{'trace':38} {'what-if':10} {'by shapes ms':>12} {'by peak ms':>10} {'change':>7}")
    for r in rows:
        for gpu, w in r["whatif"].items():
            print(f"{r['trace']:38} {gpu:10} {w['with_shapes_ms']:12.2f} {w['by_peak_ms']:10.2f} "
                  f"{w['change_pct']:+6.1f}%")


if __name__ == "__main__":
    main()
