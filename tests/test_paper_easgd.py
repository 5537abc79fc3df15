"""The EASGD reproduction: its scenarios state their free assumptions and every figure gets a range."""

import math

import pytest

from trainsim.formats.scenario_loader import load_scenario
from trainsim.scenarios.papers import easgd_knl
from trainsim.scenarios.papers.easgd import scenario_path
from trainsim.scenarios.papers.reproduce import list_papers, reproduce

pytestmark = pytest.mark.slow  # a paper reproduction: whole scenarios at the paper's scale


def test_scenario_states_its_assumptions_and_both_variants_load():
    for variant in ("original", "sync-codesign"):
        sc = load_scenario(scenario_path(), variant=variant)
        assert len(sc.assumptions) >= 6 and sc.strategy.name == "easgd"
    assert load_scenario(scenario_path(), variant="sync-codesign").strategy.easgd.variant == "sync"


def test_knl_scenario_runs_the_four_variants_on_the_stated_node_count():
    for variant in easgd_knl.VARIANTS:
        sc = load_scenario(easgd_knl.scenario_path(), variant=variant)
        assert sc.strategy.easgd.variant == variant and sc.topology["nodes"] == 63
        assert sc.batch_size == 64 * 63  # the stated per-node batch times the stated nodes


@pytest.fixture(scope="module")
def result():
    assert "easgd" in list_papers()
    return reproduce("easgd")


def test_reproduce_easgd_gives_figures_inside_their_ranges(result):
    assert len(result.figures) == 5
    for f in result.figures:
        if isinstance(f.ours, str):  # the fastest variant: the outcomes seen over the sweep
            assert f.low <= f.ours <= f.high and f.in_range == (f.published in {f.low, f.high})
            continue
        assert math.isfinite(f.ours) and f.low <= f.ours <= f.high
    assert {a["name"] for a in result.assumptions} == {"tau", "centre_cores", "nodes", "knl_model",
                                                       "batch_per_node"}
    shares = {row["variant"]: row["communication_share_pct"] for row in result.tables["variants"]}
    assert set(shares) == {"original", "sync-codesign"} and all(0 <= v <= 100 for v in shares.values())
    # a longer communication period leaves less to communicate per iteration
    sweep = {row["setting"]: row for row in result.tables["sweep"]}
    share = "communication share, Sync EASGD + co-design"
    assert sweep["tau=16"][share] < sweep["tau=4"][share] < sweep["stated"][share]


def test_knl_weak_scaling_falls_with_nodes_and_with_less_compute_per_exchange(result):
    curve = result.tables["knl_weak_scaling"]
    assert curve[0]["nodes"] == 1 and curve[0]["efficiency_pct"] == 100
    assert curve[-1]["nodes"] == 63 and curve[-1]["cores"] == 63 * 68
    efficiencies = [row["efficiency_pct"] for row in curve]
    assert efficiencies == sorted(efficiencies, reverse=True) and 0 < efficiencies[-1] < 100
    weak = {row["setting"]: row[easgd_knl.WEAK] for row in result.tables["sweep"]}
    assert weak["batch_per_node=32"] < weak["stated"] < weak["batch_per_node=128"]
    assert weak["knl_model=alexnet"] < weak["stated"]  # 61 M parameters against GoogleNet's 6.6 M
    assert weak["network_bandwidth x0.8"] < weak["stated"] < weak["network_bandwidth x1.2"]


def test_knl_variants_compared_per_iteration(result):
    rows = {row["variant"]: row for row in result.tables["knl_variants"]}
    assert set(rows) == set(easgd_knl.VARIANTS)
    assert rows["sync"]["staleness_mean"] == 0 and rows["sync"]["vs_sync"] == 1
    for variant in ("async", "async-momentum", "hogwild"):
        assert rows[variant]["staleness_mean"] > 0
    # the momentum buffer adds centre traffic to Async EASGD's
    assert rows["async-momentum"]["iteration_s"] >= rows["async"]["iteration_s"]
