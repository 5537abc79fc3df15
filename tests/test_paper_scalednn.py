"""The ScaleDNN reproduction at its stated setting: every model, each technique alone and together."""

import math

import pytest

from trainsim.formats.scenario_loader import load_scenario
from trainsim.scenarios.papers.ranges import Setting, free_assumptions
from trainsim.scenarios.papers.scalednn import (
    MODELS,
    SYSTEMS,
    TECHNIQUES,
    average_name,
    evaluate,
    savings,
    scenario_path,
)

pytestmark = pytest.mark.slow  # a paper reproduction: whole scenarios at the paper's scale


def test_scenarios_state_assumptions_and_variants_switch_the_three_techniques():
    for system in SYSTEMS:
        base = load_scenario(scenario_path(system), variant="dp-gpu0")
        opt = load_scenario(scenario_path(system), variant="scalednn")
        assert len(base.assumptions) >= 6 and base.strategy.name == opt.strategy.name == "dp-gpu0"
        assert not base.optimizations.cpu_batch_split and base.optimizations.preload == 0
        o = opt.optimizations
        assert o.cpu_batch_split and o.preload == 1 and o.param_compression.method == "fp16"
        # the CPU side is stated: a decode + augment cost per sample and a worker pool
        assert base.host.prep_s_per_sample == 0.003 and base.host.data_workers == 4
        assert base.host.loader == opt.host.loader == "shared"  # DataParallel's one process, one loader


def test_stated_setting_gives_finite_figures_for_every_model_and_technique():
    free = free_assumptions([(name, scenario_path(system)) for system, name in SYSTEMS.items()])
    assert {s.assumption.name for s in free} == {"batch", "compression", "prep_s_per_sample", "data_workers",
                                                "loader"}
    result = evaluate(Setting(), free)
    assert len(result.figures) == 10 and all(math.isfinite(x) for x in result.figures.values())
    # each technique alone is a figure of its own, and the three together save at least the best alone
    for system in SYSTEMS:
        alone = [result.figures[average_name(system, t)] for t in TECHNIQUES]
        assert result.figures[average_name(system)] >= max(alone) - 0.5
    rows = result.tables["savings"]
    assert {(r["system"], r["model"]) for r in rows} == {(s, m) for s in SYSTEMS for m in MODELS}
    # the host prepares every batch: the loader-bound models show data preparation in the baseline
    assert any(r["dp_gpu0_data_preparation_s"] > 0 for r in rows)
    # AlexNet is loader-bound: one shared pool makes 4 workers / (256 x 3 ms) batches a second, with the
    # techniques or without (they move data, not decoding)
    alexnet = next(r for r in rows if (r["system"], r["model"]) == ("pcie", "alexnet"))
    assert alexnet["dp_gpu0_s"] == pytest.approx(256 * 0.003 / 4, rel=1e-3)
    assert alexnet["optimised_s"] == pytest.approx(256 * 0.003 / 4, rel=1e-3)
    alone = result.tables["techniques_alone"]
    assert {(r["system"], r["technique"]) for r in alone} == {(s, t) for s in SYSTEMS for t in TECHNIQUES}


def test_a_loader_per_gpu_gives_the_split_the_decoding_cores_of_four():
    # the swept layout: with a DataLoader per GPU each shard of 64 samples has 4 workers of its own, so the
    # split AlexNet is no longer loader-bound, while the baseline's one loader still is
    free = free_assumptions([(name, scenario_path(system)) for system, name in SYSTEMS.items()])
    [row] = savings("pcie", models=("alexnet",), setting=Setting(chosen=(("loader", "per-gpu"),)), free=free,
                    variant="split")
    assert row["dp_gpu0_s"] == pytest.approx(256 * 0.003 / 4, rel=1e-3)
    assert row["optimised_s"] < 0.8 * row["dp_gpu0_s"]
    assert row["optimised_data_preparation_s"] < row["dp_gpu0_data_preparation_s"]
