"""Ranges, not points: a reproduction's figures over its physical parameters and its free assumptions.

A paper module gives an ``evaluate(setting)`` that returns its figures for one `Setting` (physical factors
plus a value per free assumption), and `sweep` runs it one parameter at a time: the stated setting, then
each physical parameter at 1 - spread and 1 + spread, then each free assumption at each of its choices (or
its range's ends), everything else at its stated value. A figure's ``low`` and ``high`` are the extremes
over those runs and ``in_range`` says whether the published value lies between them (a published band, ``[low,
high]``, is in range when it overlaps ours). One at a time keeps
the sweep cheap (1 + 2 P + sum of choices runs); interactions between parameters are not explored.

The free assumptions are the structured entries of the scenarios' ``assumptions:`` blocks
(`trainsim.formats.scenario.Assumption`). Before any run each is checked against its file: the stated
``value`` must be what the scenario's ``set`` field holds, so the assumption is fixed before the run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from trainsim.errors import TrainsimError

from .physics import STATED, Physics
from .reproduce import PROGRESS, Figure

SPREAD = 0.2  # the physical parameters' +-20 %


@dataclass(frozen=True)
class Stated:
    """One free assumption of one scenario file."""

    file: str  # the scenario file, as the paper's package names it
    assumption: object  # trainsim.formats.scenario.Assumption


@dataclass(frozen=True)
class Setting:
    """One run of a sweep: physical factors and the free assumptions that differ from their stated value."""

    physics: Physics = STATED
    chosen: tuple[tuple[str, object], ...] = ()

    def value(self, stated: Stated):
        """The value of a free assumption in this setting."""
        for name, value in self.chosen:
            if name == stated.assumption.name:
                return value
        return stated.assumption.value

    @property
    def label(self) -> str:
        parts = [f"{name}={_text(value)}" for name, value in self.chosen]
        return ", ".join(parts) if parts else self.physics.label()


def _text(value) -> str:
    return "none" if value is None else str(value)


@dataclass
class FigureSpec:
    """A published claim: what the paper says and, where we know it, why we land outside."""

    name: str
    published: float | str | tuple[float, float] | None  # a tuple: a band the paper reports (low, high)
    unit: str = ""
    note: str = ""  # what drives our figure
    reason: str = ""  # why the published value is outside our range, when that is known
    qualitative: bool = False  # the published claim is words, not a value to fall in a range


def free_assumptions(files: Sequence[tuple[str, str]]) -> list[Stated]:
    """The structured assumptions of each (label, path) scenario file, each checked against its file."""
    from trainsim.formats.scenario import Assumption
    from trainsim.formats.scenario_loader import load_scenario

    out, seen = [], {}
    for label, path in files:
        scenario = load_scenario(path)
        for index, a in enumerate(scenario.assumptions):
            if not isinstance(a, Assumption):
                continue
            # one assumption may be stated in several files of a paper (it then moves in all of them)
            if a.name in seen and (seen[a.name].value, seen[a.name].sweep) != (a.value, a.sweep):
                raise TrainsimError(f"assumption {a.name!r} is stated with another value or choices in "
                                    "another file of this paper", file=label, field=f"assumptions[{index}]")
            seen[a.name] = a
            if a.set is not None:
                _check_holds(path, label, index, a)
            out.append(Stated(label, a))
    return out


def _check_holds(path: str, label: str, index: int, a) -> None:
    """The scenario (each variant the assumption names) already holds the stated value at ``a.set``."""
    from trainsim.formats.scenario_loader import load_scenario

    for variant in a.variants or [None]:
        plain = load_scenario(path, variant=variant)
        forced = load_scenario(path, [f"{a.set}={_yaml(a.value)}"], variant=variant)
        if plain.model_dump() != forced.model_dump():
            raise TrainsimError(f"the stated value {_text(a.value)} is not what {a.set} holds in the "
                                "scenario",
                                file=label, field=f"assumptions[{index}].value")


def _yaml(value) -> str:
    import yaml

    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def overrides(setting: Setting, free: Sequence[Stated], file: str, variant: str | None) -> list[str]:
    """The ``--set`` overrides a setting makes to one scenario file run as ``variant``."""
    out = []
    for stated in free:
        a = stated.assumption
        if stated.file != file or a.set is None or (a.variants and variant not in a.variants):
            continue
        value = setting.value(stated)
        if value != a.value:
            out.append(f"{a.set}={_yaml(value)}")
    return out


def settings(free: Sequence[Stated], physical: Sequence[str], spread: float = SPREAD) -> list[Setting]:
    """The stated setting first, then one parameter or assumption moved at a time."""
    out = [Setting()]
    for name in physical:
        out += [Setting(physics=Physics({name: 1 - spread})), Setting(physics=Physics({name: 1 + spread}))]
    names = {}
    for stated in free:
        names.setdefault(stated.assumption.name, stated.assumption)
    for a in names.values():
        out += [Setting(chosen=((a.name, v),)) for v in a.sweep if v != a.value]
    return out


@dataclass
class Evaluation:
    """A paper's figures (name -> value) for one setting, and detail tables (kept for the stated one)."""

    figures: dict = field(default_factory=dict)
    tables: dict[str, list[dict]] = field(default_factory=dict)


def sweep(specs: Sequence[FigureSpec], evaluate: Callable[[Setting], Evaluation], free: Sequence[Stated],
          physical: Sequence[str], spread: float = SPREAD) -> tuple[list[Figure], dict[str, list[dict]]]:
    """Every figure with its stated value and range, and the tables: the stated setting's detail tables and
    ``sweep`` (one row per setting run, with its figures)."""
    todo = settings(free, physical, spread)
    progress = PROGRESS.get()
    runs = []
    for done, setting in enumerate(todo):
        if progress:
            progress(done, len(todo), "stated setting" if done == 0 else setting.label)
        runs.append((setting, evaluate(setting)))
    figures = [_figure(spec, [(s, e.figures) for s, e in runs]) for spec in specs]
    rows = [{"setting": s.label, **e.figures} for s, e in runs]
    return figures, {**runs[0][1].tables, "sweep": rows}


def _figure(spec: FigureSpec, runs: list[tuple[Setting, dict]]) -> Figure:
    ours = runs[0][1].get(spec.name)
    seen = [(values[spec.name], s) for s, values in runs if values.get(spec.name) is not None]
    numeric = [(v, s) for v, s in seen if isinstance(v, int | float) and not isinstance(v, bool)]
    low = high = low_at = high_at = None
    if numeric and len(numeric) == len(seen):
        low, low_at = min(numeric, key=lambda p: p[0])
        high, high_at = max(numeric, key=lambda p: p[0])
        in_range = _overlaps(spec.published, low, high)
    else:  # a categorical figure: the outcomes seen
        outcomes = sorted({str(v) for v, _ in seen})
        low, high = (outcomes[0], outcomes[-1]) if outcomes else (None, None)
        in_range = (str(spec.published) in outcomes) if spec.published is not None and outcomes else None
    if spec.qualitative:
        in_range = None  # words, not a value: the note says what our figure shows
    return Figure(
        name=spec.name, published=spec.published, ours=ours, low=low, high=high, in_range=in_range,
        unit=spec.unit, note=spec.note, reason=spec.reason if in_range is False else "",
        low_at=low_at.label if low_at else None, high_at=high_at.label if high_at else None,
    )


def _overlaps(published, low: float, high: float) -> bool | None:
    """Whether a published value lies in [low, high], or a published band (low, high) overlaps it."""
    if isinstance(published, tuple):
        return published[0] <= high and low <= published[1]
    return (low <= published <= high) if isinstance(published, int | float) else None


def build(paper: str, title: str, files: Sequence[tuple[str, str]], specs: Sequence[FigureSpec],
          evaluate: Callable[[Setting, Sequence[Stated]], Evaluation], physical: Sequence[str],
          spread: float = SPREAD):
    """The `Reproduction` of a paper: its scenario files' (label, path) free assumptions checked, the sweep
    run, the figures with their ranges, the assumptions and the scenarios' notes."""
    from trainsim.formats.scenario_loader import load_scenario

    from .reproduce import Reproduction

    free = free_assumptions(files)
    figures, tables = sweep(specs, lambda s: evaluate(s, free), free, physical, spread)
    notes = [f"{label}: {a}" for label, path in files for a in load_scenario(path).assumptions
             if isinstance(a, str)]
    return Reproduction(
        paper=paper, title=title, figures=figures,
        assumptions=[{"scenario": s.file, **s.assumption.model_dump(exclude_none=True),
                      "value": s.assumption.value} for s in free],
        physics={"parameters": list(physical), "spread": spread, "sweep": "one at a time"},
        notes=notes, tables=tables,
    )
