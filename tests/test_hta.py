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
from trainsim.traces import replay_traces

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


def _ddp_like_trace(tmp_path, rank: int) -> Path:
    """A V100 rank: three steps of GEMMs, sub-microsecond memsets between them (each lying inside one
    microsecond) and an all-reduce overlapping the last GEMM."""
    from trainsim.sim.replay.kineto_builder import TraceBuilder

    b = TraceBuilder(rank=rank, world_size=2, device_name="Tesla V100-SXM2-16GB")
    t = 0.0
    for step in range(1, 4):
        b.step(step, 1, t, 2500)
        g = t + 10.2
        for k in range(30):
            tiny = k % 3 != 0
            dur = 0.3 if tiny else 3.25
            b.launch(1, t + 1 + k * 0.5, 0.4, stream=7, gpu_ts=g, gpu_dur=dur,
                     name="Memset (Device)" if tiny else "volta_sgemm_32x32_nn",
                     kind="gpu_memset" if tiny else "kernel")
            g += dur + 0.45
        b.launch(1, t + 30, 0.4, stream=7, gpu_ts=g, gpu_dur=2000, name="volta_sgemm_128x64_nn")
        b.launch(1, t + 31, 0.4, stream=9, gpu_ts=g + 10, gpu_dur=1500,
                 name="ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
                 **{"Collective name": "allreduce", "In msg nelems": 2**22, "dtype": "Float",
                    "Group size": 2})
        t += 2500
    return b.write(tmp_path / f"rank{rank}.json")


@pytest.mark.parametrize("options", [
    ["--gpu", "h100-sxm"],                       # sub-microsecond kernels: HTA rounds them to -1 us unless
    ["--set", "compression=fp16"],               # the writer keeps them whole-microsecond safe
    ["--topology", "dgx-a100", "--gpu", "a100-40gb"],
    ["--set", "untraced=true"],
], ids=["gpu", "compression", "topology", "untraced"])
def test_every_whatif_folder_passes_htas_analyses(tmp_path, options):
    """A what-if's trace folder loads in HTA and runs its temporal breakdown, kernel breakdown and
    communication/computation overlap (`hta_figures` runs all three), in agreement with trainsim's own
    where the sub-microsecond kernels are a small share of the GPU's time (HTA rounds every event to whole
    microseconds, which on the H100 what-if's kernels of about one microsecond shifts its shares)."""
    from typer.testing import CliRunner

    from trainsim.cli import app
    from trainsim.sim.replay.whatif import WhatIf

    paths = [_ddp_like_trace(tmp_path, r) for r in (0, 1)]
    out = tmp_path / "whatif"
    result = CliRunner().invoke(app, ["replay", *map(str, paths), *options, "--trace", str(out)])
    assert result.exit_code == 0, result.output
    theirs = hta_figures(out)
    assert sorted(theirs) == [0, 1]
    for r in theirs.values():
        shares = (r["idle_pct"], r["compute_pct"], r["non_compute_pct"])
        assert min(shares) >= 0 and sum(shares) == pytest.approx(100, abs=0.1)
        assert 0 <= r["overlap_pct"] <= 100
    if options[0] == "--gpu":
        return
    opts = dict(zip(options[::2], options[1::2], strict=True))
    sets = dict(v.split("=") for k, v in opts.items() if k == "--set")
    whatif = WhatIf(gpu=opts.get("--gpu"), topology=opts.get("--topology"),
                    compression=sets.get("compression", "none"), untraced=sets.get("untraced") == "true")
    report = replay_traces(paths, whatif=whatif, checks=False)
    gaps = largest_gaps(replayed_figures(report, "hta"), theirs)
    assert all(gap <= POINTS for gap in gaps.values()), gaps


@pytest.mark.slow
def test_a_gpu_whatif_of_the_real_v100_trace_passes_htas_analyses(tmp_path, shared_file):
    """The V100 CUDA-graph trace replayed on an H100: thousands of its kernels become sub-microsecond."""
    trace = shared_file("traces", "v100-ddp2-rank1-cudagraph.json.gz")
    from trainsim.sim.replay.whatif import WhatIf

    report = replay_traces([trace], whatif=WhatIf(gpu="h100-sxm"), checks=False)
    replay_ranks.write_rank_traces(report, tmp_path / "trace")
    theirs = hta_figures(tmp_path / "trace")
    gaps = largest_gaps(replayed_figures(report, "hta"), theirs)
    assert all(gap <= POINTS for gap in gaps.values()), gaps
