"""The vDNN / Kim et al. reproduction at its stated setting: its scenarios state their assumptions."""

import math

import pytest

from trainsim.formats.scenario_loader import load_scenario
from trainsim.scenarios.papers.physics import RunCache
from trainsim.scenarios.papers.ranges import Setting, free_assumptions
from trainsim.scenarios.papers.vdnn import MODELS, MULTI, PER_SAMPLE, SAVED, SINGLE, evaluate, scenario_path

pytestmark = pytest.mark.slow  # a paper reproduction: whole scenarios at the paper's scale


def test_scenarios_state_their_assumptions_on_the_papers_gpu():
    single = load_scenario(scenario_path(SINGLE), variant="vdnn-all")
    assert len(single.assumptions) >= 5 and single.optimizations.offload_activations == "all"
    assert single.topology["gpu"] == "titanx-maxwell"
    baseline = load_scenario(scenario_path(SINGLE), variant="baseline")
    assert baseline.optimizations.offload_activations == "none"
    multi = load_scenario(scenario_path(MULTI))
    assert len(multi.assumptions) >= 4 and multi.optimizations.contention_aware


def test_stated_setting_gives_finite_figures():
    free = free_assumptions([(SINGLE, scenario_path(SINGLE)), (MULTI, scenario_path(MULTI))])
    assert {s.assumption.name for s in free} == {"gpu", "prefetch_distance"}
    result = evaluate(Setting(), free, RunCache())
    numbers = [v for v in result.figures.values() if not isinstance(v, str)]
    assert len(numbers) == 9 and all(math.isfinite(x) for x in numbers)
    rows = result.tables["memory_per_model"]
    assert [r["model"] for r in rows] == list(MODELS)
    # offload never raises the peak, and vDNN's network-wide baseline is at least our peak
    assert all(r["peak_offload_gib"] <= r["peak_gib"] <= r["network_wide_gib"] for r in rows)
    # vDNN's definition: the average use with offload is below its peak; in-place ReLU shrinks the baseline
    assert all(0 < r["average_offload_gib"] < r["peak_offload_gib"] for r in rows)
    assert all(r["network_wide_gib"] < r["every_output_gib"] for r in rows)
    saved = result.figures[SAVED.format(model="googlenet")]
    assert saved == rows[1]["memory_saved_vdnn_pct"] > rows[1]["memory_saved_peak_vs_network_wide_pct"]
    # the batch curve: idle SMs at tiny batches, flat where the multi-GPU batches sit
    curve = {r["batch"]: r for r in result.tables["batch_curve"]}
    assert curve[1]["wave_efficiency"] < curve[16]["wave_efficiency"] < 1
    assert curve[1]["s_per_sample"] > 1.5 * curve[128]["s_per_sample"]
    assert abs(result.figures[PER_SAMPLE]) < 1
    multi = {r["variant"]: r for r in result.tables["max_batch_multi_gpu"]}
    assert multi["with offload"]["per_gpu_batch"] >= multi["without offload"]["per_gpu_batch"] > 0
