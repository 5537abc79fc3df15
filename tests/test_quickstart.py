"""`trainsim quickstart`: calibrate, simulate, execute, compare, report — end to end on this box
(two variants, few iterations, so it stays around a minute on 2 cores)."""

import json

import pytest
from typer.testing import CliRunner

pytest.importorskip("torch")

from trainsim.calibrate.validate.quickstart import calibration_batch_sizes  # noqa: E402
from trainsim.cli import app  # noqa: E402

runner = CliRunner()


def test_calibration_batch_sizes_are_the_per_rank_batches_of_the_variants():
    # validate-cpu: batch 64 on one rank, 32 per rank on two, pipeline micro-batches of 64 / 4
    assert calibration_batch_sizes("validate-cpu", ["single"]) == (64,)
    assert calibration_batch_sizes("validate-cpu", ["single", "ddp-2"]) == (32, 64)
    assert calibration_batch_sizes("validate-cpu", ["pipeline-2-gpipe"]) == (16,)


@pytest.mark.slow
def test_quickstart_end_to_end(tmp_path):
    out = tmp_path / "qs"
    result = runner.invoke(app, ["quickstart", "--out", str(out), "--device", "cpu", "--variants",
                                 "single,ddp-2", "--iterations", "2", "--warmup", "1", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == "trainsim.validation/1" and doc["status"] == "complete"
    assert doc["scenario_run"] == "validate-cpu" and doc["baseline"] == "single"
    rows = {row["variant"]: row for row in doc["rows"]}
    assert list(rows) == ["single", "ddp-2"]
    for row in rows.values():
        assert row["status"] == "ok", row
        assert row["predicted_s"] > 0 and row["measured_s"] > 0
        predicted, measured = row["predicted_s"], row["measured_s"]
        assert row["error_pct"] == pytest.approx(100 * (predicted - measured) / measured)
    ddp = rows["ddp-2"]
    assert ddp["measured_speedup"] == pytest.approx(rows["single"]["measured_s"] / ddp["measured_s"])
    gap = ddp["predicted_speedup"] - ddp["measured_speedup"]
    assert ddp["speedup_error_pp"] == pytest.approx(100 * gap)
    report = out / "report"
    assert (out / "calibration" / "meta.json").is_file()
    assert json.loads((report / "validation.json").read_text())["rows"][1]["variant"] == "ddp-2"
    assert (report / "predicted_vs_measured.png").read_bytes()[:4] == b"\x89PNG"
    text = (report / "report.md").read_text()
    assert "| single |" in text and "| ddp-2 |" in text
    for row in rows.values():  # the simulated timeline next to the real run's profiler trace
        assert (report / row["sim_trace"]).is_file() and (report / row["real_trace"]).is_file()
