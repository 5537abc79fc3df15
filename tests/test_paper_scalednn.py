"""The ScaleDNN reproduction at its stated setting: every model, each technique alone and together."""

import math

from trainsim.formats.scenario_loader import load_scenario
from trainsim.scenarios.papers.ranges import Setting, free_assumptions
from trainsim.scenarios.papers.scalednn import MODELS, SYSTEMS, TECHNIQUES, evaluate, scenario_path


def test_scenarios_state_assumptions_and_variants_switch_the_three_techniques():
    for system in SYSTEMS:
        base = load_scenario(scenario_path(system), variant="dp-gpu0")
        opt = load_scenario(scenario_path(system), variant="scalednn")
        assert len(base.assumptions) >= 6 and base.strategy.name == opt.strategy.name == "dp-gpu0"
        assert not base.optimizations.cpu_batch_split and base.optimizations.preload == 0
        o = opt.optimizations
        assert o.cpu_batch_split and o.preload == 1 and o.param_compression.method == "fp16"


def test_stated_setting_gives_finite_figures_for_every_model_and_technique():
    free = free_assumptions([(name, scenario_path(system)) for system, name in SYSTEMS.items()])
    assert {s.assumption.name for s in free} == {"batch", "compression"}
    result = evaluate(Setting(), free)
    assert len(result.figures) == 4 and all(math.isfinite(x) for x in result.figures.values())
    rows = result.tables["savings"]
    assert {(r["system"], r["model"]) for r in rows} == {(s, m) for s in SYSTEMS for m in MODELS}
    alone = result.tables["techniques_alone"]
    assert {(r["system"], r["technique"]) for r in alone} == {(s, t) for s in SYSTEMS for t in TECHNIQUES}
