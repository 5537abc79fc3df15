"""The bundle files: atomic writes, schema checks and one-line errors naming the file and field."""

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from trainsim.calibrate.measure import bundle as bf
from trainsim.errors import TrainsimError
from trainsim.formats import bundle as fb


def meta(steps_done=None, status="complete"):
    return {
        "schema": "trainsim.calibration/1",
        "provenance": {"tool": "trainsim"},
        "config": {"model": "tiny-cnn"},
        "status": status,
        "steps_planned": ["links"],
        "steps_done": steps_done or {},
        "notes": [],
    }


def links_doc():
    fit = {
        "model": "alpha_beta",
        "alpha_s": 1e-6,
        "beta_bytes_per_s": 1e10,
        "latency_us": 1.0,
        "bandwidth_gbps": 10.0,
        "rel_rms": 0.01,
        "points": 2,
    }
    return {
        "schema": "trainsim.links/1",
        "provenance": {},
        "device": "cpu",
        "classes": [
            {
                "name": "rank_copy",
                "kind": "rank_copy",
                "src": "a",
                "dst": "b",
                "points": [[1024, 1.1e-6, 0.0], [2048, 1.2e-6, 0.0]],
                "fit": fit,
                "note": None,
            }
        ],
    }


def links_step():
    return {"links": {"files": ["links.json"], "seconds": 1.0, "finished": "2026-01-01T00:00:00+00:00"}}


def test_write_atomic_leaves_no_temporary_files(tmp_path):
    path = bf.write_json(tmp_path / "x.json", {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # as open() would make it, not mkstemp's 0600
    bf.write_yaml(tmp_path / "y.yaml", {"b": [1, 2]})
    assert fb.read_file(tmp_path / "y.yaml") == {"b": [1, 2]}


def test_a_partial_bundle_loads_with_what_it_has(tmp_path):
    bf.write_json(tmp_path / "meta.json", meta(links_step(), status="partial"))
    bf.write_json(tmp_path / "links.json", links_doc())
    loaded = fb.load_bundle(tmp_path)
    assert not loaded.complete
    assert loaded.links.classes[0].fit.bandwidth_gbps == 10.0
    assert loaded.topology is None and loaded.workload is None and loaded.collectives is None


@pytest.mark.parametrize(
    ("corrupt", "match"),
    [
        (lambda d: "{not json", r"links\.json: not valid JSON \(line 1"),
        (lambda d: json.dumps({**d, "schema": "trainsim.links/9"}), r"links\.json: schema: expected schema"),
        (lambda d: json.dumps({**d, "device": "tpu"}), r"links\.json: device: "),
        (lambda d: json.dumps({**d, "surprise": 1}), r"links\.json: surprise: unknown field"),
        (
            lambda d: json.dumps(
                {
                    **d,
                    "classes": [
                        {**d["classes"][0], "fit": {**d["classes"][0]["fit"], "beta_bytes_per_s": -1}}
                    ],
                }
            ),
            r"links\.json: classes\.0\.fit\.beta_bytes_per_s",
        ),
    ],
)
def test_corrupt_files_are_one_line_errors_naming_file_and_field(tmp_path, corrupt, match):
    bf.write_json(tmp_path / "meta.json", meta(links_step()))
    (tmp_path / "links.json").write_text(corrupt(links_doc()))
    with pytest.raises(TrainsimError, match=match) as err:
        fb.load_bundle(tmp_path)
    assert "\n" not in str(err.value)


def test_missing_files(tmp_path):
    with pytest.raises(TrainsimError, match="not a calibration bundle folder"):
        fb.load_bundle(tmp_path / "nowhere")
    with pytest.raises(TrainsimError, match=r"meta\.json: missing from the bundle"):
        fb.load_bundle(tmp_path)
    bf.write_json(tmp_path / "meta.json", meta(links_step()))
    with pytest.raises(TrainsimError, match=r"links\.json: missing from the bundle although meta\.json"):
        fb.load_bundle(tmp_path)


def test_corrupt_meta_and_topology(tmp_path):
    (tmp_path / "meta.json").write_text(json.dumps({**meta(), "status": "sort of"}))
    with pytest.raises(TrainsimError, match=r"meta\.json: status"):
        fb.load_bundle(tmp_path)
    step = {"probe": {"files": ["topology.yaml"], "seconds": 0, "finished": "now"}}
    bf.write_json(tmp_path / "meta.json", meta(step))
    (tmp_path / "topology.yaml").write_text("nodes: [\n")
    with pytest.raises(TrainsimError, match=r"topology\.yaml: not valid YAML \(line"):
        fb.load_bundle(tmp_path)
    (tmp_path / "topology.yaml").write_text(
        "schema: trainsim.topology/1\nname: x\nnodes: []\nlinks: []\nbogus: 1\n"
    )
    with pytest.raises(TrainsimError, match="topology.yaml"):
        fb.load_bundle(tmp_path)


# ---- the whole bundle, as `simulate --calibration` reads it --------------------------------------------

PINNED = Path(__file__).parent / "data" / "bundle-cpu-2rank"


def _copy_pinned(tmp_path) -> Path:
    root = tmp_path / "bundle"
    shutil.copytree(PINNED, root)
    return root


def test_the_pinned_bundle_loads_with_every_part_validated(tmp_path):
    from trainsim.api import load_bundle
    from trainsim.formats.workload import Workload
    from trainsim.topologies import Topology

    loaded = load_bundle(PINNED)
    assert isinstance(loaded.topology, Topology) and isinstance(loaded.workload_for("tiny-cnn"), Workload)
    assert loaded.device_spec.kind == "cpu" and loaded.collectives.backend == "gloo"
    assert fb.load_bundle(PINNED).workloads["tiny-cnn"]["schema"].startswith("trainsim.workload/")
    missing = r"'resnet50' is not in the calibration bundle \(it has: tiny-cnn\)"
    with pytest.raises(TrainsimError, match=missing):
        loaded.workload_for("resnet50")


BROKEN = [
    (lambda root: (root / "meta.json").unlink(), r"meta\.json: missing from the bundle"),
    (lambda root: (root / "meta.json").write_text("{corrupt"), r"meta\.json: not valid JSON"),
    (lambda root: (root / "meta.json").write_text(""), r"meta\.json: not valid JSON"),
    (lambda root: _edit(root / "meta.json", schema="trainsim.calibration/2"),
     r"meta\.json: schema: expected schema 'trainsim\.calibration/1', found 'trainsim\.calibration/2'"),
    (lambda root: _edit(root / "machine.json", cpu={**_read(root / "machine.json")["cpu"], "cores": "two"}),
     r"machine\.json: cpu\.cores"),
    (lambda root: (root / "collectives.json").write_bytes(b"\x00\xff\xfe binary \x89PNG"),
     r"collectives\.json: not a text file"),
    (lambda root: (root / "topology.yaml").write_text("nodes: [\n"), r"topology\.yaml: not valid YAML"),
    (lambda root: _edit(root / "workload-tiny-cnn.json", layers="none"), r"workload-tiny-cnn\.json: layers"),
]


def _read(path):
    return json.loads(path.read_text())


def _edit(path, **fields):
    path.write_text(json.dumps({**_read(path), **fields}))


@pytest.mark.parametrize(("damage", "match"), BROKEN)
def test_a_broken_bundle_is_one_line_naming_the_file(tmp_path, damage, match):
    from trainsim.api import load_bundle

    root = _copy_pinned(tmp_path)
    damage(root)
    with pytest.raises(TrainsimError, match=match) as err:
        load_bundle(root)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("damage", "match"), BROKEN[:6])
def test_simulate_with_a_broken_bundle_exits_with_one_line(tmp_path, damage, match):
    from typer.testing import CliRunner

    from trainsim.cli import app

    root = _copy_pinned(tmp_path)
    damage(root)
    result = CliRunner().invoke(app, ["simulate", "validate-cpu", "--calibration", str(root)])
    assert result.exit_code != 0 and "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and re.search(match, lines[0]), result.output


def test_simulate_names_the_bundle_s_workloads_when_the_scenario_s_is_not_there(tmp_path):
    from typer.testing import CliRunner

    from trainsim.cli import app

    result = CliRunner().invoke(
        app, ["simulate", "validate-cpu", "--calibration", str(PINNED), "--set", "workload=resnet50"])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert "'resnet50' is not in the calibration bundle (it has: tiny-cnn)" in result.output
