"""What every `trainsim` command shares: the group class that turns bad input into one line, the checks of
output paths (none may overwrite an input), Ctrl-C handling, progress bars on a terminal, and JSON output.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading

import typer
from typer.core import TyperGroup

from trainsim.errors import TrainsimError, error_record, raised_first

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
        return name, command, optional_values(rest, OPTIONAL_VALUES.get(name, {}))

    def invoke(self, ctx: typer.Context):
        from trainsim.files import watching_inputs

        try:
            with watching_inputs(), _second_interrupt_exits():  # no output overwrites an input; Ctrl-C
                return super().invoke(ctx)
        except TrainsimError as exc:
            exc = raised_first(exc)  # inside a simulation: its file and field, not SimPy's copy's
            if wants_json(ctx):
                print_json(error_record(exc, 2))
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        except OSError as exc:  # the file system refused something no check foresaw (a full disk, a race)
            error = TrainsimError(exc.strerror or str(exc), file=exc.filename and str(exc.filename))
            if wants_json(ctx):
                print_json(error_record(error, 2))
            typer.echo(f"error: {error}", err=True)
            raise typer.Exit(2) from None
        except _USAGE_ERROR as exc:  # typer's own checks (--iterations 0, a missing argument, no such option)
            if type(exc).__name__ == "NoArgsIsHelpError":  # a bare group: its help, as typer prints it
                raise
            param = getattr(exc, "param", None)
            field = getattr(exc, "param_hint", None) or (param.opts[0] if param and param.opts else None)
            field = field if isinstance(field, str) else None
            if wants_json(ctx):
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
            if wants_json(ctx):
                print_json(error_record(error, 2))
            typer.echo(f"error: {error}", err=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:  # Ctrl-C where the command has no partial result of its own to report
            error = TrainsimError("interrupted (Ctrl-C)")
            if wants_json(ctx):
                print_json(error_record(error, 130))
            typer.echo(f"\nerror: {error}", err=True)
            interrupt_reported()
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


def interrupt_reported() -> None:
    """The running command has printed its one line about a Ctrl-C: a second one adds none."""
    for state in _interrupt_state:
        state["reported"] = True


#: options whose value may be left out (``--ray`` alone means ``--ray local``): command -> option -> value.
#: typer has no such options, so a bare one gets its value before parsing.
OPTIONAL_VALUES = {"sweep": {"--ray": "local"}}


def optional_values(args: list[str], options: dict[str, str]) -> list[str]:
    """``args`` with the implied value after each of ``options`` given last or before another option."""
    out = []
    for i, arg in enumerate(args):
        out.append(arg)
        if arg == "--":
            return out + args[i + 1:]
        if arg in options and (i + 1 == len(args) or args[i + 1].startswith("-")):
            out.append(options[arg])
    return out


def wants_json(ctx: typer.Context) -> bool:
    """Whether the failing command was given ``--json`` (options end at ``--``)."""
    args = ctx.meta.get("trainsim.args", [])
    options = args[:args.index("--")] if "--" in args else args
    return bool(ctx.params.get("as_json")) or "--json" in options


def check_png(option: str, path: str | None) -> None:
    """A drawing is written as PNG: a name that says another format (x.jpg, x.svg, or none) is refused."""
    if path and not path.lower().endswith(".png"):
        raise TrainsimError(f"{path!r}: the drawing is a PNG; give a file name ending in .png", field=option)


def check_outputs(*options: tuple[str, str | None]) -> None:
    """Check every output file a command was asked for before it does any work (`trainsim.files`): none
    may be one of its inputs (`inputs_of_command`)."""
    from trainsim.files import check_output

    inputs = inputs_of_command() if any(path for _, path in options) else []
    for option, path in options:
        not_empty(path, option)
        if path:
            check_output(path, option, inputs)


#: the parameters that name a command's outputs (every other path it is given is an input)
OUTPUT_PARAMS = ("out", "trace_out", "records_out", "chakra_out", "png", "plot", "report_dir", "profile")


def check_not_input(path: str, option: str, **kind) -> None:
    """An output the command checks in its own way (`trainsim.files.check_not_input`'s ``folder``,
    ``whole``) must not be one of its inputs either."""
    from trainsim.files import check_not_input

    check_not_input(path, option, inputs_of_command(), **kind)


def inputs_of_command() -> list[tuple[str, str]]:
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


def distinct_outputs(*options: tuple[str, str | None]) -> None:
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


def not_empty(path: str | None, option: str) -> None:
    """An output option given an empty name (``--trace ""``) is an error, not the option left out."""
    if path is not None and not str(path).strip():
        raise TrainsimError("empty file name", field=option)


TRACE_HELP = ("Write {what} as a trace. A name ending in .json, .json.gz or .gz is one Chrome/Perfetto "
              "file; any other name is a folder of rank-N.json.gz files in PyTorch profiler (Kineto) shape, "
              "one per rank, that HTA (HolisticTraceAnalysis) reads.")


def check_trace_output(path: str | None) -> None:
    """``--trace``: a file or a folder, checked before any work (`trainsim.formats.kineto_writer`)."""
    not_empty(path, "--trace")
    if path:
        from trainsim.formats.kineto_writer import check_trace_output

        check_trace_output(path, "--trace", inputs_of_command())


@contextlib.contextmanager
def stop_on_interrupt(stop, what: str):
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


def progress_bar(*columns):
    """A progress bar on stderr that leaves nothing behind: shown on a terminal only (elsewhere rich would
    leave a blank line, e.g. before an error)."""
    from rich.console import Console
    from rich.progress import Progress

    console = Console(stderr=True)
    return Progress(*columns, console=console, transient=True, disable=not console.is_terminal)


def make_app(**kwargs) -> typer.Typer:
    return typer.Typer(cls=_OneLineErrors, no_args_is_help=True, pretty_exceptions_enable=False,
                       rich_markup_mode="markdown",
                       add_completion=False, **kwargs)


app = make_app(help="Simulate multi-GPU training hardware, calibrate it on a real box, validate the "
                    "predictions.")


@app.callback()
def _root() -> None:
    """Simulate multi-GPU training hardware, calibrate it on a real box, and validate the predictions."""


def print_json(obj) -> None:
    """Machine-readable output: one JSON document on stdout."""
    typer.echo(json.dumps(obj, indent=2, sort_keys=False, default=str))


@contextlib.contextmanager
def options_named(options: dict[str, str]):
    """An error the library names by a parameter (``algo``) is the option's or argument's that gave it
    (``--algo``): ``options`` maps one to the other."""
    try:
        yield
    except TrainsimError as exc:
        first = raised_first(exc)
        if first.file is not None or first.field not in options:
            raise
        raise TrainsimError(first.reason, field=options[first.field]) from None


def split_variants(text: str | None) -> list[str] | None:
    """``--variants A,B``: the names; None when not given. Given but naming none is an error."""
    return comma_names(text, "--variants") if text is not None else None


def comma_names(text: str, option: str) -> list[str]:
    """A comma-separated list of names; an empty one (``""``, ``,``) is an error, not "all"."""
    names = [v.strip() for v in text.split(",") if v.strip()]
    if not names:
        raise TrainsimError(f"no names in {text!r}", field=option)
    return names
