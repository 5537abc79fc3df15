"""The results file of a sweep: one CSV row per point, appended as each point finishes.

Columns (`columns`): ``key`` (the point's hash, `trainsim.sweeps.spec`), ``index`` (its position in the
sweep), ``point.<field>`` for each swept field (JSON text for lists and mappings), ``status`` (ok | error),
``error`` (one line), then the figures of `METRICS` (empty for an error).

A row is one line written by one ``write`` on a file opened for appending, so a run that stops leaves whole
rows and at worst a torn last line, which the next run cuts off before it appends (`ResultsFile.prepare`).
A rerun skips the points whose key already has a row. One sweep at a time writes a file: `ResultsFile.lock`
holds an exclusive lock on a ``.lock`` file beside it while a run reads and appends. A Parquet copy
(``.parquet`` beside the CSV) is written whole at the end of a run when pyarrow is importable.
"""

from __future__ import annotations

import csv
import fcntl
import io
import json
import os
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from trainsim.errors import TrainsimError
from trainsim.files import write_atomic

#: figures of one simulated point, with their types (how a CSV cell reads back)
METRICS: dict[str, type] = {
    "scenario": str,
    "topology": str,
    "strategy": str,
    "workload": str,
    "precision": str,
    "num_gpus": int,
    "batch_size": int,
    "iteration_time_s": float,
    "samples_per_s": float,
    "gpu_seconds_per_sample": float,  # a cost: GPUs x seconds each sample occupies them
    "compute_s": float,
    "exposed_communication_s": float,
    "exposed_transfer_s": float,
    "data_preparation_s": float,
    "idle_s": float,
    "memory_peak_gib": float,
    "oom": bool,
    "events": int,
    "sim_wall_s": float,  # wall time the simulation of this point took (not a simulated figure)
}
FIELD_PREFIX = "point."


def columns(fields: list[str]) -> list[str]:
    """The header of a sweep over ``fields``."""
    return ["key", "index", *(FIELD_PREFIX + f for f in fields), "status", "error", *METRICS]


def cell(value: Any) -> str:
    """A value as a CSV cell: strings as they are, everything else as JSON (``true``, ``[0, 1]``)."""
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), sort_keys=True)


def typed(column: str, text: str) -> Any:
    """A CSV cell read back as the value it was (None for an empty cell)."""
    if text == "":
        return None
    kind = METRICS.get(column)
    if kind is bool:
        return text == "true"
    if kind in (int, float):
        return kind(text)
    if kind is str or column in ("key", "status", "error"):
        return text
    if column == "index":
        return int(text)
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # not JSON (or nested past the decoder): the text as it is
        return text


class ResultsFile:
    """The CSV at ``path`` with header ``header``: read what a previous run left, append rows."""

    def __init__(self, path: str | os.PathLike, header: list[str]):
        self.path = Path(path)
        self.header = header

    @contextmanager
    def lock(self):
        """Hold the results file for this run: a second run on the same file (another process, or another
        sweep in this one) is refused at once rather than interleaving its rows. The lock is the kernel's
        (flock) on a ``.lock`` file beside it, removed when the run ends; a run that dies leaves the file but
        no lock, and the next run takes it."""
        lock_path = self.path.with_name(self.path.name + ".lock")
        while True:
            try:
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise TrainsimError(f"cannot write beside the results file: {exc.strerror or exc}",
                                    file=str(self.path)) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise TrainsimError("another sweep is writing this results file; wait for it to finish or "
                                    "give another --out", file=str(self.path)) from None
            if _same_file(fd, lock_path):
                break
            os.close(fd)  # a run that just ended removed the file this one locked: lock the new one
        try:
            yield self
        finally:
            with suppress(OSError):
                os.unlink(lock_path)  # while still held, so no other run holds a lock on a removed file
            os.close(fd)  # closing releases the lock

    def prepare(self, *, drop_errors: bool = False) -> dict[str, dict]:
        """The rows already there, by key (typed). Checks the header and each row, cuts a torn last line off
        the file, writes the header into a file that has none (empty, or torn within it), and with
        ``drop_errors`` rewrites it without its error rows (so those points run again)."""
        if not self.path.exists():
            return {}
        from trainsim.files import read_text

        text = read_text(self.path, what="results file", note=False)  # this run's own output
        if text and not text.endswith("\n"):  # a run stopped in the middle of a row
            text = text[: text.rfind("\n") + 1]
            write_atomic(self.path, text.encode())
        try:
            rows = list(csv.reader(io.StringIO(text)))
        except csv.Error as exc:  # a cell over the csv module's limit (128 KiB): no row trainsim wrote
            raise TrainsimError(f"not a results file: {exc}; give another --out or remove it",
                                file=str(self.path)) from None
        if not rows:
            write_atomic(self.path, self._lines([], header=True).encode())
            return {}
        if rows[0] != self.header:
            raise TrainsimError(
                "the file holds another sweep's results (its columns differ); give another --out or "
                "remove it",
                file=str(self.path), field="columns")
        found = {}
        for line, values in enumerate(rows[1:], start=2):
            row = self._parse(values, line)
            found[row["key"]] = row
        if drop_errors and any(row["status"] != "ok" for row in found.values()):
            found = {key: row for key, row in found.items() if row["status"] == "ok"}
            write_atomic(self.path, self._lines(found.values(), header=True).encode())
        return found

    def _parse(self, values: list[str], line: int) -> dict:
        """One row read back (`typed`); a row that is not one of this sweep's is an error naming its line."""
        where = f"line {line}"
        if len(values) != len(self.header):
            raise TrainsimError(f"has {len(values)} cells, the header {len(self.header)}; fix or remove the "
                                "file", file=str(self.path), field=where)
        row = {}
        for col, text in zip(self.header, values, strict=True):
            try:
                row[col] = typed(col, text)
            except ValueError:
                kind = "whole number" if col == "index" else METRICS[col].__name__
                raise TrainsimError(f"column {col!r}: {text!r} is not a {kind}; fix or remove the file",
                                    file=str(self.path), field=where) from None
        if row["status"] not in ("ok", "error") or not row["key"]:
            raise TrainsimError(f"not a results row (status {row['status']!r}, key {row['key']!r}); fix or "
                                "remove the file", file=str(self.path), field=where)
        return row

    def append(self, row: dict) -> None:
        """Add one row (creating the file with its header first): one write, so never half a row."""
        if not self.path.exists():
            write_atomic(self.path, self._lines([], header=True).encode())
        data = self._lines([row], header=False).encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            written = os.write(fd, data)
            if written != len(data):  # a full disk: take the torn part back so the file stays whole rows
                os.ftruncate(fd, os.fstat(fd).st_size - written)
                raise TrainsimError("could not write a whole row (is the disk full?)", file=str(self.path))
            os.fsync(fd)
        finally:
            os.close(fd)

    def _lines(self, rows, *, header: bool) -> str:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        if header:
            writer.writerow(self.header)
        for row in rows:
            writer.writerow([cell(row.get(col)) for col in self.header])
        return buffer.getvalue()


def parquet_available() -> bool:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


def write_parquet(rows: list[dict], header: list[str], path: str | os.PathLike) -> None:
    """The rows as a Parquet table, written whole. A column whose values are of mixed kinds (a swept field
    that is a number in one point and a list in another) is stored as its CSV text."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = {}
    for col in header:
        values = [row.get(col) for row in rows]
        kinds = {type(v) for v in values if v is not None}
        if kinds == {int, float}:
            values = [None if v is None else float(v) for v in values]
        elif len(kinds) > 1 or kinds & {list, dict}:
            values = [None if v is None else cell(v) for v in values]
        table[col] = values
    buffer = pa.BufferOutputStream()
    pq.write_table(pa.table(table), buffer)
    write_atomic(path, buffer.getvalue().to_pybytes())


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False
