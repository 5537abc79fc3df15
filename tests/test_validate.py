"""`trainsim validate`: errors and speedups computed right, every variant in the table, skipped rows with
their reason, a bundle from another machine refused unless --force, corrupt bundles as one line,
report files."""

import json
from types import SimpleNamespace

import pytest
import yaml
from typer.testing import CliRunner

from trainsim.calibrate.validate.results import (
    ValidationInterrupted,
    ValidationResult,
    ValidationRow,
    accuracy,
    compare,
    percent_error,
)
from trainsim.calibrate.validate.run import machine_mismatch
from trainsim.errors import TrainsimError

runner = CliRunner()


# ---------------------------------------------------------------- the arithmetic, on synthetic rows


def rows(*triples):
    return [ValidationRow(name, "ddp", 2, predicted_s=p, measured_s=m) for name, p, m in triples]


def test_percent_error_is_signed_relative_to_the_measurement():
    assert percent_error(0.11, 0.10) == pytest.approx(10.0)
    assert percent_error(0.09, 0.10) == pytest.approx(-10.0)
    assert percent_error(None, 0.1) is None and percent_error(0.1, None) is None
    assert percent_error(1, 0) is None


def test_compare_fills_errors_and_speedups_over_the_baseline():
    table = rows(("base", 0.200, 0.250), ("fast", 0.100, 0.125), ("slow", 0.300, 0.200))
    compare(table, "base")
    base, fast, slow = table
    assert base.error_pct == pytest.approx(-20.0) and base.predicted_speedup == base.measured_speedup == 1.0
    assert fast.error_pct == pytest.approx(-20.0)
    assert fast.predicted_speedup == pytest.approx(2.0) and fast.measured_speedup == pytest.approx(2.0)
    assert fast.speedup_error_pp == pytest.approx(0.0)
    assert slow.error_pct == pytest.approx(50.0)
    assert slow.predicted_speedup == pytest.approx(2 / 3) and slow.measured_speedup == pytest.approx(1.25)
    assert slow.speedup_error_pp == pytest.approx(100 * (2 / 3 - 1.25))


def test_rows_without_both_sides_get_no_figures():
    table = rows(("base", 0.2, 0.2), ("skipped", 0.1, None), ("not-simulated", None, 0.1))
    table[1].skipped, table[2].not_simulated = "needs 64 CPU ranks", "unknown strategy"
    compare(table, "base")
    assert [r.status for r in table] == ["ok", "skipped", "not simulated"]
    assert table[1].error_pct is None and table[1].predicted_speedup == pytest.approx(2.0)
    assert table[1].measured_speedup is None and table[1].speedup_error_pp is None
    assert table[2].error_pct is None and table[2].measured_speedup == pytest.approx(2.0)
    compare(table, "missing-baseline")
    assert all(r.predicted_speedup is None for r in table)


def test_accuracy_reports_median_worst_and_wrong_side_speedups():
    table = rows(("base", 0.100, 0.100), ("a", 0.090, 0.100), ("b", 0.130, 0.100), ("c", 0.080, 0.120))
    compare(table, "base")
    acc = accuracy(table, "base")
    assert acc["compared"] == 4
    assert acc["median_abs_error_pct"] == pytest.approx(20.0)  # |errors| 0, 10, 30, 33.3
    assert acc["worst_variant"] == "c" and acc["worst_error_pct"] == pytest.approx(-100 / 3)
    # b: predicted 0.77x (slower), measured 1.0x; c: predicted 1.25x faster, measured 0.83x slower
    assert acc["speedups_on_wrong_side"] == ["c"]
    assert set(acc["speedup_error_pp"]) == {"a", "b", "c"}
    assert acc["max_abs_speedup_error_pp"] == pytest.approx(100 * (0.1 / 0.08 - 0.1 / 0.12))


def test_the_measurement_against_itself_round_by_round():
    from trainsim.calibrate.validate.results import round_spread_pct

    assert round_spread_pct([0.010]) is None and round_spread_pct([]) is None
    assert round_spread_pct([0.010, 0.012]) == pytest.approx(20.0)  # 12 against 10, the farther way round
    assert round_spread_pct([0.010, 0.010, 0.013]) == pytest.approx(30.0)
    table = rows(("base", 0.100, 0.100), ("a", 0.050, 0.050))
    table[0].measured_round_means_s, table[1].measured_round_means_s = [0.100, 0.100], [0.050, 0.0625]
    compare(table, "base")
    assert table[1].measured_round_spread_pct == pytest.approx(25.0)
    assert table[1].measured_speedup_range_pp == pytest.approx(200.0 - 160.0)  # 2.0x and 1.6x over the rounds
    assert table[0].measured_speedup_range_pp is None  # the baseline over itself
    acc = accuracy(table, "base")
    assert acc["measured_round_spread_pct"] == pytest.approx(12.5)  # median of 0 and 25
    assert acc["measured_speedup_range_pp"] == pytest.approx(40.0)
    one = rows(("base", 0.100, 0.100))
    compare(one, "base")
    assert accuracy(one, "base")["measured_round_spread_pct"] is None  # one round says nothing


def test_machine_mismatch_compares_device_names_and_cores():
    def bundle(devices, cores, device="cpu"):
        meta = SimpleNamespace(provenance={"devices": devices}, config={"device": device})
        return SimpleNamespace(meta=meta,
                               machine=SimpleNamespace(cpu=SimpleNamespace(cores=cores)))

    here = {"devices": ["Some CPU"], "cores": 2}
    assert machine_mismatch(bundle(["Some CPU"], 2), here) is None
    assert "Other CPU" in machine_mismatch(bundle(["Other CPU"], 2), here)
    assert "8 CPU cores" in machine_mismatch(bundle(["Some CPU"], 8), here)
    assert "A100" in machine_mismatch(bundle(["NVIDIA A100"], 8, "cuda"), {"devices": ["NVIDIA H100"]})


# ---------------------------------------------------------------- against a real (small) bundle

@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory):
    pytest.importorskip("torch")
    from trainsim.calibrate.measure import runner as cal

    out = tmp_path_factory.mktemp("bundle")
    cal.run_calibration(cal.CalibrationConfig(model="tiny-cnn", out=out, device="cpu", ranks=2, quick=True,
                                              batch_sizes=(4,), steps=("probe", "layers")))
    return out


@pytest.fixture
def scenario(tmp_path):
    import os

    too_many = len(os.sched_getaffinity(0)) + 1
    data = {
        "schema": "trainsim.scenario/1", "name": "tiny-validate", "topology": "calibrated",
        "workload": {"name": "tiny-cnn", "image_size": 32}, "strategy": {"name": "single"},
        "batch_size": 8, "gpus": 1, "iterations": 2, "warmup_iterations": 1,
        "executor": {"device": "cpu"},
        "variants": {
            "single": {},
            "ddp-2": {"strategy": {"name": "ddp"}, "gpus": 2},
            "too-many-ranks": {"strategy": {"name": "ddp"}, "gpus": too_many, "batch_size": 4 * too_many},
        },
    }
    path = tmp_path / "tiny-validate.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _validate(scenario, bundle_dir, **kw):
    from trainsim.calibrate.validate.run import validate

    return validate(str(scenario), bundle_dir, execute=False, **kw)


def test_every_variant_is_a_row_and_skipped_rows_say_why(scenario, bundle_dir):
    result = _validate(scenario, bundle_dir)
    assert [r.variant for r in result.rows] == ["single", "ddp-2", "too-many-ranks"]
    assert result.baseline == "single" and result.status == "complete"
    single, ddp, too_many = result.rows
    assert single.predicted_s > 0 and ddp.predicted_s > 0 and single.prep_s_per_sample > 0
    assert ddp.predicted_speedup == pytest.approx(single.predicted_s / ddp.predicted_s)
    assert too_many.status == "skipped" and "cores" in too_many.reason and too_many.measured_s is None


def test_bundle_from_another_machine_is_refused_unless_forced(scenario, bundle_dir):
    other = {"devices": ["Imaginary CPU 9000"], "cores": 2}
    with pytest.raises(TrainsimError, match="another machine.*Imaginary CPU 9000.*--force"):
        _validate(scenario, bundle_dir, here=other)
    result = _validate(scenario, bundle_dir, here=other, force=True, variants=["single"])
    assert any("--force" in note for note in result.notes) and result.rows[0].predicted_s > 0


def test_rounds_run_every_variant_round_robin_and_pool_the_iterations(scenario, bundle_dir, monkeypatch):
    from types import SimpleNamespace

    from trainsim.calibrate.execute import executor
    from trainsim.calibrate.validate.run import validate

    order, times = [], {"single": iter([[0.010, 0.012], [0.020, 0.030]]), "ddp-2": iter([[0.5], [0.7]])}
    peaks = iter([[3 << 20], [5 << 20, 4 << 20], [2 << 20], [6 << 20, 1 << 20]])

    def fake_run(cfg):
        name = "single" if cfg.ranks == 1 else "ddp-2"
        order.append(name)
        seconds = next(times[name])
        # single reads as a CUDA peak, ddp-2 as CPU ranks' resident-set growth
        measure = "cuda.max_memory_allocated" if name == "single" else "cpu.peak_rss_delta"
        return SimpleNamespace(iteration_s=seconds, breakdown_s={"forward": seconds[0]},
                               peak_memory_bytes=next(peaks), memory_measure=measure)

    monkeypatch.setattr(executor, "run", fake_run)
    result = validate(str(scenario), bundle_dir, ["single", "ddp-2"], rounds=2)
    assert order == ["single", "ddp-2", "single", "ddp-2"]
    single, ddp = result.rows
    assert single.measured_iterations_s == [0.010, 0.012, 0.020, 0.030] and single.measured_rounds == 2
    # the mean of the pooled iterations (the median would be 0.016), their IQR the spread
    assert single.measured_s == pytest.approx(0.018) and ddp.measured_s == pytest.approx(0.6)
    assert single.measured_iqr_s == pytest.approx(0.0225 - 0.0115)
    assert single.measured_breakdown_s == {"forward": pytest.approx(0.015)}  # the mean over the rounds
    # peak memory: the largest rank of the largest round, compared with the simulation on CUDA only
    assert single.measured_peak_memory_bytes == 3 << 20 and ddp.measured_peak_memory_bytes == 6 << 20
    assert single.predicted_peak_memory_bytes > 0
    assert single.memory_error_pct == pytest.approx(
        100 * (single.predicted_peak_memory_bytes - (3 << 20)) / (3 << 20))
    assert ddp.memory_error_pct is None
    assert result.accuracy()["memory_compared"] == 1
    with pytest.raises(TrainsimError, match="rounds"):
        validate(str(scenario), bundle_dir, ["single"], rounds=0)


def test_unknown_variant_lists_the_valid_ones(scenario, bundle_dir):
    with pytest.raises(TrainsimError, match="unknown variant 'nope'; valid choices: ddp-2, single"):
        _validate(scenario, bundle_dir, variants=["single", "nope"])


def test_interrupt_keeps_the_finished_rows(scenario, bundle_dir, tmp_path):
    def progress(text):
        if text.startswith("ddp-2"):
            raise KeyboardInterrupt

    with pytest.raises(ValidationInterrupted) as info:
        _validate(scenario, bundle_dir, report_dir=tmp_path / "rep", progress=progress)
    doc = json.loads((tmp_path / "rep" / "validation.json").read_text())
    assert doc["schema"] == "trainsim.validation/1" and doc["status"] == "interrupted"
    assert doc["rows"][0]["predicted_s"] > 0 and doc["rows"][1]["status"] == "pending"
    assert info.value.partial.rows[0].predicted_s > 0
    assert "Status: interrupted" in (tmp_path / "rep" / "report.md").read_text()


def test_corrupt_bundle_is_one_line_on_the_cli(scenario, tmp_path):
    from trainsim.cli import app

    (tmp_path / "meta.json").write_text("{not json")
    result = runner.invoke(app, ["validate", str(scenario), "--calibration", str(tmp_path)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "meta.json" in lines[0] and "not valid JSON" in lines[0]
    result = runner.invoke(app, ["validate", str(scenario), "--calibration", str(tmp_path / "missing")])
    assert result.exit_code == 2 and "not a calibration bundle folder" in result.output


def test_bundle_without_topology_is_one_line(scenario, tmp_path):
    meta = {"schema": "trainsim.calibration/1", "provenance": {"devices": ["x"]}, "config": {"device": "cpu"},
            "status": "partial", "steps_planned": ["probe"], "steps_done": {}, "notes": []}
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(TrainsimError, match="no topology.yaml"):
        _validate(scenario, tmp_path)


# ---------------------------------------------------------------- the report


def synthetic_result():
    table = rows(("single", 0.100, 0.105), ("ddp-2", 0.060, 0.055))
    table.append(ValidationRow("too-many", "ddp", 64, skipped="needs 64 CPU ranks, each on its own core"))
    compare(table, "single")
    return ValidationResult("tiny", "bundle/", "single", "cpu", table, notes=["a note"])


def test_report_writes_markdown_and_png(tmp_path):
    from trainsim.calibrate.validate.report import report_markdown, write_report

    files = write_report(synthetic_result(), tmp_path)
    assert files["chart"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = files["report"].read_text()
    assert text == report_markdown(synthetic_result())
    for needle in ("| single |", "| ddp-2 |", "| too-many |", "skipped too-many: needs 64 CPU ranks",
                   "predicted_vs_measured.png", "-4.8", "a note"):
        assert needle in text
    assert not list(tmp_path.glob(".*"))  # no temporary files left


def test_cli_help_names_the_options():
    from trainsim.cli import app

    result = runner.invoke(app, ["validate", "--help"])
    assert result.exit_code == 0
    for option in ("--calibration", "--variants", "--report", "--force", "--json"):
        assert option in result.output


def test_rows_on_the_default_pipeline_leave_its_in_loop_cost_to_the_bundle():
    pytest.importorskip("torch")  # the other pipeline is timed here, with torch
    from trainsim.calibrate.execute.config import DataConfig, ExecConfig
    from trainsim.calibrate.validate.run import _measured_costs

    configs = {"plain": ExecConfig(model="tiny-cnn", model_cfg={"image_size": 16}, batch_size=4),
               "heavy": ExecConfig(model="tiny-cnn", model_cfg={"image_size": 16}, batch_size=4,
                                   data=DataConfig(augment_repeats=3))}
    for in_loop, plain_measured in ((True, False), (False, True)):
        table = [ValidationRow(name, "single", 1) for name in configs]
        _measured_costs(table, configs, dict.fromkeys(configs), in_loop=in_loop)
        plain, heavy = table
        assert heavy.prep_s_per_sample > 0  # another pipeline: timed here
        assert (plain.prep_s_per_sample is not None) == plain_measured
