"""The `trainsim` command line: a package of small modules, one per command group, each a thin layer over
`trainsim.api` (parse the options, make one API call, print what it returns).

Every command has `--help`; commands that print results take `--json`. Bad input raises `TrainsimError`
somewhere below; the group class in `common` turns it into one line on stderr and exit code 2. The order
the modules are imported in is the order `trainsim --help` lists the commands.
"""

from __future__ import annotations

import sys

import typer

from . import common
from .common import app, print_json


@app.command()
def version(as_json: bool = typer.Option(False, "--json", help="Print JSON.")):
    """Print the trainsim version."""
    from trainsim import api

    if as_json:
        print_json({"trainsim": api.version()})
    else:
        typer.echo(f"trainsim {api.version()}")


# the command groups register themselves on `app` when imported, in the order --help lists them
from . import replay, topo, calibrate, library, simulate, sweep, validate, plan, search  # noqa: E402, F401, I001

__all__ = ["app", "main"]


def main() -> None:
    from trainsim.sim.core.collector import collect_less_often

    collect_less_often()  # a command is one short process: fewer collector passes (sim/core/collector.py)
    common._WHOLE_PROCESS = True  # a second Ctrl-C's handler stays until the process ends
    app(prog_name="trainsim")


if __name__ == "__main__":
    sys.exit(main())
