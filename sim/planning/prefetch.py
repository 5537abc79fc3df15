"""``prefetch_distance: auto``: the distance it stands for, found by simulating the run at fixed distances
(`trainsim.sim.optimizations.offload.resolve_auto_distance` says which)."""

from __future__ import annotations

from collections.abc import Callable

from trainsim.formats.scenario_options import _offload_on
from trainsim.sim.core.result import Result
from trainsim.sim.run import Run


def auto_prefetch_distance(run: Run, simulate: Callable[[Run], Result]) -> int | None:
    """The prefetch distance of ``run`` when its scenario offloads activations with ``prefetch_distance:
    auto``; None otherwise. ``simulate(run) -> Result`` runs a probe: the run at a fixed distance."""
    opts = run.scenario.optimizations
    if not _offload_on(opts.offload_activations) or opts.prefetch_distance != "auto":
        return None
    from trainsim.sim.optimizations.offload import resolve_auto_distance

    def probe(scenario):
        return simulate(run.with_scenario(scenario))

    return resolve_auto_distance(run.scenario, len(run.workload.layers), probe)
