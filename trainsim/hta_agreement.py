"""Whether Meta's HolisticTraceAnalysis (HTA) reads trainsim's traces as trainsim reads its own runs.

HTA (``pip install 'trainsim[hta]'``) is run on a folder written by ``--trace DIR``: its temporal breakdown
(idle, compute and non-compute shares of each rank's GPU time), its kernel breakdown (time per kernel
type) and its communication/computation overlap. trainsim's side comes from its own breakdown of the same
run, per rank, over the steps HTA reads: every recorded step but the last (HTA leaves the last out unless
there is only one), and the GPU work launched in them:

- **idle**: time the GPU runs nothing: trainsim's idle plus its data preparation (the GPU waits for its
  data loader); a replay's ``gpu_idle_s``;
- **compute**: time a compute kernel runs (trainsim's compute class, a replay's ``compute_s``);
- **overlap**: the share of communication time that runs under compute.

Where trainsim's breakdown counts time in which the GPU runs nothing of its own as communication, HTA, which
sees only the GPU's own events, counts it as idle: waiting for a parameter server's update, and a peer copy
that another GPU's copy engine runs (the scatter and gather of GPU0-centric data parallelism, drawn on the
GPU that runs it, as the profiler draws a copy on the stream that issued it). Those strategies differ by
that time: ps-resnet50-pcie-4gpu-gen3 by 2.4 points, dp-gpu0-resnet50-pcie-4gpu-gen3 by up to 20 points on
the GPUs gpu0 copies to (``benchmarks/hta_agreement.py``).

HTA's window runs from the first to the last GPU event of those steps; ``window="hta"`` takes trainsim's
breakdown over that same window and the same GPU work: HTA files an op under a step through the runtime call
that launched it (its correlation id) and leaves out ops whose launch the trace lacks (614 of the V100
CUDA-graph trace's 15,632, whose launches the profiler did not record; the replay keeps them at their
measured start), so over that window trainsim counts only ops with a known launch too;
``window="steps"`` over the whole steps, as trainsim reports them (the
two differ by the time the GPU waits at the edges of the steps: the CPU's work before the first launch and
after the last kernel). What remains between HTA and trainsim over one window is how HTA reads the trace:
which events it counts as which kind and its rounding of each event to whole microseconds (start up, end
down).
"""

from __future__ import annotations

import logging
import os

from trainsim.errors import TrainsimError


def hta_figures(folder: str | os.PathLike) -> dict[int, dict]:
    """HTA's figures per rank: ``idle_pct``, ``compute_pct``, ``non_compute_pct``, ``overlap_pct`` and
    ``kernel_types`` (kernel type -> % of GPU kernel time, over all ranks)."""
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError:
        raise TrainsimError("HTA is not installed: pip install 'trainsim[hta]' "
                            "(HolisticTraceAnalysis)") from None
    if not os.path.isdir(folder) or not any(n.endswith((".json", ".gz")) for n in os.listdir(folder)):
        raise TrainsimError("no trace files (.json, .json.gz) in this folder", file=str(folder))
    logging.getLogger("hta").setLevel(logging.ERROR)
    analysis = TraceAnalysis(trace_dir=str(folder))
    temporal = analysis.get_temporal_breakdown(visualize=False)
    kernel_types, _ = analysis.get_gpu_kernel_breakdown(visualize=False)
    overlap = analysis.get_comm_comp_overlap(visualize=False)
    types = {str(row["kernel_type"]): float(row["percentage"]) for _, row in kernel_types.iterrows()}
    out: dict[int, dict] = {}
    for _, row in temporal.iterrows():
        out[int(row["rank"])] = {"idle_pct": float(row["idle_time_pctg"]),
                                 "compute_pct": float(row["compute_time_pctg"]),
                                 "non_compute_pct": float(row["non_compute_time_pctg"]),
                                 "kernel_types": types}
    for _, row in overlap.iterrows():
        out[int(row["rank"])]["overlap_pct"] = float(row["comp_comm_overlap_pctg"])
    return out


def _read_steps(n: int) -> range:
    """Indices of the recorded steps HTA reads: all but the last, unless there is only one."""
    return range(n - 1 if n > 1 else n)


def simulated_figures(result, window: str = "hta") -> dict[int, dict]:
    """trainsim's figures per GPU (rank = its index) of a simulated run, over the iterations HTA reads
    (``window``: see the module docstring)."""
    from trainsim.sim.core.machine import COMM, COMPUTE
    from trainsim.sim.core.result import breakdown, busy_time, classify
    from trainsim.sim.output.kineto_ranks import GPU_STREAM

    ends = result.iteration_ends_s
    measured = range(result.warmup_iterations, len(ends))
    read = [measured[i] for i in _read_steps(len(measured))]
    out: dict[int, dict] = {}
    for g in result.gpus:
        ops = [op for op in result.machine.ops if op.resource == g.name]
        if window == "hta":
            work = [op for op in ops if op.iteration in read and op.stream in GPU_STREAM]
            windows = [(min(op.start for op in work), max(op.end for op in work))]
        else:
            windows = [(ends[i - 1] if i else 0.0, ends[i]) for i in read]
        total = sum(b - a for a, b in windows)
        parts = breakdown(result.machine.ops, g.name, windows)
        compute = [(op.start, op.end, 0) for op in ops if op.category == COMPUTE and op.stream == "compute"]
        comm = [(op.start, op.end, 1) for op in ops if op.stream == "comm" and op.category == COMM]
        comm_s = sum(busy_time([(a, b) for a, b, _ in comm], lo, hi) for lo, hi in windows)
        exposed = sum(classify(compute + comm, lo, hi, 2)[1] for lo, hi in windows)
        out[g.index] = {"idle_pct": 100 * (parts["idle"] + parts["data_preparation"]) / total,
                        "compute_pct": 100 * parts["compute"] / total,
                        "overlap_pct": 100 * (1 - exposed / comm_s) if comm_s > 0 else None}
    return out


def replayed_figures(report, window: str = "hta") -> dict[int, dict]:
    """trainsim's figures per rank of a replay (the what-if's if there is one), over the steps HTA reads
    (``window``: see the module docstring)."""
    from trainsim.sim.replay.engine import breakdown

    result = report.whatif or report.replay
    out: dict[int, dict] = {}
    for rr in result.ranks:
        numbered = [s for s in rr.steps if s.step is not None]     # HTA reads ProfilerSteps only
        steps = [numbered[i] for i in _read_steps(len(numbered))]
        if not steps:
            continue
        if window == "hta":
            numbers = {s.step for s in steps}
            ops = [o for o in rr.graph.ops if o.step in numbers and o.launch is not None]
            span = (min(rr.op_start[o.index] for o in ops), max(rr.op_end[o.index] for o in ops))
            parts = [breakdown(ops, rr.op_start, rr.op_end, span)]
            total = span[1] - span[0]
        else:
            parts = [s.replayed_breakdown for s in steps]
            total = sum(s.replayed_s for s in steps)
        comm = sum(p["communication_s"] for p in parts)
        exposed = sum(p["communication_exposed_s"] for p in parts)
        out[rr.graph.rank] = {"idle_pct": 100 * sum(p["gpu_idle_s"] for p in parts) / total,
                              "compute_pct": 100 * sum(p["compute_s"] for p in parts) / total,
                              "overlap_pct": 100 * (1 - exposed / comm) if comm > 0 else None}
    return out


def largest_gaps(ours: dict[int, dict], theirs: dict[int, dict]) -> dict[str, float]:
    """The largest difference over ranks, in percentage points, of each figure both sides have."""
    gaps: dict[str, float] = {}
    for rank, mine in ours.items():
        for key in ("idle_pct", "compute_pct", "overlap_pct"):
            if mine.get(key) is None or theirs.get(rank, {}).get(key) is None:
                continue
            gaps[key] = max(gaps.get(key, 0.0), abs(mine[key] - theirs[rank][key]))
    return gaps
