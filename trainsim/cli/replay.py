"""`trainsim replay`: a run's profiler traces played back, and what-ifs on them (`trainsim.api.replay`)."""

from __future__ import annotations

import typer

from .common import TRACE_HELP, app, check_not_input, check_trace_output, distinct_outputs, print_json


@app.command("replay")
def replay_cmd(
    traces: list[str] = typer.Argument(
        ..., metavar="TRACE...", help="Kineto trace files (.json or .json.gz), one per rank of one run, or "
             "the folder that holds them; or Chakra execution traces (<prefix>.<rank>.et); or PyTorch "
             "execution traces (ExecutionTraceObserver's JSON) each with its Kineto trace."),
    topology: str | None = typer.Option(
        None, "--topology", metavar="NAME|FILE",
        help="What-if: re-time collectives and host copies by this topology's models, relative to the "
             "machine the trace ran on (ran_on)."),
    gpu: str | None = typer.Option(None, "--gpu", metavar="SPEC",
                                   help=("What-if: rescale GPU work to this device (`trainsim device list`): "
                                         "matrix kernels by the roofline of their op where the trace "
                                         "recorded shapes (record_shapes=True), else by peak FLOP/s; other "
                                         "kernels by memory bandwidth.")),
    sets: list[str] = typer.Option(
        [], "--set", metavar="KEY=VALUE",
        help="What-if switches: compression=fp16|bf16, pinned=true, collectives=flow|analytic, "
             "algo=ring|tree|nvls|nvls_tree|auto, network=isolated|shared (transfers alone or contending), "
             "ran_on=TOPOLOGY (the machine the trace ran on: the what-ifs' baseline and the checks; "
             "by default the preset its GPU implies), untraced=true (the step without the profiler: the "
             "stalls it recorded taken out of the CPU threads) with profiler_event_us=US (its cost per "
             "recorded host event, from `trainsim calibrate profiler` on such a box)."),
    trace_out: str | None = typer.Option(
        None, "--trace", metavar="DIR|OUT.json.gz",
        help=TRACE_HELP.format(what="the replay (the what-if, if any)")),
    chakra_out: str | None = typer.Option(
        None, "--chakra", metavar="DIR",
        help="Also write the replay (the what-if, if any) as Chakra execution traces, "
             "DIR/trainsim.<rank>.et, as ASTRA-sim and Chakra's tools read them."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """Import PyTorch profiler traces, replay them against the measured step times, and answer what-ifs."""
    from rich.console import Console

    from trainsim import api
    from trainsim.provenance import provenance
    from trainsim.sim.replay.chakra_graph import check_chakra_folder

    distinct_outputs(("--trace", trace_out), ("--chakra", chakra_out))
    check_trace_output(trace_out)
    if chakra_out:
        check_not_input(chakra_out, "--chakra", folder=True, whole=True)
        check_chakra_folder(chakra_out)
    prov = provenance(timestamp=False, traces=[str(t) for t in traces], topology=topology, gpu=gpu,
                      sets=list(sets))
    with Console(stderr=True).status("replaying") as status:
        report = api.replay(traces, topology=topology, gpu=gpu, sets=sets, trace=trace_out, chakra=chakra_out,
                            provenance=prov, progress=status.update)
    if as_json:
        print_json(report.to_dict(provenance=prov))
        return
    for line in report.lines():
        typer.echo(line)
    if trace_out:
        typer.echo(f"replay trace written to {trace_out}")
    if chakra_out:
        typer.echo(f"Chakra execution traces written to {chakra_out}")
