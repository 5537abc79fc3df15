"""NCCL figures measured on the box replace NCCL's tuning tables: the topology's ``nccl`` block (written by
calibrate on CUDA from forced NCCL_ALGO / NCCL_PROTO sweeps) and how the collective model uses it."""

from __future__ import annotations

import json

import pytest
import yaml

from trainsim.calibrate.measure import nccl_protocols
from trainsim.calibrate.measure.alphabeta import fit_alpha_beta
from trainsim.calibrate.measure.collbench import CollectiveResult, bus_factor
from trainsim.cli import app
from trainsim.errors import TrainsimError
from trainsim.sim.collectives.ops import choose, collective_time, simulate_collective
from trainsim.topologies import load_topology

MEASURED = {"ranks": 8, "source": "a test", "figures": [
    {"collective": "allreduce", "algo": "ring", "proto": "simple", "latency_us": 30.0, "busbw_gbps": 200.0},
    {"collective": "allreduce", "algo": "ring", "proto": "ll", "latency_us": 9.0, "busbw_gbps": 40.0}]}


def _a100(nccl=MEASURED):
    with open(_preset_path("dgx-a100")) as fh:
        data = yaml.safe_load(fh)
    return load_topology({**data, "nccl": nccl})


def _preset_path(name):
    from importlib import resources

    return str(resources.files("trainsim.topologies") / f"{name}.yaml")


@pytest.mark.parametrize("size", [1024, 2**20, 2**30])
def test_the_measured_group_gets_the_measurement_back_on_both_paths(size):
    topo = _a100()
    expected = 30e-6 + size / (200e9 / bus_factor("all_reduce", 8))
    analytic = collective_time(topo, "allreduce", None, size, algo="ring", proto="simple")
    assert analytic == pytest.approx(expected)
    flow = simulate_collective(topo, "allreduce", None, size, algo="ring", proto="simple")["time_s"]
    assert flow == pytest.approx(expected)


def test_other_groups_keep_the_plans_shape_and_unmeasured_pairs_keep_nccls_tables():
    topo, preset = _a100(), load_topology("dgx-a100")
    four = topo.gpus[:4]
    # fewer ranks: fewer ring steps, so less latency, at the measured fraction of the links' rate
    small = collective_time(topo, "allreduce", four, 1024, algo="ring", proto="simple")
    assert 0 < small < 30e-6
    # LL128 and trees were not measured: NCCL's figures, as on the preset
    for algo, proto in (("ring", "ll128"), ("tree", "simple")):
        assert collective_time(topo, "allreduce", None, 2**20, algo=algo, proto=proto) == pytest.approx(
            collective_time(preset, "allreduce", None, 2**20, algo=algo, proto=proto))


def test_auto_chooses_by_the_measured_times():
    # a measured LL that is slow at every size is never chosen; on the preset NCCL's LL wins at 1 KiB
    slow_ll = {**MEASURED, "figures": [{**MEASURED["figures"][1], "latency_us": 500.0}]}
    assert choose(load_topology("dgx-a100"), "allreduce", None, 1024) == ("ring", "ll")
    assert choose(_a100(slow_ll), "allreduce", None, 1024) != ("ring", "ll")


def test_figures_come_from_the_forced_sweeps():
    calls = []

    def fake_bench(device, ranks, sizes, *, repeats, target_s, collectives, env):
        calls.append(env)
        if env["NCCL_ALGO"] == "NVLS":
            raise TrainsimError("rank 0 failed: NCCL error: invalid usage (no algorithm available)")
        out = []
        for name in collectives:
            times = [12e-6 + s / 80e9 for s in sizes]
            out.append(CollectiveResult(name, ranks, "nccl", fit=fit_alpha_beta(sizes, times)))
        return out

    block, notes = nccl_protocols.measure(8, [2**k for k in range(10, 31, 2)], bench=fake_bench)
    assert {(c["NCCL_ALGO"], c["NCCL_PROTO"]) for c in calls} == {
        ("Ring", "LL"), ("Ring", "LL128"), ("Ring", "Simple"), ("Tree", "LL"), ("Tree", "LL128"),
        ("Tree", "Simple"), ("NVLS", "Simple")}
    assert len(notes) == 1 and "nvls/simple" in notes[0]
    ring = next(f for f in block["figures"] if (f["collective"], f["algo"], f["proto"]) ==
                ("allgather", "ring", "ll"))
    assert ring["latency_us"] == pytest.approx(12.0, rel=1e-3)
    assert ring["busbw_gbps"] == pytest.approx(80 * 7 / 8, rel=1e-3)
    assert not any(f["algo"] == "tree" and f["collective"] != "allreduce" for f in block["figures"])
    # the block loads as a topology's nccl figures
    assert len(_a100(block).spec.nccl.figures) == 3 * 3 + 3


def test_bad_nccl_block_is_one_line_naming_the_field(tmp_path):
    from typer.testing import CliRunner

    with open(_preset_path("dgx-a100")) as fh:
        data = yaml.safe_load(fh)
    bad = {**data, "nccl": {**MEASURED, "figures": [{**MEASURED["figures"][0], "proto": "LL"}]}}
    path = tmp_path / "box.yaml"
    path.write_text(yaml.safe_dump(bad))
    result = CliRunner().invoke(app, ["topo", "bench", str(path), "--sizes", "1K"])
    assert result.exit_code != 0
    line = result.output.strip()
    assert "\n" not in line and "nccl.figures[0].proto" in line and "'ll128'" in line


@pytest.mark.cuda
def test_forced_sweeps_on_two_gpus():
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    block, notes = nccl_protocols.measure(2, [2**k for k in range(10, 27, 4)], repeats=2)
    assert block is not None, notes
    protos = {(f["algo"], f["proto"]) for f in block["figures"]}
    assert {("ring", "ll"), ("ring", "simple")} <= protos
    assert len(_a100({**block, "ranks": 2}).spec.nccl.figures) == len(block["figures"])


def test_topo_show_reports_the_measured_figures(tmp_path):
    from typer.testing import CliRunner

    with open(_preset_path("dgx-a100")) as fh:
        data = yaml.safe_load(fh)
    path = tmp_path / "box.yaml"
    path.write_text(yaml.safe_dump({**data, "nccl": MEASURED}))
    result = CliRunner().invoke(app, ["topo", "show", str(path)])
    assert result.exit_code == 0
    assert "allreduce ring/simple 30.0 us 200.0 GB/s" in result.output
    shown = CliRunner().invoke(app, ["topo", "show", str(path), "--json"])
    assert json.loads(shown.output)["nccl"]["figures"][1]["proto"] == "ll"
