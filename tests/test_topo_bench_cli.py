"""`trainsim topo bench`: the nccl-tests-style table, --json rows, and one-line errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from trainsim.cli import app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, ["topo", "bench", *args])


def test_table_has_both_paths_per_size():
    result = invoke("dgx-a100", "--collective", "allreduce", "--sizes", "1K:1M:32")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "flow path" in out and "analytic path" in out and "busbw" in out and "algbw" in out
    rows = [line.split() for line in out.splitlines() if line and not line.startswith("#")]
    assert [int(r[0]) for r in rows] == [1024, 32768, 1048576]
    assert all(r[1] == "ring" for r in rows)  # no in-switch reduction on A100: ring
    assert "x 1.750" in out  # the all-reduce bus factor for 8 GPUs


def test_json_rows_have_the_documented_fields():
    result = invoke("dgx-h100", "--sizes", "1M,1G", "--algo", "nvls", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert len(rows) == 4
    for row in rows:
        assert {"size_bytes", "time_s", "algbw_gbps", "busbw_gbps", "method", "algo"} <= set(row)
        assert row["algo"] == "nvls" and row["method"] in ("flow", "analytic")
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 2 * 7 / 8)


def test_one_method_and_a_gpu_subset():
    result = invoke("dgx1-v100", "-c", "broadcast", "--gpus", "0,1,2,3", "--method", "analytic",
                    "--sizes", "1M", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["method"] for r in rows] == ["analytic"]


@pytest.mark.parametrize("args,message", [
    (["dgx-a100", "--collective", "allsum"], "--collective: unknown collective 'allsum'"),
    (["dgx-a100", "--algo", "nvls"], "--algo: nvls needs every GPU of the group linked to one NVSwitch"),
    (["dgx-a100", "--algo", "magic"], "--algo: unknown algorithm 'magic'"),
    (["dgx-a100", "--proto", "xyz"], "--proto: unknown protocol 'xyz'; valid choices: auto, ll, ll128, "
                                     "simple"),
    (["dgx-a100", "--gpus", "0,42"], "--gpus: "),
    (["dgx-a100", "--gpus", "0,42"], "out of range"),
    (["dgx-a100", "--sizes", "lots"], "--sizes: cannot read size"),
    (["dgx-a100", "--method", "guess"], "--method: unknown method"),
    (["no-such-machine"], "no-such-machine"),
])
def test_bad_input_exits_2_with_one_line(args, message):
    result = invoke(*args)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
