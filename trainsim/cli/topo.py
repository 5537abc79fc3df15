"""`trainsim topo`: the topology library (list, show, route, bench)."""

from __future__ import annotations

import contextlib

import typer

from .common import app, check_outputs, check_png, make_app, options_named, print_json, progress_bar

topo_app = make_app(help="Built-in and generated topologies: list them, show one, route a transfer.")
app.add_typer(topo_app, name="topo")


@contextlib.contextmanager
def _spinner(what: str):
    """A spinner with the elapsed time on a terminal: a 100k-GPU cluster takes minutes to read and describe;
    yields a function that names the current step."""
    from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

    with progress_bar(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn()) as bar:
        task = bar.add_task(what, total=None)
        yield lambda step: bar.update(task, description=step)


@topo_app.command("list")
def topo_list(as_json: bool = typer.Option(False, "--json", help="Print JSON.")):
    """List the built-in topologies with their GPU count, GPU type and a one-line description."""
    from trainsim import api
    from trainsim.topologies.report import preset_lines

    rows = api.topologies()
    if as_json:
        print_json(rows)
    else:
        typer.echo("\n".join(preset_lines(rows)))


@topo_app.command("show")
def topo_show(
    topology: str = typer.Argument(..., help="A preset name (`trainsim topo list`) or a topology YAML file."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    png: str | None = typer.Option(None, "--png", metavar="FILE.png",
                                   help="Also draw the topology to this PNG file."),
):
    """Nodes, links, per-GPU injection and bisection bandwidth, and the kinds of path between GPUs."""
    from trainsim import api
    from trainsim.topologies.report import show_lines

    check_png("--png", png)
    check_outputs(("--png", png))
    with _spinner(f"reading {topology}") as step:
        desc = api.describe_topology(topology, png=png, progress=step)
    if as_json:
        print_json(desc | ({"png": png} if png else {}))
    else:
        typer.echo("\n".join(show_lines(desc)))
        if png:
            typer.echo(f"drawing written to {png}")


@topo_app.command("route")
def topo_route(
    topology: str = typer.Argument(..., help="A preset name or a topology YAML file."),
    src: str = typer.Argument(..., help="Source node name (e.g. gpu0, n1.gpu3, cpu0.dram) or GPU index."),
    dst: str = typer.Argument(..., help="Destination node name or GPU index."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """The links a transfer from SRC to DST uses (per leg when staged through host memory)."""
    from trainsim import api
    from trainsim.topologies.report import route_lines

    with _spinner(f"reading {topology}"):
        report = api.route(topology, src, dst)
    if as_json:
        print_json(report)
    else:
        typer.echo("\n".join(route_lines(report)))


@topo_app.command("bench")
def topo_bench(
    topology: str = typer.Argument(..., help="A preset name or a topology YAML file."),
    collective: str = typer.Option("allreduce", "--collective", "-c",
                                   help="allreduce, reduce_scatter, allgather, broadcast, reduce, alltoall "
                                        "or sendrecv."),
    algo: str = typer.Option("auto", "--algo", help="ring, tree, nvls, nvls_tree, p2p, or auto "
                                                      "(NCCL-like choice)."),
    proto: str = typer.Option("auto", "--proto", help="NCCL protocol: ll, ll128, simple, or auto (NCCL's "
                                                       "choice, the lowest predicted time)."),
    sizes: str = typer.Option("1K:1G", "--sizes", help="MIN:MAX[:FACTOR] (factor 2 by default) or a "
                                                        "comma list; K/M/G = 2^10/2^20/2^30 bytes."),
    gpus: str | None = typer.Option(None, "--gpus",
                                    help="Comma-separated GPU names or indices (default: all)."),
    method: str = typer.Option("both", "--method", help="flow, analytic or both."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON: a list of rows."),
):
    """Collective timings on a topology, nccl-tests style: size, time, algbw, busbw, from the flow-level
    simulation and the analytic alpha-beta model."""
    from trainsim import api
    from trainsim.sim.collectives.ops import bench_lines

    with progress_bar() as bar, options_named({f: f"--{f}" for f in ("collective", "algo", "proto", "sizes",
                                                                       "gpus", "method")}):
        task = bar.add_task(f"{collective} on {topology}", total=None)

        def progress(total: int | None = None) -> None:
            if total is not None:
                bar.update(task, total=total)
            else:
                bar.advance(task)

        bench = api.bench_collectives(topology, collective, algo=algo, proto=proto, sizes=sizes, gpus=gpus,
                                      method=method, progress=progress)
    if as_json:
        print_json(bench.rows)
        return
    typer.echo("\n".join(bench_lines(bench.rows, title=bench.title)))
