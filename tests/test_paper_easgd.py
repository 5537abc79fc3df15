"""The EASGD reproduction: its scenario states its assumptions and it produces finite figures."""

import math

from trainsim.formats.scenario_loader import load_scenario
from trainsim.scenarios.papers.easgd import scenario_path
from trainsim.scenarios.papers.reproduce import list_papers, reproduce


def test_scenario_states_its_assumptions_and_both_variants_load():
    for variant in ("original", "sync-codesign"):
        sc = load_scenario(scenario_path(), variant=variant)
        assert len(sc.assumptions) >= 6 and sc.strategy.name == "easgd"
    assert load_scenario(scenario_path(), variant="sync-codesign").strategy.easgd.variant == "sync"


def test_reproduce_easgd_gives_finite_figures():
    assert "easgd" in list_papers()
    result = reproduce("easgd")
    numbers = [f.ours for f in result.figures]
    assert len(numbers) == 3 and all(isinstance(x, float) and math.isfinite(x) and x > 0 for x in numbers)
    shares = {row["variant"]: row["communication_share_pct"] for row in result.tables["variants"]}
    assert set(shares) == {"original", "sync-codesign"} and all(0 <= v <= 100 for v in shares.values())
