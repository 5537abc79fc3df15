"""HTA's reading of trainsim's trace folders next to trainsim's own breakdown.

    python benchmarks/hta_agreement.py [--scenario NAME]... [--trace FILE]...

Needs Meta's HolisticTraceAnalysis (``pip install -e ".[hta]"``). For each simulated scenario (default: the
8-GPU DDP runs on DGX A100 and DGX-1 V100, a parameter server and GPU0-centric data parallelism) and each
replayed trace (default: every real trace in ../shared/traces beside the repository and the H200 traces
under tests/data), it writes the per-rank
folder (`--trace DIR`), runs HTA's temporal breakdown, kernel breakdown and comm/comp overlap on it, and
prints per case, as the mean over ranks: HTA's idle, compute and overlap shares; trainsim's over HTA's
window and over whole steps (`trainsim.hta_agreement` says how each is taken); the largest difference
over ranks, in points; and, for a replay (which plays the measured durations back), HTA's idle and compute
on the measured trace itself, which the replayed folder should give back. A trace that cannot be replayed
prints its one-line reason instead.

Where the gap is larger than HTA's rounding: the parameter server and GPU0-centric runs (see
`trainsim.hta_agreement`), and the V100 CUDA-graph trace (3 points), whose graph kernels trainsim's replay
graph does not yet tie to their ``cudaGraphLaunch``: it files them under the step they run in, HTA under the
step that launched them. HTA reads that replayed folder as it reads the measured trace all the same.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import tempfile
import warnings
from pathlib import Path

from trainsim import api
from trainsim.errors import TrainsimError
from trainsim.hta_agreement import hta_figures, largest_gaps, replayed_figures, simulated_figures
from trainsim.sim.output.kineto_ranks import write_rank_traces
from trainsim.sim.replay import kineto_ranks as replay_ranks
from trainsim.traces import replay_traces

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
# DDP on two 8-GPU boxes; then two strategies whose breakdown counts as communication time HTA sees as idle
# (the parameter-server wait, peer copies run by gpu0's engine; see trainsim.hta_agreement)
SCENARIOS = ["ddp-resnet50-dgx-a100", "ddp-vgg16-dgx1-v100", "ps-resnet50-pcie-4gpu-gen3",
             "dp-gpu0-resnet50-pcie-4gpu-gen3"]


def _mean(figures: dict[int, dict], key: str) -> float | None:
    values = [f[key] for f in figures.values() if f.get(key) is not None and f[key] == f[key]]   # not NaN
    return sum(values) / len(values) if values else None


def _cell(x: float | None) -> str:
    return f"{x:7.2f}" if x is not None else "      -"


def _row(name: str, ranks: int, theirs: dict, by_window: dict[str, dict],
         measured: dict | None = None) -> str:
    cells = []
    for key in ("idle_pct", "compute_pct", "overlap_pct"):
        cells += [_cell(_mean(theirs, key)), _cell(_mean(by_window["hta"], key)),
                  _cell(_mean(by_window["steps"], key))]
    gaps = largest_gaps(by_window["hta"], theirs)
    worst = max(gaps.get("idle_pct", 0.0), gaps.get("compute_pct", 0.0))
    row = f"{name:<42}{ranks:>6} " + " ".join(cells) + f" {worst:8.2f}"
    if measured is not None:
        row += f"   {_cell(_mean(measured, 'idle_pct'))} {_cell(_mean(measured, 'compute_pct'))}"
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", action="append", help="a shipped scenario or YAML file (repeatable)")
    parser.add_argument("--trace", action="append", type=Path, help="a Kineto trace file (repeatable)")
    args = parser.parse_args()
    scenarios = args.scenario or (SCENARIOS if not args.trace else [])
    traces = args.trace or (sorted(SHARED.glob("*.json.gz")) + sorted((ROOT / "tests/data/traces-h200")
                                                                      .glob("*.json.gz")) if not args.scenario
                            else [])
    logging.getLogger("hta").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    print("shares of GPU time in %: HTA | trainsim over HTA's window | trainsim over whole steps; "
          "gap: largest |HTA - trainsim (HTA's window)| over ranks, idle or compute, in points")
    print(f"{'case':<42}{'ranks':>6} {'idle (HTA|win|steps)':>23} {'compute (HTA|win|steps)':>23} "
          f"{'overlap (HTA|win|steps)':>23} {'gap':>8}   {'HTA measured':>15}")
    with tempfile.TemporaryDirectory() as tmp:
        for i, name in enumerate(scenarios):
            result = api.simulate(name)
            folder = Path(tmp) / f"sim{i}"
            write_rank_traces(result, folder)
            theirs = hta_figures(folder)
            windows = {w: simulated_figures(result, w) for w in ("hta", "steps")}
            print(_row(f"simulate {Path(name).stem}", len(theirs), theirs, windows))
        for i, path in enumerate(traces):
            label = f"replay {path.name.removesuffix('.json.gz')}"
            try:
                report = replay_traces([path], checks=False)
            except TrainsimError as exc:
                print(f"{label:<42}  not replayed: {exc}")
                continue
            if not report.replay.steps:
                print(f"{label:<42}  no ProfilerStep spans: nothing to compare per step")
                continue
            folder = Path(tmp) / f"replay{i}"
            replay_ranks.write_rank_traces(report, folder)
            theirs = hta_figures(folder)
            windows = {w: replayed_figures(report, w) for w in ("hta", "steps")}
            original = Path(tmp) / f"measured{i}"
            original.mkdir()
            shutil.copy(path, original / path.name)
            print(_row(label, len(theirs), theirs, windows, measured=hta_figures(original)))


if __name__ == "__main__":
    main()
