"""A sweep's rows for the terminal: a rich table (one line a point) and a one-line summary."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from .results import FIELD_PREFIX, cell
from .runner import SweepReport

#: the figures shown per point (the CSV has them all): column -> (heading, format)
SHOWN = {
    "num_gpus": ("GPUs", "{:d}"),
    "samples_per_s": ("samples/s", "{:,.1f}"),
    "iteration_time_s": ("iteration (ms)", "{:.3f}"),
    "gpu_seconds_per_sample": ("GPU-ms/sample", "{:.4f}"),
    "memory_peak_gib": ("peak GiB", "{:.2f}"),
}
SCALE = {"iteration_time_s": 1e3, "gpu_seconds_per_sample": 1e3}


def rich_table(report: SweepReport, front: list[dict] | None = None) -> Table:
    """The rows in point order; rows on the Pareto front (``front``) are starred."""
    table = Table(title=report.name)
    table.add_column("#", justify="right")
    for name in report.fields:
        table.add_column(name)
    for heading, _ in SHOWN.values():
        table.add_column(heading, justify="right")
    table.add_column("status")
    starred = {row["key"] for row in front or []}
    for row in report.rows:
        values = [f"{row['index']}{'*' if row['key'] in starred else ''}"]
        values += [escape(cell(row.get(FIELD_PREFIX + name))) for name in report.fields]
        for column, (_, fmt) in SHOWN.items():
            value = row.get(column)
            values.append("" if value is None else fmt.format(value * SCALE.get(column, 1)))
        status = row["status"] if row["status"] == "ok" else f"[red]{escape(row.get('error') or 'error')}[/]"
        if row["status"] == "ok" and row.get("oom"):
            status = "[yellow]out of memory[/]"
        values.append(status)
        table.add_row(*values)
    return table


def summary(report: SweepReport) -> str:
    done = f"{report.ran} ran now, {report.resumed} from earlier runs"
    repeats = f", {report.duplicates} repeated points run once" if report.duplicates else ""
    files = str(report.results) + (f" and {report.parquet}" if report.parquet else "")
    return (f"{len(report.rows)} points: {done}, {report.failed} failed{repeats}; {report.wall_s:.1f} s; "
            f"results in {files}")
