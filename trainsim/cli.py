"""The `trainsim` command line: a thin layer over the library API.

Every command has `--help`; commands that print results take `--json`. Bad input raises
`TrainsimError` somewhere below; the group class here turns it into one line on stderr and exit code 2.

It stays one module: each command is its options, one library call and its printing, and the command
table reads as the product's surface in one place.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading

import typer
from typer.core import TyperGroup

import trainsim
from trainsim.errors import TrainsimError, error_record, raised_first, unknown_name

#: click's UsageError, the base of typer.BadParameter: typer vendors click in new versions and not in old
#: ones, so it is found from the class typer does export
_USAGE_ERROR = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


class _OneLineErrors(TyperGroup):
    """Print a TrainsimError, an OSError from the file system, or a command's need of torch where it is not
    installed, as one line on stderr and exit 2, instead of a traceback; with ``--json`` also print it as a
    JSON object on stdout (`trainsim.errors.error_record`)."""

    def resolve_command(self, ctx, args):
        ctx.meta.setdefault("trainsim.args", []).extend(args)  # to see --json if a command fails
        name, command, rest = super().resolve_command(ctx, args)
        return name, command, _optional_values(rest, OPTIONAL_VALUES.get(name, {}))

    def invoke(self, ctx: typer.Context):
        from trainsim.files import watching_inputs

        try:
            with watching_inputs(), _second_interrupt_exits():  # no output overwrites an input; Ctrl-C
                return super().invoke(ctx)
        except TrainsimError as exc:
            exc = raised_first(exc)  # inside a simulation: its file and field, not SimPy's copy's
            if _wants_json(ctx):
                print_json(error_record(exc, 2))
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        except OSError as exc:  # the file system refused something no check foresaw (a full disk, a race)
            error = TrainsimError(exc.strerror or str(exc), file=exc.filename and str(exc.filename))
            if _wants_json(ctx):
                print_json(error_record(error, 2))
            typer.echo(f"error: {error}", err=True)
            raise typer.Exit(2) from None
        except _USAGE_ERROR as exc:  # typer's own checks (--iterations 0, a missing argument, no such option)
            if type(exc).__name__ == "NoArgsIsHelpError":  # a bare group: its help, as typer prints it
                raise
            param = getattr(exc, "param", None)
            field = getattr(exc, "param_hint", None) or (param.opts[0] if param and param.opts else None)
            field = field if isinstance(field, str) else None
            if _wants_json(ctx):
                print_json({"error": exc.format_message(), "file": None, "field": field,
                            "exit_code": exc.exit_code})
            command = exc.ctx.command_path if exc.ctx else ctx.command_path
            message = " ".join(exc.format_message().split())  # one line, as every other error
            typer.echo(f"error: {message} (see `{command} --help`)", err=True)
            raise typer.Exit(exc.exit_code) from None
        except ModuleNotFoundError as exc:  # a command that measures, on an install without torch
            if exc.name != "torch":
                raise
            command = " ".join(filter(None, (ctx.command_path, ctx.invoked_subcommand)))  # none: a callback
            error = TrainsimError(f"`{command}` needs torch (the calibrate extra): pip install torch, or "
                                  "pip install 'trainsim[calibrate]'")
            if _wants_json(ctx):
                print_json(error_record(error, 2))
            typer.echo(f"error: {error}", err=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:  # Ctrl-C where the command has no partial result of its own to report
            error = TrainsimError("interrupted (Ctrl-C)")
            if _wants_json(ctx):
                print_json(error_record(error, 130))
            typer.echo(f"\nerror: {error}", err=True)
            _interrupt_reported()
            raise typer.Exit(130) from None


#: whether a second Ctrl-C's handler stays in place until the process ends (the `trainsim` command itself,
#: not an app invoked inside another program, e.g. by CliRunner in tests)
_WHOLE_PROCESS = False


@contextlib.contextmanager
def _second_interrupt_exits():
    """While a command runs, a first Ctrl-C interrupts it as usual (KeyboardInterrupt: the command keeps
    what it finished, e.g. a sweep's rows, and says so in one line); a second one, while that winds down,
    ends the process at once with status 130: worker processes killed, one line if none was printed yet, no
    traceback. Without it a second Ctrl-C lands in a ``finally`` or in Python's exit handlers, which then
    print a traceback and may wait for ever on a worker pool half shut down."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    import os

    state = {"interrupted": False}

    def second(_signum, _frame):
        import multiprocessing

        for child in multiprocessing.active_children():
            child.kill()
        if not state.get("reported"):
            os.write(2, b"\nerror: interrupted twice (Ctrl-C): stopped at once; what was written is kept\n")
        os._exit(130)

    def first(_signum, _frame):
        state["interrupted"] = True
        signal.signal(signal.SIGINT, second)
        raise KeyboardInterrupt

    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.default_int_handler:  # Ctrl-C ignored (a background job), or handled already
        yield
        return
    signal.signal(signal.SIGINT, first)
    _interrupt_state.append(state)
    try:
        yield
    finally:
        _interrupt_state.remove(state)
        if not (state["interrupted"] and _WHOLE_PROCESS):  # else `second` stays until the process exits
            signal.signal(signal.SIGINT, previous)


#: the state of the interrupt handler of the running command: "reported" once its error line is printed
_interrupt_state: list[dict] = []


def _interrupt_reported() -> None:
    """The running command has printed its one line about a Ctrl-C: a second one adds none."""
    for state in _interrupt_state:
        state["reported"] = True


#: options whose value may be left out (``--ray`` alone means ``--ray local``): command -> option -> value.
#: typer has no such options, so a bare one gets its value before parsing.
OPTIONAL_VALUES = {"sweep": {"--ray": "local"}}


def _optional_values(args: list[str], options: dict[str, str]) -> list[str]:
    """``args`` with the implied value after each of ``options`` given last or before another option."""
    out = []
    for i, arg in enumerate(args):
        out.append(arg)
        if arg == "--":
            return out + args[i + 1:]
        if arg in options and (i + 1 == len(args) or args[i + 1].startswith("-")):
            out.append(options[arg])
    return out


def _wants_json(ctx: typer.Context) -> bool:
    """Whether the failing command was given ``--json`` (options end at ``--``)."""
    args = ctx.meta.get("trainsim.args", [])
    options = args[:args.index("--")] if "--" in args else args
    return bool(ctx.params.get("as_json")) or "--json" in options


def _check_png(option: str, path: str | None) -> None:
    """A drawing is written as PNG: a name that says another format (x.jpg, x.svg, or none) is refused."""
    if path and not path.lower().endswith(".png"):
        raise TrainsimError(f"{path!r}: the drawing is a PNG; give a file name ending in .png", field=option)


def _check_outputs(*options: tuple[str, str | None]) -> None:
    """Check every output file a command was asked for before it does any work (`trainsim.files`): none
    may be one of its inputs (`_inputs`)."""
    from trainsim.files import check_output

    inputs = _inputs() if any(path for _, path in options) else []
    for option, path in options:
        _not_empty(path, option)
        if path:
            check_output(path, option, inputs)


#: the parameters that name a command's outputs (every other path it is given is an input)
OUTPUT_PARAMS = ("out", "trace_out", "records_out", "chakra_out", "png", "plot", "report_dir", "profile")


def _check_not_input(path: str, option: str, **kind) -> None:
    """An output the command checks in its own way (`trainsim.files.check_not_input`'s ``folder``,
    ``whole``) must not be one of its inputs either."""
    from trainsim.files import check_not_input

    check_not_input(path, option, _inputs(), **kind)


def _inputs() -> list[tuple[str, str]]:
    """The running command's input files and folders (`trainsim.inputs`): what no output may overwrite."""
    import importlib

    from trainsim.inputs import command_inputs

    core = next(c.__module__ for c in typer.Context.__mro__ if c.__module__.endswith(".core"))  # click's
    ctx = importlib.import_module(core.removesuffix("core") + "globals").get_current_context(silent=True)
    if ctx is None:
        return []
    names = {p.name: (max(p.opts, key=len) if p.param_type_name == "option"
                      else (getattr(p, "metavar", None) or p.name.upper()).removesuffix("..."))
             for p in ctx.command.params}
    return command_inputs(ctx.params, names, OUTPUT_PARAMS)


def _distinct_outputs(*options: tuple[str, str | None]) -> None:
    """Two outputs of one command must not be one file, or one inside the other (a trace folder is replaced
    whole): else the second write would destroy the first."""
    import os

    given = [(option, os.path.realpath(path)) for option, path in options if path]
    for i, (option, path) in enumerate(given):
        for other, other_path in given[:i]:
            inside = path.startswith(other_path + os.sep) or other_path.startswith(path + os.sep)
            if path == other_path or inside:
                raise TrainsimError(f"{option} and {other} name the same place; give each its own",
                                    file=dict(options)[option], field=option)


def _not_empty(path: str | None, option: str) -> None:
    """An output option given an empty name (``--trace ""``) is an error, not the option left out."""
    if path is not None and not str(path).strip():
        raise TrainsimError("empty file name", field=option)


TRACE_HELP = ("Write {what} as a trace. A name ending in .json, .json.gz or .gz is one Chrome/Perfetto "
              "file; any other name is a folder of rank-N.json.gz files in PyTorch profiler (Kineto) shape, "
              "one per rank, that HTA (HolisticTraceAnalysis) reads.")


def _check_trace_output(path: str | None) -> None:
    """``--trace``: a file or a folder, checked before any work (`trainsim.formats.kineto_writer`)."""
    _not_empty(path, "--trace")
    if path:
        from trainsim.formats.kineto_writer import check_trace_output

        check_trace_output(path, "--trace", _inputs())


@contextlib.contextmanager
def _stop_on_interrupt(stop, what: str):
    """While inside: the first Ctrl-C calls ``stop()`` (a run that ends early and keeps what it did) and
    says so on stderr; a second one interrupts at once (KeyboardInterrupt)."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread gets signals
        yield
        return

    def first(_signum, _frame):
        signal.signal(signal.SIGINT, signal.default_int_handler)
        typer.echo(f"\nstopping {what}; Ctrl-C again to stop at once and keep nothing", err=True)
        stop()

    previous = signal.signal(signal.SIGINT, first)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _progress_bar(*columns):
    """A progress bar on stderr that leaves nothing behind: shown on a terminal only (elsewhere rich would
    leave a blank line, e.g. before an error)."""
    from rich.console import Console
    from rich.progress import Progress

    console = Console(stderr=True)
    return Progress(*columns, console=console, transient=True, disable=not console.is_terminal)


def _app(**kwargs) -> typer.Typer:
    return typer.Typer(cls=_OneLineErrors, no_args_is_help=True, pretty_exceptions_enable=False,
                       rich_markup_mode="markdown",
                       add_completion=False, **kwargs)


app = _app(help="Simulate multi-GPU training hardware, calibrate it on a real box, validate the predictions.")


@app.callback()
def _root() -> None:
    """Simulate multi-GPU training hardware, calibrate it on a real box, and validate the predictions."""


def print_json(obj) -> None:
    """Machine-readable output: one JSON document on stdout."""
    typer.echo(json.dumps(obj, indent=2, sort_keys=False, default=str))


@app.command()
def version(as_json: bool = typer.Option(False, "--json", help="Print JSON.")):
    """Print the trainsim version."""
    if as_json:
        print_json({"trainsim": trainsim.__version__})
    else:
        typer.echo(f"trainsim {trainsim.__version__}")


# ---- replay: PyTorch profiler (Kineto) traces (logic in trainsim.sim.replay.engine) ----

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

    from trainsim.provenance import provenance
    from trainsim.sim.replay.chakra_graph import check_chakra_folder, write_replay_et
    from trainsim.sim.replay.whatif import WhatIf
    from trainsim.traces import replay_traces

    _distinct_outputs(("--trace", trace_out), ("--chakra", chakra_out))
    _check_trace_output(trace_out)
    if chakra_out:
        _check_not_input(chakra_out, "--chakra", folder=True, whole=True)
        check_chakra_folder(chakra_out)
    whatif = WhatIf.from_options(topology=topology, gpu=gpu, sets=sets)
    console = Console(stderr=True)
    with console.status("replaying") as status:
        report = replay_traces(traces, whatif=whatif, progress=lambda msg: status.update(msg))
    prov = provenance(timestamp=False, traces=[str(t) for t in traces], whatif=whatif.to_dict())
    if trace_out:
        from trainsim.sim.replay.kineto_ranks import write_trace

        write_trace(report, trace_out, provenance=prov)
    if chakra_out:
        write_replay_et(report, chakra_out, provenance=prov)
    if as_json:
        print_json(report.to_dict(provenance=prov))
        return
    for line in report.lines():
        typer.echo(line)
    if trace_out:
        typer.echo(f"replay trace written to {trace_out}")
    if chakra_out:
        typer.echo(f"Chakra execution traces written to {chakra_out}")


# ---- trainsim topo: the topology library ----------------------------------------------------------------
topo_app = _app(help="Built-in and generated topologies: list them, show one, route a transfer.")
app.add_typer(topo_app, name="topo")


def _load_checked_topology(source):
    """A topology for the topo commands: loaded, and every GPU's spec known to the device library."""
    from trainsim.sim.core.devices import check_topology_devices
    from trainsim.topologies import load_topology

    topo = load_topology(source)
    check_topology_devices(topo)
    return topo


def _read_topology(source):
    """`_load_checked_topology` under a spinner on a terminal: a 100k-GPU cluster takes a minute to read."""
    from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

    with _progress_bar(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn()) as bar:
        bar.add_task(f"reading {source}", total=None)
        return _load_checked_topology(source)


@topo_app.command("list")
def topo_list(as_json: bool = typer.Option(False, "--json", help="Print JSON.")):
    """List the built-in topologies with their GPU count, GPU type and a one-line description."""
    from trainsim.topologies.analysis import preset_rows
    from trainsim.topologies.report import preset_lines

    rows = preset_rows()
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
    from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

    from trainsim.topologies.analysis import describe, draw_png
    from trainsim.topologies.report import show_lines

    _check_png("--png", png)
    _check_outputs(("--png", png))
    with _progress_bar(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn()) as bar:
        task = bar.add_task(f"reading {topology}", total=None)  # a 100k-GPU cluster takes minutes
        topo = _load_checked_topology(topology)
        desc = describe(topo, progress=lambda step: bar.update(task, description=step))
    if png:
        try:
            draw_png(topo, png)
        except OSError as exc:
            raise TrainsimError(f"cannot write the drawing: {exc.strerror or exc}", file=png) from None
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
    from trainsim.topologies.analysis import route_report
    from trainsim.topologies.report import route_lines

    report = route_report(_read_topology(topology), src, dst)
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

    with _options_named({f: f"--{f}" for f in ("collective", "algo", "proto", "sizes", "gpus", "method")}):
        _topo_bench(topology, collective, algo, proto, sizes, gpus, method, as_json)


@contextlib.contextmanager
def _options_named(options: dict[str, str]):
    """An error the library names by a parameter (``algo``) is the option's or argument's that gave it
    (``--algo``): ``options`` maps one to the other."""
    try:
        yield
    except TrainsimError as exc:
        first = raised_first(exc)
        if first.file is not None or first.field not in options:
            raise
        raise TrainsimError(first.reason, field=options[first.field]) from None


def _topo_bench(topology, collective, algo, proto, sizes, gpus, method, as_json) -> None:
    from trainsim.sim.collectives import ops as coll

    methods = coll.METHODS if method == "both" else (method,)
    if method != "both" and method not in coll.METHODS:
        raise TrainsimError(f"unknown method {method!r}; valid choices: both, flow, analytic", field="method")
    topo = _read_topology(topology)
    size_list = coll.parse_sizes(sizes)
    group = [g.strip() for g in gpus.split(",") if g.strip()] if gpus else None
    with _progress_bar() as bar:
        task = bar.add_task(f"{collective} on {topo.name}", total=len(size_list) * len(methods))
        rows = coll.bench(topo, collective, size_list, algo=algo, proto=proto, gpus=group, methods=methods,
                          progress=lambda: bar.advance(task))
    if as_json:
        print_json(rows)
        return
    n = len(coll.resolve_gpus(topo, group))
    title = (f"{collective} on {topo.name}, {n} GPUs, algo {algo}, proto {proto}; "
             f"busbw = algbw x {coll.bus_factor(collective, n):.3f}")
    typer.echo("\n".join(coll.bench_lines(rows, title=title)))


# ---------------------------------------------------------------- calibrate (calibrate/measure/runner.py)
calibrate_app = _app(help="Measure this box (topology, links, collectives, a model's layers) into a bundle: "
                          "`trainsim calibrate --model NAME [OPTIONS]`. Ctrl-C leaves a usable partial "
                          "bundle; --resume continues it.", invoke_without_command=True)
app.add_typer(calibrate_app, name="calibrate")


@calibrate_app.callback()
def calibrate_run(
    ctx: typer.Context,
    model: str = typer.Option(None, "--model", "-m", help="Model from the zoo, e.g. tiny-cnn, resnet18."),
    device: str = typer.Option("auto", "--device", help="cuda, cpu, or auto (cuda when a GPU is visible)."),
    batch_sizes: str = typer.Option("8,16,32", "--batch-sizes", help="Per-device batch sizes to profile."),
    precisions: str = typer.Option("fp32", "--precisions", help="Measure the layers in each of these too "
                                   "(fp32, bf16, fp16: autocast), e.g. fp32,bf16; a workload file each."),
    ranks: int = typer.Option(None, "--ranks", help="Ranks for collectives (default: GPUs, or CPU cores)."),
    out: str = typer.Option("calibration", "--out", "-o", help="Bundle folder to write."),
    quick: bool = typer.Option(False, "--quick", help="Short sweeps, few repeats (about a minute on CPU)."),
    resume: bool = typer.Option(False, "--resume", help="Skip the steps the bundle in --out already has."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary."),
):
    """Calibrate this machine: `trainsim calibrate --model NAME [...]` writes a calibration bundle
    (topology.yaml, links.json, collectives.json, workload-<model>.json, machine.json, meta.json).
    Ctrl-C leaves a usable partial bundle; --resume continues it."""
    if ctx.invoked_subcommand is not None:
        return
    if model is None:
        raise TrainsimError("give --model NAME (or a subcommand; see --help)", field="--model")
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from trainsim.calibrate.measure import runner

    config = runner.CalibrationConfig(model=model, out=out, device=device, ranks=ranks, quick=quick,
                                      resume=resume, batch_sizes=runner.parse_batch_sizes(batch_sizes),
                                      precisions=tuple(p.strip() for p in precisions.split(",") if p.strip()))
    runner.validate(config)  # bad input fails here, before the progress bar
    columns = (TextColumn("{task.description}"), BarColumn(),
               TextColumn("{task.completed}/{task.total} steps"), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=as_json) as bar:
        task = bar.add_task("calibrate", total=len(config.steps))

        def report(step: str, detail: str) -> None:
            bar.update(task, description=f"{step}: {detail}"[:70])
            if detail in ("done", "done earlier (resumed)"):
                bar.advance(task)

        try:
            path = runner.run_calibration(config, progress=report)
        except runner.CalibrationInterrupted as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(130) from None
    summary = runner.summarize(path)
    if as_json:
        print_json(summary)
        return
    typer.echo(f"bundle: {summary['path']} ({summary['status']})")
    for step, record in summary["steps"].items():
        typer.echo(f"  {step:<12} {record['seconds']:8.1f} s  {record['headline']}")
    for note in summary["notes"]:
        typer.echo(f"  note: {note}")


# ---- trainsim calibrate describe / layers: the model zoo, read by torch (calibrate/measure/describe.py, ...)
_MODEL_SET_HELP = "Model option KEY=VALUE (repeatable): image_size, num_classes; GPT: n_layer, n_head, ..."


def _print_workload(workload, path, as_json: bool, extra: dict | None = None) -> None:
    from trainsim.calibrate.measure.describe import layer_rows

    summary = {**workload.summary(), **(extra or {}), "file": str(path) if path else None}
    if as_json:
        print_json({**summary, "per_layer": layer_rows(workload)})
        return
    for key, value in summary.items():
        typer.echo(f"{key:<34} {value}")
    batch = max(p[0] for p in workload.layers[0].forward.points) if workload.measured else None
    timed = f" {f'fwd ms@{batch}':>11} {f'bwd ms@{batch}':>11}" if batch else ""
    typer.echo(f"{'layer':<28} {'kind':<10} {'params':>11} {'saved KiB':>10} {'out KiB':>9} "
               f"{'GFLOP fwd':>10}{timed}")
    for row in layer_rows(workload):
        times = (f" {row['forward_s'][batch] * 1e3:>11.4f} {row['backward_s'][batch] * 1e3:>11.4f}"
                 if batch else "")
        typer.echo(f"{row['name']:<28} {row['kind']:<10} {row['params']:>11} "
                   f"{row['saved_kib_per_sample']:>10.1f} {row['output_kib_per_sample']:>9.1f} "
                   f"{row['gflops_forward_per_sample']:>10.4f}{times}")


@calibrate_app.command("describe")
def calibrate_describe(
    model: str = typer.Argument(..., help="Model from the zoo: tiny-cnn, alexnet, vgg16, resnet18, resnet50, "
                                          "googlenet, gpt2-small."),
    out: str = typer.Option(None, "--out", "-o", help="Write the trainsim.workload/2 JSON here."),
    settings: list[str] = typer.Option(None, "--set", help=_MODEL_SET_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (summary and one row per layer)."),
):
    """Per-layer shapes, bytes and FLOPs of a zoo model, read off torch (no timing).

    Parameter, saved-activation and output bytes and FLOPs per layer, as a trainsim.workload/2 file; runs
    on torch's meta device, so it takes seconds even for GPT-2."""
    from trainsim.calibrate.measure.describe import describe, parse_overrides
    from trainsim.formats.workload import save_workload

    _check_outputs(("--out", out))
    workload = describe(model, **parse_overrides(settings))
    path = save_workload(workload, out) if out else None
    _print_workload(workload, path, as_json)


@calibrate_app.command("layers")
def calibrate_layers(
    model: str = typer.Argument(..., help="Model from the zoo (see `calibrate describe --help`)."),
    device: str = typer.Option("auto", "--device", help="cuda, cuda:N, cpu, or auto."),
    batch_sizes: str = typer.Option("8,16,32", "--batch-sizes", help="Per-device batch sizes, e.g. 8,16,32."),
    repeats: int = typer.Option(10, "--repeats", help="Measured iterations per batch size."),
    warmup: int = typer.Option(3, "--warmup", help="Unmeasured iterations per batch size."),
    optimizer: str = typer.Option("sgd", "--optimizer", help="sgd (momentum 0.9), adam or adamw."),
    threads: int = typer.Option(None, "--threads", help="torch.set_num_threads (default: torch's choice)."),
    precision: str = typer.Option("fp32", "--precision", help="fp32, or bf16/fp16 under autocast."),
    layer_timing: str = typer.Option(
        "clock", "--layer-timing",
        help="clock: between CUDA events (CPU: perf_counter) at each layer's hooks; kernels: the time of the "
             "kernels launched inside them (torch.profiler), so a host-bound iteration's launch gaps are not "
             "counted as layer time."),
    settings: list[str] = typer.Option(None, "--set", help=_MODEL_SET_HELP),
    out: str = typer.Option(None, "--out", "-o", help="Write the measured trainsim.workload/2 JSON here."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (summary and one row per layer)."),
):
    """Measure a zoo model's per-layer forward/backward times at several batch sizes.

    Also the optimizer step, the whole iteration (and the time no layer accounts for) and the input
    preparation: the `layers` step of `trainsim calibrate`, alone."""
    from rich.console import Console

    from trainsim.calibrate.measure.describe import parse_overrides
    from trainsim.calibrate.measure.layer_profile import AUTOCAST, TIMINGS, profile_layers
    from trainsim.calibrate.measure.runner import parse_batch_sizes
    from trainsim.formats.workload import save_workload

    _check_outputs(("--out", out))
    if precision not in AUTOCAST:
        raise unknown_name("precision", precision, AUTOCAST, field="--precision")
    if layer_timing not in TIMINGS:
        raise unknown_name("layer timing", layer_timing, TIMINGS, field="--layer-timing")
    console = Console(stderr=True)
    with console.status("profiling") as status:
        workload = profile_layers(model, device, parse_batch_sizes(batch_sizes), repeats=repeats,
                                  warmup=warmup, optimizer=optimizer, threads=threads, precision=precision,
                                  timing=layer_timing, progress=status.update, **parse_overrides(settings))
    for item in workload.provenance.skipped or []:
        console.print(f"note: batch {item.batch} not measured: {item.reason}")
    path = save_workload(workload, out) if out else None
    iteration = workload.provenance.iteration
    extra = {"iteration_s": {p.batch: round(p.s, 6) for p in iteration.plain},
             "unattributed_s": {p.batch: round(p.s, 6) for p in iteration.unattributed},
             "host_dispatch_s": {p.batch: round(p.s, 6) for p in iteration.plain_host}}
    _print_workload(workload, path, as_json, extra)


@calibrate_app.command("profiler")
def calibrate_profiler(
    model: str = typer.Argument(..., help="Model from the zoo (see `calibrate describe --help`); one whose "
                                          "step the host's dispatch bounds (small batch) measures best."),
    device: str = typer.Option("auto", "--device", help="cuda, cuda:N, cpu, or auto."),
    batch: int = typer.Option(8, "--batch-size", help="Per-device batch size."),
    repeats: int = typer.Option(20, "--repeats", help="Measured steps without and under the profiler."),
    warmup: int = typer.Option(5, "--warmup", help="Unmeasured steps first."),
    precision: str = typer.Option("fp32", "--precision", help="fp32, or bf16/fp16 under autocast."),
    optimizer: str = typer.Option("sgd", "--optimizer", help="sgd (momentum 0.9), adam or adamw."),
    settings: list[str] = typer.Option(None, "--set", help=_MODEL_SET_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """Measure what torch.profiler costs this box's host per recorded event.

    The figure `trainsim replay --set untraced=true --set profiler_event_us=X` takes out of a trace
    recorded on such a box, so that its what-ifs are for the step as it trains untraced."""
    from rich.console import Console

    from trainsim.calibrate.measure.describe import parse_overrides
    from trainsim.calibrate.measure.profiler_cost import measure_profiler_cost

    console = Console(stderr=True)
    with console.status("measuring") as status:
        cost = measure_profiler_cost(model, device, batch, repeats, warmup, optimizer=optimizer,
                                     precision=precision, progress=status.update, **parse_overrides(settings))
    if as_json:
        print_json(cost.to_dict())
        return
    typer.echo(f"torch.profiler on {cost.device}: {cost.model}, batch {cost.batch}, {cost.precision}, "
               f"median of {cost.repeats} steps each")
    typer.echo(f"  host per step without the profiler  {cost.untraced_host_s * 1e3:10.3f} ms "
               f"(IQR {cost.untraced_iqr_s * 1e3:.3f})")
    typer.echo(f"  host per step under the profiler    {cost.traced_host_s * 1e3:10.3f} ms "
               f"(IQR {cost.traced_iqr_s * 1e3:.3f})")
    typer.echo(f"  host events recorded per step       {cost.events_per_step:10.0f}")
    typer.echo(f"  cost per recorded event             {cost.per_event_s * 1e6:10.2f} us")
    typer.echo(f"replay a trace of this box as untraced: trainsim replay TRACE --set untraced=true "
               f"--set profiler_event_us={max(cost.per_event_s, 0.0) * 1e6:.2f}")


# ---- trainsim workload / device: per-layer workloads (trainsim/formats/workload.py), device specs, roofline
workload_app = _app(help="Per-layer workloads: list the built-ins, show or generate one, time one.")
app.add_typer(workload_app, name="workload")


@workload_app.command("list")
def workload_list(as_json: bool = typer.Option(False, "--json", help="Print JSON.")):
    """List the built-in workloads with their parameters and forward GFLOPs per sample."""
    from trainsim.formats.workload import list_workloads, load_workload

    rows = [load_workload(name).summary() for name in list_workloads()]
    if as_json:
        print_json([row["name"] for row in rows])
        return
    for row in rows:
        typer.echo(f"{row['name']:<12} {row['layers']:4d} layers {row['params'] / 1e6:9.2f} M params "
                   f"{row['gflops_forward_per_sample']:9.3f} GFLOP/sample fwd")


@workload_app.command("show")
def workload_show(
    workload: str = typer.Argument(..., help="A built-in name (`trainsim workload list`) or a JSON file."),
    layers: bool = typer.Option(False, "--layers", help="Also list every layer."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (the summary; with --layers the file)."),
):
    """Headline figures of a workload: parameters, FLOPs, saved activations, where its times come from."""
    from trainsim.formats.workload import load_workload

    wl = load_workload(workload)
    if as_json:
        print_json(wl.to_json_dict() if layers else wl.summary())
        return
    for key, value in wl.summary().items():
        typer.echo(f"{key:<34} {value}")
    if layers:
        for layer in wl.layers:
            typer.echo(f"  {layer.name:<36} {layer.kind:<10} params {layer.param_bytes:>11d} B  "
                       f"fwd {layer.flops_forward_per_sample / 1e6:10.2f} MFLOP  "
                       f"saved {layer.saved_activation_bytes_per_sample:>10d} B/sample")


@workload_app.command("generate")
def workload_generate(
    model: str = typer.Argument(..., help="alexnet, vgg16, resnet18, resnet50, googlenet, tiny-cnn, gpt..."),
    options: list[str] = typer.Option([], "--set", metavar="KEY=VALUE",
                                      help="Model option, e.g. image_size=64, num_classes=10, "
                                           "input_dtype=float32, n_layer=24."),
    out: str | None = typer.Option(None, "--out", "-o", help="Write the workload JSON here."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """Generate an analytic workload (shapes, bytes, FLOPs; no torch) from a model's layer arithmetic."""
    from trainsim.formats.workload import save_workload
    from trainsim.sim.compute.analytic_models import build_analytic, parse_options

    _check_outputs(("--out", out))
    wl = build_analytic(model, **parse_options(options))
    if out:
        save_workload(wl, out)
    if as_json:
        print_json(wl.summary() | ({"out": out} if out else {}))
        return
    typer.echo(f"{wl.name}: {wl.num_params:,} params, {wl.flops_forward_per_sample / 1e9:.3f} GFLOP/sample "
               f"forward, {len(wl.layers)} layers" + (f"; written to {out}" if out else ""))


@workload_app.command("times")
def workload_times(
    workload: str = typer.Argument(..., help="A built-in name or a workload JSON file."),
    device: str = typer.Option(..., "--device", "-d", help="Device spec (`trainsim device list`)."),
    batch: int = typer.Option(32, "--batch", "-b", help="Per-device batch size."),
    precision: str = typer.Option("fp32", "--precision", help="fp32, tf32, fp16 or bf16."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """Per-layer forward/backward time on a device: measured, retargeted from another device, or roofline."""
    from trainsim.formats.workload import load_workload
    from trainsim.sim.compute.roofline import times_report

    report = times_report(load_workload(workload), device, batch, precision)
    if as_json:
        print_json(report)
        return
    for layer in report["layers"]:
        typer.echo(f"  {layer['name']:<36} {layer['forward_s'] * 1e3:9.3f} ms "
                   f"{layer['backward_s'] * 1e3:9.3f} ms  {layer['source']}")
    typer.echo(f"{report['workload']} on {report['device']} ({precision}, batch {batch}): forward "
               f"{report['forward_s'] * 1e3:.2f} ms, backward {report['backward_s'] * 1e3:.2f} ms")


device_app = _app(help="GPU device specs (peak FLOP/s, memory bandwidth and size) used by the roofline.")
app.add_typer(device_app, name="device")


@device_app.command("list")
def device_list(as_json: bool = typer.Option(False, "--json", help="Print JSON.")):
    """List the built-in device specs."""
    from trainsim.sim.core.devices import DEVICES

    if as_json:
        print_json([spec.to_json_dict() for spec in DEVICES.values()])
        return
    for spec in DEVICES.values():
        peaks = ", ".join(f"{k} {v / 1e12:g}" for k, v in spec.peak_flops.items())
        typer.echo(f"{spec.name:<10} {spec.memory_bytes / 2**30:5.0f} GiB "
                   f"{spec.memory_bandwidth / 1e9:6.0f} GB/s  TFLOP/s: {peaks}")


@device_app.command("show")
def device_show(
    name: str = typer.Argument(..., metavar="DEVICE",
                               help="A device name or alias, e.g. v100, a100-80gb, h100."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """One device spec, with its source."""
    from trainsim.sim.core.devices import get_device

    with _options_named({"device": "DEVICE"}):
        record = get_device(name).to_json_dict()
    if as_json:
        print_json(record)
        return
    for key, value in record.items():
        typer.echo(f"{key:<22} {value}")


# ---- trainsim simulate / scenarios: the training-iteration simulator (sim/simulation.py, scenarios/) ----

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
    from trainsim.sim.output import report

    _distinct_outputs(("--trace", trace_out), ("--records", records_out), ("--chakra", chakra_out))
    _check_outputs(("--records", records_out))
    _check_trace_output(trace_out)
    if chakra_out:
        from trainsim.sim.replay.chakra_graph import check_chakra_folder

        _check_not_input(chakra_out, "--chakra", folder=True, whole=True)
        check_chakra_folder(chakra_out)
    err = Console(stderr=True)
    stop = api.StopFlag()
    with err.status(f"simulating {scenario}"), _stop_on_interrupt(
            stop.request, "when the current iteration has finished on every rank"):
        # every op and rate change is kept only for the files that show them
        result = api.simulate(scenario, overrides=overrides, variant=variant, calibration=calibration,
                              record=bool(trace_out or records_out or chakra_out), stop=stop)
    stopped = (f"stopped early: the result covers the first {result.iterations} measured iterations"
               if result.stopped_early else None)
    prov = None
    if trace_out or chakra_out or as_json:  # only files and JSON carry it (versions cost start-up time)
        prov = provenance(timestamp=False, scenario=scenario, overrides=list(overrides), variant=variant,
                          calibration=calibration)
    if trace_out:
        from trainsim.sim.output.kineto_ranks import write_trace

        write_trace(result, trace_out, provenance=prov)
    if records_out:
        from trainsim.sim.output.records import write_records

        write_records(result, records_out)
    if chakra_out:
        from trainsim.traces import write_simulation_et

        write_simulation_et(result, chakra_out, provenance=prov)
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

    from trainsim.provenance import provenance
    from trainsim.resolve import resolve
    from trainsim.sim.planning.max_batch import max_batch

    run = resolve(scenario, overrides=overrides, variant=variant)
    sc = run.scenario
    chosen: str | list[str] = policy if policy in ("all", "conv") else _names(policy, "--offload")
    # the policy is --offload's where the scenario has none of its own
    given = {} if sc.optimizations.offload_activations not in ("none", []) else {
        "optimizations.offload_activations": "--offload"}
    with Console(stderr=True).status(f"searching the largest batch of {sc.name}"), _options_named(given):
        doc = max_batch(run, policy=chosen)
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


# ---- trainsim sweep: many scenarios from one file (trainsim/sweeps/) ---------------------------------------

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

    from trainsim.sweeps import load_spec, run_sweep
    from trainsim.sweeps.plot import check_axis, plot_sweep
    from trainsim.sweeps.report import rich_table, summary

    sweep = load_spec(spec)
    check_axis(axis)
    out = f"{sweep.spec.name}.csv" if out is None else out
    _distinct_outputs(("--out", out), ("--plot", plot))
    _check_png("--plot", plot)
    _check_outputs(("--out", out), ("--plot", plot))
    bar = _progress_bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn())
    task = bar.add_task(sweep.spec.name, total=len(sweep.points))  # known before a point resolves
    failed = written = 0

    def progress(done: int, total: int, row: dict | None) -> None:
        nonlocal failed, written
        if row is not None:  # else a point the results file holds already
            failed += row["status"] != "ok"
            written += 1
        where = f"point {row['index']}" if row is not None else "skipping points already done"
        bar.update(task, completed=done, total=total,
                   description=f"{sweep.spec.name}: {where}" + (f", {failed} failed" if failed else ""))

    try:
        with bar:
            report = run_sweep(sweep, out, workers=workers, ray=ray, retry_failed=retry_failed,
                               progress=progress)
    except KeyboardInterrupt:
        typer.echo(f"error: interrupted; the {written} points that finished this run are in {out}; run the "
                   "same command again to resume", err=True)
        _interrupt_reported()
        raise typer.Exit(130) from None
    front = plot_sweep(report.rows, axis, plot, title=sweep.spec.name) if plot else None
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


scenarios_app = _app(help="The scenarios shipped with trainsim.")
app.add_typer(scenarios_app, name="scenarios")


@scenarios_app.command("list")
def scenarios_list(as_json: bool = typer.Option(False, "--json", help="Print JSON.")):
    """List the shipped scenarios (run one with `trainsim simulate NAME`)."""
    from trainsim.formats.scenario_loader import list_scenarios

    found = list_scenarios()
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

    from trainsim.formats.scenario_loader import load_scenario

    sc = load_scenario(scenario, overrides, variant=variant)
    if as_json:
        print_json(sc.model_dump(mode="json", by_alias=True))
        return
    fields = sc.model_dump(mode="json", by_alias=True, exclude_defaults=True, exclude={"variants"})
    typer.echo(yaml.safe_dump(fields, sort_keys=False, width=110).rstrip())
    if sc.variants:
        typer.echo(f"# variants (--variant NAME): {', '.join(sc.variants)}")


# ---- trainsim execute: the real PyTorch executor (calibrate/execute/executor.py) ---------------------------

@app.command("execute")
def execute_cmd(
    scenario: str = typer.Argument(..., metavar="SCENARIO",
                                   help="A shipped scenario (e.g. validate-cpu) or a YAML file."),
    variants: list[str] = typer.Option([], "--variant", help="Run only this variant (repeatable; "
                                       "default: every variant, or the scenario itself when it has none)."),
    iterations: int | None = typer.Option(None, "--iterations", min=1,
                                          help="Override the measured iterations."),
    warmup: int | None = typer.Option(None, "--warmup", min=0, help="Override the warm-up iterations."),
    out: str | None = typer.Option(None, "--out", metavar="FILE.json", help="Also write the measurements."),
    profile: str | None = typer.Option(None, "--profile", metavar="DIR",
                                       help="Also record a torch.profiler trace of each variant's last "
                                       "warm-up iteration: DIR/VARIANT.rankR.json."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """Run a scenario's variants for real with PyTorch on this box and print what was measured.

    Variants this box cannot run (no CUDA, too few cores or GPUs, ...) are listed as skipped, with why.
    """
    from rich.console import Console

    from trainsim.calibrate.execute.config import load_scenario_dict
    from trainsim.calibrate.execute.executor import (
        execution_report,
        outcome_lines,
        outcomes_table,
        run_scenario,
        write_measurements,
    )
    from trainsim.provenance import provenance

    _distinct_outputs(("--out", out), ("--profile", profile))
    _check_outputs(("--out", out))
    if profile:
        from trainsim.files import check_output_folder

        check_output_folder(profile, "--profile", _inputs())
    data = load_scenario_dict(scenario)
    overrides = {k: v for k, v in (("iterations", iterations), ("warmup", warmup)) if v is not None}
    err = Console(stderr=True)
    with err.status(f"executing {scenario}") as status:
        outcomes = run_scenario(data, variants or None, file=scenario, progress=status.update,
                                profile_dir=profile, **overrides)
    prov = provenance(scenario=scenario, variants=list(variants), **overrides)
    doc = execution_report(outcomes, provenance=prov)
    if out:
        write_measurements(doc, out)
    if as_json:
        print_json(doc)
        raise typer.Exit(1 if any(o.failed for o in outcomes) else 0)
    console = Console()
    console.print(outcomes_table(outcomes))
    for line in outcome_lines(outcomes):
        console.print(line, soft_wrap=True, markup=False)
    if out:
        console.print(f"measurements written to {out}")
    if any(o.failed for o in outcomes):
        raise typer.Exit(1)


# ---- trainsim validate / quickstart: predicted vs measured (calibrate/validate/run.py, report.py, quickstart

def _print_validation(result, files: dict | None, as_json: bool, extra: dict | None = None) -> None:
    from rich.console import Console

    from trainsim.calibrate.validate import report
    from trainsim.provenance import provenance

    if as_json:
        print_json({**result.to_dict(provenance=provenance()), **(extra or {}),
                    "files": {k: str(v) for k, v in (files or {}).items()}})
        return
    console = Console(width=None if sys.stdout.isatty() else 150)  # piped: keep the 11 columns readable
    console.print(report.rich_table(result))
    for line in report.headline_lines(result) + report.reason_lines(result) + result.notes:
        console.print(line, soft_wrap=True, markup=False)
    for what, path in (files or {}).items():
        console.print(f"{what} written to {path}", soft_wrap=True, markup=False)


def _run_validation(call, total: int):
    """Run ``call(progress)`` under one rich progress bar on stderr (``progress(text)`` names the variant
    before a colon; each new name advances the bar). Ctrl-C: say where the partial rows are, exit 130."""
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn

    from trainsim.calibrate.measure.runner import CalibrationInterrupted
    from trainsim.calibrate.validate.results import ValidationInterrupted

    bar = _progress_bar(TextColumn("{task.description}"), BarColumn(),
                        TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn())
    task = bar.add_task("validate", total=total)
    seen: list[str] = []

    def progress(text: str, advance: bool = True) -> None:
        name = text.split(":", 1)[0]
        if advance and name not in seen:
            if seen:
                bar.advance(task)
            seen.append(name)
        bar.update(task, description=text[:72])

    try:
        with bar:
            return call(progress)
    except (ValidationInterrupted, CalibrationInterrupted) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(130) from None


def _split_variants(text: str | None) -> list[str] | None:
    """``--variants A,B``: the names; None when not given. Given but naming none is an error."""
    return _names(text, "--variants") if text is not None else None


def _names(text: str, option: str) -> list[str]:
    """A comma-separated list of names; an empty one (``""``, ``,``) is an error, not "all"."""
    names = [v.strip() for v in text.split(",") if v.strip()]
    if not names:
        raise TrainsimError(f"no names in {text!r}", field=option)
    return names


@app.command("validate")
def validate_cmd(
    scenario: str = typer.Argument(..., metavar="SCENARIO",
                                   help="A shipped scenario (validate-cpu, validate-gpu) or a YAML file."),
    calibration: str = typer.Option(..., "--calibration", metavar="DIR",
                                    help="The calibration bundle of this box (`trainsim calibrate`)."),
    variants: str | None = typer.Option(None, "--variants", metavar="A,B,C",
                                        help="Only these variants (default: all)."),
    baseline: str | None = typer.Option(None, "--baseline", help="Speedups are over this variant "
                                        "(default: the first one run)."),
    iterations: int | None = typer.Option(None, "--iterations", min=1,
                                          help="Override the measured iterations."),
    warmup: int | None = typer.Option(None, "--warmup", min=0, help="Override the warm-up iterations."),
    report_dir: str | None = typer.Option(None, "--report", metavar="DIR",
                                          help="Write report.md, a predicted-vs-measured chart, "
                                               "validation.json and both traces of each variant here."),
    rounds: int = typer.Option(1, "--rounds", min=1,
                               help="Execute every variant this many times, round-robin, and pool the "
                                    "iterations (steadier figures on a shared box)."),
    force: bool = typer.Option(False, "--force", help="Compare even with a bundle from another machine."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """Simulate each variant from the calibration bundle and execute it for real with PyTorch: predicted vs
    measured iteration time, error %, and speedups over the baseline variant (difference in points).

    Variants this box cannot run are listed as skipped, with why; a bundle from another machine is refused
    unless --force."""
    from trainsim.calibrate.execute.config import load_scenario_dict, scenario_variants
    from trainsim.calibrate.validate import report
    from trainsim.calibrate.validate.run import validate

    if report_dir:
        from trainsim.files import check_output_folder

        check_output_folder(report_dir, "--report", _inputs())
    names = _split_variants(variants)
    overrides = {k: v for k, v in (("iterations", iterations), ("warmup", warmup)) if v is not None}
    result = _run_validation(
        lambda progress: validate(scenario, calibration, names, force=force, report_dir=report_dir,
                                  baseline=baseline, progress=progress, rounds=rounds, **overrides),
        rounds * (len(names) if names else len(scenario_variants(load_scenario_dict(scenario)))) + rounds - 1)
    files = report.write_report(result, report_dir) if report_dir else None
    _print_validation(result, files, as_json)


@app.command("quickstart")
def quickstart_cmd(
    out: str = typer.Option("trainsim-quickstart", "--out", "-o", metavar="DIR",
                            help="Folder for the calibration bundle and the report."),
    device: str = typer.Option("auto", "--device", help="cuda, cpu, or auto (cuda when a GPU is visible)."),
    variants: str | None = typer.Option(None, "--variants", metavar="A,B,C",
                                        help="Only these variants of the validation scenario "
                                             "(default: all)."),
    iterations: int | None = typer.Option(None, "--iterations", min=1,
                                          help="Override the measured iterations."),
    warmup: int | None = typer.Option(None, "--warmup", min=0, help="Override the warm-up iterations."),
    resume: bool = typer.Option(False, "--resume", help="Continue the calibration bundle already in --out."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """The main job in one command: calibrate this box quickly, simulate the validation scenario from that
    bundle, execute it for real, print predicted vs measured and write the report (OUT/report/report.md).

    Picks CUDA when present (validate-gpu), else the CPU (validate-cpu: a few minutes on 2 cores)."""
    from trainsim.calibrate.execute.config import load_scenario_dict, scenario_variants
    from trainsim.calibrate.measure.runner import resolve_device
    from trainsim.calibrate.validate import quickstart as qs

    overrides = {k: v for k, v in (("iterations", iterations), ("warmup", warmup)) if v is not None}
    names = _split_variants(variants)
    total = len(names) if names else len(scenario_variants(load_scenario_dict(
        qs.SCENARIOS[resolve_device(device)])))
    done = _run_validation(
        lambda progress: qs.quickstart(
            out, device=device, variants=names, resume=resume, progress=progress,
            calibration_progress=lambda step, detail: progress(
                f"calibrating this box (quick): {step}: {detail}", advance=False),
            **overrides),
        total)
    _print_validation(done.validation, {**done.files, "bundle": done.calibration}, as_json,
                      {"scenario_run": done.scenario})


# ---- plan: per-layer spatial/hybrid decomposition (logic in trainsim.sim.planning.spatial_plan) ------------

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

    from trainsim.provenance import provenance
    from trainsim.resolve import resolve
    from trainsim.sim.planning import spatial_plan

    _check_outputs(("--out", out))
    if precision is not None and precision not in ("fp32", "tf32", "fp16", "bf16"):
        raise TrainsimError(f"unknown precision {precision!r}; valid choices: bf16, fp16, fp32, tf32",
                            field="--precision")
    err = Console(stderr=True)
    if scenario is not None:
        if workload or topology or batch:
            raise TrainsimError("give SCENARIO or --workload/--topology/--batch, not both", field="SCENARIO")
        if gpus is not None:
            overrides = [*overrides, f"gpus={gpus}"]
        if precision is not None:
            overrides = [*overrides, f"precision={precision}"]
        with err.status(f"planning {scenario}"):
            result = spatial_plan.plan_scenario(resolve(scenario, overrides=list(overrides)),
                                                simulate=not no_simulate)
    else:
        given = (("--workload", workload), ("--topology", topology), ("--batch", batch))
        missing = [name for name, value in given if value is None]
        if missing:
            raise TrainsimError(f"without SCENARIO, give {', '.join(missing)}", field=missing[0])
        if overrides:
            raise TrainsimError("overrides a scenario's fields, and none is given: give SCENARIO, or say it "
                                "with --workload, --topology, --batch, --gpus and --precision", field="--set")
        from trainsim.formats.workload import load_workload
        from trainsim.topologies import load_topology

        wl, topo = load_workload(workload), load_topology(topology)
        with err.status(f"planning {wl.name} on {topo.name}"):
            result = spatial_plan.plan(wl, topo, batch, gpus, precision or "fp32", simulate=not no_simulate,
                                       base={"topology": topology, "workload": workload})
    doc = {**result.to_dict(), "provenance": provenance(timestamp=False, scenario=scenario, workload=workload,
                                                        topology=topology, batch=batch, gpus=gpus)}
    if out:
        spatial_plan.write_plan(doc, out)
    if as_json:
        print_json(doc)
        return
    for line in spatial_plan.plan_lines(result):
        typer.echo(line)
    if out:
        typer.echo(f"plan written to {out}")


# ---- reproduce: the seed papers' claims -------------------------------------------------------------

@app.command("reproduce")
def reproduce_cmd(
    paper: str = typer.Argument(None, help="Paper to reproduce (omit to list them)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """Run a paper's scenarios (scenarios/papers/) and print our figures next to the published ones."""
    from rich.console import Console
    from rich.table import Table

    from trainsim.scenarios.papers.reproduce import list_papers, reproduce

    if paper is None:
        papers = list_papers()
        if as_json:
            print_json(papers)
        else:
            for key, title in papers.items():
                typer.echo(f"{key:12s} {title}")
        return
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    bar = _progress_bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn())
    task = bar.add_task(paper, total=None)

    def progress(done: int, total: int, label: str) -> None:
        bar.update(task, completed=done, total=total, description=f"{paper}: {label}"[:72])

    with bar:
        result = reproduce(paper, progress=progress)
    if as_json:
        print_json(result.to_dict())
        return
    def cell(value) -> str:
        if isinstance(value, tuple | list):  # a published band
            return "-".join(cell(v) for v in value)
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    table = Table(title=result.title)
    for column in ("figure", "published", "ours", "low", "high", "in range", "unit", "why / what drives it"):
        table.add_column(column, overflow="fold")
    for fig in result.figures:
        in_range = {True: "yes", False: "no", None: "-"}[fig.in_range]
        table.add_row(fig.name, cell(fig.published), cell(fig.ours), cell(fig.low), cell(fig.high), in_range,
                      fig.unit, fig.reason or fig.note)
    console = Console()
    console.print(table)
    for name, rows in result.tables.items():  # extra detail, e.g. a strong-scaling table
        if not rows:
            continue
        detail = Table(title=name)
        for column in rows[0]:
            detail.add_column(column, overflow="fold")
        for row in rows:
            detail.add_row(*(cell(v) for v in row.values()))
        console.print(detail)
    if result.physics.get("parameters"):
        console.print(f"swept {result.physics['sweep']}: {', '.join(result.physics['parameters'])} "
                      f"x(1 +- {result.physics['spread']:g})")
    for a in result.assumptions:
        values = a.get("choices") or a.get("range")
        console.print(f"assumes ({a['scenario']}) {a['name']} = {a['value']} over {values}: {a['reason']}")
    for note in result.notes:
        console.print(f"assumes: {note}")


def main() -> None:
    from trainsim.sim.core.collector import collect_less_often

    collect_less_often()  # a command is one short process: fewer collector passes (sim/core/collector.py)
    global _WHOLE_PROCESS
    _WHOLE_PROCESS = True
    app(prog_name="trainsim")


if __name__ == "__main__":
    sys.exit(main())
