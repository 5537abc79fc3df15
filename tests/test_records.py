"""Flat records: one row per op or transfer."""

import csv
import io

import pytest

from trainsim.api import simulate
from trainsim.sim.output.records import COLUMNS, records, to_csv, write_records

SCENARIO = {
    "schema": "trainsim.scenario/1",
    "name": "records-test",
    "topology": "pcie-4gpu-gen3",
    "workload": "tiny-cnn",
    "strategy": {"name": "dp-gpu0"},
    "batch_size": 64,
    "gpus": 2,
    "iterations": 1,
    "warmup_iterations": 0,
}


def test_rows_cover_ops_and_flows():
    result = simulate(SCENARIO)
    rows = records(result)
    kinds = {r["kind"] for r in rows}
    assert kinds == {"gpu", "flow"}
    forward = [r for r in rows if r["op"] == "forward" and r["resource"] == "gpu0"]
    assert [r["layer"] for r in forward] == [
        layer for layer in ("conv1", "relu1", "pool1", "conv2", "relu2", "pool2", "fc")
    ]
    h2d = next(r for r in rows if r["op"] == "h2d_input")
    assert h2d["bytes"] == 64 * 3 * 32 * 32 and h2d["route"] == "cpu0.dram->cpu0->sw0->gpu0"
    assert h2d["category"] == "transfer"
    scatter = next(r for r in rows if r["op"] == "scatter_input")
    assert scatter["peer"] == "gpu0" and scatter["resource"] == "gpu1"
    flows = [r for r in rows if r["kind"] == "flow"]
    assert all(r["iteration"] == 0 for r in flows)
    assert all(r["end_s"] >= r["start_s"] for r in rows)
    assert [r["start_s"] for r in rows] == sorted(r["start_s"] for r in rows)


def test_csv_round_trips(tmp_path):
    result = simulate(SCENARIO)
    path = tmp_path / "r.csv"
    write_records(result, path)
    text = path.read_text()
    assert text == to_csv(result)
    parsed = list(csv.DictReader(io.StringIO(text)))
    assert tuple(parsed[0]) == COLUMNS
    assert len(parsed) == len(records(result))
    h2d = next(r for r in parsed if r["op"] == "h2d_input")
    assert float(h2d["duration_s"]) == pytest.approx(float(h2d["end_s"]) - float(h2d["start_s"]))
