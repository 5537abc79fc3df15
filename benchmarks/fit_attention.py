"""Fit the kernel model's fused-attention figures on published per-kernel measurements (issue 42).

    python benchmarks/fit_attention.py [--data benchmarks/data/attention-kernels.json] [--write]

Reads the attention rows (``trainsim.kernel-rows/1``: the FlashAttention-2 series of the FlashAttention-3
paper's H100 figures, and PyTorch SDPA's flash backend timed by pytorch/benchmark), fits per GPU
generation the figures `trainsim.sim.compute.kernels.attention_fit` describes on the first source's rows,
and prints per row the measured and modelled TFLOP/s, the error on the fitted rows, with each head
dimension left out, and on the other source's rows; then what the kernel model gave before (the GEMM
efficiency, no per-block cost). ``--write`` stores the figures under the generation's ``attention`` class in
the shipped ``params.json``, with the rows they rest on and the held-out band.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from trainsim.sim.compute.kernels import attention_fit
from trainsim.sim.compute.kernels.attention import fused_seconds
from trainsim.sim.compute.kernels.hardware import matrix_peak
from trainsim.sim.compute.kernels.matmul import tensor_efficiency
from trainsim.sim.compute.kernels.params import PARAMS_FILE, load_params
from trainsim.sim.core.devices import get_device

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "benchmarks" / "data" / "attention-kernels.json"
FIT_SOURCE = "fa3-paper"


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _line(title: str, errs: list[float]) -> str:
    if not errs:
        return f"  {title:44s} no rows"
    return (f"  {title:44s} rows {len(errs):3d}  median |error| {statistics.median(abs(e) for e in errs) * 100:5.1f} %"
            f"  p10 {_quantile(errs, 0.1) * 100:+6.1f} %  p90 {_quantile(errs, 0.9) * 100:+6.1f} %")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(DATA), help="the rows (trainsim.kernel-rows/1 JSON)")
    parser.add_argument("--write", action="store_true", help="store the figures in the shipped params.json")
    args = parser.parse_args(argv)
    data = json.loads(Path(args.data).read_text())
    rows = attention_fit.rows_from(data)
    params = load_params()
    stored = json.loads(PARAMS_FILE.read_text())
    for name in sorted({r.device for r in rows}):
        device = get_device(name)
        mine = [r for r in rows if r.device == name]
        own = [r for r in mine if r.source == FIT_SOURCE]
        figures = attention_fit.fit_attention(own, device)
        print(f"{device.name} ({device.architecture}): fitted on {len(own)} rows of {FIT_SOURCE}")
        for k, v in figures.items():
            print(f"  {k:22s} {v:8.4f}")
        gemm_eff, where = tensor_efficiency(device, params, "matmul", "bf16")
        print(f"\n  {'source':24s} {'pass':8s} {'mask':6s} {'d':>4s} {'seq':>6s} {'measured':>9s} {'model':>7s} "
              f"{'err':>7s} {'before':>7s} {'err':>7s}   (TFLOP/s)")
        before_errs = []
        for r in mine:
            model = attention_fit.predict(r, device, figures)
            old, _ = fused_seconds(r.spec(), device.sm_count, matrix_peak(device, "bf16"), gemm_eff)
            measured = r.seconds()
            before_errs.append(old / measured - 1)
            print(f"  {r.source:24s} {'bwd' if r.backward else 'fwd':8s} {'causal' if r.causal else '-':6s} "
                  f"{r.head_dim:4d} {r.seq_len:6d} {r.tflops:9.1f} {r.tflops * measured / model:7.1f} "
                  f"{model / measured - 1:+7.1%} {r.tflops * measured / old:7.1f} {old / measured - 1:+7.1%}")
        held = attention_fit.held_out_errors(mine, device, FIT_SOURCE)
        print()
        print(_line("fitted rows", attention_fit.errors(own, device, figures)))
        print(_line("each head dimension left out", held["head_dim"]))
        print(_line("other sources (not fitted on)", held["other_sources"]))
        print(_line(f"before: the GEMM efficiency {gemm_eff:.3f}, no block cost", before_errs))
        if args.write:
            band = held["head_dim"] + held["other_sources"]
            arch = stored["architectures"].setdefault(device.architecture, {})
            arch["attention"] = {**figures, "rows": len(own),
                                 "evidence": f"benchmarks/data/attention-kernels.json: {FIT_SOURCE} ({device.name})"}
            stored["held_out"]["attention"] = {
                "median_abs": round(statistics.median(abs(e) for e in band), 4),
                "p10": round(_quantile(band, 0.1), 4), "p50": round(_quantile(band, 0.5), 4),
                "p90": round(_quantile(band, 0.9), 4), "rows": len(band),
                "how": "each head dimension left out of the fit, and the rows of sources not fitted on"}
    if args.write:
        stored["evidence"]["attention_kernels"] = {
            "file": "benchmarks/data/attention-kernels.json", "sources": data["sources"],
            "fit": "python benchmarks/fit_attention.py --write"}
        stored["unfitted"]["attention"] = (
            "fused attention is fitted for Hopper only (16-bit FlashAttention-2 kernels, the ones PyTorch's SDPA "
            "flash backend runs); Blackwell runs the same kernels and takes Hopper's figures; Ampere and Ada, "
            "fp32/TF32 inputs and the unfused path are composed from the matmul and memory-bound figures")
        PARAMS_FILE.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
        print(f"\nwrote {PARAMS_FILE.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
