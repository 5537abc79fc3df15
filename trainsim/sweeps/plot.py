"""Throughput against a cost or size axis, with the Pareto front marked: the points no other point beats on
both (as much throughput or more for as little of the axis or less, better in one)."""

from __future__ import annotations

import io
import os

from trainsim.errors import TrainsimError, unknown_name
from trainsim.files import write_atomic

#: the axes a sweep can be plotted against (columns of the results), with their labels; less is better
AXES = {
    "gpu_seconds_per_sample": "cost: GPU-seconds per sample",
    "num_gpus": "GPUs",
    "batch_size": "global batch (samples)",
    "memory_peak_gib": "peak GPU memory (GiB)",
    "iteration_time_s": "iteration time (s)",
}
THROUGHPUT = "samples_per_s"


def check_axis(axis: str) -> str:
    if axis not in AXES:
        raise unknown_name("plot axis", axis, AXES, field="--x")
    return axis


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the (x, y) points that are not dominated when x is minimised and y maximised, by x."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best = [], float("-inf")
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def plot_sweep(rows: list[dict], axis: str, path: str | os.PathLike, *, title: str = "") -> list[dict]:
    """Draw the rows that ran (status ok) to the PNG ``path``; returns the rows on the Pareto front."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    check_axis(axis)
    ok = [row for row in rows if row.get("status") == "ok" and row.get(axis) is not None
          and row.get(THROUGHPUT) is not None]
    if not ok:
        raise TrainsimError("no point ran successfully; nothing to plot", file=str(path), field="--plot")
    xy = [(float(row[axis]), float(row[THROUGHPUT])) for row in ok]
    front = pareto_front(xy)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter([x for x, _ in xy], [y for _, y in xy], color="0.6", label="points", zorder=2)
    ax.plot([xy[i][0] for i in front], [xy[i][1] for i in front], "o-", color="tab:red",
            label="Pareto front", zorder=3)
    for i in front:
        ax.annotate(str(ok[i]["index"]), xy[i], textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel(AXES[axis])
    ax.set_ylabel("throughput (samples/s)")
    ax.set_title(title or "sweep")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    plt.close(fig)
    write_atomic(path, buffer.getvalue())
    return [ok[i] for i in front]
