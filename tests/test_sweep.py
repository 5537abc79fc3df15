"""Sweeps (trainsim/sweeps): the spec's points, one row per point, failures recorded per point, resuming,
local processes and Ray giving the rows one by one gives, the Pareto plot, and each bad input as one line."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from trainsim.cli import app
from trainsim.errors import TrainsimError
from trainsim.sweeps import load_spec, run_sweep
from trainsim.sweeps.plot import pareto_front
from trainsim.sweeps.results import ResultsFile, columns
from trainsim.sweeps.spec import list_specs

runner = CliRunner()
BASE = {"name": "tiny", "topology": "pcie-4gpu-gen3", "workload": "tiny-cnn", "strategy": {"name": "ddp"},
        "batch_size": 16, "gpus": 2, "iterations": 1, "warmup_iterations": 0}
#: figures that depend on the machine's load, not on the scenario
UNSTABLE = ("sim_wall_s",)


def _spec(tmp_path: Path, **body) -> Path:
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(BASE))
    spec = {"schema": "trainsim.sweep/1", "name": "t", "scenario": "base.yaml", **body}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _stable(rows: list[dict]) -> dict:
    return {row["key"]: {k: v for k, v in row.items() if k not in UNSTABLE} for row in rows}


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def fails(*args, expected: tuple[str, ...]):
    """One clean `error:` line naming every ``expected`` text, non-zero exit, no traceback."""
    result = invoke(*args)
    assert result.exit_code != 0, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


# ---- the spec ----------------------------------------------------------------------------------------------

def test_points_are_the_list_crossed_with_the_grid(tmp_path):
    sweep = load_spec(_spec(tmp_path, points=[{"gpus": 1}, {"gpus": 2, "batch_size": 32}],
                            grid={"strategy.name": ["ddp", "dp-gpu0"], "optimizations.preload": [0, 1]}))
    assert sweep.fields == ["gpus", "batch_size", "strategy.name", "optimizations.preload"]
    assert [p.values for p in sweep.points[:2]] == [
        {"gpus": 1, "strategy.name": "ddp", "optimizations.preload": 0},
        {"gpus": 1, "strategy.name": "ddp", "optimizations.preload": 1}]
    assert len(sweep.points) == 8 and sweep.points[-1].values == {
        "gpus": 2, "batch_size": 32, "strategy.name": "dp-gpu0", "optimizations.preload": 1}
    scenario = sweep.resolve(sweep.points[-1])
    assert (scenario.gpus, scenario.batch_size, scenario.strategy.name) == (2, 32, "dp-gpu0")
    assert scenario.optimizations.preload == 1 and scenario.topology == "pcie-4gpu-gen3"


def test_the_shipped_sweep_resolves():
    assert "ddp-resnet50-scaling" in list_specs()
    sweep = load_spec("ddp-resnet50-scaling")
    assert len(sweep.points) == 24
    assert {sweep.resolve(p).topology for p in sweep.points} == {"dgx-a100", "dgx1-v100", "pcie-8gpu-2socket"}


@pytest.mark.slow
def test_the_large_model_sweep_runs_end_to_end(tmp_path):
    assert "llama3-8b-dgx-h100-layouts" in list_specs()
    sweep = load_spec("llama3-8b-dgx-h100-layouts")
    assert len(sweep.points) == 48
    out = tmp_path / "layouts.csv"
    result = invoke("sweep", "llama3-8b-dgx-h100-layouts", "-o", out, "--workers", "1", "--json")
    assert result.exit_code == 0, result.output
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 48 and {row["status"] for row in rows} == {"ok"}
    oom = {(row["point.strategy.mesh.zero"], row["point.strategy.mesh.tp"])
           for row in rows if row["oom"] == "true"}
    assert ("0", "1") in oom and ("3", "1") not in oom  # DDP of 8B does not fit 80 GB; FSDP does


def test_pareto_front():
    points = [(1, 10), (2, 15), (2, 12), (3, 14), (4, 20), (1, 9), (5, 20)]
    assert pareto_front(points) == [0, 1, 4]
    assert pareto_front([]) == []


# ---- running ---------------------------------------------------------------------------------------------

def test_a_sweep_writes_one_row_per_point_and_records_failures(tmp_path):
    # point 1 is invalid (batch_size 0), point 2 valid but fails to run (8 GPUs on a 4-GPU machine)
    spec = _spec(tmp_path, points=[{"gpus": 1}, {"batch_size": 0}, {"gpus": 8}, {"gpus": 4}])
    out = tmp_path / "r.csv"
    result = invoke("sweep", spec, "-o", out, "--workers", "1", "--json")
    assert result.exit_code == 1, result.output  # points failed: the run says so, after writing every row
    doc = json.loads(result.stdout)
    assert (doc["points"], doc["ran"], doc["failed"]) == (4, 4, 2)
    rows = sorted(_rows(out), key=lambda r: int(r["index"]))
    assert [r["status"] for r in rows] == ["ok", "error", "error", "ok"]
    assert "point 1" in rows[1]["error"] and "batch_size" in rows[1]["error"]
    assert "point 2" in rows[2]["error"] and "gpus" in rows[2]["error"] and rows[2]["samples_per_s"] == ""
    assert rows[3]["num_gpus"] == "4" and float(rows[3]["samples_per_s"]) > 0
    assert float(rows[3]["gpu_seconds_per_sample"]) == pytest.approx(4 / float(rows[3]["samples_per_s"]))


def test_rerun_resumes_repairs_a_torn_row_and_retries_failures(tmp_path):
    spec = _spec(tmp_path, grid={"gpus": [1, 2, 4, 8]})
    out = tmp_path / "r.csv"
    assert invoke("sweep", spec, "-o", out, "-j", "1").exit_code == 1  # gpus 8 fails on a 4-GPU machine
    first = _rows(out)
    doc = json.loads(invoke("sweep", spec, "-o", out, "--json").stdout)
    assert (doc["ran"], doc["resumed"]) == (0, 4)
    text = out.read_text()
    out.write_text(text[: len(text) - 20])  # a run that stopped in the middle of its last row
    doc = json.loads(invoke("sweep", spec, "-o", out, "-j", "1", "--json").stdout)
    assert (doc["ran"], doc["resumed"]) == (1, 3)
    assert _stable(_rows(out)) == _stable(first)
    doc = json.loads(invoke("sweep", spec, "-o", out, "-j", "1", "--retry-failed", "--json").stdout)
    assert (doc["ran"], doc["resumed"], doc["failed"]) == (1, 3, 1)  # gpus 8 fails again, once
    assert len(_rows(out)) == 4


def test_an_interrupted_run_keeps_whole_rows(tmp_path):
    sweep = load_spec(_spec(tmp_path, grid={"gpus": [1, 2, 4]}))
    out = tmp_path / "r.csv"

    def stop(done, total, row):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(sweep, out, workers=1, progress=stop)
    assert len(_rows(out)) == 1
    report = run_sweep(sweep, out, workers=1)
    assert (report.ran, report.resumed, len(_rows(out))) == (2, 1, 3)


def test_two_sweeps_cannot_write_one_results_file(tmp_path):
    sweep = load_spec(_spec(tmp_path, grid={"gpus": [1]}))
    out = tmp_path / "r.csv"
    with ResultsFile(out, columns(sweep.fields)).lock():
        with pytest.raises(TrainsimError, match="another sweep is writing this results file"):
            run_sweep(sweep, out, workers=1)
        assert (tmp_path / "r.csv.lock").exists()  # the refused run left the holder's lock alone
    assert not out.exists()  # the refused run wrote nothing
    assert run_sweep(sweep, out, workers=1).ran == 1  # and the lock is released with its holder
    assert not (tmp_path / "r.csv.lock").exists()  # nothing left behind


def test_parallel_workers_give_the_rows_of_one_by_one(tmp_path):
    spec = load_spec(_spec(tmp_path, grid={"gpus": [1, 2, 4], "strategy.name": ["ddp", "dp-gpu0"]}))
    serial = run_sweep(spec, tmp_path / "serial.csv", workers=1)
    parallel = run_sweep(spec, tmp_path / "parallel.csv", workers=2)
    assert serial.failed == 0 and len(serial.rows) == 6
    assert _stable(_rows(tmp_path / "serial.csv")) == _stable(_rows(tmp_path / "parallel.csv"))
    assert [r["key"] for r in serial.rows] == [r["key"] for r in parallel.rows]


def test_repeated_points_run_once(tmp_path):
    report = run_sweep(load_spec(_spec(tmp_path, grid={"gpus": [2, 2], "batch_size": [16]})),
                       tmp_path / "r.csv", workers=1)
    assert (report.ran, report.duplicates, len(report.rows)) == (1, 1, 1)


def test_plot_marks_the_pareto_front(tmp_path):
    spec = _spec(tmp_path, grid={"gpus": [1, 2, 4]})
    png = tmp_path / "p.png"
    result = invoke("sweep", spec, "-o", tmp_path / "r.csv", "-j", "1", "--plot", png, "--x", "num_gpus",
                    "--json")
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(result.stdout)["pareto_front"]


def test_parquet_beside_the_csv(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    report = run_sweep(load_spec(_spec(tmp_path, grid={"gpus": [1, 2]})), tmp_path / "r.csv", workers=1)
    table = pq.read_table(report.parquet).to_pylist()
    assert sorted(r["point.gpus"] for r in table) == [1, 2] and all(r["samples_per_s"] > 0 for r in table)


def test_ray_gives_the_rows_of_local_processes(tmp_path):
    pytest.importorskip("ray")
    spec = _spec(tmp_path, grid={"gpus": [1, 2]})
    result = invoke("sweep", spec, "-o", tmp_path / "ray.csv", "-j", "2", "--ray")
    assert result.exit_code == 0, result.output
    assert invoke("sweep", spec, "-o", tmp_path / "local.csv", "-j", "1").exit_code == 0
    assert _stable(_rows(tmp_path / "ray.csv")) == _stable(_rows(tmp_path / "local.csv"))


# ---- bad input: one line each, no results file -------------------------------------------------------------

@pytest.mark.parametrize(("body", "expected"), [
    ({"grid": {"optimizations.prelod": [0, 1]}}, ("sweep.yaml", "grid.optimizations.prelod", "preload")),
    ({"points": [{"gpu": 2}]}, ("points.0.gpu", "unknown key", "gpus")),
    ({"set": {"nope": 1}, "grid": {"gpus": [1]}}, ("set.nope",)),
    ({}, ("sweep.yaml", "no points")),
    ({"grid": {"gpus": []}}, ("grid.gpus", "empty list")),
    ({"grid": {"gpus": 2}}, ("grid.gpus", "list")),
    ({"grid": {"gpus": [1]}, "points": [{"gpus": 2}]}, ("grid.gpus", "both")),
    ({"grid": {"gpus": [1]}, "extra": 1}, ("extra", "unknown field")),
    ({"grid": {"gpus": [1]}, "variant": "nope"}, ("base.yaml", "has no variants", "'nope'")),
    ({"grid": {"gpus": [1]}, "name": "../../elsewhere"}, ("sweep.yaml", "name", "not a plain name")),
])
def test_bad_specs(tmp_path, body, expected):
    out = tmp_path / "r.csv"
    fails("sweep", _spec(tmp_path, **body), "-o", out, expected=expected)
    assert not out.exists()


def test_bad_names_and_options(tmp_path):
    out = tmp_path / "r.csv"
    fails("sweep", "no-such-sweep", "-o", out, expected=("no-such-sweep", "ddp-resnet50-scaling"))
    spec = _spec(tmp_path, grid={"gpus": [1]})
    fails("sweep", spec, "-o", out, "--x", "cost", expected=("--x", "num_gpus"))
    bad_base = tmp_path / "bad-base.yaml"
    bad_base.write_text(yaml.safe_dump({"scenario": "missing.yaml", "grid": {"gpus": [1]}}))
    fails("sweep", bad_base, "-o", out, expected=("missing.yaml", "file not found"))
    fails("sweep", spec, "-o", tmp_path / "r.parquet", expected=("r.parquet", "--out", ".csv"))
    assert not out.exists()


def test_a_results_file_of_another_sweep_is_refused(tmp_path):
    out = tmp_path / "r.csv"
    ResultsFile(out, columns(["batch_size"])).append({"key": "k", "index": 0, "status": "ok"})
    before = out.read_text()
    fails("sweep", _spec(tmp_path, grid={"gpus": [1]}), "-o", out, expected=(str(out), "another sweep"))
    assert out.read_text() == before


@pytest.mark.parametrize("left", ["", "key,ind"])  # made and left empty; torn within the header
def test_a_results_file_without_a_header_gets_one(tmp_path, left):
    out = tmp_path / "r.csv"
    out.write_text(left)
    assert invoke("sweep", _spec(tmp_path, grid={"gpus": [1, 2]}), "-o", out, "-j", "1").exit_code == 0
    rows = _rows(out)
    assert [r["point.gpus"] for r in rows] == ["1", "2"] and all(r["status"] == "ok" for r in rows)


@pytest.mark.parametrize(("row", "expected"), [
    ("a,b,c", ("line 2", "3 cells")),
    ("{key},x" + ",{rest}", ("line 2", "column 'index'", "'x' is not a whole number")),
    ("{key},0" + ",{rest}", ()),  # the row as the sweep wrote it: read back, so the run resumes
])
def test_a_results_row_that_is_not_the_sweeps_is_an_error(tmp_path, row, expected):
    spec = _spec(tmp_path, grid={"gpus": [1]})
    out = tmp_path / "r.csv"
    assert invoke("sweep", spec, "-o", out).exit_code == 0
    header, written = out.read_text().splitlines()
    key, _index, rest = written.split(",", 2)
    out.write_text(f"{header}\n{row.format(key=key, rest=rest)}\n")
    before = out.read_text()
    if not expected:
        assert json.loads(invoke("sweep", spec, "-o", out, "--json").stdout)["resumed"] == 1
        return
    fails("sweep", spec, "-o", out, expected=(str(out), *expected))
    assert out.read_text() == before


def test_unreachable_ray_address(tmp_path):
    pytest.importorskip("ray")
    out = tmp_path / "r.csv"
    fails("sweep", _spec(tmp_path, grid={"gpus": [1]}), "-o", out, "--ray", "127.0.0.1:1",
          expected=("--ray", "cannot reach", "127.0.0.1:1"))
    fails("sweep", _spec(tmp_path, grid={"gpus": [1]}), "-o", out, "--ray", "nohost",
          expected=("--ray", "HOST:PORT"))
    assert not out.exists()


def test_ray_not_installed(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    out = tmp_path / "r.csv"
    fails("sweep", _spec(tmp_path, grid={"gpus": [1]}), "-o", out, "--ray",
          expected=("--ray", "pip install 'trainsim[ray]'"))
    assert not out.exists()
