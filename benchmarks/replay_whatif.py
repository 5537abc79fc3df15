"""What-if replays on every real trace: can a user trust them?

    python benchmarks/replay_whatif.py [TRACES_DIR] [--gpu h100-sxm]

TRACES_DIR defaults to ../shared/traces beside the repository (see its README). Files named
``<job>-rank<N>.json.gz`` with the same ``<job>`` are one job and are replayed together. Per job it prints:

- **identity**: the largest step change of the what-if that names the machine the trace ran on and its own
  GPU, with no options (it must give the measurement back; aim <= 0.5 %). Traces whose GPU is unknown get
  the plain replay.
- **GPU swap** to ``--gpu`` (about 3x or more the compute of a V100 or an A100): per step the step change
  next to the compute change and the share of the step the GPU was busy; for GPU-bound steps (busy >= 90 %)
  the share of the compute saved that the step saves (aim >= 50 %). A busy GPU does not make a step
  GPU-bound: the CPU may set its pace. So each step also shows how long its CPU threads waited on the GPU
  (`cpu_waited_s`), and, for steps that waited at least 10 %, the share of min(compute saved, CPU waited)
  the step saves: what a faster GPU could take off at most, where one thread sets the pace.
- **compression** (fp16): the change of all NCCL time, and of the all-reduces of at least 16 MB (however
  their kernels are named: an all-reduce in a SendRecv kernel counts), which are bandwidth-bound: their own
  time, latency + transfer, (aim: cut 35-65 %) and their whole kernels, whose waits for peers compression
  does not shorten; and how many re-timed collectives were held to what the wires allow (floor) or what
  their measured rate allows (ceiling): none may end outside.
- **collectives on another machine** (dgx-h100, or dgx-a100 for H100 traces): the NCCL time change and the
  same bounds.

Traces without a GPU spec trainsim knows (no deviceProperties) are taken to have run on ``--ran-on``
(default dgx-a100, as the shared README says of the 128-rank job); a trace on a GPU it cannot model says
so on its line.
"""

from __future__ import annotations

import argparse
import logging
import re
import tempfile
import warnings
from collections import defaultdict
from pathlib import Path

from trainsim.errors import TrainsimError
from trainsim.formats.kineto import load_traces
from trainsim.hta_agreement import hta_figures, largest_gaps, replayed_figures
from trainsim.sim.replay import kineto_ranks
from trainsim.sim.replay.engine import ReplayResult, replay
from trainsim.sim.replay.trace_graph import build_graph
from trainsim.sim.replay.whatif import WhatIf, WhatIfModel, home_topology, trace_device
from trainsim.topologies import load_topology
from trainsim.traces import replay_traces, whatif_model

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACES = ROOT.parent / "shared" / "traces"
GPU_BOUND = 0.90
WAITED_SHARE = 0.10   # steps whose CPU waited on the GPU this share of the step: a faster GPU can help
BIG_ALLREDUCE = 16e6


def jobs(folder: Path) -> dict[str, list[Path]]:
    """Trace files grouped by job: the name without its rank<N> part."""
    out: dict[str, list[Path]] = defaultdict(list)
    for path in sorted(folder.glob("*.json*")):
        out[re.sub(r"-?rank\d+", "", path.name.split(".json")[0])].append(path)
    return dict(out)


def busy_share(step) -> float:
    return 1.0 - step.measured_breakdown["gpu_idle_s"] / step.measured_s if step.measured_s else 0.0


def cpu_waited_s(graph, step: int | None) -> float:
    """Seconds the step's CPU threads spent in calls that returned on GPU work still running when they
    began (synchronisations, pageable copies, launches on a full queue). Where one thread sets the step's
    pace, a faster GPU can take off the step about this much at most: the rest is CPU time."""
    spans = [s for s in graph.steps if s.number == step] if step is not None else []
    lo, hi = ((graph.points[spans[0].start].t, graph.points[spans[0].end].t) if spans
              else (-float("inf"), float("inf")))
    waited = 0.0
    for pts in graph.thread_points:
        for before, after in zip(pts, pts[1:], strict=False):
            p, call = graph.points[after], graph.points[before]
            if p.gpu_waits and lo <= p.t <= hi and any(
                    graph.ops[o].event.ts + graph.ops[o].event.dur > call.t for o, _ in p.gpu_waits):
                waited += p.t - call.t
    return waited


def identity(graphs, ran_on: str | None, compute_model: str = "roofline") -> tuple[str, float | None]:
    """(how, largest |step change| in %) of the identity what-if."""
    spec = trace_device(graphs[0])
    if spec is None or ran_on is None:
        result = replay(graphs)
        how = "plain replay"
    else:
        result = replay(graphs, op_time=whatif_model(graphs, WhatIf(topology=ran_on, gpu=spec.name,
                                                                    ran_on=ran_on,
                                                                    compute_model=compute_model)))
        how = f"{ran_on} + {spec.name}"
    errors = [abs(s.error_pct) for s in result.steps]
    return how, max(errors) if errors else None


def collective_times(result: ReplayResult, model: WhatIfModel) -> tuple[dict, dict]:
    """Per (rank, op): replayed duration of every NCCL kernel, and of big all-reduces only."""
    every, big = {}, {}
    for rr in result.ranks:
        for o in rr.graph.ops:
            if o.kind != "collective":
                continue
            t = rr.op_end[o.index] - rr.op_start[o.index]
            every[(rr.graph.rank, o.index)] = t
            if is_big_allreduce(model, rr.graph.rank, o):
                big[(rr.graph.rank, o.index)] = t
    return every, big


def is_big_allreduce(model: WhatIfModel, rank: int, op) -> bool:
    """An all-reduce of 16 MB or more, however its kernel is named (a SendRecv kernel its call says ran an
    all-reduce counts)."""
    m, split = model.nccl.member(rank, op), model.nccl.split(rank, op)
    return m is not None and split is not None and m.op == "allreduce" and split.nbytes >= BIG_ALLREDUCE


def own_time_cuts(model: WhatIfModel) -> tuple[float, list[float]]:
    """The big all-reduces' own time (latency + transfer, without their wait for peers) after the what-if
    (re-timed, with the casts) against measured: (change of the sum in %, each change in %)."""
    before, after, each = 0.0, 0.0, []
    for (rank, index), row in model.retimed.items():
        op = model.graphs_by_rank[rank].ops[index]
        if not is_big_allreduce(model, rank, op):
            continue
        core = model.nccl.split(rank, op).core_s
        new = row["new_s"] + row["casts_s"]
        before, after = before + core, after + new
        each.append(100 * (new / core - 1))
    return (100 * (after / before - 1) if before else float("nan")), sorted(each)


def bounds_line(model: WhatIfModel) -> str:
    """How many re-timed collectives the what-if held to the wires' floor or their measured rate's ceiling."""
    rows = list(model.retimed.values())
    floor = sum(1 for r in rows if r["core_s"] < r["floor_s"] * (1 - 1e-9))
    ceiling = sum(1 for r in rows if r["core_s"] > r["ceiling_s"] * (1 + 1e-9))
    outside = sum(1 for r in rows
                  if not r["floor_s"] * (1 - 1e-9) <= r["new_s"] <= r["ceiling_s"] * (1 + 1e-9))
    return (f"{len(rows)} re-timed, {outside} outside [wires, measured rate] (held there: {floor} to the "
            f"wires, {ceiling} to the measured rate)")


def hta_agreement(paths: list[Path]) -> str:
    """HTA's reading of the replayed traces against trainsim's breakdown (largest gap over ranks, over HTA's
    window), where HolisticTraceAnalysis is installed."""
    try:
        import hta  # noqa: F401
    except ImportError:
        return "not run (pip install 'trainsim[hta]')"
    logging.getLogger("hta").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    report = replay_traces(paths, checks=False)
    with tempfile.TemporaryDirectory() as tmp:
        kineto_ranks.write_rank_traces(report, Path(tmp))
        gaps = largest_gaps(replayed_figures(report), hta_figures(tmp))
    return ", ".join(f"{k.removesuffix('_pct')} {v:.2f}" for k, v in gaps.items()) + " points (aim <= 2)"


def run_job(name: str, paths: list[Path], gpu: str, default_ran_on: str,
            compute_model: str = "roofline") -> None:
    print(f"\n== {name} ({len(paths)} file{'s' * (len(paths) > 1)})")
    try:
        traces = load_traces(paths)
    except TrainsimError as exc:
        print(f"   refused: {exc}")
        return
    graphs = [build_graph(t) for t in traces]
    base = replay(graphs)
    if not base.steps:
        print("   no GPU op and no CPU point: nothing to replay")
        return
    whole = base.steps[0].step is None      # no ProfilerStep spans: the whole trace is one window
    ran_on = home_topology(graphs) or (default_ran_on if trace_device(graphs[0]) is None and
                                       not graphs[0].trace.devices else None)
    how, ident = identity(graphs, ran_on, compute_model)
    print(f"   identity ({how}): max |step change| {ident:.4f} %")
    if whole:
        print("   no ProfilerStep#N spans: the whole trace is one window (HTA reads steps: not compared)")
    else:
        print(f"   HTA agreement (largest |HTA - trainsim| over ranks): {hta_agreement(paths)}")
    try:
        model = whatif_model(graphs, WhatIf(gpu=gpu, ran_on=ran_on, compute_model=compute_model))
    except TrainsimError as exc:
        print(f"   GPU swap: {exc}")
        return
    swapped = replay(graphs, op_time=model)
    print(f"   GPU swap to {gpu}" + (f" (ran on {ran_on})" if ran_on else "") + ":")
    print(f"   {'rank':>4} {'step':>5} {'measured ms':>11} {'what-if ms':>10} {'step d ms':>9} "
          f"{'compute d ms':>12} {'busy %':>6} {'CPU waited ms':>13} {'saved/compute saved':>19} "
          f"{'saved/reachable':>15}")
    by_rank = {g.rank: g for g in graphs}
    bound, reachable = [], []
    for m, w in zip(base.steps, swapped.steps, strict=True):
        d_step = w.replayed_s - m.measured_s
        d_compute = w.replayed_breakdown["compute_s"] - m.measured_breakdown["compute_s"]
        share = d_step / d_compute if d_compute < 0 else float("nan")
        waited = cpu_waited_s(by_rank[m.rank], m.step)
        most = min(-d_compute, waited)
        of_reachable = -d_step / most if most > 0 else float("nan")
        busy = busy_share(m)
        if busy >= GPU_BOUND:
            bound.append(share)
        if waited >= WAITED_SHARE * m.measured_s and d_compute < 0:
            reachable.append(of_reachable)
        step = "all" if m.step is None else m.step
        print(f"   {m.rank:>4} {step:>5} {m.measured_s * 1e3:>11.2f} {w.replayed_s * 1e3:>10.2f} "
              f"{d_step * 1e3:>9.2f} {d_compute * 1e3:>12.2f} {100 * busy:>6.1f} {waited * 1e3:>13.2f} "
              f"{share:>19.2f} {of_reachable:>15.2f}")
    if bound:
        print(f"   GPU-bound steps (busy >= {GPU_BOUND:.0%}): {len(bound)}, step saves "
              f"{min(bound):.0%}-{max(bound):.0%} of the compute saved (aim >= 50 %)")
    else:
        print(f"   no GPU-bound step (busy >= {GPU_BOUND:.0%})")
    if reachable:
        print(f"   steps whose CPU waited on the GPU >= {WAITED_SHARE:.0%} of the step: {len(reachable)}, "
              f"step saves {min(reachable):.0%}-{max(reachable):.0%} of min(compute saved, CPU waited)")
    for note in model.notes():
        print(f"   note: {note}")
    try:
        compressed_model = whatif_model(graphs, WhatIf(compression="fp16", ran_on=ran_on))
    except TrainsimError as exc:
        print(f"   compression: {exc}")
        return
    measured_all, measured_big = collective_times(base, compressed_model)
    if not measured_all:
        print("   compression: no NCCL kernels")
        return
    compressed = replay(graphs, op_time=compressed_model)
    after_all, after_big = collective_times(compressed, compressed_model)
    total = 100 * (sum(after_all.values()) / sum(measured_all.values()) - 1)
    line = f"   compression fp16: all NCCL time {total:+.1f} %"
    if measured_big:
        own, each = own_time_cuts(compressed_model)
        cuts = sorted(100 * (after_big[k] / measured_big[k] - 1) for k in measured_big)
        mean = 100 * (sum(after_big.values()) / sum(measured_big.values()) - 1)
        line += (f"; {len(cuts)} all-reduces >= 16 MB, their own time (latency + transfer): {own:+.1f} % in "
                 f"all (each {each[0]:+.1f} to {each[-1]:+.1f} %; aim -35 to -65 %); whole kernels with "
                 f"their waits for peers: {mean:+.1f} % (each {cuts[0]:+.1f} to {cuts[-1]:+.1f} %)")
    else:
        line += "; no all-reduce of 16 MB or more"
    print(line)
    print(f"   compression bounds: {bounds_line(compressed_model)}")
    for note in compressed_model.notes():
        print(f"   note: {note}")
    if ran_on is not None:
        retime(graphs, ran_on)


def retime(graphs, ran_on: str) -> None:
    """Re-time the collectives on another machine (dgx-h100, or dgx-a100 from an H100 machine): the NCCL
    time change, and that no re-timed collective beats the wires or falls behind its measured rate. A job
    larger than one machine runs on a cluster of them (one non-blocking InfiniBand switch; alpha-beta
    collectives past 16 GPUs, as the flows of a 128-rank all-to-all take long)."""
    world = max([g.trace.world_size or 1 for g in graphs] + [len(graphs)])
    other = "dgx-a100" if ran_on.startswith("dgx-h100") else "dgx-h100"
    with tempfile.TemporaryDirectory() as tmp:
        home, target = (cluster(name, world, Path(tmp)) for name in (ran_on, other))
        try:
            model = whatif_model(graphs, WhatIf(topology=target, ran_on=home,
                                               collectives="analytic" if world > 16 else "flow"))
            measured, _ = collective_times(replay(graphs), model)
            moved, _ = collective_times(replay(graphs, op_time=model), model)
        except TrainsimError as exc:
            print(f"   collectives on {other}: {exc}")
            return
    if not measured:
        return
    change = 100 * (sum(moved.values()) / sum(measured.values()) - 1)
    where = f"{Path(target).stem} (ran on {Path(home).stem})"
    print(f"   collectives on {where}: all NCCL time {change:+.1f} %; {bounds_line(model)}")


def cluster(machine: str, world: int, folder: Path) -> str:
    """``machine`` itself when it holds ``world`` GPUs, else a YAML file of enough of them on one HDR (A100)
    or NDR (H100) InfiniBand switch, written in ``folder``."""
    gpus = len(load_topology(machine).gpus)
    if world <= gpus:
        return machine
    nodes = -(-world // gpus)
    path = folder / f"{machine}-{nodes}node.yaml"
    path.write_text(f"schema: trainsim.topology/1\nname: {path.stem}\ngenerator: cluster\nnode: {machine}\n"
                    f"nodes: {nodes}\nnetwork: ib\ngeneration: {'ndr' if 'h100' in machine else 'hdr'}\n")
    return str(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="?", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--gpu", default="h100-sxm", help="GPU to swap in (default h100-sxm)")
    parser.add_argument("--ran-on", default="dgx-a100",
                        help="machine of traces that name no GPU (default dgx-a100)")
    parser.add_argument("--compute-model", choices=("roofline", "kernels"), default="roofline",
                        help="how the GPU swap rescales matrix kernels with shapes (default roofline)")
    args = parser.parse_args()
    if not args.traces.is_dir():
        raise SystemExit(f"no traces folder at {args.traces}")
    for name, paths in jobs(args.traces).items():
        run_job(name, paths, args.gpu, args.ran_on, args.compute_model)


if __name__ == "__main__":
    main()
