"""`trainsim plan` and `reproduce`: a per-layer decomposition chosen for a model and machine, and the seed
papers' figures reproduced."""

from __future__ import annotations

import typer

from .common import app, check_outputs, print_json, progress_bar


@app.command("plan")
def plan_cmd(
    scenario: str | None = typer.Argument(
        None, metavar="SCENARIO",
        help="A scenario (shipped name or YAML): its topology, workload, batch, GPUs and precision. "
        "Or give --workload, --topology and --batch."),
    workload: str | None = typer.Option(None, "--workload", help="A workload (built-in name or JSON file)."),
    topology: str | None = typer.Option(None, "--topology", help="A topology (preset name or YAML file)."),
    batch: int | None = typer.Option(None, "--batch", min=1, help="Global batch size."),
    gpus: int | None = typer.Option(None, "--gpus", min=1, help="Use the first N GPUs (default: all)."),
    precision: str | None = typer.Option(
        None, "--precision", help="fp32, tf32, fp16 or bf16 (default: the scenario's, else fp32)."),
    overrides: list[str] = typer.Option([], "--set", metavar="KEY.PATH=VALUE",
                                        help="Override a scenario field (repeatable)."),
    no_simulate: bool = typer.Option(
        False, "--no-simulate", help="Only the performance model (do not simulate plan and data parallel)."),
    out: str | None = typer.Option(None, "--out", metavar="FILE.json", help="Also write the plan as JSON."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """Choose each layer's decomposition (samples x height x width) for a model, machine and batch with a fast
    performance model (dynamic programming over layers), then simulate the plan and pure data parallelism."""
    from rich.console import Console

    from trainsim import api
    from trainsim.provenance import provenance
    from trainsim.sim.planning.spatial_plan import plan_lines, write_plan

    check_outputs(("--out", out))
    with Console(stderr=True).status(f"planning {scenario or workload}"):
        result = api.plan(scenario, workload_source=workload, topology_source=topology, batch=batch,
                          gpus=gpus, precision=precision, overrides=overrides,
                          simulate_plan=not no_simulate)
    doc = {**result.to_dict(), "provenance": provenance(timestamp=False, scenario=scenario, workload=workload,
                                                        topology=topology, batch=batch, gpus=gpus)}
    if out:
        write_plan(doc, out)
    if as_json:
        print_json(doc)
        return
    for line in plan_lines(result):
        typer.echo(line)
    if out:
        typer.echo(f"plan written to {out}")


@app.command("reproduce")
def reproduce_cmd(
    paper: str = typer.Argument(None, help="Paper to reproduce (omit to list them)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """Run a paper's scenarios (scenarios/papers/) and print our figures next to the published ones."""
    from trainsim import api

    if paper is None:
        papers = api.papers()
        if as_json:
            print_json(papers)
        else:
            for key, title in papers.items():
                typer.echo(f"{key:12s} {title}")
        return
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    bar = progress_bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                       TimeElapsedColumn())
    task = bar.add_task(paper, total=None)

    def progress(done: int, total: int, label: str) -> None:
        bar.update(task, completed=done, total=total, description=f"{paper}: {label}"[:72])

    with bar:
        result = api.reproduce(paper, progress=progress)
    if as_json:
        print_json(result.to_dict())
        return
    _print_reproduction(result)


def _cell(value) -> str:
    if isinstance(value, tuple | list):  # a published band
        return "-".join(_cell(v) for v in value)
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _print_reproduction(result) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=result.title)
    for column in ("figure", "published", "ours", "low", "high", "in range", "unit", "why / what drives it"):
        table.add_column(column, overflow="fold")
    for fig in result.figures:
        in_range = {True: "yes", False: "no", None: "-"}[fig.in_range]
        table.add_row(fig.name, _cell(fig.published), _cell(fig.ours), _cell(fig.low), _cell(fig.high),
                      in_range, fig.unit, fig.reason or fig.note)
    console = Console()
    console.print(table)
    for name, rows in result.tables.items():  # extra detail, e.g. a strong-scaling table
        if not rows:
            continue
        detail = Table(title=name)
        for column in rows[0]:
            detail.add_column(column, overflow="fold")
        for row in rows:
            detail.add_row(*(_cell(v) for v in row.values()))
        console.print(detail)
    if result.physics.get("parameters"):
        console.print(f"swept {result.physics['sweep']}: {', '.join(result.physics['parameters'])} "
                      f"x(1 +- {result.physics['spread']:g})")
    for a in result.assumptions:
        values = a.get("choices") or a.get("range")
        console.print(f"assumes ({a['scenario']}) {a['name']} = {a['value']} over {values}: {a['reason']}")
    for note in result.notes:
        console.print(f"assumes: {note}")
