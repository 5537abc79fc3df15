"""Paper reproductions: each seed paper's claims, simulated on the closest machine it describes.

A reproduction is a function registered under the paper's short name, in a module of this package beside
the scenarios it runs (whose YAML files state every assumption the paper does not) and returns our figures
next to the published ones: per figure the published value, ours at the stated assumptions, the ``low`` and
``high`` over a sweep of the physical parameters and the free assumptions (`.ranges`), and whether the
published value is ``in_range``. A figure that lands outside is a finding to explain, not a number to tune
toward: its ``reason`` says why where that is known, and its ``note`` says what drives it.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field

from trainsim.errors import unknown_name


@dataclass
class Figure:
    """One published claim and what the simulator says: ``ours`` at the stated assumptions, ``low`` and
    ``high`` over the sweep (and the settings that gave them), ``in_range`` (None where the claim has no
    value to compare), and the ``reason`` when the published value is outside and the cause is known."""

    name: str
    published: float | str | tuple[float, float] | None  # a tuple: a band the paper reports
    ours: float | str | None
    low: float | str | None = None
    high: float | str | None = None
    in_range: bool | None = None
    unit: str = ""
    note: str = ""
    reason: str = ""
    low_at: str | None = None
    high_at: str | None = None


@dataclass
class Reproduction:
    """A paper's figures; ``assumptions``: its free assumptions (scenario, name, value, choices or range,
    reason); ``physics``: the physical parameters swept and by how much; ``notes``: the scenarios' stated
    setting in sentences."""

    paper: str
    title: str
    figures: list[Figure]
    assumptions: list[dict] = field(default_factory=list)
    physics: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    tables: dict[str, list[dict]] = field(default_factory=dict)  # extra detail, e.g. a scaling table

    def to_dict(self) -> dict:
        return asdict(self)


ReproduceFn = Callable[..., Reproduction]
#: told (settings run so far, settings in all, the label of the one starting) before each setting of a
#: ranges sweep runs (`.ranges.sweep`); set by `reproduce` for the length of one reproduction
PROGRESS: ContextVar[Callable[[int, int, str], None] | None] = ContextVar("reproduce_progress", default=None)
_PAPERS: dict[str, tuple[str, ReproduceFn]] = {}


def register_paper(key: str, title: str):
    """Decorator: ``@register_paper("scalednn", "ScaleDNN (Xu et al., ICCAD 2021)")``."""

    def wrap(fn: ReproduceFn) -> ReproduceFn:
        _PAPERS[key] = (title, fn)
        return fn

    return wrap


def _load_all() -> None:
    # Importing a paper's module registers it: every module of this package but this one.
    import importlib
    import pkgutil

    import trainsim.scenarios.papers as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name != "reproduce":
            importlib.import_module(f"{pkg.__name__}.{info.name}")


def list_papers() -> dict[str, str]:
    _load_all()
    return {key: title for key, (title, _fn) in sorted(_PAPERS.items())}


def reproduce(key: str, progress: Callable[[int, int, str], None] | None = None, **options) -> Reproduction:
    """The paper ``key``'s reproduction. ``progress(done, total, label)`` is told before each setting of its
    sweep runs (`.ranges.sweep`); a paper that sweeps in several parts tells each part from 0."""
    _load_all()
    if key not in _PAPERS:
        raise unknown_name("paper", key, _PAPERS, field="PAPER")
    token = PROGRESS.set(progress)
    try:
        return _PAPERS[key][1](**options)
    finally:
        PROGRESS.reset(token)
