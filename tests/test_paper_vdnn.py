"""The vDNN / Kim et al. reproduction: its scenarios state their assumptions and give finite figures."""

import math

from trainsim.formats.scenario_loader import load_scenario
from trainsim.scenarios.papers.reproduce import list_papers, reproduce
from trainsim.scenarios.papers.vdnn import MODELS, MULTI, SINGLE, scenario_path


def test_scenarios_state_their_assumptions():
    single = load_scenario(scenario_path(SINGLE), variant="vdnn-all")
    assert len(single.assumptions) >= 5 and single.optimizations.offload_activations == "all"
    baseline = load_scenario(scenario_path(SINGLE), variant="baseline")
    assert baseline.optimizations.offload_activations == "none"
    multi = load_scenario(scenario_path(MULTI))
    assert len(multi.assumptions) >= 4 and multi.optimizations.contention_aware


def test_reproduce_vdnn_gives_finite_figures():
    assert "vdnn" in list_papers()
    result = reproduce("vdnn")
    numbers = [f.ours for f in result.figures if not isinstance(f.ours, str)]
    assert len(numbers) == 6 and all(isinstance(x, float) and math.isfinite(x) for x in numbers)
    rows = result.tables["memory_per_model"]
    assert [r["model"] for r in rows] == list(MODELS)
    # offload never raises the peak; a model that fits with offload shows it in the table
    assert all(r["peak_offload_gib"] <= r["peak_gib"] for r in rows)
    multi = {r["variant"]: r for r in result.tables["max_batch_multi_gpu"]}
    assert multi["with offload"]["per_gpu_batch"] >= multi["without offload"]["per_gpu_batch"] > 0
