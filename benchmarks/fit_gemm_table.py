"""Fit Hopper's and Blackwell's tensor-core GEMM figures on XLA's measured GEMM table (issue 42).

    python benchmarks/fit_gemm_table.py [--write] [--quick]

Reads benchmarks/data/xla-gemm-table.csv (written by benchmarks/extract_xla_gemm_table.py from the GEMM
table XLA ships: 375 shapes a GPU and precision, batch 1/2/4 by m, n, k of 256 ... 4096, each timed on the
GPU; H100 SXM in bf16 and TF32, B200 in bf16, TF32 and fp8) and, per architecture, fits the kernel model's
tensor-core GEMM figures (`trainsim.sim.compute.kernels.gemm_fit`): per precision the share of its peak, a
tile's fixed cost in steps of K, the operand-load penalty of small tiles and a call's fixed GPU time, under
the ceiling of the largest share of the peak any of its rows reached (measured, not fitted); per
architecture the tile shapes its kernels take, chosen among `CANDIDATE_TILES` by the fitted error.

It prints, per GPU and precision: the figures; the median |error| and the 10th/90th percentiles on the
fitted rows, on each shape left out (10 folds), and before (the figures the model had: the roofline
fraction 0.7 through the stand-in chain); then the cross-GPU check: each GPU's rows predicted with the
other architecture's figures, and the B200/H100 time ratio per shape, predicted against measured.
``--write`` stores the figures, tiles and held-out bands in the shipped params.json. ``--quick`` skips the
held-out folds.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from pathlib import Path

from trainsim.sim.compute.kernels import gemm_fit
from trainsim.sim.compute.kernels.dataset import read_rows
from trainsim.sim.compute.kernels.params import PARAMS_FILE, KernelParams, load_params
from trainsim.sim.core.devices import get_device

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "benchmarks" / "data" / "xla-gemm-table.csv"
EXTRA = ("call_s", "tile_a")
#: tile shapes the tensor-core GEMMs may take (rows x columns of output a thread block computes): those
#: CUTLASS's sm90/sm100 kernels offer, whose row count steps by 64 (a warpgroup's MMA); the fit picks a set
CANDIDATE_TILES = {
    "square": [[128, 128], [128, 64], [64, 128], [64, 64]],
    "wide": [[128, 128], [128, 256], [256, 128], [64, 128]],
    "wide+small": [[128, 256], [256, 128], [128, 128], [64, 128], [128, 64], [64, 64]],
}


def series() -> dict[tuple[str, str], list[gemm_fit.GemmRow]]:
    """The table's rows by (device, dtype)."""
    out: dict[tuple[str, str], list[gemm_fit.GemmRow]] = {}
    for r in read_rows(TABLE, shown=TABLE.name):
        s = r.spec
        out.setdefault((r.device, s.dtype), []).append(
            gemm_fit.GemmRow(TABLE.name, r.device, s.dtype, s.batch, s.m, s.n, s.k, False, r.latency_s))
    return out


def dtypes(by_series: dict, device: str) -> set[str]:
    """The precisions the table has rows of for ``device``."""
    return {t for d, t in by_series if d == device}


def with_tiles(params: KernelParams, architecture: str, tiles) -> KernelParams:
    data = copy.deepcopy(params.data)
    data["tiles"].setdefault(architecture, {})["tensor"] = tiles
    return KernelParams(data, file=params.file)


def without_fit(params: KernelParams, architectures) -> KernelParams:
    """``params`` without this script's figures: what the model had before."""
    data = copy.deepcopy(params.data)
    for arch in architectures:
        data["tiles"].get(arch, {}).pop("tensor", None)
        matmul = data["architectures"].get(arch, {}).get("matmul", {})
        for dtype in ("tf32", "bf16", "fp16", "fp8"):
            if arch == "ampere" and dtype == "tf32":
                continue  # fit_trace_gemms.py's
            for name in ("tensor_efficiency", "k0", "call_s", "tile_a", "ceiling"):
                matmul.pop(f"{name}_{dtype}", None)
    return KernelParams(data, file=params.file)


def stats(errs: list[float]) -> dict:
    q = sorted(errs)
    return {"rows": len(q), "median_abs": round(statistics.median(abs(e) for e in q), 4),
            "p10": round(q[len(q) // 10], 4), "p50": round(q[len(q) // 2], 4),
            "p90": round(q[(9 * len(q)) // 10], 4)}


def line(title: str, s: dict) -> str:
    return (f"  {title:34s} rows {s['rows']:4d}  median |error| {s['median_abs'] * 100:5.1f} %  "
            f"p10 {s['p10'] * 100:+6.1f} %  p90 {s['p90'] * 100:+6.1f} %")


def apply(params: KernelParams, device, fitted: dict) -> KernelParams:
    for dtype, figures in fitted.items():
        params = gemm_fit.with_figures(params, device, dtype, figures)
    return params


def fit_architecture(by_series, architecture: str, base: KernelParams):
    """The tile set, the figures per dtype and the fitted params for one architecture's series."""
    mine = {key: rows for key, rows in by_series.items() if get_device(key[0]).architecture == architecture}
    best = None
    for name, tiles in CANDIDATE_TILES.items():
        params = with_tiles(base, architecture, tiles)
        figures, errs = {}, []
        for (device, dtype), rows in mine.items():
            spec = get_device(device)
            top = gemm_fit.ceiling(rows, spec)
            params = gemm_fit.with_figures(params, spec, dtype, top)
            figures[dtype] = {**gemm_fit.fit_tensor_gemm(rows, spec, params, EXTRA), **top}
            errs.append(stats(gemm_fit.errors(rows, spec, gemm_fit.with_figures(params, spec, dtype,
                                                                                figures[dtype])))["median_abs"])
        score = statistics.mean(errs)
        print(f"  {architecture}: tiles {name:10s} mean of the series' median |error| {score * 100:5.1f} %")
        if best is None or score < best[0]:
            best = (score, name, tiles, figures)
    _, name, tiles, figures = best
    device = get_device(next(iter(mine))[0])
    return name, tiles, figures, apply(with_tiles(base, architecture, tiles), device, figures)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="store the figures in the shipped params.json")
    parser.add_argument("--quick", action="store_true", help="skip the held-out folds")
    args = parser.parse_args(argv)
    by_series = series()
    architectures = sorted({get_device(d).architecture for d, _ in by_series})
    before = without_fit(load_params(), architectures)
    print(f"{TABLE.name}: " + ", ".join(f"{d} {t} {len(r)}" for (d, t), r in sorted(by_series.items())))
    print("\ntile sets (fitted error):")
    chosen, params = {}, before
    for arch in architectures:
        name, tiles, figures, fitted = fit_architecture(by_series, arch, params)
        chosen[arch] = (name, tiles, figures)
        params = fitted
    bands: dict[str, list[float]] = {}
    for (device, dtype), rows in sorted(by_series.items()):
        spec = get_device(device)
        name, tiles, figures = chosen[spec.architecture]
        print(f"\n{device} ({spec.architecture}) {dtype}: tiles {name} {tiles}")
        for figure, value in figures[dtype].items():
            print(f"  {figure:26s} {value:.4g}")
        print(line("fitted rows", stats(gemm_fit.errors(rows, spec, params))))
        if not args.quick:
            base = with_tiles(before, spec.architecture, tiles)
            held = gemm_fit.held_out_errors(rows, spec, base, extra=EXTRA, with_ceiling=True)
            bands.setdefault(dtype, []).extend(held)
            print(line("each shape left out (10 folds)", stats(held)))
        big = [r for r in rows if r.seconds >= 20e-6]
        print(line("rows of >= 20 us", stats(gemm_fit.errors(big, spec, params))))
        print(line("before", stats(gemm_fit.errors(rows, spec, before))))
    print("\ncross-GPU: each GPU's rows under the other architecture's figures (tiles, efficiencies, k0, "
          "call)")
    devices = sorted({d for d, _ in by_series})
    for device in devices:
        spec = get_device(device)
        for other in devices:
            if other == device:
                continue
            swapped = copy.deepcopy(params.data)
            mine, theirs = spec.architecture, get_device(other).architecture
            arches = swapped["architectures"]
            arches[mine]["matmul"] = copy.deepcopy(arches[theirs]["matmul"])
            swapped["tiles"].setdefault(mine, {})["tensor"] = swapped["tiles"][theirs]["tensor"]
            swapped = KernelParams(swapped, file=params.file)
            for dtype in sorted(dtypes(by_series, device) & dtypes(by_series, other)):
                rows = by_series[(device, dtype)]
                print(line(f"{device} {dtype} with {theirs}'s", stats(gemm_fit.errors(rows, spec, swapped))))
    if len(devices) == 2:
        a, b = (get_device(d) for d in devices)
        print(f"\n{b.name}/{a.name} time ratio per shape, predicted over measured minus one:")
        for dtype in sorted(dtypes(by_series, a.name) & dtypes(by_series, b.name)):
            ra = {r.shape: r for r in by_series[(a.name, dtype)]}
            errs, peak_errs = [], []
            for r in by_series[(b.name, dtype)]:
                measured = r.seconds / ra[r.shape].seconds
                predicted = gemm_fit.predict(r, b, params) / gemm_fit.predict(ra[r.shape], a, params)
                errs.append(predicted / measured - 1)
                peak_errs.append(a.peak_flops[dtype] / b.peak_flops[dtype] / measured - 1)
            print(line(f"{dtype}: kernel model", stats(errs)))
            print(line(f"{dtype}: peak ratio", stats(peak_errs)))
    if args.write:
        write(chosen, bands, by_series)
    return 0


#: precisions whose figures also become the default's (the median over the architectures measured in it), for
#: GPUs of generations with no rows of their own in that precision: bf16 (and fp16, which takes bf16's),
#: whose share of peak holds across generations (H100 0.85, B200 0.71 per tile) where TF32's on the same GPU
#: does not (H100 0.54): an Ampere or Ada bf16 GEMM is timed as a bf16 GEMM, not as its TF32 sibling
DEFAULT_PRECISIONS = ("bf16",)
FIGURE_NAMES = ("tensor_efficiency", "k0", "call_s", "tile_a", "ceiling")


def set_defaults(stored: dict) -> None:
    """The default matmul figures of `DEFAULT_PRECISIONS`: per figure the median over the architectures
    this fit measured in that precision."""
    import statistics

    for dtype in DEFAULT_PRECISIONS:
        for name in FIGURE_NAMES:
            key = f"{name}_{dtype}"
            values = [entry["matmul"][key] for entry in stored["architectures"].values()
                      if key in entry.get("matmul", {})
                      and "xla-gemm-table" in entry.get("tensor_evidence", {}).get(f"matmul.{key}", "")]
            if values:
                stored["default"]["matmul"][f"{name}_{dtype}"] = float(f"{statistics.median(values):.4g}")


def write(chosen: dict, bands: dict, by_series: dict) -> None:
    stored = json.loads(PARAMS_FILE.read_text())
    for arch, (name, tiles, figures) in chosen.items():
        stored["tiles"].setdefault(arch, {})["tensor"] = tiles
        entry = stored["architectures"].setdefault(arch, {})
        devices = sorted({d for d, t in by_series if get_device(d).architecture == arch})
        entry.setdefault("from", devices)
        for dtype, values in figures.items():
            entry.setdefault("matmul", {}).update(values)
            rows = sum(len(r) for (d, t), r in by_series.items() if t == dtype and d in devices)
            said = (f"benchmarks/data/xla-gemm-table.csv: {rows} {dtype} GEMMs timed on {', '.join(devices)} "
                    f"(XLA's GEMM table; python benchmarks/fit_gemm_table.py --write)")
            entry.setdefault("tensor_evidence", {}).update({f"matmul.{n}": said for n in values})
        entry.setdefault("tensor_evidence", {})["tiles.tensor"] = (
            f"{name}: the set of CANDIDATE_TILES with the least fitted error (benchmarks/fit_gemm_table.py)")
    set_defaults(stored)
    for dtype, errs in bands.items():
        stored["held_out"][f"tensor.matmul.{dtype}"] = {"how": "each shape left out (10 folds), Hopper and "
                                                        "Blackwell rows of XLA's GEMM table", **stats(errs)}
    stored["evidence"]["xla_gemm_table"] = {
        "files": ["benchmarks/data/xla-gemm-table.csv"],
        "from": "XLA's GemmPerfTable (matmul_interpolator_data.h; Apache-2.0), as embedded in the "
                "jax-cuda12-pjrt 0.12.0.1 wheel (python benchmarks/extract_xla_gemm_table.py WHEEL)",
        "what": "per GPU and precision, 375 GEMMs (batch 1/2/4; m, n, k 256 ... 4096) timed on the GPU: "
                "H100 SXM (sm_90) bf16 and TF32, B200 (sm_100) bf16, TF32 and fp8",
        "fit": "python benchmarks/fit_gemm_table.py --write"}
    unfitted = stored["unfitted"]
    unfitted["matmul.tensor_efficiency_bf16"] = (
        "fitted for Hopper and Blackwell on XLA's GEMM table; Ampere and Ada bf16/fp16 and Volta fp16 have "
        "no GPU-bound tensor-core GEMM rows: they take the default's bf16 figures, the median of Hopper's "
        "and Blackwell's (fp16 takes bf16's), on their own peaks and SIMT tiles")
    unfitted["tensor_efficiency.fp16, fp8"] = (
        "fp16 takes bf16's figure (one peak for both since Ampere); fp8 is fitted on Blackwell (XLA's "
        "table), elsewhere it takes fp16's: the table's sm_90 fp8 rows run above H100's dense fp8 peak and "
        "were left out")
    PARAMS_FILE.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
    print(f"\nwrote {PARAMS_FILE.name}")


if __name__ == "__main__":
    sys.exit(main())
