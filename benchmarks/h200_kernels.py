"""The kernel model against the kernel sweeps of a lent H200 (issue 42): held out, then Hopper's tensor-core
GEMM figures fitted on two sweeps and judged on the third.

    python benchmarks/h200_kernels.py [--write]

Reads ``benchmarks/data/h200-kernels/sweep{1,2,3}/kernels.csv`` (``trainsim calibrate kernels`` on one
H200, 2026-11-28; each folder's provenance.json gives the command, driver, CUDA, cuDNN and torch; sweep 1:
named shapes at batch 64, sweep 2: 80 drawn GEMM shapes (seed 1), fp16 and batch 32, sweep 3: 120 drawn
GEMM shapes (seed 2) and batch 128). Each row is one kernel's GPU time per call, back to back in a CUDA
graph, with the kernels it launched. Prints:

1. **held out**: the shipped figures (fitted without these rows) against every row, per kernel class,
   precision and pass: median |predicted / measured - 1| and the signed 10th/50th/90th percentiles;
2. **Hopper tensor-core GEMMs refitted**: per precision, the figures `fit_gemm_table.py` fits (share of
   peak, a tile's K prologue, the small-tile penalty, a call's fixed GPU time, under the measured ceiling)
   on sweeps 1 and 2's GEMMs of that precision, the tile set chosen the same way, judged on sweep 3's
   drawn shapes (never fitted on) and on XLA's H100 rows (another Hopper, another library), against the
   shipped figures on the same rows.

``--write`` stores the refit (fitted on all three sweeps) as Hopper's figures in the shipped params.json.
Takes about a minute.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fit_gemm_table as table  # noqa: E402  (the same fitter, tile candidates and write-out)

from trainsim.sim.compute.kernels import gemm_fit  # noqa: E402
from trainsim.sim.compute.kernels.dataset import read_rows  # noqa: E402
from trainsim.sim.compute.kernels.model import kernel_time  # noqa: E402
from trainsim.sim.compute.kernels.params import PARAMS_FILE, load_params  # noqa: E402
from trainsim.sim.core.devices import get_device  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SWEEPS = ROOT / "benchmarks" / "data" / "h200-kernels"
TENSOR = ("tf32", "bf16", "fp16", "fp8")


def sweep_rows(number: int):
    path = SWEEPS / f"sweep{number}" / "kernels.csv"
    return read_rows(path, shown=f"sweep{number}")


def _pass(row) -> str:
    spec = row.spec
    if row.kernel_class == "conv":
        return spec.pass_
    if row.kernel_class == "attention":
        return ("backward" if spec.backward else "forward") + (" fused" if spec.fused else " unfused")
    return ""


def _stats(errs) -> str:
    e = np.asarray(errs)
    return (f"rows {len(e):4d}  median |error| {np.median(abs(e)) * 100:6.1f} %  "
            f"p10 {np.quantile(e, .1) * 100:+7.1f} %  p50 {np.median(e) * 100:+7.1f} %  "
            f"p90 {np.quantile(e, .9) * 100:+7.1f} %")


def held_out(rows) -> None:
    print("1. held out: the shipped figures against every sweep row (GPU time per call)")
    groups, classes = defaultdict(list), defaultdict(list)
    for row in rows:
        error = kernel_time(row.spec, row.device).seconds / row.latency_s - 1
        groups[(row.kernel_class, row.dtype, _pass(row))].append(error)
        classes[row.kernel_class].append(error)
    for (cls, dtype, how), errs in sorted(groups.items()):
        print(f"  {cls:11s} {dtype:5s} {how:16s} {_stats(errs)}")
    for cls, errs in sorted(classes.items()):
        print(f"  {cls:11s} all   {'':16s} {_stats(errs)}")


def gemm_series(rows) -> dict:
    """Tensor-core GEMM rows by (device, dtype), misaligned where the library ran its align1 kernels."""
    out = defaultdict(list)
    for r in rows:
        if r.kernel_class == "matmul" and r.dtype in TENSOR:
            s = r.spec
            misaligned = any("align1" in k for k in r.kernels)
            out[(r.device, s.dtype)].append(gemm_fit.GemmRow(
                r.source, r.device, s.dtype, s.batch, s.m, s.n, s.k, misaligned, r.latency_s))
    return dict(out)


def refit(fit_rows, judged_rows) -> tuple:
    """Hopper's figures fitted on ``fit_rows``'s GEMMs; the errors before and after on ``judged_rows``' and
    on XLA's H100 rows."""
    shipped = load_params()
    base = table.without_fit(shipped, ["hopper"])
    name, tiles, figures, fitted = table.fit_architecture(gemm_series(fit_rows), "hopper", base)
    h200 = get_device("h200")
    judged = gemm_series(judged_rows)
    xla = {key: rows for key, rows in table.series().items() if key[0] == "h100-sxm"}
    print(f"2. Hopper tensor-core GEMMs refitted on sweeps 1-2: tiles {name} {tiles}")
    for dtype, figs in sorted(figures.items()):
        print(f"  {dtype}: " + ", ".join(f"{k} {v:.4g}" for k, v in sorted(figs.items())))
    for (device, dtype), rows in sorted({**judged, **xla}.items()):
        spec = get_device(device)
        where = "sweep 3 (drawn shapes)" if device == "h200" else "XLA's H100 table"
        print(f"  {dtype:5s} {where:24s} shipped {_stats(gemm_fit.errors(rows, spec, shipped))}")
        print(f"  {dtype:5s} {where:24s} refit   {_stats(gemm_fit.errors(rows, spec, fitted))}")
    return name, tiles, figures, h200


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true",
                        help="store Hopper's GEMM figures fitted on all three sweeps in params.json")
    args = parser.parse_args(argv)
    sweeps = {n: sweep_rows(n) for n in (1, 2, 3)}
    held_out([r for rows in sweeps.values() for r in rows])
    refit(sweeps[1] + sweeps[2], sweeps[3])
    if args.write:
        name, tiles, figures, _ = refit([r for rows in sweeps.values() for r in rows], sweeps[3])
        stored = json.loads(PARAMS_FILE.read_text())
        stored = copy.deepcopy(stored)
        stored["tiles"].setdefault("hopper", {})["tensor"] = tiles
        matmul = stored["architectures"].setdefault("hopper", {}).setdefault("matmul", {})
        for figs in figures.values():
            matmul.update(figs)
        PARAMS_FILE.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
        print(f"wrote Hopper's tensor-core GEMM figures ({', '.join(sorted(figures))}) to {PARAMS_FILE.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
