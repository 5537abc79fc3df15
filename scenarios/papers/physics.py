"""The physical parameters a reproduction sweeps, and the machine with some of them scaled.

A `Physics` is a factor per parameter (1.0: the topology and device library as they are). `machine_for`
builds the scenario's machine with those factors applied to a copy of its topology graph and to copies of
its GPUs' device specs, so a simulation on it differs from the stated one only in that parameter:

- ``pcie_bandwidth``, ``nvlink_bandwidth``, ``socket_bandwidth`` (UPI/QPI), ``network_bandwidth`` (IB,
  Ethernet): every link of that kind, both directions (its usable and raw rate);
- ``link_latency``: every link's latency;
- ``gpu_flops``: every precision's peak of every GPU; ``gpu_memory_bandwidth``: their HBM/GDDR bandwidth;
- ``host_copy_rate``: what one CPU core copies (pageable staging, parameter-server and EASGD-centre updates)
  and each socket's DRAM link.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from trainsim.errors import unknown_name

LINK_KINDS = {
    "pcie_bandwidth": ("pcie",),
    "nvlink_bandwidth": ("nvlink",),
    "socket_bandwidth": ("upi",),
    "network_bandwidth": ("ib", "ethernet"),
}
PARAMETERS = (*LINK_KINDS, "link_latency", "gpu_flops", "gpu_memory_bandwidth", "host_copy_rate")


@dataclass(frozen=True)
class Physics:
    """Factors on the physical parameters (a parameter absent is 1.0)."""

    factors: dict[str, float] = field(default_factory=dict)

    def __post_init__(self):
        for name in self.factors:
            if name not in PARAMETERS:
                raise unknown_name("physical parameter", name, PARAMETERS, field="physics")

    def factor(self, name: str) -> float:
        return self.factors.get(name, 1.0)

    @property
    def stated(self) -> bool:
        return all(f == 1.0 for f in self.factors.values())

    def label(self) -> str:
        return ", ".join(f"{k} x{v:g}" for k, v in self.factors.items() if v != 1.0) or "stated"


STATED = Physics()


def scaled_topology(topology, physics: Physics):
    """A copy of ``topology`` whose links carry the scaled bandwidths and latencies."""
    from trainsim.topologies.topology import Topology

    graph = topology.graph.copy()  # each edge gets its own attribute dict
    by_kind = {kind: physics.factor(name) for name, kinds in LINK_KINDS.items() for kind in kinds}
    by_kind["dram"] = physics.factor("host_copy_rate")
    latency = physics.factor("link_latency")
    for _u, _v, attrs in graph.edges(data=True):
        f = by_kind.get(attrs["kind"], 1.0)
        for key in ("bandwidth", "raw_bandwidth"):
            if attrs.get(key) is not None:
                attrs[key] *= f
        if attrs.get("latency") is not None:
            attrs["latency"] *= latency
    for _n, attrs in graph.nodes(data=True):
        if attrs.get("kind") == "cpu":
            attrs["dram_bandwidth"] *= physics.factor("host_copy_rate")
    return Topology(topology.spec, graph, source=topology.source)


def scaled_device(device, physics: Physics):
    """A copy of a DeviceSpec with its peaks and memory bandwidth scaled."""
    flops = physics.factor("gpu_flops")
    return dataclasses.replace(
        device,
        peak_flops={k: v * flops for k, v in device.peak_flops.items()},
        memory_bandwidth=device.memory_bandwidth * physics.factor("gpu_memory_bandwidth"),
    )


def _run(source):
    """A resolved Run of ``source`` (a Run, or a Scenario to resolve)."""
    from trainsim.resolve import Run, resolve

    return source if isinstance(source, Run) else resolve(source)


def machine_for(run, physics: Physics = STATED):
    """The Machine a Simulation of ``run`` (a resolved Run) runs on, with ``physics`` applied (None when
    stated: the simulation builds its own)."""
    if physics.stated:
        return None
    from trainsim.sim.core.devices import get_device
    from trainsim.sim.core.machine import Machine
    from trainsim.sim.simulation import CountingEnvironment

    topology = scaled_topology(run.topology, physics)
    specs = {topology.gpu_spec(g) for g in topology.gpus}
    devices = {name: scaled_device(get_device(name), physics) for name in specs}
    machine = Machine(topology, CountingEnvironment(), devices=devices, record_link_rates=False,
                      record_flows=False, record_memory=False)
    for host in machine.hosts.values():
        host.copy_rate *= physics.factor("host_copy_rate")
        host.pageable_rate *= physics.factor("host_copy_rate")
    return machine


def simulate(source, physics: Physics = STATED):
    """The Result of ``source`` (a resolved Run, or a Scenario to resolve) under ``physics`` (nothing
    recorded)."""
    from trainsim.sim.simulation import Simulation

    run = _run(source)
    return Simulation(run, machine=machine_for(run, physics), record=False).run()


class RunCache:
    """Results by (scenario, physics), for a sweep whose settings share runs (an assumption that only
    changes how a figure is computed re-uses every simulation of the stated setting)."""

    def __init__(self):
        self._results: dict = {}

    def simulate(self, source, physics: Physics = STATED):
        """The Result of ``source`` (a resolved Run, or a Scenario to resolve) under ``physics``."""
        scenario = getattr(source, "scenario", source)
        key = (scenario.model_dump_json(), tuple(sorted(physics.factors.items())))
        if key not in self._results:
            self._results[key] = simulate(source, physics)
        return self._results[key]


def communication_share(result) -> float:
    """Everything on the critical rank that is not compute, as a fraction of the iteration."""
    return 1.0 - result.breakdown_s["compute"] / result.iteration_time_s
