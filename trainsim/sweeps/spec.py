"""The sweep file format `trainsim.sweep/1`: a base scenario and the points to run, each a set of field
values.

    schema: trainsim.sweep/1
    name: ddp-scaling
    scenario: ddp-resnet50-dgx-a100      # a shipped scenario, or a YAML path (relative to this file)
    variant: null                        # optional: one of the scenario's variants
    set: {iterations: 1}                 # applied to every point
    points:                              # a list of points ...
      - {gpus: 2, batch_size: 512}
      - {gpus: 8, batch_size: 2048}
    grid:                                # ... crossed with a grid (every combination of the values)
      topology: [dgx-a100, dgx1-v100]
      optimizations.preload: [0, 1]

Fields are the scenario's own, as ``--set`` names them (``strategy.name``, ``optimizations.preload``); a
value replaces the field at that path, and a point's own value replaces the one ``set`` gives. The points
are every list point (or the base alone, without a list) crossed with every grid combination, in the
file's order, made one at a time as the run takes them (`Points`). A field that names no scenario field,
an empty grid, a field given by both the grid and the list, a missing base scenario or variant, and more
than `MAX_POINTS` points are refused when the file is read; a point whose scenario is invalid is that
point's error, found when the point resolves (`Sweep.resolve`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from trainsim.errors import TrainsimError, from_validation_error, unknown_name
from trainsim.files import read_text
from trainsim.formats.scenario import Scenario
from trainsim.formats.scenario_loader import apply_variant, load_scenario, read_scenario_data, set_path
from trainsim.yamlio import parse_yaml_mapping

SCHEMA = "trainsim.sweep/1"
#: the most points one sweep may have: at a few seconds a point, more is days of work, and a grid that
#: large is a typo (a list of 1,000 values where 10 were meant) more often than a plan
MAX_POINTS = 100_000


class SweepSpec(BaseModel):
    """One sweep file; `load_spec` reads it and checks what a model alone cannot (fields, emptiness)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)

    schema_: Literal["trainsim.sweep/1"] = Field(default=SCHEMA, alias="schema")
    name: str = Field(default="sweep", min_length=1,
                      description="names the default results file NAME.csv: letters, digits, '.', '_', '-'")
    description: str = ""
    scenario: str = Field(min_length=1, description="the base scenario: a shipped name or a YAML path")
    variant: str | None = Field(default=None, description="one of the base scenario's variants")
    set: dict[str, Any] = Field(default_factory=dict, description="field values every point gets")
    grid: dict[str, list[Any]] = Field(default_factory=dict, description="field -> values, all combinations")
    points: list[dict[str, Any]] = Field(default_factory=list, description="a mapping of values per point")

    @field_validator("name")
    @classmethod
    def _a_file_name(cls, name: str) -> str:
        # the default results file is NAME.csv in the current folder: a name must not lead out of it
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            raise ValueError(f"{name!r} is not a plain name (letters, digits, '.', '_', '-', not starting "
                             "with '.', '_' or '-'); it names the results file NAME.csv")
        return name


@dataclass(frozen=True)
class Point:
    """One point of a sweep: its position and the swept field values it sets (``{"gpus": 4, ...}``)."""

    index: int
    values: dict[str, Any]


class Points(Sequence):
    """The points of a sweep, made when asked for: every list point crossed with every grid combination
    (the last grid field varying fastest), so that the size of a large grid is known at once and its points
    cost nothing until they run."""

    def __init__(self, spec: SweepSpec):
        self._listed = spec.points or [{}]
        self._keys = list(spec.grid)
        self._values = [spec.grid[key] for key in self._keys]
        self._combos = math.prod(len(v) for v in self._values)

    def __len__(self) -> int:
        return len(self._listed) * self._combos

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        listed, combo = divmod(index, self._combos)
        values = dict(self._listed[listed])
        for key, choices in zip(reversed(self._keys), reversed(self._values), strict=True):
            combo, i = divmod(combo, len(choices))
            values[key] = choices[i]
        ordered = {**self._listed[listed], **{key: values[key] for key in self._keys}}
        return Point(index=index, values=ordered)

    def __iter__(self):
        return (self[i] for i in range(len(self)))


@dataclass
class Sweep:
    """A checked sweep file: the spec, its label in messages, where its base scenario is, its points."""

    spec: SweepSpec
    label: str
    base: str  # the base scenario as load_scenario takes it
    points: Points

    @property
    def fields(self) -> list[str]:
        """The swept fields, list fields first, then grid fields, each once, in the file's order."""
        listed = dict.fromkeys(key for point in self.spec.points for key in point)
        return [*listed, *(key for key in self.spec.grid if key not in listed)]

    def resolve(self, point: Point) -> Scenario:
        """The point's full, validated scenario; a one-line TrainsimError naming the point if invalid."""
        return load_scenario(self.base, variant=self.spec.variant, values={**self.spec.set, **point.values},
                             where=f"{self.label} point {point.index}")

    def raw_key(self, point: Point) -> str:
        """The key of a point that does not resolve: a hash of what it was made from."""
        return _digest({"base": self.base, "variant": self.spec.variant, "set": self.spec.set,
                        "values": point.values})


def scenario_key(scenario: Scenario) -> str:
    """The key of a resolved point: a hash of its whole validated scenario (what a rerun recognises). Files
    it names (a topology, a workload) enter by name, not content: after editing one, use another --out."""
    return _digest(scenario.model_dump(mode="json", by_alias=True))


def _digest(data) -> str:
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _shipped_spec(name: str):
    entry = resources.files("trainsim.scenarios").joinpath("sweeps", name if name.endswith(".yaml")
                                                           else f"{name}.yaml")
    return entry if entry.is_file() else None


def list_specs() -> list[str]:
    """The names of the sweep files shipped under scenarios/sweeps/."""
    folder = resources.files("trainsim.scenarios").joinpath("sweeps")
    return sorted(e.name.removesuffix(".yaml") for e in folder.iterdir() if e.name.endswith(".yaml"))


def load_spec(source: str | os.PathLike) -> Sweep:
    """A checked `Sweep` from a YAML path or the name of a shipped sweep (``trainsim sweep ddp-scaling``)."""
    text = os.fspath(source)
    path = Path(text)
    if path.exists() or text.endswith((".yaml", ".yml")) or os.sep in text:
        raw = read_text(path, text, "sweep file")  # first: it names a missing file or a link loop
        label, folder = text, path.resolve().parent
    elif (entry := _shipped_spec(text)) is not None:
        label, folder, raw = f"sweeps/{entry.name}", None, entry.read_text()
    else:
        raise unknown_name("sweep", text, list_specs())
    data = parse_yaml_mapping(raw, label, "sweep file")
    if "schema" in data and data["schema"] != SCHEMA:
        raise TrainsimError(f"unsupported schema {data['schema']!r}; expected {SCHEMA!r}", file=label,
                            field="schema")
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc, file=label) from None
    base = _base_scenario(spec.scenario, folder)
    # a missing base scenario or variant is the sweep file's error, not every point's
    data, base_label, _ = read_scenario_data(base)
    apply_variant(data, spec.variant, label=base_label)
    _check_fields(spec, label)
    points = Points(spec)
    if len(points) > MAX_POINTS:
        sizes = [str(len(v)) for v in ([spec.points] if spec.points else []) + list(spec.grid.values())]
        raise TrainsimError(f"the sweep has {len(points):,} points ({' x '.join(sizes)}); at most "
                            f"{MAX_POINTS:,} run in one sweep: split it into several files", file=label,
                            field="grid" if spec.grid else "points")
    return Sweep(spec=spec, label=label, base=base, points=points)


def _base_scenario(name: str, folder: Path | None) -> str:
    """A relative path to an existing file is read from the sweep file's folder; else as given."""
    if folder is not None and not Path(name).is_absolute() and (folder / name).is_file():
        return str(folder / name)
    return name


def _check_fields(spec: SweepSpec, label: str) -> None:
    if not spec.grid and not spec.points:
        raise TrainsimError("the sweep has no points: give a grid (field: [values]) or a list of points",
                            file=label, field="grid")
    checked = [("set", key) for key in spec.set] + [("grid", key) for key in spec.grid]
    checked += [(f"points.{i}", key) for i, point in enumerate(spec.points) for key in point]
    for where, key in checked:
        try:
            set_path({}, key, None)  # the path against the scenario schema; the scratch mapping is dropped
        except TrainsimError as exc:
            raise TrainsimError(exc.reason, file=label, field=f"{where}.{key}") from None
    for key, values in spec.grid.items():
        if not values:
            raise TrainsimError("an empty list of values gives no points", file=label, field=f"grid.{key}")
    both = sorted({key for point in spec.points for key in point} & set(spec.grid))
    if both:
        raise TrainsimError("a field is swept by both the grid and the list of points", file=label,
                            field=f"grid.{both[0]}")

