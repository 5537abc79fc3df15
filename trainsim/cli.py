"""The `trainsim` command line: a thin layer over the library API.

Every command has `--help`; commands that print results take `--json`. Bad input raises
`TrainsimError` somewhere below; the group class here turns it into one line on stderr and exit code 2.
"""

from __future__ import annotations

import json
import sys

import typer
from typer.core import TyperGroup

import trainsim
from trainsim.errors import TrainsimError


class _OneLineErrors(TyperGroup):
    """Print a TrainsimError as one line and exit 2, instead of a traceback."""

    def invoke(self, ctx: typer.Context):
        try:
            return super().invoke(ctx)
        except TrainsimError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None


def _app(**kwargs) -> typer.Typer:
    return typer.Typer(cls=_OneLineErrors, no_args_is_help=True, pretty_exceptions_enable=False,
                       add_completion=False, **kwargs)


app = _app(help="Simulate multi-GPU training hardware, calibrate it on a real box, and validate the predictions.")


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


def main() -> None:
    app(prog_name="trainsim")


if __name__ == "__main__":
    sys.exit(main())
