"""Headline accuracy of trainsim on this box: predicted vs measured on the CPU validation scenario.

    .venv/bin/python benchmarks/validate_accuracy.py [--repeats 3] [--rounds 3] [--variants a,b]
                                                     [--iterations N] [--calibration DIR] [--out DIR]

1. Calibrates this box quickly at the per-rank batch sizes of the scenario's variants, afresh for every
   repeat (as `trainsim quickstart` does), so the spread includes the calibration's own; --calibration DIR
   reuses one bundle for every repeat instead.
2. Issue 4's check: the calibrated model (the scenario's baseline, one rank) simulated from its own bundle vs
   its measured iteration time.
3. Runs `validate validate-cpu` ``--repeats`` times, each against its own bundle, every variant executed
   ``--rounds`` times round-robin with the iterations pooled (`validate --rounds`), and prints per repeat:
   the median |error|, the worst error, and every speedup's error in percentage points, then each figure's
   spread over the repeats.

Prints the load average next to the figures: timings taken while other work shares the cores are noisy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {len(os.sched_getaffinity(0))} cores"


def main(argv: list[str] | None = None) -> int:
    from trainsim.calibrate.measure import runner
    from trainsim.calibrate.validate.quickstart import LAYER_REPEATS, calibration_batch_sizes
    from trainsim.calibrate.validate.report import write_report
    from trainsim.calibrate.validate.run import validate

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="validate-cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3, help="real runs per variant, round-robin, pooled")
    parser.add_argument("--variants", default=None, help="comma list (default: all)")
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--calibration", default=None, help="an existing bundle of this box")
    parser.add_argument("--out", default=None, help="keep the bundle and reports here")
    args = parser.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v] if args.variants else None
    out = Path(args.out or tempfile.mkdtemp(prefix="trainsim-accuracy-"))
    overrides = {"iterations": args.iterations} if args.iterations else {}

    print(f"# {args.scenario} on this box; {_load()}")

    def calibrate(k: int) -> str:
        began = time.perf_counter()
        config = runner.CalibrationConfig(model="tiny-cnn", out=out / f"calibration-{k}", device="cpu",
                                          ranks=2, quick=True, repeats=LAYER_REPEATS,
                                          batch_sizes=calibration_batch_sizes(args.scenario))
        path = str(runner.run_calibration(config))
        print(f"\ncalibrated in {time.perf_counter() - began:.0f} s -> {path}")
        return path

    repeats = []
    for k in range(args.repeats):
        bundle = args.calibration or calibrate(k)
        began = time.perf_counter()
        result = validate(args.scenario, bundle, variants, report_dir=out / f"report-{k}", rounds=args.rounds,
                          **overrides)
        write_report(result, out / f"report-{k}")
        acc = result.accuracy()
        repeats.append((result, acc))
        print(f"\n## repeat {k + 1}: {time.perf_counter() - began:.0f} s; {_load()}")
        base = result.row(result.baseline)
        if base.error_pct is not None:
            print(f"single-rank calibrated model ({result.baseline}): predicted "
                  f"{base.predicted_s * 1e3:.2f} ms, measured {base.measured_s * 1e3:.2f} ms, "
                  f"error {base.error_pct:+.1f} %")
        for r in result.rows:
            if r.status != "ok":
                print(f"  {r.variant:<28} {r.status}: {r.reason}")
                continue
            pp = f"{r.speedup_error_pp:+7.1f} pp" if r.speedup_error_pp is not None else ""
            print(f"  {r.variant:<28} pred {r.predicted_s * 1e3:8.2f} ms  meas {r.measured_s * 1e3:8.2f} ms "
                  f"(IQR {r.measured_iqr_s * 1e3:6.2f})  err {r.error_pct:+7.1f} %  speedup pred "
                  f"{r.predicted_speedup:6.3f} meas {r.measured_speedup:6.3f} {pp}")
        if acc["compared"]:
            worst_pp = acc["max_abs_speedup_error_pp"] or 0.0
            print(f"  median |error| {acc['median_abs_error_pct']:.1f} %, worst "
                  f"{acc['worst_error_pct']:+.1f} % ({acc['worst_variant']}), worst speedup error "
                  f"{worst_pp:.1f} pp, wrong side of 1.0: "
                  f"{', '.join(acc['speedups_on_wrong_side']) or 'none'}")
            if acc["measured_round_spread_pct"] is not None:
                print(f"  the measurement against itself: a round's mean up to "
                      f"{acc['measured_round_spread_pct']:.1f} % from the other rounds' (median over the "
                      f"variants), a speedup {acc['measured_speedup_range_pp'] or 0.0:.1f} pp apart over the "
                      f"rounds")

    if len(repeats) > 1:
        print("\n## spread over the repeats (min .. max)")
        for key in ("median_abs_error_pct", "worst_error_pct", "max_abs_speedup_error_pp",
                    "measured_round_spread_pct", "measured_speedup_range_pp"):
            values = [acc[key] for _, acc in repeats if acc[key] is not None]
            if values:
                mid = statistics.median(values)
                print(f"  {key:<26} {min(values):+8.1f} .. {max(values):+8.1f} (median {mid:+.1f})")
        base_errors = [res.row(res.baseline).error_pct for res, _ in repeats]
        base_errors = [e for e in base_errors if e is not None]
        if base_errors:
            print(f"  {'single-rank error %':<26} {min(base_errors):+8.1f} .. {max(base_errors):+8.1f}")
    print(f"\nreports in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
