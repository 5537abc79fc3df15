"""Run a sweep: resolve its points one by one as the backend takes them, skip those the results file
already holds, run the rest and append each row as it finishes.

    from trainsim.sweeps import load_spec, run_sweep
    report = run_sweep(load_spec("sweep.yaml"), "results.csv", workers=2)

A point whose scenario is invalid is recorded as its error without running; a point that fails while it runs
likewise. Two points that resolve to the same scenario (same key) run once. Everything that can refuse the
run (the results file of another sweep, Ray missing or unreachable) is checked before a row is written.
Nothing waits for the whole sweep to resolve: the first points run while later ones are still unresolved, so
a large sweep starts at once and its progress counts every point from the start.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trainsim.errors import TrainsimError

from . import backends
from .results import FIELD_PREFIX, ResultsFile, columns, parquet_available, write_parquet
from .spec import Point, Sweep, scenario_key

#: called as each point is settled: (points settled so far, points in the sweep, the row written now, or
#: None for a point the results file already holds or that repeats an earlier one)
Progress = Callable[[int, int, dict | None], None]


@dataclass
class SweepReport:
    """What a run did: the rows of the sweep's points (point order, previous runs' rows included), how many
    ran now, were already done, failed; where the results are."""

    name: str
    results: Path
    rows: list[dict]
    ran: int
    resumed: int
    duplicates: int
    wall_s: float
    parquet: Path | None = None
    fields: list[str] = field(default_factory=list)

    @property
    def failed(self) -> int:
        return sum(row["status"] != "ok" for row in self.rows)

    def to_dict(self) -> dict:
        return {"schema": "trainsim.sweep-result/1", "name": self.name, "results": str(self.results),
                "parquet": str(self.parquet) if self.parquet else None, "points": len(self.rows),
                "ran": self.ran, "resumed": self.resumed, "failed": self.failed,
                "duplicates": self.duplicates, "wall_s": round(self.wall_s, 3), "fields": self.fields,
                "rows": self.rows}


def parquet_path(results: str | os.PathLike) -> Path:
    """Where the Parquet copy of a results CSV goes: beside it, ``.parquet`` for ``.csv``."""
    return Path(results).with_suffix(".parquet")


def run_sweep(sweep: Sweep, results: str | os.PathLike, *, workers: int | None = None,
              ray: str | None = None, retry_failed: bool = False, progress: Progress | None = None
              ) -> SweepReport:
    """Run the points of ``sweep`` not yet in ``results`` (a CSV, created if missing) on ``workers`` local
    processes (default: this process's cores), or on Ray when ``ray`` is an address or ``local``
    (`trainsim.sweeps.backends.connect_ray`). ``retry_failed``: points recorded as errors run again."""
    start = time.perf_counter()
    if parquet_path(results) == Path(results):
        raise TrainsimError("the results file is the CSV (its Parquet copy goes beside it); give a .csv name",
                            file=str(results), field="--out")
    if ray is not None:
        backends.check_ray(ray)
    header = columns(sweep.fields)
    with ResultsFile(results, header).lock() as store:
        return _run_locked(sweep, store, ray, workers, retry_failed, progress, start)


def _run_locked(sweep: Sweep, store: ResultsFile, ray: str | None, workers: int | None, retry_failed: bool,
                progress: Progress | None, start: float) -> SweepReport:
    """`run_sweep` once the results file is held."""
    results, header = store.path, store.header
    done = store.prepare(drop_errors=retry_failed)
    previous = set(done)
    total = len(sweep.points)
    order: dict[str, None] = {}  # every point's key, in point order
    resolved: dict[str, Point] = {}
    settled = written = 0

    def settle(row: dict | None) -> None:
        nonlocal settled
        settled += 1
        if progress:
            progress(settled, total, row)

    def record(key: str, point: Point, outcome: dict) -> None:
        nonlocal written
        row = {"key": key, "index": point.index,
               **{FIELD_PREFIX + name: value for name, value in point.values.items()}, **outcome}
        store.append(row)
        done[key] = {col: row.get(col) for col in header}
        written += 1
        settle(row)

    def tasks():
        """The points to run, resolved as the backend asks for them; the others settle on the way."""
        for point in sweep.points:
            try:
                scenario = sweep.resolve(point)
            except TrainsimError as exc:
                key, scenario, message = sweep.raw_key(point), None, str(exc)
            else:
                key = scenario_key(scenario)
            if key in order or key in done:  # repeats an earlier point, or ran in an earlier run
                order.setdefault(key, None)
                settle(None)
                continue
            order[key] = None
            if scenario is None:
                record(key, point, {"status": "error", "error": message})
                continue
            resolved[key] = point
            yield key, scenario

    if ray is not None:
        todo = list(tasks())  # Ray takes its tasks at once
        outcomes = backends.run_ray(backends.connect_ray(ray, workers), todo) if todo else iter(())
    else:
        outcomes = backends.run_local(tasks(), workers or backends.default_workers())
    for key, outcome in outcomes:
        point = resolved[key]
        if outcome["status"] != "ok":  # name the point, as an invalid point's error does
            outcome = {**outcome, "error": f"{sweep.label} point {point.index}: {outcome['error']}"}
        record(key, point, outcome)
    rows = [done[key] for key in order if key in done]
    parquet = None
    if parquet_available() and done:
        parquet = parquet_path(results)
        write_parquet(list(done.values()), header, parquet)
    return SweepReport(name=sweep.spec.name, results=Path(results), rows=rows, ran=written,
                       resumed=sum(key in previous for key in order), duplicates=total - len(order),
                       wall_s=time.perf_counter() - start, parquet=parquet, fields=sweep.fields)
