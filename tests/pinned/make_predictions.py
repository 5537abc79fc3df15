"""Writes tests/data/bundle-cpu-2rank.predictions.json: what the simulator predicts for every variant of
`validate-cpu` from the pinned CPU bundle (tests/data/bundle-cpu-2rank, a 2-rank gloo calibration of a
2-vCPU box), with and without the per-variant measurements `validate` feeds it (input pipeline cost, loader
overlap, codec cost). `tests/test_pinned_predictions.py` checks that refactors leave them unchanged; rerun
this only when the physics is meant to change, and say so in the commit.

    python tests/pinned/make_predictions.py
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent / "data"
BUNDLE = HERE / "bundle-cpu-2rank"
OUT = HERE / "bundle-cpu-2rank.predictions.json"
SCENARIO = "validate-cpu"

#: the measurements validate hands the prediction, as a 2-vCPU box measured them (fixed inputs here)
MEASURED = {"prep_s_per_sample": 2.5e-4, "loader_overlap": {"step": 1.12, "prep": 1.3}, "codec_s": 4e-4}


def _workload_name(workload) -> str | None:
    if isinstance(workload, str):
        return workload
    if isinstance(workload, dict):
        return workload.get("name")
    return getattr(workload, "name", None)


def predictions() -> dict:
    """Every variant of the scenario whose model the pinned bundle calibrated (the others, e.g. the mesh
    rows' llama-tiny, need a bundle of their own)."""
    from trainsim.calibrate.validate.run import predict
    from trainsim.errors import TrainsimError
    from trainsim.formats.scenario_loader import check_variants
    from trainsim.resolve import load_bundle, resolve_scenario

    calibrated = set(load_bundle(str(BUNDLE)).workloads)
    out = {}
    for variant in check_variants(SCENARIO):
        if _workload_name(resolve_scenario(SCENARIO, variant=variant).workload) not in calibrated:
            continue
        for label, extra in (("bundle", {}), ("measured", MEASURED)):
            try:
                result = predict(SCENARIO, variant, str(BUNDLE), **extra)
            except TrainsimError as exc:  # a variant the simulator declines stays declined
                out[f"{variant}/{label}"] = {"error": str(exc)}
                continue
            out[f"{variant}/{label}"] = {
                "iteration_times_s": result.iteration_times_s,
                "breakdown_s": result.breakdown_s,
                "memory_peak_bytes": [g.memory_peak_bytes for g in result.gpus],
            }
    return out


if __name__ == "__main__":
    OUT.write_text(json.dumps(predictions(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}")
