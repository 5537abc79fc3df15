"""Parallel strategies as a small protocol, and the registry that finds them by name.

A `Strategy` says what it asks of a run before it starts — whether it can model the run (``check``), the
batch each rank's per-layer costs are computed at (``rank_batch``: the global batch over the ranks by
default; a pipeline's micro-batch; a spatial split's sample group), how many samples a rank's loader
prepares at once (``loaded_batch``) and whether the training loop keeps the model's output through backward
(``loop_holds_output``), and which ranks it simulates where they are alike by construction
(``representatives``) — and then starts its SimPy processes on a `Context` (``start``), which call
``ctx.finish(iteration, gpu)`` when a rank is done with an iteration. The simulator asks only these; it
never branches on a strategy's name.

Strategies live in their own modules of this package (ddp.py, dp_gpu0.py, parameter_server.py, ...) and
register when imported; `MODULES` names the module of each shipped strategy, so a run imports only the one
it uses (the others cost start-up time).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from trainsim.errors import TrainsimError, unknown_name

if TYPE_CHECKING:
    from trainsim.formats.scenario import Scenario
    from trainsim.formats.workload import Workload
    from trainsim.sim.run import Run

    from .context import Context

__all__ = ["MODULES", "Strategy", "StrategyDef", "get_strategy", "register", "strategies"]


class Strategy(Protocol):
    """A parallel strategy (see the module)."""

    name: str
    loop_holds_output: bool

    def check(self, run: Run) -> None: ...

    def rank_batch(self, run: Run) -> int: ...

    def loaded_batch(self, run: Run, per_rank: int) -> int: ...

    def representatives(self, run: Run) -> dict[str, list[str]] | None: ...

    def start(self, ctx: Context) -> None: ...


RankBatch = Callable[["Scenario", list[str], "Workload"], int]


@dataclass(frozen=True)
class StrategyDef:
    """A `Strategy` made of functions: ``starts`` (the processes), and optional hooks that replace the
    defaults (``rank_batch_of(scenario, ranks, workload)``, which also checks the strategy's options
    against them; ``loaded_batch_of(scenario, per_rank)``; ``check_run(run)``)."""

    name: str
    starts: Callable[[Context], None]
    rank_batch_of: RankBatch | None = None
    loaded_batch_of: Callable[[Scenario, int], int] | None = None
    check_run: Callable[[Run], None] | None = None
    loop_holds_output: bool = True
    representatives_of: Callable[[Run], dict[str, list[str]]] | None = None

    def check(self, run: Run) -> None:
        if self.check_run is not None:
            self.check_run(run)

    def rank_batch(self, run: Run) -> int:
        """By default each rank takes an equal share of the global batch (strategy single: all of it)."""
        sc, n = run.scenario, len(run.ranks)
        if self.rank_batch_of is not None:
            return self.rank_batch_of(sc, list(run.ranks), run.workload)
        if sc.batch_size % n:
            raise TrainsimError(
                f"batch_size {sc.batch_size} does not divide over {n} GPUs",
                file=sc.source,
                field="batch_size",
            )
        return sc.batch_size // n

    def loaded_batch(self, run: Run, per_rank: int) -> int:
        """By default a rank's loader prepares the rank's batch."""
        return self.loaded_batch_of(run.scenario, per_rank) if self.loaded_batch_of else per_rank

    def representatives(self, run: Run) -> dict[str, list[str]] | None:
        """The ranks the strategy simulates, each with the ranks it stands for (itself first), where its
        ranks are alike by construction; None: the simulator looks for symmetry itself (sim/symmetry.py)."""
        return self.representatives_of(run) if self.representatives_of else None

    def start(self, ctx: Context) -> None:
        self.starts(ctx)


_REGISTRY: dict[str, StrategyDef] = {}

#: the module of this package that registers each shipped strategy
MODULES = {
    "single": "ddp",
    "ddp": "ddp",
    "dp-gpu0": "dp_gpu0",
    "parameter-server": "parameter_server",
    "easgd": "easgd",
    "pipeline": "pipeline",
    "spatial": "spatial",
    "hybrid": "spatial",
    "mesh": "mesh",
}


def _load(name: str) -> None:
    """Import the shipped module that registers strategy ``name`` (nothing for other names)."""
    if name in MODULES and name not in _REGISTRY:
        importlib.import_module(f"{__package__}.{MODULES[name]}")


def register(
    name: str,
    *,
    rank_batch: RankBatch | None = None,
    loaded_batch: Callable[[Scenario, int], int] | None = None,
    check: Callable[[Run], None] | None = None,
    loop_holds_output: bool = True,
    representatives: Callable[[Run], dict[str, list[str]]] | None = None,
):
    """Register the decorated ``start(ctx)`` as strategy ``name``, with its hooks (see `StrategyDef`)."""

    def wrap(start: Callable[[Context], None]) -> Callable[[Context], None]:
        _REGISTRY[name] = StrategyDef(
            name, start, rank_batch, loaded_batch, check, loop_holds_output, representatives
        )
        return start

    return wrap


def strategies() -> dict[str, Strategy]:
    """Every registered strategy by name (the shipped ones imported, and so registered, first)."""
    for name in MODULES:
        _load(name)
    return dict(_REGISTRY)


def get_strategy(name: str) -> Strategy:
    """Strategy ``name``; an error listing the valid names if there is none."""
    _load(name)
    if name not in _REGISTRY:
        raise unknown_name("strategy", name, strategies(), field="strategy.name")
    return _REGISTRY[name]
