"""The EASGD reproduction: its scenario states its free assumptions and every figure gets a range."""

import math

from trainsim.formats.scenario_loader import load_scenario
from trainsim.scenarios.papers.easgd import scenario_path
from trainsim.scenarios.papers.reproduce import list_papers, reproduce


def test_scenario_states_its_assumptions_and_both_variants_load():
    for variant in ("original", "sync-codesign"):
        sc = load_scenario(scenario_path(), variant=variant)
        assert len(sc.assumptions) >= 6 and sc.strategy.name == "easgd"
    assert load_scenario(scenario_path(), variant="sync-codesign").strategy.easgd.variant == "sync"


def test_reproduce_easgd_gives_figures_inside_their_ranges():
    assert "easgd" in list_papers()
    result = reproduce("easgd")
    assert len(result.figures) == 3
    for f in result.figures:
        assert math.isfinite(f.ours) and f.low <= f.ours <= f.high
    assert {a["name"] for a in result.assumptions} == {"tau", "centre_cores"}
    shares = {row["variant"]: row["communication_share_pct"] for row in result.tables["variants"]}
    assert set(shares) == {"original", "sync-codesign"} and all(0 <= v <= 100 for v in shares.values())
    # a longer communication period leaves less to communicate per iteration
    sweep = {row["setting"]: row for row in result.tables["sweep"]}
    share = "communication share, Sync EASGD + co-design"
    assert sweep["tau=16"][share] < sweep["tau=4"][share] < sweep["stated"][share]
