"""`Run`: one simulation, fully resolved — everything the simulator needs and nothing it must look up.

A Run is made once, at the boundary, by `trainsim.resolve.resolve` (the only code that follows a scenario's
file references: topology and workload files, a calibration bundle). Everything below it — `Simulation`,
the planners, sweeps, paper reproductions, the executor's configuration — takes a Run or its scenario and
reads no file. A variant of a run on the same inputs (another batch, another optimization switch) is
``run.with_scenario(changed)``, which checks the ranks again against the same topology.

    run = trainsim.resolve.resolve("ddp-resnet50-dgx-a100", overrides=["batch_size=512"])
    result = Simulation(run).run()
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from trainsim.errors import TrainsimError

if TYPE_CHECKING:
    from trainsim.formats.bundle import RunMeasurements
    from trainsim.formats.scenario import Scenario
    from trainsim.formats.workload import Workload
    from trainsim.sim.core.devices import DeviceSpec
    from trainsim.sim.hosts.call_latency import Latency, TimerTick
    from trainsim.topologies import Topology

__all__ = ["HostMeasurements", "Run", "rank_names"]


@dataclass(frozen=True)
class HostMeasurements:
    """What a calibration measured of the host beyond the hardware graph (a CPU box's gloo ranks): the cost
    of one call of each collective before its bytes move (``calls``, by op; ``p2p``: one send/recv
    message), the timer tick stalled calls return on (``tick``), and what validation measured for this run
    (``run``: input pipeline cost, loader overlap, codec cost). Empty without a calibration bundle."""

    calls: Mapping[str, Latency] = field(default_factory=dict)
    tick: TimerTick | None = None
    run: RunMeasurements | None = None

    def __post_init__(self):
        object.__setattr__(self, "calls", MappingProxyType(dict(self.calls)))


@dataclass(frozen=True)
class Run:
    """One resolved simulation.

    ``scenario``: the validated scenario with overrides and variant applied and its batch resolved
    (``batch_size`` is always the global batch here). ``topology``, ``workload``: loaded and checked.
    ``devices``: device specs a calibration measured, by spec name (they win over the library's).
    ``ranks``: the GPU names the run uses, in rank order. ``host``: measured host figures."""

    scenario: Scenario
    topology: Topology
    workload: Workload
    ranks: tuple[str, ...]
    devices: Mapping[str, DeviceSpec] = field(default_factory=dict)
    host: HostMeasurements = field(default_factory=HostMeasurements)

    def __post_init__(self):
        object.__setattr__(self, "devices", MappingProxyType(dict(self.devices)))
        object.__setattr__(self, "ranks", tuple(self.ranks))

    @property
    def source(self) -> str | None:
        """The scenario's file (or label) for error messages."""
        return self.scenario.source

    @property
    def measured(self) -> RunMeasurements | None:
        return self.host.run

    def with_scenario(self, scenario: Scenario) -> Run:
        """The same inputs (topology, workload, devices, host) under another scenario: its ranks are
        checked against the topology again."""
        return replace(self, scenario=scenario, ranks=tuple(rank_names(scenario, self.topology)))

    def with_topology(self, topology: Topology, devices: Mapping[str, Any] | None = None) -> Run:
        """The same scenario on another (already loaded) topology, e.g. one with scaled links."""
        return replace(self, topology=topology, devices=self.devices if devices is None else devices,
                       ranks=tuple(rank_names(self.scenario, topology)))


def rank_names(scenario: Scenario, topology: Topology) -> list[str]:
    """The GPU names ``scenario`` runs on (its ``gpus``: a count, indices or all; strategy single: one),
    checked against ``topology``."""
    available = topology.gpus
    spec = scenario.gpus
    if spec is None:
        spec = 1 if scenario.strategy.name == "single" else len(available)
    if isinstance(spec, int):
        if spec > len(available):
            raise TrainsimError(
                f"the scenario asks for {spec} GPUs but topology {topology.name!r} has {len(available)}",
                file=scenario.source, field="gpus")
        return available[:spec]
    bad = [i for i in spec if i >= len(available)]
    if bad:
        raise TrainsimError(
            f"GPU index {bad[0]} is out of range: topology {topology.name!r} has "
            f"{len(available)} GPUs (0..{len(available) - 1})", file=scenario.source, field="gpus")
    return [available[i] for i in spec]
