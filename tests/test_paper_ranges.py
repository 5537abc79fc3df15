"""The reproductions' range engine: free assumptions in a scenario, the one-at-a-time sweep, the figures'
ranges, the scaled physics, and the ``--json`` fields of ``trainsim reproduce``."""

import json

import pytest
import yaml
from typer.testing import CliRunner

from trainsim.cli import app
from trainsim.errors import TrainsimError
from trainsim.formats.scenario import Assumption
from trainsim.formats.scenario_loader import load_scenario
from trainsim.scenarios.papers.physics import Physics, scaled_topology, simulate
from trainsim.scenarios.papers.ranges import (
    Evaluation,
    FigureSpec,
    Setting,
    free_assumptions,
    overrides,
    settings,
    sweep,
)
from trainsim.topologies import load_topology

runner = CliRunner()
BASE = {"name": "s", "topology": "pcie-4gpu-gen3", "workload": "tiny-cnn", "strategy": {"name": "ddp"},
        "batch_size": 8, "iterations": 1, "warmup_iterations": 0}


def _scenario(tmp_path, assumption: dict, **extra):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**BASE, **extra, "assumptions": ["a sentence", assumption]}))
    return str(path)


def test_an_assumption_needs_choices_or_range_and_a_value_inside():
    Assumption(name="tau", value=1, choices=[1, 4], reason="r")
    for bad in ({"choices": [2, 4]}, {"range": [2.0, 4.0]}, {}, {"choices": [1, 4], "range": [0.0, 2.0]}):
        with pytest.raises(ValueError):
            Assumption(name="tau", value=1, reason="r", **bad)


def test_a_bad_assumption_is_one_line_naming_the_file_and_field(tmp_path):
    path = _scenario(tmp_path, {"name": "batch", "value": 8, "choices": [4, 16], "reason": "r"})
    result = runner.invoke(app, ["simulate", path])
    assert result.exit_code != 0 and "Traceback" not in result.output
    line = result.stderr.strip()
    assert line.startswith(f"error: {path}: assumptions: ") and "entry 1" in line
    assert "not one of its choices" in line and len(line.splitlines()) == 1


def test_the_stated_value_must_be_what_the_scenario_holds(tmp_path):
    ok = _scenario(tmp_path, {"name": "batch", "value": 8, "choices": [8, 16], "set": "batch_size",
                              "reason": "r"})
    assert [s.assumption.name for s in free_assumptions([("s.yaml", ok)])] == ["batch"]
    wrong = _scenario(tmp_path, {"name": "batch", "value": 16, "choices": [8, 16], "set": "batch_size",
                                 "reason": "r"})
    with pytest.raises(TrainsimError, match=r"s.yaml: assumptions\[1\].value: the stated value 16 is not"):
        free_assumptions([("s.yaml", wrong)])


def test_settings_move_one_thing_at_a_time_and_overrides_follow_variants(tmp_path):
    path = _scenario(tmp_path, {"name": "batch", "value": 8, "choices": [8, 16, 32], "set": "batch_size",
                                "variants": ["big"], "reason": "r"}, variants={"big": {}, "small": {}})
    free = free_assumptions([("s.yaml", path)])
    runs = settings(free, ["gpu_flops"])
    assert [s.label for s in runs] == ["stated", "gpu_flops x0.8", "gpu_flops x1.2", "batch=16", "batch=32"]
    assert overrides(runs[3], free, "s.yaml", "big") == ["batch_size=16"]
    assert overrides(runs[3], free, "s.yaml", "small") == []
    assert overrides(runs[0], free, "s.yaml", "big") == []


def test_sweep_reports_extremes_and_whether_the_published_value_is_inside(tmp_path):
    path = _scenario(tmp_path, {"name": "batch", "value": 8, "choices": [8, 16], "set": "batch_size",
                                "reason": "r"})
    free = free_assumptions([("s.yaml", path)])

    def evaluate(setting: Setting) -> Evaluation:
        batch = setting.value(free[0])
        x = batch * setting.physics.factor("gpu_flops")
        return Evaluation({"x": x, "fits": "yes" if batch < 10 else "no"})

    specs = [FigureSpec("x", 20.0, reason="too far"), FigureSpec("x", 10.0), FigureSpec("fits", "yes")]
    figures, tables = sweep(specs, evaluate, free, ["gpu_flops"])
    far, near, fits = figures
    assert (far.ours, far.low, far.high) == (8.0, 6.4, 16.0)
    assert far.in_range is False and far.reason == "too far" and far.high_at == "batch=16"
    assert near.in_range is True and near.reason == ""
    assert fits.in_range is True and (fits.low, fits.high) == ("no", "yes")
    assert [row["setting"] for row in tables["sweep"]][0] == "stated"


def test_reproduce_tells_its_progress_before_each_setting(tmp_path, monkeypatch):
    import trainsim.scenarios.papers.reproduce as papers

    path = _scenario(tmp_path, {"name": "batch", "value": 8, "choices": [8, 16, 32], "set": "batch_size",
                                "reason": "r"})
    free = free_assumptions([("s.yaml", path)])

    def paper():
        return sweep([FigureSpec("x", 1.0)], lambda s: Evaluation({"x": 1.0}), free, ["gpu_flops"])

    monkeypatch.setitem(papers._PAPERS, "fake", ("Fake", paper))
    monkeypatch.setattr(papers, "_load_all", lambda: None)
    told = []
    papers.reproduce("fake", progress=lambda done, total, label: told.append((done, total, label)))
    assert told == [(0, 5, "stated setting"), (1, 5, "gpu_flops x0.8"), (2, 5, "gpu_flops x1.2"),
                    (3, 5, "batch=16"), (4, 5, "batch=32")]
    paper()  # outside a reproduction nobody is told
    assert len(told) == 5


def test_a_published_band_is_in_range_when_it_overlaps_ours(tmp_path):
    path = _scenario(tmp_path, {"name": "batch", "value": 8, "choices": [8, 16], "set": "batch_size",
                                "reason": "r"})
    free = free_assumptions([("s.yaml", path)])

    def evaluate(setting: Setting) -> Evaluation:
        return Evaluation({"x": float(setting.value(free[0]))})  # 8 stated, 16 at the other choice

    specs = [FigureSpec("x", (12.0, 30.0)), FigureSpec("x", (1.0, 7.9)), FigureSpec("x", (9.0, 10.0))]
    overlapping, below, inside = sweep(specs, evaluate, free, [])[0]
    assert (overlapping.low, overlapping.high) == (8.0, 16.0)
    assert overlapping.in_range is True and below.in_range is False and inside.in_range is True


def test_scaled_physics_scales_the_links_and_the_time():
    topology = load_topology("pcie-4gpu-gen3")
    scaled = scaled_topology(topology, Physics({"pcie_bandwidth": 0.5, "link_latency": 2.0}))
    for u, v, attrs in topology.graph.edges(data=True):
        mine = scaled.graph.edges[u, v]
        factor = 0.5 if attrs["kind"] == "pcie" else 1.0
        assert mine["bandwidth"] == pytest.approx(attrs["bandwidth"] * factor)
        assert mine["latency"] == pytest.approx(attrs["latency"] * 2.0)
    sc = load_scenario(dict(BASE, iterations=2, warmup_iterations=1))
    stated = simulate(sc).iteration_time_s
    assert simulate(sc, Physics({"gpu_flops": 1.2, "gpu_memory_bandwidth": 1.2})).iteration_time_s < stated
    assert simulate(sc, Physics({"pcie_bandwidth": 0.8})).iteration_time_s > stated
    with pytest.raises(TrainsimError, match="unknown physical parameter 'flops'; valid choices"):
        Physics({"flops": 1.1})


@pytest.mark.slow
def test_cli_reproduce_json_gives_each_figure_its_range_and_each_assumption_its_reason():
    result = runner.invoke(app, ["reproduce", "easgd", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["paper"] == "easgd" and doc["physics"]["spread"] == 0.2
    for figure in doc["figures"]:
        assert {"name", "published", "ours", "low", "high", "in_range"} <= set(figure)
        assert figure["low"] <= figure["ours"] <= figure["high"]
        assert figure["in_range"] == (figure["low"] <= figure["published"] <= figure["high"])
    tau = next(a for a in doc["assumptions"] if a["name"] == "tau")
    assert tau["value"] == 1 and tau["choices"] == [1, 4, 16] and tau["reason"]
    table = runner.invoke(app, ["reproduce", "easgd"])
    assert table.exit_code == 0 and "in range" in table.output
    assert "assumes (easgd-alexnet-k80.yaml) tau" in table.output


def test_cli_reproduce_prints_a_published_band(monkeypatch):
    import trainsim.scenarios.papers.reproduce as papers

    figure = papers.Figure(name="peak", published=(49.4, 54.78), ours=52.39, low=50.18, high=54.77,
                           in_range=True, unit="%")
    monkeypatch.setattr(papers, "reproduce",
                        lambda key, progress=None: papers.Reproduction("p", "P", [figure]))
    table = runner.invoke(app, ["reproduce", "p"])
    assert table.exit_code == 0 and "49.4-54.78" in table.output
    doc = json.loads(runner.invoke(app, ["reproduce", "p", "--json"]).output)
    assert doc["figures"][0]["published"] == [49.4, 54.78]


def test_cli_reproduce_unknown_paper_names_the_choices():
    result = runner.invoke(app, ["reproduce", "nopaper"])
    assert result.exit_code != 0 and "valid choices: axonn, dryden, easgd, scalednn, vdnn" in result.stderr
