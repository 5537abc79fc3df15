"""Headline accuracy of trainsim on this box: predicted vs measured on a validation scenario.

    .venv/bin/python benchmarks/validate_accuracy.py [--scenario validate-cpu|validate-gpu|FILE]
                     [--repeats 3] [--rounds 3] [--variants a,b] [--iterations N] [--calibration DIR]
                     [--out DIR] [--results FILE]

1. Calibrates this box quickly for the scenario's model (its zoo options too) on the scenario's device, at
   the per-rank batch sizes of its variants, afresh for every repeat (as `trainsim quickstart` does), so the
   spread includes the calibration's own; --calibration DIR reuses one bundle for every repeat instead.
2. Issue 4's check: the calibrated model (the scenario's baseline, one rank) simulated from its own bundle vs
   its measured iteration time.
3. Runs `validate validate-cpu` ``--repeats`` times, each against its own bundle, every variant executed
   ``--rounds`` times round-robin with the iterations pooled (`validate --rounds`), and prints per repeat:
   the median |error|, the worst error, and every speedup's error in percentage points, then each figure's
   spread over the repeats.

Prints the load average next to the figures: timings taken while other work shares the cores are noisy.
The first line says where it ran (host, device name, driver, CUDA and torch versions, date); --results FILE
also writes that line and every figure printed to FILE (for benchmarks/results/).
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


def provenance() -> str:
    """Where these figures come from: host, device (name, driver, CUDA), torch version and the date."""
    import datetime
    import platform

    import torch

    device = f"CPU ({os.cpu_count()} cores)"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        device = (f"{torch.cuda.device_count()} x {props.name} ({props.total_memory / 2**30:.0f} GiB), "
                  f"driver {_driver_version()}, CUDA {torch.version.cuda}")
    return (f"{platform.node()}: {device}; torch {torch.__version__}; python {platform.python_version()}; "
            f"{datetime.date.today().isoformat()}")


def main(argv: list[str] | None = None) -> int:
    from trainsim.calibrate.measure import runner
    from trainsim.calibrate.validate.quickstart import (
        LAYER_REPEATS,
        _scenario_model,
        calibration_batch_sizes,
        calibration_precisions,
    )
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
    parser.add_argument("--results", default=None, help="also write what is printed to this file")
    args = parser.parse_args(argv)
    if args.results:
        sys.stdout = _Tee(sys.stdout, Path(args.results))
    variants = [v for v in args.variants.split(",") if v] if args.variants else None
    out = Path(args.out or tempfile.mkdtemp(prefix="trainsim-accuracy-"))
    overrides = {"iterations": args.iterations} if args.iterations else {}

    model, options = _scenario_model(args.scenario)
    device = _scenario_device(args.scenario)
    print(f"# {args.scenario} ({model}) on {provenance()}")
    print(f"# {_load()}")

    def calibrate(k: int) -> str:
        began = time.perf_counter()
        config = runner.CalibrationConfig(model=model, model_options=options, out=out / f"calibration-{k}",
                                          device=device, ranks=min(2, runner.default_ranks(device)),
                                          quick=True, repeats=LAYER_REPEATS,
                                          batch_sizes=calibration_batch_sizes(args.scenario, variants),
                                          precisions=calibration_precisions(args.scenario, variants))
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
            if r.memory_error_pct is not None:
                print(f"  {'':<28} peak memory pred {r.predicted_peak_memory_bytes / 2**30:7.2f} GiB  meas "
                      f"{r.measured_peak_memory_bytes / 2**30:7.2f} GiB  err {r.memory_error_pct:+7.1f} %")
        if acc["compared"]:
            worst_pp = acc["max_abs_speedup_error_pp"] or 0.0
            print(f"  median |error| {acc['median_abs_error_pct']:.1f} %, worst "
                  f"{acc['worst_error_pct']:+.1f} % ({acc['worst_variant']}), worst speedup error "
                  f"{worst_pp:.1f} pp, wrong side of 1.0: "
                  f"{', '.join(acc['speedups_on_wrong_side']) or 'none'}")
            if acc["memory_compared"]:
                print(f"  peak memory: median |error| {acc['median_abs_memory_error_pct']:.1f} %, worst "
                      f"{acc['worst_memory_error_pct']:+.1f} % ({acc['worst_memory_variant']})")
            if acc["measured_round_spread_pct"] is not None:
                print(f"  the measurement against itself: a round's mean up to "
                      f"{acc['measured_round_spread_pct']:.1f} % from the other rounds' (median over the "
                      f"variants), a speedup {acc['measured_speedup_range_pp'] or 0.0:.1f} pp apart over the "
                      f"rounds")

    if len(repeats) > 1:
        print("\n## spread over the repeats (min .. max)")
        for key in ("median_abs_error_pct", "worst_error_pct", "max_abs_speedup_error_pp",
                    "median_abs_memory_error_pct", "worst_memory_error_pct",
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


def _driver_version() -> str:
    import subprocess

    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return done.stdout.split("\n")[0].strip() or "unknown"


def _scenario_device(scenario: str) -> str:
    """The device the scenario's real runs use (its executor's), resolved on this box."""
    from trainsim.calibrate.execute.config import exec_config_from_scenario, load_scenario_dict
    from trainsim.calibrate.measure import runner

    cfg = exec_config_from_scenario(load_scenario_dict(scenario), None, file=scenario)
    return runner.resolve_device(cfg.device)


class _Tee:
    """stdout that is also written, line by line, to a file (kept when the run is cut short)."""

    def __init__(self, stream, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.stream, self.file = stream, path.open("w")

    def write(self, text: str) -> int:
        self.file.write(text)
        self.file.flush()
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


if __name__ == "__main__":
    sys.exit(main())
