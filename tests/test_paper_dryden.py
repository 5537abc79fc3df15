"""The Dryden et al. reproduction: its shipped files are current and it produces finite figures."""

import math

import pytest

from trainsim.formats.scenario_loader import load_scenario
from trainsim.formats.workload import dumps_workload, load_workload
from trainsim.scenarios.papers.dryden import SETS, mesh_cnn, papers_dir
from trainsim.scenarios.papers.reproduce import list_papers, reproduce

pytestmark = pytest.mark.slow  # a paper reproduction: whole scenarios at the paper's scale


def test_shipped_mesh_workload_is_what_the_generator_makes():
    shipped = (papers_dir() / "dryden-meshcnn.json").read_text()
    assert shipped == dumps_workload(mesh_cnn())
    wl = load_workload(str(papers_dir() / "dryden-meshcnn.json"))
    assert wl.layers[0].spatial.in_h == 2048 and wl.input.bytes_per_sample == 18 * 2048 * 2048 * 4


def test_scenarios_state_their_assumptions():
    for _, file, _ in SETS:
        sc = load_scenario(str(papers_dir() / file))
        assert len(sc.assumptions) >= 5
        assert sc.strategy.collectives == "analytic"


def test_reproduce_dryden_gives_finite_figures_and_scaling_tables():
    assert "dryden" in list_papers()
    result = reproduce("dryden")
    numbers = [f.ours for f in result.figures if isinstance(f.ours, float)]
    assert numbers and all(math.isfinite(x) and x > 0 for x in numbers)
    assert all(f.in_range is None for f in result.figures)  # the abstract's claims are words
    for key, _, _ in SETS:
        rows = result.tables[f"{key}_strong_scaling"]
        assert [r["gpus"] for r in rows] == sorted(r["gpus"] for r in rows)
        # the planner never does worse than data parallelism on the same GPUs
        assert all(r["hybrid_ms"] <= r["dp_ms"] * (1 + 1e-9) for r in rows if r["dp_gpus"] == r["gpus"])
