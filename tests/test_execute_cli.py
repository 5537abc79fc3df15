"""`trainsim execute`: runs a scenario's variants for real, marks what this box cannot run; one-line
errors."""

import json
import os

import pytest
import yaml
from typer.testing import CliRunner

pytest.importorskip("torch")

from trainsim.cli import app  # noqa: E402

runner = CliRunner()
TOO_MANY = len(os.sched_getaffinity(0)) + 1


@pytest.fixture
def scenario(tmp_path):
    data = {
        "schema": "trainsim.scenario/1", "name": "tiny", "topology": "calibrated",
        "workload": {"name": "tiny-cnn", "image_size": 16}, "strategy": {"name": "single"},
        "batch_size": 4, "gpus": 1, "iterations": 2, "warmup_iterations": 0,
        "executor": {"device": "cpu"},
        "variants": {
            "single": {},
            "too-many-ranks": {"strategy": {"name": "ddp"}, "gpus": TOO_MANY, "batch_size": 4 * TOO_MANY},
            "hybrid": {"strategy": {"name": "hybrid"}, "gpus": 1},
        },
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_execute_json_measures_and_marks_skipped_rows(scenario, tmp_path):
    out = tmp_path / "measured.json"
    result = runner.invoke(app, ["execute", str(scenario), "--json", "--iterations", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == "trainsim.execution/1" and doc["provenance"]["tool"] == "trainsim"
    rows = {row["variant"]: row for row in doc["variants"]}
    assert list(rows) == ["single", "too-many-ranks", "hybrid"]
    measured = rows["single"]["measurement"]
    assert measured["schema"] == "trainsim.measurement/1" and measured["median_s"] > 0
    assert len(measured["iteration_s"]) == 1 and measured["samples_per_s"] > 0
    assert "cores" in rows["too-many-ranks"]["skipped"] and rows["too-many-ranks"]["measurement"] is None
    assert "hybrid" in rows["hybrid"]["skipped"]
    assert json.loads(out.read_text())["variants"][0]["measurement"]["median_s"] == measured["median_s"]


def test_execute_table_names_the_reason(scenario):
    result = runner.invoke(app, ["execute", str(scenario), "--variant", "too-many-ranks",
                                 "--variant", "hybrid"])
    assert result.exit_code == 0, result.output
    assert f"skipped too-many-ranks: needs {TOO_MANY} CPU ranks" in result.output
    assert "skipped hybrid: the executor does not run strategy hybrid" in result.output


@pytest.mark.parametrize("args, message", [
    (["--variant", "nope"], "valid choices: hybrid, single, too-many-ranks"),
    (["--iterations", "0"], "iterations"),
])
def test_execute_bad_input_is_one_line(scenario, args, message):
    result = runner.invoke(app, ["execute", str(scenario), *args])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_execute_bad_scenario_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"workload": "tiny-cnn", "strategy": {"name": "teleport"},
                                    "batch_size": 4}))
    result = runner.invoke(app, ["execute", str(path)])
    assert result.exit_code == 2 and "teleport" in result.output and "Traceback" not in result.output
    missing = runner.invoke(app, ["execute", "no-such-scenario"])
    assert missing.exit_code == 2 and "validate-cpu" in missing.output


def test_a_scenario_on_a_gpu_machine_runs_on_cuda_or_is_skipped():
    # the shipped single-GPU ResNet-50 (dgx-a100) is a CUDA run: a box without CUDA skips it at once rather
    # than training ResNet-50 on its cores for minutes
    import torch

    from trainsim.calibrate.execute.config import exec_config_from_scenario, load_scenario_dict

    assert exec_config_from_scenario(load_scenario_dict("single-gpu-resnet50")).device == "cuda"
    run = {"workload": "tiny-cnn", "strategy": {"name": "single"}, "batch_size": 8}
    assert exec_config_from_scenario({**run, "topology": "calibrated"}).device == "cpu"
    assert exec_config_from_scenario(run).device == "cpu"  # no topology: the box it runs on
    on_gpus = {**run, "topology": "dgx-a100", "executor": {"device": "cpu"}}
    assert exec_config_from_scenario(on_gpus).device == "cpu"
    if torch.cuda.is_available():
        pytest.skip("this box has CUDA: the scenario would run")
    result = runner.invoke(app, ["execute", "single-gpu-resnet50", "--json"])
    assert result.exit_code == 0, result.output
    (entry,) = json.loads(result.stdout)["variants"]
    assert "needs CUDA" in entry["skipped"]
