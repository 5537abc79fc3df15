"""Fit the kernel model's tensor-core figures on calibrated layers measured on a GPU (issue 42).

    python benchmarks/fit_layer_figures.py BUNDLE_DIR... [--device h200] [--write]

Reads every ``workload-*.json`` under the given calibration bundles (``benchmarks/data/h200-run3``: ResNet-18,
ResNet-50 and GPT-2 small measured on one H200 in fp32 and bf16), fits the figures
`trainsim.sim.compute.kernels.layer_fit` describes on their GPU-bound layer passes, and prints the fitted
figures, the stand-ins of those too few rows support, and the error on the fitted and held-out rows.
``--write`` stores the figures, the rows each rests on and the held-out band in the shipped ``params.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trainsim.errors import TrainsimError
from trainsim.formats.workload import load_workload
from trainsim.sim.compute.kernels import layer_fit
from trainsim.sim.compute.kernels.params import PARAMS_FILE, load_params
from trainsim.sim.core.devices import get_device

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "benchmarks" / "data" / "h200-run3"


def load_rows(paths: list[str], device: str | None = None) -> list[layer_fit.LayerRow]:
    """The layer rows of every calibrated workload file under ``paths`` (bundle folders or files)."""
    files = []
    for path in paths:
        p = Path(path)
        files += sorted(p.rglob("workload-*.json")) if p.is_dir() else [p]
    rows = []
    spec = get_device(device) if device else None
    for file in files:
        workload = load_workload(file)
        if not any(layer.forward for layer in workload.layers):
            continue
        label = "/".join(file.parts[-3:])
        rows += layer_fit.layer_rows(workload, label, spec)
    return rows


def _print_errors(title: str, errs: dict) -> None:
    print(title)
    for (kind, dtype), e in errs.items():
        print(f"  {kind:16s} {dtype:10s} rows {e['rows']:4d}  median |error| {e['median_abs'] * 100:5.1f} %  "
              f"p10 {e['p10'] * 100:+6.1f} %  p50 {e['p50'] * 100:+6.1f} %  p90 {e['p90'] * 100:+6.1f} %")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="calibration bundles (folders) or workload files")
    parser.add_argument("--device", help="the device spec they were measured on (default: each file's)")
    parser.add_argument("--write", action="store_true", help="store the figures in the shipped params.json")
    args = parser.parse_args(argv)
    try:
        rows = load_rows(args.paths, args.device)
        out = layer_fit.split_fit(rows)
        bound = layer_fit.gpu_bound(rows)
        kept, tied = layer_fit.supported([r for r, k in zip(rows, bound, strict=True) if k])
        full_table = layer_fit.Table(kept)
        full = layer_fit.fit(full_table, tied=tied)  # the figures kept: every usable row (the split judges)
    except TrainsimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result = out["fit"]
    print(f"{len(kept)} of {len(rows)} layer passes GPU-bound and usable; fitted on {len(out['train'])}, "
          f"held out {len(out['test'])}")
    for (cls, name), source in sorted(tied.items()):
        take = (f"{source[0]}.{source[1]}" if isinstance(source, tuple)
                else f"{source:g} (fitted elsewhere, or the roofline fraction)")
        print(f"  {cls}.{name}: fewer than {layer_fit.MIN_ROWS} GPU-bound rows, takes {take}")
    for (cls, name), value in sorted(full.figures.items()):
        split = result.figures.get((cls, name))
        print(f"  {cls}.{name} = {value:.4g} (split: {split:.4g})" if split is not None
              else f"  {cls}.{name} = {value:.4g} (no row in the fitted split)")
    if full.misaligned is not None:
        print(f"  matmul.misaligned = {full.misaligned:.4f}")
    _print_errors("fitted rows (the split's figures):", layer_fit.errors(out["train"], result))
    held = layer_fit.errors(out["test"], out["held"]) if "held" in out else {}
    _print_errors("held-out rows:", held)
    if out["unjudged"]:
        print(f"  (held-out figures no fitted row has, fitted on the held-out rows: {out['unjudged']})")
    if args.write:
        device = rows[0].device
        figures = dict(full.figures)
        notes = {which: layer_fit.evidence_note(kept, which, full_table) for which in full.figures}
        notes[layer_fit.CALL] = notes.get(("conv", "tensor_efficiency_tf32"), "")
        if full.misaligned is not None:
            figures[("matmul", "misaligned")] = full.misaligned
            notes[("matmul", "misaligned")] = layer_fit.evidence_note(
                kept, ("matmul", "tensor_efficiency_bf16"),
                                                            full_table, misaligned=True)
        band = {f"{kind}.{dtype}": {"p10": round(e["p10"], 4), "p90": round(e["p90"], 4),
                                    "median_abs": round(e["median_abs"], 4), "rows": e["rows"]}
                for (kind, dtype), e in held.items()}
        data = layer_fit.store(load_params().data, device, get_device(device).architecture, figures, notes,
                               band, tied)
        data["evidence"]["h200_layers"] = {
            "what": "per-layer forward/backward times of trainsim calibrate bundles (CUDA events at each "
                    "layer's hooks), fp32 (cuDNN TF32 convolutions, fp32 GEMMs) and bf16 autocast; only "
                    f"GPU-bound passes: >= {layer_fit.ABOVE_FLOOR:g}x the 10th percentile of their file, "
                    f"pass and kind in a run whose hooked layers sum to <= {layer_fit.GPU_BOUND_RUN:g}x its "
                    f"plain iteration, or >= {layer_fit.ALONE:g}x it in any run",
            "files": sorted({r.source for r in rows}),
            "fit": "python benchmarks/fit_layer_figures.py benchmarks/data/h200-run3 --write",
            "held_out": "ResNet-50's layer2 and layer4 (and ResNet-18) predicted from figures fitted on its "
                        "stem, layer1 and layer3",
        }
        PARAMS_FILE.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        print(f"wrote {PARAMS_FILE.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
