"""Meta's HolisticTraceAnalysis reads trainsim's trace folders and finds what trainsim reports: its temporal
breakdown (idle and compute shares), kernel breakdown and communication/computation overlap on a simulated
8-GPU run and on replayed traces agree with trainsim's own breakdown within 2 points, over the window HTA
reads (`trainsim.hta_agreement`). Skipped where HTA is not installed (``pip install 'trainsim[hta]'``)."""

import json
from pathlib import Path

import pytest

from trainsim import api
from trainsim.hta_agreement import hta_figures, largest_gaps, replayed_figures, simulated_figures
from trainsim.sim.output.kineto_ranks import write_rank_traces
from trainsim.sim.replay import kineto_ranks as replay_ranks
from trainsim.sim.replay.engine import replay_traces

pytest.importorskip("hta")

ROOT = Path(__file__).parents[1]
H200_TRACE = Path(__file__).parent / "data" / "traces-h200" / "resnet50-fp32-step.json.gz"
POINTS = 2.0


def test_simulated_8_gpu_run(tmp_path):
    result = api.simulate("ddp-resnet50-dgx-a100")       # 8 A100s, ResNet-50, DDP; 3 measured iterations
    write_rank_traces(result, tmp_path / "trace")
    theirs = hta_figures(tmp_path / "trace")
    assert sorted(theirs) == list(range(8))
    for window in ("hta", "steps"):   # HTA's window, and the whole iterations trainsim reports
        gaps = largest_gaps(simulated_figures(result, window), theirs)
        assert set(gaps) == {"idle_pct", "compute_pct", "overlap_pct"}
        assert all(gap <= POINTS for gap in gaps.values()), (window, gaps)
    kinds = theirs[0]["kernel_types"]
    assert kinds["COMPUTATION"] > 90 and "MEMORY" in kinds
    assert any("COMMUNICATION" in k for k in kinds)


def test_data_bound_run_is_idle_for_hta_as_for_trainsim(tmp_path):
    # the GPUs wait for one slow loader worker: trainsim's data preparation is GPU idle time for HTA
    workload = json.loads((ROOT / "scenarios" / "workloads" / "tiny-cnn.json").read_text())
    workload["input"]["prep_s_per_sample"] = 0.0005
    (tmp_path / "slow-input.json").write_text(json.dumps(workload))
    result = api.simulate("ddp-resnet50-pcie-4gpu-gen3", overrides=[
        f"workload={tmp_path / 'slow-input.json'}", "batch_size=256", "iterations=3", "host.data_workers=1"])
    write_rank_traces(result, tmp_path / "trace")
    ours, theirs = simulated_figures(result, "steps"), hta_figures(tmp_path / "trace")
    assert ours[0]["idle_pct"] > 90
    gaps = largest_gaps(ours, theirs)
    assert all(gap <= POINTS for gap in gaps.values()), gaps


@pytest.mark.parametrize("name", ["a100-ddp", "h200-resnet50"])
def test_replayed_trace(tmp_path, shared_file, name):
    trace = shared_file("traces", "kineto-a100-ddp2-rank0.json.gz") if name == "a100-ddp" else H200_TRACE
    report = replay_traces([trace], checks=False)
    replay_ranks.write_rank_traces(report, tmp_path / "trace")
    theirs = hta_figures(tmp_path / "trace")
    gaps = largest_gaps(replayed_figures(report, "hta"), theirs)
    assert {"idle_pct", "compute_pct"} <= set(gaps)
    assert all(gap <= POINTS for gap in gaps.values()), gaps
