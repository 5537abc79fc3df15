"""``trainsim quickstart``: the main job on whatever box it runs on, in one call.

1. a quick calibration of this box for the validation scenario's model, at the per-rank batch sizes its
   variants run (``OUT/calibration``);
2. the validation scenario for this box (``validate-gpu`` when CUDA is present, else ``validate-cpu``),
   every variant simulated from that bundle and executed for real (``calibrate.validate``);
3. the predicted-vs-measured report (``OUT/report``: report.md, the chart, validation.json, the traces).

Ctrl-C keeps what finished: a partial bundle (``resume=True`` continues it) and the rows so far.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainsim.calibrate.validate.results import ValidationResult

DEFAULT_OUT = "trainsim-quickstart"
# per-layer timing repeats: --quick's 3 leave a median that one busy moment on a shared box moves by 10-15 %;
# 20 cost seconds on the validation models and make the layer times the simulator starts from stable
LAYER_REPEATS = 20
SCENARIOS = {"cpu": "validate-cpu", "cuda": "validate-gpu"}


@dataclass
class QuickstartResult:
    scenario: str
    calibration: Path
    report_dir: Path
    validation: ValidationResult
    files: dict[str, Path]


def calibration_batch_sizes(scenario: str, variants: list[str] | None = None) -> tuple[int, ...]:
    """The per-rank batch sizes the scenario's variants run with the scenario's own model (a pipeline's
    micro-batch, too), so the bundle measures the layers at the sizes the simulator will ask for."""
    from trainsim.calibrate.execute.config import (
        exec_config_from_scenario,
        load_scenario_dict,
        scenario_variants,
    )

    data = load_scenario_dict(scenario)
    base = exec_config_from_scenario(data, None, file=scenario)
    sizes = set()
    for name in variants or scenario_variants(data) or [None]:
        cfg = exec_config_from_scenario(data, name, file=scenario)
        if (cfg.model, cfg.model_cfg) != (base.model, base.model_cfg):
            continue  # another model: the bundle cannot predict it anyway (validate says so)
        if cfg.strategy == "pipeline":
            stages = cfg.pipeline.stages or cfg.ranks
            replicas = max(1, cfg.ranks // stages)
            sizes.add(max(1, cfg.batch_size // replicas // cfg.pipeline.micro_batches))
        else:
            sizes.add(cfg.batch_size if cfg.strategy == "single" else cfg.local_batch)
    return tuple(sorted(sizes))


def calibration_precisions(scenario: str, variants: list[str] | None = None) -> tuple[str, ...]:
    """The precisions the scenario's variants run its own model in (fp32 first), so the bundle measures the
    layers in each rather than leave the simulator to rescale fp32 times by a roofline."""
    from trainsim.calibrate.execute.config import (
        exec_config_from_scenario,
        load_scenario_dict,
        scenario_variants,
    )

    data = load_scenario_dict(scenario)
    base = exec_config_from_scenario(data, None, file=scenario)
    wanted = {"fp32"}
    for name in variants or scenario_variants(data) or [None]:
        cfg = exec_config_from_scenario(data, name, file=scenario)
        if (cfg.model, cfg.model_cfg) == (base.model, base.model_cfg):
            wanted.add(cfg.precision)
    from trainsim.calibrate.measure.runner import PRECISIONS

    return ("fp32",) + tuple(sorted(p for p in wanted if p in PRECISIONS and p != "fp32"))


def quickstart(out: str | os.PathLike = DEFAULT_OUT, *, device: str = "auto",
               variants: list[str] | None = None, resume: bool = False,
               calibration_progress: Callable[[str, str], None] | None = None,
               progress: Callable[[str], None] | None = None, **overrides) -> QuickstartResult:
    """Calibrate quickly, simulate and execute the validation scenario, write the report under ``out``.

    ``overrides`` go to the real runs (``iterations=``, ``warmup=``)."""
    from trainsim.calibrate.measure import runner
    from trainsim.calibrate.validate import report
    from trainsim.calibrate.validate.run import validate

    out = Path(out)
    resolved = runner.resolve_device(device)
    scenario = SCENARIOS[resolved]
    model, options = _scenario_model(scenario)
    config = runner.CalibrationConfig(
        model=model, model_options=options, out=out / "calibration", device=resolved, quick=True,
        resume=resume, repeats=LAYER_REPEATS,
        batch_sizes=calibration_batch_sizes(scenario, variants),
        precisions=calibration_precisions(scenario, variants),
        ranks=min(2, runner.default_ranks(resolved)))
    runner.validate(config)
    bundle = runner.run_calibration(config, progress=calibration_progress)
    report_dir = out / "report"
    result = validate(scenario, bundle, variants, report_dir=report_dir, progress=progress, **overrides)
    files = report.write_report(result, report_dir)
    return QuickstartResult(scenario, Path(bundle), report_dir, result, files)


def _scenario_model(scenario: str) -> tuple[str, dict]:
    """The zoo model of the scenario's base (and its options: image size, classes), which is calibrated."""
    from trainsim.calibrate.execute.config import exec_config_from_scenario, load_scenario_dict

    cfg = exec_config_from_scenario(load_scenario_dict(scenario), None, file=scenario)
    return cfg.model, dict(cfg.model_cfg)
