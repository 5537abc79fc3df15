"""Fit Ampere's TF32 tensor-core GEMM figures on the GEMM kernels of real A100 traces (issue 42).

    python benchmarks/fit_trace_gemms.py [--write]

Reads the two ranks of the 128-rank A100 job in ../shared/traces (HolisticTraceAnalysis's public test data,
recorded with shapes), takes every TF32 tensor-core GEMM kernel (cutlass ``s1688gemm``) whose op's shapes
were recorded and which ran alone on the GPU (under 5 % of its time beside a kernel of another stream), with
any split-K reduction its op launched, and fits on rank 0's calls of at least 1 GFLOP whose dimensions are
all at least 128 the three figures `trainsim.sim.compute.kernels.gemm_fit` describes: the share of the TF32
peak, a tile's fixed cost in steps of K and the factor of the misaligned (``align1``) kernels. It prints the rows, the error on the fitted rows, on each shape left out,
on rank 1 (the same job, other calls) and on the other calls, against what the kernel model gives without
these figures (TF32 at the roofline fraction 0.7, misaligned at the bf16 factor).
``--write`` stores the figures in the shipped ``params.json`` under the Ampere architecture's matmul class.
The trace does not name its A100; the board is taken as the 40 GB SXM (the TF32 peak and SM count are the
same on every A100; only memory-bound calls would tell the boards apart).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from trainsim.formats.kineto import load_trace
from trainsim.sim.compute.kernels import gemm_fit
from trainsim.sim.compute.kernels.params import PARAMS_FILE, KernelParams, load_params
from trainsim.sim.core.devices import get_device
from trainsim.sim.replay.trace_graph import build_graph
from trainsim.sim.replay.whatif import is_matrix_kernel, kernel_precision

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT.parent / "shared" / "traces"
FIT, CHECK = "a100-128rank-sampled-rank0.json.gz", "a100-128rank-sampled-rank1.json.gz"
DEVICE = "a100-40gb"
ALONE = 0.05          # at most this share of a kernel's time beside another stream's kernel
BIG_FLOPS = 1e9       # the fitted calls: compute-bound on an A100 at TF32 ...
FIGURES = ("tensor_efficiency_tf32", "k0_tf32", "misaligned_tf32")
MIN_DIM = 128         # ... whose every dimension fills a tile (DLRM's 10- and 20-wide GEMMs do not)


def trace_rows(path: Path) -> list[gemm_fit.GemmRow]:
    """The TF32 GEMM calls of a trace that ran alone, one row per op (its GEMM and split-K kernels)."""
    graph = build_graph(load_trace(path))
    kernels = sorted((o for o in graph.ops if o.kind == "kernel"), key=lambda o: o.event.ts)
    spans = [(o.event.ts, o.event.ts + o.event.dur, o.event.stream) for o in kernels]

    def beside(o) -> float:
        a, b = o.event.ts, o.event.ts + o.event.dur
        return sum(min(b, y) - max(a, x) for x, y, s in spans if s != o.event.stream and x < b and y > a)

    by_op = defaultdict(list)
    for o in kernels:
        if o.work is not None and o.work.shape and o.work.shape[0] == "gemm":
            by_op[id(o.work)].append(o)
    rows = []
    for ops in by_op.values():
        gemms = [o for o in ops if is_matrix_kernel(o.name) and kernel_precision(o.name) == "tf32"]
        if len(gemms) != 1:
            continue
        total = sum(o.event.dur for o in ops)
        if sum(beside(o) for o in ops) > ALONE * total:
            continue
        _, batch, m, n, k = gemms[0].work.shape
        rows.append(gemm_fit.GemmRow(path.name, DEVICE, "tf32", int(batch), int(m), int(n), int(k),
                                     "align1" in gemms[0].name, float(total)))
    return rows


def _without_fit(params, device):
    """``params`` as they were before this fit: its figures left out of the architecture's matmul class."""
    data = copy.deepcopy(params.data)
    matmul = data["architectures"].get(device.architecture, {}).get("matmul", {})
    for name in FIGURES:
        matmul.pop(name, None)
    return KernelParams(data, file=params.file)


def fitted_call(row: gemm_fit.GemmRow) -> bool:
    return row.flops >= BIG_FLOPS and min(row.m, row.n, row.k) >= MIN_DIM


def _summary(title: str, errs: list[float]) -> str:
    if not errs:
        return f"  {title:40s} no rows"
    q = sorted(errs)
    return (f"  {title:40s} rows {len(errs):4d}  median |error| {statistics.median(abs(e) for e in errs) * 100:5.1f} %"
            f"  p10 {q[len(q) // 10] * 100:+6.1f} %  p90 {q[(9 * len(q)) // 10] * 100:+6.1f} %")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="store the figures in the shipped params.json")
    args = parser.parse_args(argv)
    if not (TRACES / FIT).exists():
        print(f"no traces: {TRACES.name}/{FIT} is missing (the shared folder beside the checkout)")
        return 1
    device, params = get_device(DEVICE), _without_fit(load_params(), get_device(DEVICE))
    fit_rows, check_rows = trace_rows(TRACES / FIT), trace_rows(TRACES / CHECK)
    big = [r for r in fit_rows if fitted_call(r)]
    figures = gemm_fit.fit_tensor_gemm(big, device, params)
    fitted = gemm_fit.with_figures(params, device, "tf32", figures)
    print(f"{device.name} ({device.architecture}), TF32 GEMM calls that ran alone: {len(fit_rows)} in {FIT} "
          f"({len(big)} of >= 1 GFLOP, every dimension >= 128, fitted), {len(check_rows)} in {CHECK}")
    for name, value in figures.items():
        print(f"  {name:26s} {value:.4f}")
    print(f"\n  {'m':>6s} {'n':>6s} {'k':>6s} {'align':>5s} {'GFLOP':>7s} {'measured us':>11s} {'TFLOP/s':>8s} "
          f"{'model':>8s} {'err':>7s} {'before':>8s} {'err':>7s}")
    seen = set()
    for r in sorted(big, key=lambda r: -r.flops):
        if r.shape in seen:
            continue
        seen.add(r.shape)
        now, old = gemm_fit.predict(r, device, fitted), gemm_fit.predict(r, device, params)
        print(f"  {r.m:6d} {r.n:6d} {r.k:6d} {'1' if r.misaligned else '4':>5s} {r.flops / 1e9:7.2f} "
              f"{r.seconds * 1e6:11.1f} {r.flops / r.seconds / 1e12:8.1f} {r.flops / now / 1e12:8.1f} "
              f"{now / r.seconds - 1:+7.1%} {r.flops / old / 1e12:8.1f} {old / r.seconds - 1:+7.1%}")
    small = [r for r in fit_rows + check_rows if not fitted_call(r)]
    check_big = [r for r in check_rows if fitted_call(r)]
    print()
    print(_summary("fitted calls", gemm_fit.errors(big, device, fitted)))
    print(_summary("each shape left out", gemm_fit.held_out_errors(big, device, params)))
    print(_summary(f"{CHECK} (not fitted)", gemm_fit.errors(check_big, device, fitted)))
    print(_summary("other calls (not fitted)", gemm_fit.errors(small, device, fitted)))
    print(_summary("before: fitted calls", gemm_fit.errors(big, device, params)))
    print(_summary(f"before: {CHECK}", gemm_fit.errors(check_big, device, params)))
    print(_summary("before: other calls", gemm_fit.errors(small, device, params)))
    if args.write:
        stored = json.loads(PARAMS_FILE.read_text())
        arch = stored["architectures"].setdefault(device.architecture, {})
        arch.setdefault("matmul", {}).update(figures)
        rows_said = (f"../shared/traces/{FIT}: {len(big)} TF32 GEMM calls of >= 1 GFLOP, every dimension >= 128, "
                     "that ran alone (python benchmarks/fit_trace_gemms.py --write)")
        arch.setdefault("tensor_evidence", {}).update({f"matmul.{name}": rows_said for name in figures})
        stored["unfitted"]["tensor_efficiency.other_generations"] = (
            "tensor-core figures rest on four GPUs: Hopper's TF32 convolutions and misaligned bf16 GEMMs on an "
            "h200 (calibration bundles), Ampere's TF32 GEMMs on an a100 (profiler traces, fit_trace_gemms.py), "
            "Hopper's and Blackwell's bf16/TF32(/fp8) GEMMs on an h100 and a b200 (XLA's GEMM table, "
            "fit_gemm_table.py); every other generation and precision takes the default's fractions of its own "
            "tensor-core peaks, a guess until a sweep of its own")
        stored["evidence"]["a100_trace_gemms"] = {
            "files": [FIT, CHECK], "from": "HolisticTraceAnalysis public test data (MIT), via ../shared/traces",
            "what": "GEMM kernels timed by the PyTorch profiler in a 128-rank A100 job with their ops' shapes; "
                    "TF32 cutlass kernels, align1 (misaligned) and align4 variants named by the kernel",
            "fit": "python benchmarks/fit_trace_gemms.py --write"}
        PARAMS_FILE.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
        print(f"\nwrote {PARAMS_FILE.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
