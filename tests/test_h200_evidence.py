"""The kept H200 evidence (benchmarks/data/h200-run3) still loads, and the simulator's peak memory of its
fp32 rows stays within issue 21's 5 % of `torch.cuda.max_memory_allocated` (`benchmarks/h200_evidence.py`
prints every row)."""

import json
from pathlib import Path

import pytest

from trainsim.calibrate.validate.run import predict

ROOT = Path(__file__).resolve().parent.parent
EVIDENCE = ROOT / "benchmarks" / "data" / "h200-run3"
ROWS = [("validate-gpu", "validate-gpu", "single-pinned"),
        ("resnet50", str(ROOT / "benchmarks" / "gpu" / "resnet50.yaml"), "resnet50"),
        ("gpt2-small", str(ROOT / "benchmarks" / "gpu" / "gpt2-small.yaml"), "gpt2-small")]


@pytest.mark.parametrize(("folder", "scenario", "variant"), ROWS, ids=[r[0] for r in ROWS])
def test_fp32_peak_memory_within_five_percent_of_the_h200(folder, scenario, variant):
    report = json.loads((EVIDENCE / folder / "report-0.json").read_text())
    row = next(r for r in report["rows"] if r["variant"] == variant)
    result = predict(scenario, variant, str(EVIDENCE / folder / "calibration-0"),
                     prep_s_per_sample=row["prep_s_per_sample"])
    peak = max(g.memory_peak_bytes for g in result.gpus)
    assert peak == pytest.approx(row["measured_peak_memory_bytes"], rel=0.05)
    assert result.gpus[0].memory_at_peak["workspaces"] == 2 * 32 * 2**20  # an H200: compute capability 9.0
