"""The ScaleDNN reproduction: its scenarios state their assumptions and it produces finite figures."""

import math

from typer.testing import CliRunner

from trainsim.cli import app
from trainsim.formats.scenario_loader import load_scenario
from trainsim.scenarios.papers.reproduce import list_papers, reproduce
from trainsim.scenarios.papers.scalednn import MODELS, SYSTEMS, scenario_path


def test_scenarios_state_assumptions_and_variants_switch_the_three_techniques():
    for system in SYSTEMS:
        base = load_scenario(scenario_path(system), variant="dp-gpu0")
        opt = load_scenario(scenario_path(system), variant="scalednn")
        assert len(base.assumptions) >= 6 and base.strategy.name == opt.strategy.name == "dp-gpu0"
        assert not base.optimizations.cpu_batch_split and base.optimizations.preload == 0
        o = opt.optimizations
        assert o.cpu_batch_split and o.preload == 1 and o.param_compression.method == "fp16"


def test_reproduce_scalednn_gives_finite_figures_for_every_model():
    assert "scalednn" in list_papers()
    result = reproduce("scalednn")
    numbers = [f.ours for f in result.figures]
    assert len(numbers) == 4 and all(isinstance(x, float) and math.isfinite(x) for x in numbers)
    rows = result.tables["savings"]
    assert {(r["system"], r["model"]) for r in rows} == {(s, m) for s in SYSTEMS for m in MODELS}
    assert all(r["scalednn_s"] > 0 and r["dp_gpu0_s"] > 0 for r in rows)


def test_cli_reproduce_scalednn_json():
    result = CliRunner().invoke(app, ["reproduce", "scalednn", "--json"])
    assert result.exit_code == 0, result.output
    assert '"paper": "scalednn"' in result.output
