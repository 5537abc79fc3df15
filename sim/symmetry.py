"""Symmetry: simulate one copy per class of identical parts of a run and mirror it onto the others, exactly.

Two cases, each with a condition that makes every mirrored rank run exactly the timeline of the rank it is
mirrored from. Both need analytic collectives (a time and a byte count per link from the plan, not flows
that could share links with anything else), nothing per rank that breaks the tie (no jitter, no measured
host) and no record asked for every rank (records and traces show every rank, so nothing is mirrored).

``ddp`` (`mirror_ranks` over machines): ranks meet only in collectives over all of them. When the machines
are renamed copies of one another (`Topology.representative`), every rank has the same costs and no
data-movement optimization is on, every rank of a copy runs the timeline of the same rank of its class's
first machine: same compute, same contention for that machine's PCIe links and host cores, same collective
start and end. So the first machine of each class is simulated.

``pipeline`` with data-parallel replicas (`_replica_mirror`): a replica's stages meet other replicas only in
each stage's all-reduce, which starts when the stage is done in every replica. Replica ``b`` is a copy of
an earlier replica ``a`` when

1. its ranks are ``a``'s renamed: rank i of ``b`` is on a copy of the machine of rank i of ``a``, the same
   GPU of it, with equal costs (one machine of ``b`` for each machine of ``a``);
2. its flows (stage-to-stage sends both ways, every rank's host copies: input, optimizer-state offload)
   take routes of the same shape: route k of ``b`` has route k of ``a``'s length, and its j-th link has the
   same attributes (bandwidth, latency, kind, ...) as ``a``'s j-th, with one link of ``b`` for each link of
   ``a`` across all its routes (so ``b``'s flows share links exactly as ``a``'s do); links inside a machine
   are the renamed ones of condition 1.

and for all replicas together:

3. no machine holds ranks of two replicas, and no link is on the routes of two replicas (the network's
   uplinks included): a replica's flows share links only with its own flows, whose rates max-min fairness
   sets independently of every other replica's.

Then the compute, the messages and their contention of ``b`` are those of ``a``, event for event at the same
times, and each stage's all-reduce starts when the slowest class is done, as in the full run. Only the
optimizer-state offload (the replica's own host links) of the data-movement optimizations may be on.
Replicas that copy none before them are simulated themselves (e.g. one whose sends cross a leaf boundary
that the others' do not: its route has more hops).

Mirroring the results: iteration ends, GPU utilisation and memory of a mirrored rank are its
representative's; a mirrored machine's link bytes are the representative machine's flow bytes renamed,
a mirrored replica's links between machines carry its representative's (`Mirror.links`), and collectives'
bytes are credited on every link from the plan.

`mirror_ranks` decides (None: simulate every rank); the strategy runs only ``Mirror.simulated``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Edge = tuple[str, str]


@dataclass(frozen=True)
class Mirror:
    """Which ranks run and whom each stands for."""

    stands_for: dict[str, list[str]]  # simulated rank -> the ranks it stands for, itself first
    machines: dict[int, int]  # machine of a rank -> the simulated machine it copies (itself if simulated)
    # a mirrored link between machines (or in the network) -> the simulated link whose flows it repeats
    links: dict[Edge, Edge] = field(default_factory=dict)

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
    if st.collectives != "analytic" or detail or host is not None or jitter is not None:
        return None
    if st.name == "ddp" and scenario.optimizations == Optimizations():
        return _machine_mirror(topology, ranks, costs)
    if st.name == "pipeline":
        offload = {"offload_optimizer_state", "offload_chunk_mb"}  # per rank, on the rank's own host links
        if scenario.optimizations.model_dump(exclude=offload) != Optimizations().model_dump(exclude=offload):
            return None
        from trainsim.formats.scenario_options import PipelineOptions

        return _replica_mirror(topology, ranks, costs, (st.pipeline or PipelineOptions()).stages)
    return None


def _machine_mirror(topology, ranks: list[str], costs: dict) -> Mirror | None:
    """ddp: the first machine of each class of identical machines stands for the others."""
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
            if not _same_costs(costs, g, r):
                return None
            if first == m:
                stands_for.setdefault(g, []).insert(0, g)
            else:
                stands_for.setdefault(r, []).append(g)
    order = {g: i for i, g in enumerate(ranks)}
    return Mirror({g: stands_for[g] for g in sorted(stands_for, key=order.get)}, copies)


def _same_costs(costs: dict, a: str, b: str) -> bool:
    return costs[a] is costs[b] or costs[a] == costs[b]


# ---- pipeline x data parallelism ---------------------------------------------------------------------------


def _replica_mirror(topology, ranks: list[str], costs: dict, stages: int) -> Mirror | None:
    """pipeline: the first replica of each class of copies (conditions 1-3) stands for the others."""
    dp = len(ranks) // stages
    if dp < 2 or len(ranks) % stages:
        return None
    replicas = [ranks[r * stages:(r + 1) * stages] for r in range(dp)]
    machines = [[topology.machine_of(g) for g in replica] for replica in replicas]
    owner: dict[int, int] = {}
    for r, ms in enumerate(machines):
        for m in ms:
            if owner.setdefault(m, r) != r:
                return None  # condition 3: two replicas on one machine contend for its links and cores
    routes = [_flow_routes(topology, replica) for replica in replicas]
    machine_of = dict(topology.graph.nodes(data="machine"))
    seen: set[Edge] = set()
    for r, replica_routes in enumerate(routes):
        links = {e for route in replica_routes for e in route}
        if links & seen:
            return None  # condition 3: a link (e.g. a leaf's uplink) carries two replicas' flows
        if any(machine_of[n] not in (-1, *machines[r]) for e in links for n in e):
            return None  # a route through another replica's machine: keep it simple, simulate all
        seen |= links
    firsts: list[int] = []  # the first replica of each class
    of: list[int] = []  # each replica's class's first replica
    maps: list[tuple[dict[int, int], dict[Edge, Edge]] | None] = []
    for r in range(dp):
        for a in firsts:
            found = _copy_of(topology, replicas[a], replicas[r], routes[a], routes[r], costs, machine_of)
            if found is not None:
                of.append(a)
                maps.append(found)
                break
        else:
            firsts.append(r)
            of.append(r)
            maps.append(None)
    if len(firsts) == dp:
        return None  # no replica copies another: nothing to save
    stands_for = {g: [g] for a in firsts for g in replicas[a]}
    copies: dict[int, int] = {m: m for a in firsts for m in machines[a]}
    links: dict[Edge, Edge] = {}
    for r in range(dp):
        if of[r] == r:
            continue
        for g, h in zip(replicas[r], replicas[of[r]], strict=True):
            stands_for[h].append(g)
        machine_map, link_map = maps[r]
        copies.update(machine_map)
        links.update(link_map)
    order = {g: i for i, g in enumerate(ranks)}
    return Mirror({g: stands_for[g] for g in sorted(stands_for, key=order.get)}, copies, links)


def _flow_routes(topology, replica: list[str]) -> list[list[Edge]]:
    """Every route a replica's flows take, in a fixed order: each stage's sends to the next stage and back
    (each leg of a copy staged through host memory), then each rank's copies from and to its host memory."""
    out: list[list[Edge]] = []
    for a, b in zip(replica, replica[1:], strict=False):
        out += topology.gpu_copy_legs(a, b) + topology.gpu_copy_legs(b, a)
    for g in replica:
        dram = topology.host_memory(g)
        out += [topology.route(dram, g), topology.route(g, dram)]
    return out


def _copy_of(topology, a: list[str], b: list[str], routes_a, routes_b, costs: dict,
             machine_of: dict) -> tuple[dict[int, int], dict[Edge, Edge]] | None:
    """Whether replica ``b`` is a copy of replica ``a`` (conditions 1 and 2): ``b``'s machines -> ``a``'s and
    ``b``'s links between machines -> ``a``'s, or None."""
    machines: dict[int, int] = {}
    for g, h in zip(b, a, strict=True):
        mb, ma = machine_of[g], machine_of[h]
        if machines.setdefault(mb, ma) != ma or topology.representative(mb) != topology.representative(ma):
            return None
        if topology.rename(g, ma) != h or not _same_costs(costs, g, h):
            return None
    if len(set(machines.values())) != len(machines):
        return None  # two machines of b copy one of a
    if len(routes_a) != len(routes_b):
        return None
    attrs = topology.edge_attrs
    links: dict[Edge, Edge] = {}
    for route_a, route_b in zip(routes_a, routes_b, strict=True):
        if len(route_a) != len(route_b):
            return None
        for ea, eb in zip(route_a, route_b, strict=True):
            if links.setdefault(eb, ea) != ea or _link(attrs[ea]) != _link(attrs[eb]):
                return None
            inside = machine_of[eb[0]] == machine_of[eb[1]] != -1
            if inside and tuple(topology.rename(n, machines[machine_of[n]]) for n in eb) != ea:
                return None  # inside a machine a link must be the renamed one (its bytes mirror by name)
    if len(set(links.values())) != len(links):
        return None  # two links of b stand for one of a: b's flows would share where a's do not
    between = {eb: ea for eb, ea in links.items() if not machine_of[eb[0]] == machine_of[eb[1]] != -1}
    return machines, between


def _link(attrs: dict) -> tuple:
    """What a flow on the link sees: its attributes (bandwidth, latency, kind, lanes, ...)."""
    return tuple(sorted((k, v) for k, v in attrs.items()
                        if v is None or isinstance(v, int | float | bool | str)))
