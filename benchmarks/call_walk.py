"""How one scenario walks from the command line to its result: which trainsim modules it enters, and how many
times each is entered from another module.

    python benchmarks/call_walk.py [SCENARIO] [--set K=V ...] [--json]

Runs `trainsim simulate SCENARIO --json` in this process under a profile hook that sees every Python call.
A visit to a module is a call into one of its functions from a function of another trainsim module (calls
inside a module, and returns, are not visits). A layered run enters each module from the one above it and
returns: one visit per distinct call (``sim/simulation.py``: the Simulation made, then run), with modules
called back from below (a strategy calling into the simulation that started it) showing as repeated visits.
Imports are not visits. Printed: the visits to the command's layers (cli, api, resolve, simulation) with the
first caller of each, and the busiest modules (the machine's resources, entered per event). The default
scenario is ddp-resnet50-dgx-a100.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _module_of(filename: str) -> str | None:
    """The repository path of a trainsim source file (``sim/simulation.py``), None outside the project."""
    try:
        rel = Path(filename).resolve().relative_to(ROOT)
    except ValueError:
        return None
    return str(rel) if rel.suffix == ".py" and rel.parts[0] != "benchmarks" else None


def walk(argv: list[str]) -> tuple[Counter, dict]:
    """(visits per module, first caller per module) of ``trainsim`` run with ``argv``."""
    from trainsim.cli import app

    visits: Counter = Counter()
    callers: dict = {}
    modules: dict = {}  # code object -> module, looked up once

    def module(code):
        if code not in modules:
            modules[code] = _module_of(code.co_filename)
        return modules[code]

    def profile(frame, event, _arg):
        if event != "call" or frame.f_code.co_name == "<module>":  # an import runs module code: no visit
            return
        here = module(frame.f_code)
        if here is None:
            return
        back = frame.f_back
        while back is not None and module(back.f_code) is None:  # through library frames (simpy, typer)
            back = back.f_back
        caller = module(back.f_code) if back is not None else None
        if caller != here:
            visits[here] += 1
            callers.setdefault(here, caller)

    sys.setprofile(profile)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
            app(argv, prog_name="trainsim")
    finally:
        sys.setprofile(None)
    return visits, callers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", nargs="?", default="ddp-resnet50-dgx-a100")
    parser.add_argument("--set", action="append", default=[], dest="sets", metavar="K=V")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    argv = ["simulate", args.scenario, "--json"] + [x for s in args.sets for x in ("--set", s)]
    visits, callers = walk(argv)
    if args.json:
        doc = {"argv": argv, "visits": dict(visits.most_common()), "first_caller": callers}
        print(json.dumps(doc, indent=1))
        return 0
    print(f"trainsim {' '.join(argv)}: {len(visits)} modules entered")
    print(f"{'module':<44} {'visits':>8}  first entered from")
    for mod in ("trainsim/cli/simulate.py", "trainsim/api.py", "trainsim/resolve.py", "sim/simulation.py"):
        if mod in visits:
            print(f"{mod:<44} {visits[mod]:>8}  {callers[mod]}")
    print("busiest modules (called from below or per event, e.g. the machine's resources):")
    for mod, n in visits.most_common(8):
        print(f"{mod:<44} {n:>8}  {callers[mod]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
