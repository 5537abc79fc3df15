"""`trainsim simulate`, `max-batch` and `scenarios`: a scenario's training iterations simulated, the largest
batch that fits, and the shipped scenarios."""

from __future__ import annotations

import typer

from .common import (
    TRACE_HELP,
    app,
    check_not_input,
    check_outputs,
    check_trace_output,
    comma_names,
    distinct_outputs,
    make_app,
    options_named,
    print_json,
    stop_on_interrupt,
)

scenarios_app = make_app(help="The scenarios shipped with trainsim.")


@app.command("simulate")
def simulate_cmd(
    scenario: str = typer.Argument(..., metavar="SCENARIO",
                                   help="A shipped scenario (see `trainsim scenarios list`) or a YAML file."),
    overrides: list[str] = typer.Option([], "--set", metavar="KEY.PATH=VALUE",
                                        help="Override a scenario field, e.g. --set batch_size=512 "
                                        "(repeatable; the value is parsed as YAML)."),
    variant: str | None = typer.Option(None, "--variant", help="Apply one of the scenario's named variants."),
    calibration: str | None = typer.Option(None, "--calibration", metavar="DIR",
                                           help="A calibration bundle: its topology and workload replace the "
                                                "scenario's."),
    trace_out: str | None = typer.Option(None, "--trace", metavar="DIR|FILE.json.gz",
                                         help=TRACE_HELP.format(what="the run")),
    records_out: str | None = typer.Option(None, "--records", metavar="FILE.csv",
                                           help="Write one flat row per op/transfer (CSV)."),
    chakra_out: str | None = typer.Option(None, "--chakra", metavar="DIR",
                                          help="Write the run as Chakra execution traces, "
                                               "DIR/trainsim.<rank>.et (ASTRA-sim's workload)."),
    allow_oom: bool = typer.Option(False, "--allow-oom",
                                   help="Exit 0 when the run does not fit in GPU memory (default: exit 3)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """Simulate training iterations of a scenario: iteration time, where it goes, memory and links.

    Exit codes: 0 done; 2 bad input; 3 the run does not fit in GPU memory (a result: everything is still
    printed and written; --allow-oom exits 0); 130 stopped by Ctrl-C (the iterations done are reported)."""
    from rich.console import Console

    from trainsim import api
    from trainsim.provenance import provenance
    from trainsim.sim.core.window import StopFlag
    from trainsim.sim.output import report

    distinct_outputs(("--trace", trace_out), ("--records", records_out), ("--chakra", chakra_out))
    check_outputs(("--records", records_out))
    check_trace_output(trace_out)
    if chakra_out:
        from trainsim.sim.replay.chakra_graph import check_chakra_folder

        check_not_input(chakra_out, "--chakra", folder=True, whole=True)
        check_chakra_folder(chakra_out)
    prov = None
    if trace_out or chakra_out or as_json:  # only files and JSON carry it (versions cost start-up time)
        prov = provenance(timestamp=False, scenario=scenario, overrides=list(overrides), variant=variant,
                          calibration=calibration)
    stop = StopFlag()
    with Console(stderr=True).status(f"simulating {scenario}"), stop_on_interrupt(
            stop.request, "when the current iteration has finished on every rank"):
        result = api.simulate(scenario, overrides=overrides, variant=variant, calibration=calibration,
                              record=False, stop=stop, trace=trace_out, records=records_out,
                              chakra=chakra_out, provenance=prov)
    stopped = (f"stopped early: the result covers the first {result.iterations} measured iterations"
               if result.stopped_early else None)
    oom_exit = 3 if result.oom and not allow_oom else 0
    if as_json:
        print_json(result.to_dict(provenance=prov))
        if stopped:
            typer.echo(f"warning: {stopped}", err=True)
            raise typer.Exit(130)
        raise typer.Exit(oom_exit)
    console = Console()
    if stopped:
        console.print(f"[bold yellow]{stopped}[/]")
    console.print(report.headline(result), soft_wrap=True, markup=False)
    for table in report.tables(result):
        console.print(table)
    if line := report.host_dispatch(result):
        console.print(line)
    for note in report.notes(result):
        console.print(f"note: {note}", markup=False)
    for line in result.oom:
        console.print(f"[bold red]OUT OF MEMORY (a result, not an error): {line}[/]")
    for path, what in ((trace_out, "trace"), (records_out, "records"), (chakra_out, "Chakra traces")):
        if path:
            console.print(f"{what} written to {path}")
    if stopped:
        raise typer.Exit(130)
    raise typer.Exit(oom_exit)


@app.command("max-batch")
def max_batch_cmd(
    scenario: str = typer.Argument(..., metavar="SCENARIO",
                                   help="A shipped scenario or a YAML file (strategy single, ddp, dp-gpu0 or "
                                        "parameter-server)."),
    overrides: list[str] = typer.Option([], "--set", metavar="KEY.PATH=VALUE",
                                        help="Override a scenario field (repeatable)."),
    variant: str | None = typer.Option(None, "--variant", help="Apply one of the scenario's named variants."),
    policy: str = typer.Option("all", "--offload",
                               help="Offload policy when the scenario has none: all, conv, or layer names "
                                    "separated by commas."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """The largest per-GPU batch that fits in GPU memory without and with activation offload (vDNN), and the
    samples/s at each."""
    from rich.console import Console

    from trainsim import api
    from trainsim.provenance import provenance

    sc = api.scenario(scenario, overrides=overrides, variant=variant)
    chosen: str | list[str] = policy if policy in ("all", "conv") else comma_names(policy, "--offload")
    # the policy is --offload's where the scenario has none of its own
    given = {} if sc.optimizations.offload_activations not in ("none", []) else {
        "optimizations.offload_activations": "--offload"}
    with Console(stderr=True).status(f"searching the largest batch of {sc.name}"), options_named(given):
        doc = api.max_batch(sc, policy=chosen)
    doc["provenance"] = provenance(timestamp=False, scenario=scenario, overrides=list(overrides),
                                   variant=variant, offload=policy)
    if as_json:
        print_json(doc)
        return
    typer.echo(f"{doc['scenario']} on {doc['gpus']} GPU(s), offload {doc['offload']}")
    for label, key in (("without offload", "without_offload"), ("with offload", "with_offload")):
        row = doc[key]
        peak = "nothing fits" if row["memory_peak_gib"] is None else f"{row['memory_peak_gib']:.2f} GiB peak"
        typer.echo(f"  {label:16s} batch {row['per_gpu_batch']:6d}/GPU ({row['global_batch']} global)  "
                   f"{row['samples_per_s']:10.1f} samples/s  {peak}")
    if doc["batch_gain"] is not None:
        typer.echo(f"  offload: batch x{doc['batch_gain']:.2f}, throughput x{doc['throughput_gain']:.2f}")


app.add_typer(scenarios_app, name="scenarios")


@scenarios_app.command("list")
def scenarios_list(as_json: bool = typer.Option(False, "--json", help="Print JSON.")):
    """List the shipped scenarios (run one with `trainsim simulate NAME`)."""
    from trainsim import api

    found = api.scenarios()
    if as_json:
        print_json([{"name": k, "description": v} for k, v in found.items()])
        return
    width = max((len(k) for k in found), default=0)
    for name, description in found.items():
        typer.echo(f"{name:<{width}}  {description}")


@scenarios_app.command("show")
def scenarios_show(
    scenario: str = typer.Argument(..., metavar="SCENARIO", help="A shipped scenario or a YAML file."),
    overrides: list[str] = typer.Option([], "--set", metavar="KEY.PATH=VALUE",
                                        help="Override a scenario field (repeatable)."),
    variant: str | None = typer.Option(None, "--variant", help="Apply one of the scenario's named variants."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (every field, defaults included)."),
):
    """A scenario as the simulator reads it, with --set and --variant applied: as YAML, the fields it sets
    (the others keep their defaults), and the names of its variants."""
    import yaml

    from trainsim import api

    sc = api.scenario(scenario, overrides=overrides, variant=variant)
    if as_json:
        print_json(sc.model_dump(mode="json", by_alias=True))
        return
    fields = sc.model_dump(mode="json", by_alias=True, exclude_defaults=True, exclude={"variants"})
    typer.echo(yaml.safe_dump(fields, sort_keys=False, width=110).rstrip())
    if sc.variants:
        typer.echo(f"# variants (--variant NAME): {', '.join(sc.variants)}")
