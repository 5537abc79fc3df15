"""`trainsim search`: the best parallel layouts (strategy ``mesh``) of a transformer on a machine
(`trainsim.api.search`)."""

from __future__ import annotations

import sys

import typer

from trainsim.errors import TrainsimError

from .common import app, check_outputs, check_png, distinct_outputs, print_json, progress_bar

_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def _count(text: str | None, option: str) -> float | None:
    """A token count: a number, optionally with k, M, B (or G) or T (``15T``, ``4M``, ``1e12``)."""
    if text is None:
        return None
    raw = text.strip().replace("_", "").replace(",", "")
    scale = _SUFFIX.get(raw[-1:].lower(), 1.0) if raw else 1.0
    number = raw[:-1] if scale != 1.0 else raw
    try:
        value = float(number) * scale
    except ValueError:
        raise TrainsimError(f"{text!r} is not a count (a number, optionally with k, M, B or T)",
                            field=option) from None
    if not 0 < value < 1e30:
        raise TrainsimError(f"{text!r}: give a positive count below 1e30", field=option)
    return value


def _ints(text: str | None, option: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise TrainsimError(f"{text!r}: give whole numbers separated by commas", field=option) from None
    if not values or any(v < 0 or v > 1_000_000 for v in values):
        raise TrainsimError(f"{text!r}: give one or more whole numbers from 0 to 1,000,000", field=option)
    return values


def _names(text: str | None, option: str, valid: tuple[str, ...]) -> tuple[str, ...] | None:
    if text is None:
        return None
    values = tuple(v.strip() for v in text.split(",") if v.strip())
    bad = [v for v in values if v not in valid]
    if not values or bad:
        raise TrainsimError(f"{(bad or [text])[0]!r} is not one of {', '.join(valid)}", field=option)
    return values


@app.command("search")
def search_cmd(
    scenario: str | None = typer.Argument(
        None, metavar="SCENARIO",
        help="A scenario (shipped name or YAML): its topology, workload, batch, GPUs, precision and "
             "optimizer. Or give --model, --topology, --gpus and --batch."),
    model: str | None = typer.Option(
        None, "--model", "-m", metavar="WORKLOAD",
        help="A transformer workload: preset name (llama3-70b), JSON file, or a mapping such as "
             "'{name: llama3-70b, seq_len: 8192}'."),
    topology: str | None = typer.Option(
        None, "--topology", metavar="TOPOLOGY",
        help="A topology: preset name, YAML file, or a generator mapping such as '{generator: "
             "rail_optimised, node: dgx-h100, nodes: 128, network: ib, generation: ndr, radix: 256}'."),
    gpus: str | None = typer.Option(
        None, "--gpus", metavar="N[,N...]",
        help="GPUs to train on (default: the scenario's, else the topology's); several to compare counts."),
    batch: int | None = typer.Option(None, "--batch", min=1, max=2**31,
                                     help="Global batch (sequences per step)."),
    tokens_per_step: str | None = typer.Option(
        None, "--tokens-per-step", metavar="N",
        help="Global batch in tokens (a multiple of the sequence length)."),
    precision: str | None = typer.Option(None, "--precision", help="bf16 (default), fp16, fp32 or tf32."),
    optimizer: str | None = typer.Option(None, "--optimizer", help="adam (default), momentum or sgd."),
    compute_model: str | None = typer.Option(
        None, "--compute-model",
        help="kernels (the default: the kernel model) or roofline: how the layers' times are estimated "
             "(the scenario's compute_model)."),
    overrides: list[str] = typer.Option([], "--set", metavar="KEY.PATH=VALUE",
                                        help="Override a scenario field (repeatable)."),
    objective: str = typer.Option(
        "throughput", "--objective",
        help="throughput (tokens/s), time (to train --tokens), gpu-hours, energy (at the GPUs' rated "
             "power: an upper bound) or cost (--price-per-gpu-hour)."),
    tokens: str | None = typer.Option(None, "--tokens", metavar="N",
                                      help="Tokens to train (15T, 2e12): time, GPU-hours, energy and cost."),
    price: float | None = typer.Option(None, "--price-per-gpu-hour", min=0.0, max=1e9,
                                       help="Price of one GPU for one hour (cost)."),
    top: int = typer.Option(10, "--top", min=0, max=1000,
                            help="Simulate the best N in full (0: rank only)."),
    collectives: str = typer.Option("analytic", "--collectives",
                                    help="How the simulations time collectives: analytic (fast) or flow."),
    headroom: float = typer.Option(0.0, "--headroom", min=0.0, max=0.99,
                                   help="Fraction of each GPU's memory kept free (the allocator's)."),
    tp: str | None = typer.Option(None, "--tp", metavar="1,2,4,8", help="Tensor-parallel degrees to try."),
    cp: str | None = typer.Option(None, "--cp", metavar="1,2,4,8", help="Context-parallel degrees to try."),
    pp: str | None = typer.Option(None, "--pp", metavar="1,2,4,...", help="Pipeline degrees to try."),
    ep: str | None = typer.Option(None, "--ep", metavar="1,2,...", help="Expert-parallel degrees to try."),
    zero: str | None = typer.Option(None, "--zero", metavar="0,1,2,3", help="ZeRO stages to try."),
    no_hsdp: bool = typer.Option(False, "--no-hsdp", help="No HSDP shard groups (shard over all of dp)."),
    async_tp: bool = typer.Option(False, "--async-tp",
                                  help="Also try async tensor parallelism where sequence parallelism is on."),
    micro_batch: str | None = typer.Option(None, "--micro-batch", metavar="1,2,4",
                                           help="Micro-batches to try."),
    recompute: str | None = typer.Option(None, "--recompute", metavar="none,selective,full",
                                         help="Activation recomputation to try."),
    schedule: str | None = typer.Option(None, "--schedule", metavar="1f1b,gpipe,zb-h1",
                                         help="Pipeline schedules."),
    virtual_stages: str | None = typer.Option(None, "--virtual-stages", metavar="1,2,4",
                                              help="Interleaved 1F1B's model chunks per pipeline rank."),
    out: str | None = typer.Option(None, "--out", metavar="FILE.json", help="Also write the result as JSON."),
    plot: str | None = typer.Option(None, "--plot", metavar="FILE.png",
                                    help="Plot throughput against --plot-x, the Pareto front marked."),
    plot_x: str = typer.Option("memory", "--plot-x",
                               help="The plot's x axis: memory, gpu-hours, cost, energy or gpus."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """Search the parallel layouts (tp x cp x pp x ep x ZeRO/FSDP/HSDP x micro-batch x recompute x schedule x
    virtual stages) of a transformer for a GPU count, machine and batch: keep those that fit in memory
    (closed form), rank them by the analytic step time, simulate the best --top in full and rank those by
    the simulated figure."""
    import dataclasses

    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    from trainsim import api
    from trainsim.provenance import provenance
    from trainsim.sim.parallel.search import OBJECTIVES, PLOT_AXES, SearchSpace, mesh_supports_virtual_stages
    from trainsim.sim.parallel.stage_costs import SCHEDULES

    distinct_outputs(("--out", out), ("--plot", plot))
    check_png("--plot", plot)
    check_outputs(("--out", out), ("--plot", plot))
    if objective not in OBJECTIVES:
        raise TrainsimError(f"unknown objective {objective!r}; valid choices: {', '.join(OBJECTIVES)}",
                            field="--objective")
    if plot_x not in PLOT_AXES:
        raise TrainsimError(f"unknown plot axis {plot_x!r}; valid choices: {', '.join(PLOT_AXES)}",
                            field="--plot-x")
    changes = {}
    for name, text in (("tp", tp), ("cp", cp), ("pp", pp), ("ep", ep), ("micro_batch", micro_batch),
                       ("virtual_stages", virtual_stages)):
        values = _ints(text, "--" + name.replace("_", "-"))
        if values is not None:
            if 0 in values:
                raise TrainsimError(f"{text!r}: degrees are at least 1", field="--" + name.replace("_", "-"))
            changes[name] = values
    interleaved = changes.get("virtual_stages", (1,)) != (1,)
    if interleaved and not mesh_supports_virtual_stages():
        raise TrainsimError("this trainsim's strategy mesh has no virtual stages", field="--virtual-stages")
    zeros = _ints(zero, "--zero")
    if zeros is not None:
        if any(z > 3 for z in zeros):
            raise TrainsimError(f"{zero!r}: ZeRO stages are 0, 1, 2 and 3", field="--zero")
        changes["zero"] = zeros
    for name, text, valid in (("recompute", recompute, ("none", "selective", "full")),
                              ("schedule", schedule, SCHEDULES)):
        values = _names(text, f"--{name}", valid)
        if values is not None:
            changes[name] = values
    if no_hsdp:
        changes["hsdp"] = False
    if async_tp:
        changes["async_tp"] = (False, True)
    space = dataclasses.replace(SearchSpace(), **changes)
    counts = list(_ints(gpus, "--gpus")) if gpus is not None else None
    if counts is not None and 0 in counts:
        raise TrainsimError(f"{gpus!r}: a GPU count is at least 1", field="--gpus")
    per_step = _count(tokens_per_step, "--tokens-per-step")
    if per_step is not None and per_step != int(per_step):
        raise TrainsimError(f"{tokens_per_step!r} is not a whole number of tokens", field="--tokens-per-step")

    bar = progress_bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                       TimeElapsedColumn())
    task = bar.add_task("reading the model and the machine", total=None)

    def progress(phase: str, done: int, total: int) -> None:
        bar.update(task, completed=done, total=total, description=f"{phase} layouts")

    prov = provenance(timestamp=False, scenario=scenario, workload=model, topology=topology, gpus=gpus,
                      batch=batch, objective=objective)
    with bar:
        report = api.search(scenario, model=model, topology_source=topology, gpus=counts, batch=batch,
                            tokens_per_step=int(per_step) if per_step is not None else None,
                            precision=precision, optimizer=optimizer, compute_model=compute_model,
                            overrides=overrides,
                            objective=objective, tokens=_count(tokens, "--tokens"), price=price, top=top,
                            collectives=collectives,
                            space=space, headroom=headroom, progress=progress, out=out, plot=plot,
                            plot_x=plot_x, provenance=prov)
    doc = report.to_dict()
    if as_json:
        print_json({**doc, "provenance": prov})
    else:
        _print(report)
        if out:
            typer.echo(f"result written to {out}")
        if plot and report.ranking.candidates:
            typer.echo(f"plot written to {plot}")
    if not report.ranking.candidates:
        raise typer.Exit(1)


def _gib(x: float | None) -> str:
    return "-" if x is None else f"{x / 2**30:.1f}"


def _print(report) -> None:
    from rich.console import Console
    from rich.table import Table

    r, o = report.ranking, report.objective
    console = Console(width=None if sys.stdout.isatty() else 160)
    cap = ", ".join(f"{c / 2**30:.0f} GiB" for c in sorted(set(r.capacity.values())))
    console.print(f"{report.model} on {', '.join(map(str, report.gpus))} x {report.device}, {report.batch} "
                  f"sequences of {report.seq_len} tokens per step: {r.enumerated:,} layouts ranked in "
                  f"{r.seconds:.1f} s, {r.fitting:,} fit in {cap}; the best {len(report.top)} simulated in "
                  f"{report.simulate_seconds:.1f} s ({report.collectives} collectives)",
                  soft_wrap=True, markup=False)
    if not r.candidates:
        need = "" if r.least_memory is None else f": the least any needs is {r.least_memory / 2**30:.1f} GiB"
        console.print(f"no layout fits in memory{need}", soft_wrap=True, markup=False)
        return
    extra = {"time": ("days to train", "time_to_train_s", 86400, ",.1f"),
             "gpu-hours": ("GPU-hours", "gpu_hours", 1, ",.0f"),
             "energy": ("MWh (upper bound)", "energy_kwh_upper_bound", 1000, ",.1f"),
             "cost": ("cost", "cost", 1, ",.0f")}
    table = Table(title=f"best layouts by {o.name}" + ("" if report.top else " (analytic)"))
    columns = ["rank", "layout", "memory GiB (closed / sim)", "step s (analytic)", "step s (sim)",
               "analytic vs sim", "tokens/s"]
    if o.name in extra:
        columns.append(extra[o.name][0])
    for column in columns:
        table.add_column(column, overflow="fold")
    rows = report.top or r.candidates[:10]
    for i, c in enumerate(rows):
        figures = c.simulated_figures or c.figures
        row = [str(i + 1), c.label, f"{_gib(c.memory.peak)} / {_gib(c.simulated_memory)}"
               + (" OOM" if c.simulated_oom else ""), f"{c.predicted.iteration_s:.3f}",
               "-" if c.simulated_step_s is None else f"{c.simulated_step_s:.3f}",
               "-" if c.simulated_step_s is None else
               f"{c.predicted.iteration_s / c.simulated_step_s - 1:+.1%}",
               f"{figures['tokens_per_s']:,.0f}"]
        if o.name in extra:
            _, key, scale, fmt = extra[o.name]
            row.append(format(figures[key] / scale, fmt))
        table.add_row(*row)
    console.print(table)
    for note in report.notes:
        console.print(f"note: {note}", soft_wrap=True, markup=False)
