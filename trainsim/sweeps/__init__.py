"""Sweeps: many what-if scenarios from one file, run in parallel, one row each (`trainsim sweep`).

    spec.py      the sweep file (trainsim.sweep/1): base scenario, grid and list of field values -> points
    results.py   the results CSV (and Parquet copy): columns, appending a row whole, reading what is done
    worker.py    one point: simulate, reduce the Result to its row's figures, never raise
    backends.py  where points run: local processes or a Ray cluster
    runner.py    resolve, skip what is done, run the rest, append as they finish
    plot.py      throughput against a cost or size axis, the Pareto front marked
"""

from .runner import SweepReport, run_sweep
from .spec import Sweep, SweepSpec, load_spec

__all__ = ["Sweep", "SweepReport", "SweepSpec", "load_spec", "run_sweep"]
