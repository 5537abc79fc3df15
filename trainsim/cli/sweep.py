"""`trainsim sweep`: many scenarios from one file, in parallel, resumable (`trainsim.api.sweep`)."""

from __future__ import annotations

import sys

import typer

from .common import (
    app,
    check_outputs,
    check_png,
    distinct_outputs,
    interrupt_reported,
    print_json,
    progress_bar,
)


@app.command("sweep")
def sweep_cmd(
    spec: str = typer.Argument(..., metavar="SPEC",
                               help="A sweep file (trainsim.sweep/1) or the name of a shipped one."),
    out: str | None = typer.Option(None, "--out", "-o", metavar="FILE.csv",
                                   help="The results CSV (default: NAME.csv, NAME the sweep's name); a "
                                        "Parquet copy goes beside it when pyarrow is installed. Rerunning "
                                        "with the same file runs only the points it lacks."),
    workers: int | None = typer.Option(None, "--workers", "-j", min=1,
                                       help="Local processes (default: every core; 1: one by one)."),
    ray: str | None = typer.Option(None, "--ray", metavar="[ADDRESS]",
                                   help="Run the points on Ray: alone, a new local Ray instance; or a "
                                        "cluster at HOST:PORT, ray://HOST:PORT or auto (put it after SPEC)."),
    retry_failed: bool = typer.Option(False, "--retry-failed",
                                      help="Run again the points the results file records as errors."),
    plot: str | None = typer.Option(None, "--plot", metavar="FILE.png",
                                    help="Plot throughput against --x with the Pareto front marked."),
    axis: str = typer.Option("gpu_seconds_per_sample", "--x", metavar="AXIS",
                             help="The plot's cost or size axis: gpu_seconds_per_sample, num_gpus, "
                                  "batch_size, memory_peak_gib or iteration_time_s."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """Run every point of a sweep (a base scenario, a grid and/or list of field values) in parallel: one row
    per point in a CSV, failures recorded per point, and a rerun resumes where the last one stopped.

    Exit code 1 when any point of the sweep is recorded as an error (after every point ran and the files
    were written)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    from trainsim import api
    from trainsim.sweeps.report import rich_table, summary

    bar = progress_bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                       TimeElapsedColumn())
    task = bar.add_task(spec, total=None)
    state = {"name": spec, "out": out, "failed": 0, "written": 0}

    def started(name: str, results: str, points: int) -> None:
        # the outputs are checked once the spec names them, before any point runs
        distinct_outputs(("--out", results), ("--plot", plot))
        check_png("--plot", plot)
        check_outputs(("--out", results), ("--plot", plot))
        state.update(name=name, out=results)
        bar.update(task, description=name, total=points)  # known before a point resolves

    def progress(done: int, total: int, row: dict | None) -> None:
        if row is not None:  # else a point the results file holds already
            state["failed"] += row["status"] != "ok"
            state["written"] += 1
        where = f"point {row['index']}" if row is not None else "skipping points already done"
        failed = f", {state['failed']} failed" if state["failed"] else ""
        bar.update(task, completed=done, total=total, description=f"{state['name']}: {where}{failed}")

    try:
        with bar:
            done = api.sweep(spec, out=out, workers=workers, ray=ray, retry_failed=retry_failed, plot=plot,
                             axis=axis, started=started, progress=progress)
    except KeyboardInterrupt:
        typer.echo(f"error: interrupted; the {state['written']} points that finished this run are in "
                   f"{state['out']}; run the same command again to resume", err=True)
        interrupt_reported()
        raise typer.Exit(130) from None
    report, front = done.report, done.front
    if as_json:
        print_json(report.to_dict() | {"plot": plot, "x": axis,
                                       "pareto_front": [row["index"] for row in front or []]})
        raise typer.Exit(1 if report.failed else 0)
    console = Console(width=None if sys.stdout.isatty() else 160)  # piped: keep the columns readable
    console.print(rich_table(report, front))
    console.print(summary(report), soft_wrap=True, markup=False)
    if plot:
        console.print(f"plot written to {plot} (* marks the Pareto front)", soft_wrap=True, markup=False)
    if report.failed:
        raise typer.Exit(1)
