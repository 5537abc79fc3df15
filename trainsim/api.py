"""The library's front door: load a scenario (and a calibration bundle), then simulate.

    from trainsim import api
    result = api.simulate("ddp-resnet50-dgx-a100", overrides=["batch_size=512"])
    result = api.simulate("validate-cpu", calibration="bundle-dir", variant="ddp")
    bundle = api.load_bundle("bundle-dir")          # validated; workloads as the simulator's Workload

The simulator (`trainsim.sim.simulation.Simulation`) takes only validated objects; reading files is here and
in `trainsim.formats`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from trainsim.errors import TrainsimError
from trainsim.formats.scenario import Scenario
from trainsim.formats.scenario_loader import load_scenario
from trainsim.formats.workload import parse_workload
from trainsim.sim.core.result import Result
from trainsim.sim.simulation import Simulation

if TYPE_CHECKING:
    from trainsim.formats.bundle import Bundle, RunMeasurements

__all__ = ["Bundle", "RunMeasurements", "Scenario", "load_bundle", "load_scenario", "simulation", "simulate"]


def __getattr__(name: str):
    # the bundle's file models are imported when first used: a run without a bundle does not need them
    if name in ("Bundle", "RunMeasurements"):
        from trainsim.formats import bundle

        return getattr(bundle, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_bundle(path: str | os.PathLike | Bundle) -> Bundle:
    """The calibration bundle in folder ``path``, every file validated (its workloads as `Workload`s); a
    one-line TrainsimError naming the file and field if not. A Bundle is returned as it is."""
    from trainsim.formats import bundle as bundle_format

    if isinstance(path, bundle_format.Bundle):
        return path
    return bundle_format.load_bundle(path, read_workload=parse_workload)


def simulation(
    scenario: str | os.PathLike | dict | Scenario,
    *,
    calibration: str | os.PathLike | Bundle | None = None,
    overrides: Sequence[str] = (),
    variant: str | None = None,
    measurements: RunMeasurements | None = None,
    **options,
) -> Simulation:
    """A `Simulation` of ``scenario`` (a shipped name, a YAML path, a mapping or a Scenario) with
    ``overrides`` (``key.path=value``) and ``variant`` applied, on the calibration bundle ``calibration`` (a
    folder or a loaded Bundle) if given, carrying ``measurements`` (what validation measured for this run;
    they need the bundle); ``options`` are Simulation's keyword arguments."""
    if not isinstance(scenario, Scenario) or overrides or variant is not None:
        scenario = load_scenario(scenario, list(overrides), variant=variant)
    bundle = load_bundle(calibration) if calibration is not None else None
    if measurements is not None:
        if bundle is None:
            raise TrainsimError("measurements of a run need the calibration bundle they complete",
                                field="calibration")
        bundle = bundle.with_run(measurements)
    return Simulation(scenario, bundle=bundle, **options)


def simulate(
    scenario: str | os.PathLike | dict | Scenario,
    *,
    calibration: str | os.PathLike | Bundle | None = None,
    overrides: Sequence[str] = (),
    variant: str | None = None,
    record: bool = True,
) -> Result:
    """Load ``scenario`` (and the calibration bundle), simulate it, return the Result.

    ``record``: keep every op, flow, link-rate change and memory change (what records and traces are
    written from); False keeps one record per stretch of back-to-back layers, enough for the Result, which
    is far cheaper in time and memory at scale."""
    return simulation(scenario, calibration=calibration, overrides=overrides, variant=variant,
                      record=record).run()
