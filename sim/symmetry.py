"""Symmetry: simulate one machine per class of identical machines and mirror it onto the others, exactly.

In data parallelism (``ddp``) ranks meet only in collectives over all of them. When those are analytic (a
time and a byte count per link from the plan, not flows that could share links with anything else), the
machines are renamed copies of one another (`Topology.representative`), every rank has the same costs and
nothing per rank breaks the tie (no jitter, no measured host, no data-movement optimization), then every
rank of a copy runs exactly the timeline of the same rank of its class's first machine: same compute, same
contention for that machine's PCIe links and host cores, same collective start and end. So the first
machine of each class is simulated, and each of its ranks stands for the same rank of every copy:

- iteration ends, GPU utilisation and memory of a mirrored rank are its representative's;
- a mirrored machine's link bytes are the representative's bytes that flows moved (its own transfers:
  input copies) renamed, plus the collectives' bytes credited on its own links from the plan.

`mirror_ranks` decides (None: simulate every rank); the strategy runs only ``Mirror.simulated``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mirror:
    """Which ranks run and whom each stands for."""

    stands_for: dict[str, list[str]]  # simulated rank -> the ranks it stands for, itself first
    machines: dict[int, int]  # machine of a rank -> the simulated machine it copies (itself if simulated)

    @property
    def simulated(self) -> list[str]:
        return list(self.stands_for)


def mirror_ranks(scenario, topology, ranks: list[str], costs: dict, *, detail: bool, host,
                 jitter) -> Mirror | None:
    """The mirror for a run of ``scenario`` on ``ranks`` (see the module docstring); None when a condition
    for exact mirroring fails or nothing would be saved. ``detail``: every record is asked for (records and
    traces show every rank), so nothing is mirrored."""
    from trainsim.formats.scenario import Optimizations

    st = scenario.strategy
    if (st.name != "ddp" or st.collectives != "analytic" or detail or host is not None or jitter is not None
            or scenario.optimizations != Optimizations()):
        return None
    by_machine: dict[int, list[str]] = {}
    for gpu in ranks:
        by_machine.setdefault(topology.machine_of(gpu), []).append(gpu)
    copies = {m: topology.representative(m) for m in by_machine}
    if all(first == m for m, first in copies.items()):
        return None  # no machine copies another: nothing to save
    stands_for: dict[str, list[str]] = {}
    for m, gpus in by_machine.items():
        first = copies[m]
        if first not in by_machine:
            return None  # the class's first machine takes no part: keep it simple, simulate all
        renamed = [topology.rename(g, first) for g in gpus]
        if renamed != by_machine[first]:
            return None  # the copy's ranks are not the same GPUs, in the same order
        for g, r in zip(gpus, renamed, strict=True):
            if costs[g] is not costs[r] and costs[g] != costs[r]:
                return None
            if first == m:
                stands_for.setdefault(g, []).insert(0, g)
            else:
                stands_for.setdefault(r, []).append(g)
    order = {g: i for i, g in enumerate(ranks)}
    return Mirror({g: stands_for[g] for g in sorted(stands_for, key=order.get)}, copies)
