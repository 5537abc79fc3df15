"""The library's front door: resolve a scenario into a `Run`, then simulate it.

    from trainsim import api
    result = api.simulate("ddp-resnet50-dgx-a100", overrides=["batch_size=512"])
    result = api.simulate("validate-cpu", calibration="bundle-dir", variant="ddp-2")
    run = api.resolve("ddp-resnet50-dgx-a100")      # the resolved Run: scenario, topology, workload, ranks
    bundle = api.load_bundle("bundle-dir")          # validated; workloads as the simulator's Workload

Reading files is `trainsim.resolve`'s (and `trainsim.formats`'); the simulator
(`trainsim.sim.simulation.Simulation`) takes a resolved `Run` only.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from trainsim.formats.scenario import Scenario
from trainsim.formats.scenario_loader import load_scenario
from trainsim.resolve import Run, load_bundle, resolve, resolve_scenario
from trainsim.sim.core.result import Result
from trainsim.sim.core.window import StopFlag
from trainsim.sim.simulation import Simulation

if TYPE_CHECKING:
    from trainsim.formats.bundle import Bundle, RunMeasurements

__all__ = ["Bundle", "Run", "RunMeasurements", "Scenario", "StopFlag", "load_bundle", "load_scenario",
           "resolve", "resolve_scenario", "simulate", "simulation"]


def __getattr__(name: str):
    # the bundle's file models are imported when first used: a run without a bundle does not need them
    if name in ("Bundle", "RunMeasurements"):
        from trainsim.formats import bundle

        return getattr(bundle, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def simulation(
    scenario: str | os.PathLike | dict | Scenario | Run,
    *,
    calibration: str | os.PathLike | Bundle | None = None,
    overrides: Sequence[str] = (),
    variant: str | None = None,
    measurements: RunMeasurements | None = None,
    **options,
) -> Simulation:
    """A `Simulation` of ``scenario`` (a resolved Run, or what `resolve` takes: a shipped name, a YAML path,
    a mapping or a Scenario, with ``overrides``, ``variant``, ``calibration`` and ``measurements``);
    ``options`` are Simulation's keyword arguments."""
    run = scenario if isinstance(scenario, Run) else resolve(
        scenario, overrides=overrides, variant=variant, calibration=calibration, measurements=measurements)
    return Simulation(run, **options)


def simulate(
    scenario: str | os.PathLike | dict | Scenario | Run,
    *,
    calibration: str | os.PathLike | Bundle | None = None,
    overrides: Sequence[str] = (),
    variant: str | None = None,
    record: bool = True,
    stop: StopFlag | None = None,
) -> Result:
    """Resolve ``scenario`` (and the calibration bundle), simulate it, return the Result.

    ``record``: keep every op, flow, link-rate change and memory change (what records and traces are
    written from); False keeps one record per stretch of back-to-back layers, enough for the Result, which
    is far cheaper in time and memory at scale. ``stop``: once requested (e.g. from a signal handler), the
    run ends when the next iteration has finished on every rank, and the Result covers the iterations done
    (``stopped_early``)."""
    return simulation(scenario, calibration=calibration, overrides=overrides, variant=variant,
                      record=record, stop=stop).run()
