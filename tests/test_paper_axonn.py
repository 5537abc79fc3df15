"""The AxoNN reproduction at its stated setting: its scenario states its assumptions, finite figures."""

import math

from trainsim.formats.scenario_loader import load_scenario
from trainsim.scenarios.papers.axonn import SCENARIO, STAGES, evaluate, scenario_path
from trainsim.scenarios.papers.physics import RunCache
from trainsim.scenarios.papers.ranges import Setting, free_assumptions


def test_scenario_states_its_assumptions():
    sc = load_scenario(scenario_path(), variant="offload")
    assert len(sc.assumptions) >= 6
    assert sc.strategy.name == "pipeline" and sc.optimizations.offload_optimizer_state


def test_stated_setting_gives_finite_figures():
    free = free_assumptions([(SCENARIO, scenario_path())])
    result = evaluate(Setting(), free, RunCache(), {})
    numbers = [x for x in result.figures.values() if not isinstance(x, str)]
    assert numbers and all(isinstance(x, float) and math.isfinite(x) and x > 0 for x in numbers)
    rows = result.tables["configurations"]
    assert len(rows) == 2 * len(STAGES)
    # the model state per parameter is what the memory accounting says, whatever the stage count
    assert all(r["bytes_per_param"] == 16.0 for r in rows if not r["offload"])
    assert all(4.0 < r["bytes_per_param"] < 4.5 for r in rows if r["offload"])
