"""Collectives on a topology, two ways: decomposed into flows (fidelity) and analytic alpha-beta (scale).

    from trainsim.sim.collectives.ops import run_collective, collective_time, bench
    # inside a SimPy process, on a FlowNetwork built from the same topology:
    yield env.process(run_collective(env, net, topo, "allreduce", gpus, nbytes, algo="auto"))
    seconds = collective_time(topo, "allreduce", gpus, nbytes)     # no simulation

Both paths run from the same `Plan` (plans.py: which transfers, on which routes, in which order), so
their difference is only what fair sharing does beyond the per-edge load count; NCCL's latencies,
protocol bandwidths and choices come from nccl_tuning.py. Sizes follow nccl-tests: ``nbytes`` is S, the
whole array; algbw = S / t and busbw = algbw x `bus_factor`.

It stays one module: the collectives' entry points, the choice of algorithm and protocol and both timing
paths share the plan and its efficiency, and change together.
"""

from __future__ import annotations

import dataclasses
import math
import re
import weakref
from collections.abc import Callable, Generator, Iterable, Sequence

import numpy as np
import simpy

from trainsim.errors import TrainsimError, unknown_name
from trainsim.sim.core.devices import compute_capability as device_compute_capability
from trainsim.sim.core.devices import get_device
from trainsim.sim.core.flows import FlowNetwork
from trainsim.topologies import Topology

from . import measured
from . import nccl_tuning as tune
from .plans import (
    Plan,
    alpha_beta,
    bandwidth_term,
    by_machine,
    hop_class,
    nvls_plan,
    nvls_switch,
    nvls_tree_plan,
    p2p_plan,
    ring_plan,
    tree_plan,
)

COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "alltoall", "sendrecv")
ALGORITHMS = ("auto", "ring", "tree", "nvls", "nvls_tree", "p2p")
# What each collective can run as (NCCL: tree, NVLS and NVLSTree are all-reduce algorithms, NVLS also does
# reduce-scatter / all-gather; all-to-all and send/recv are point-to-point).
SUPPORTED = {"allreduce": ("ring", "tree", "nvls", "nvls_tree"), "reduce_scatter": ("ring", "nvls"),
             "allgather": ("ring", "nvls"), "broadcast": ("ring",), "reduce": ("ring",),
             "alltoall": ("p2p",), "sendrecv": ("p2p",)}
PROTOCOLS = ("auto", *tune.PROTOCOLS)
METHODS = ("flow", "analytic")
MAX_FLOWS = 8192  # per collective on the flow path, before repeated steps are grouped (run_collective)

GB = 1e9
Edge = tuple[str, str]

# Plans and their alpha-beta per topology, so repeated collectives (DDP buckets, sweeps) cost a lookup.
_plans: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw / algbw: 2(n-1)/n all-reduce; (n-1)/n reduce-scatter, all-gather, all-to-all;
    1 broadcast, reduce, send/recv."""
    _check_op(op)
    if op == "allreduce":
        return 2 * (n - 1) / n
    if op in ("reduce_scatter", "allgather", "alltoall"):
        return (n - 1) / n
    return 1.0


def _check_op(op: str) -> None:
    if op not in COLLECTIVES:
        raise unknown_name("collective", op, COLLECTIVES, field="collective")


def _check_algo(op: str, algo: str) -> None:
    if algo not in ALGORITHMS:
        raise unknown_name("algorithm", algo, ALGORITHMS, field="algo")
    if algo != "auto" and algo not in SUPPORTED[op]:
        raise TrainsimError(f"{op} cannot run as {algo!r}; valid choices: auto, {', '.join(SUPPORTED[op])}",
                            field="algo")


def _check_proto(proto: str) -> None:
    if proto not in PROTOCOLS:
        raise unknown_name("protocol", proto, PROTOCOLS, field="proto")


def compute_capability(topo: Topology, gpus: Sequence[str]) -> int | None:
    """The smallest SM version in the group, as NCCL tunes for (None: a CPU rank or an unknown device, where
    NCCL's model does not apply and the LEGACY Simple figures stay)."""
    names = _names(topo, gpus)
    cache = _plans.setdefault(topo, {})
    key = ("cc", names)
    if key not in cache:  # kept: asked about per plan, per protocol and per call
        nodes = topo.graph.nodes
        ccs = [device_compute_capability(spec) for spec in {nodes[g].get("spec") for g in names}]
        cache[key] = None if not ccs or None in ccs else min(ccs)
    return cache[key]


def feasible_protocols(topo: Topology, op: str, gpus: list[str], algo: str) -> list[str]:
    """What "auto" chooses among for ``algo``: Simple only off NCCL or for NVLS / NVLSTree; LL128 where NCCL
    enables it by default (NVLink in one node on SM70/80/90). Cached with the plans."""
    names = _names(topo, gpus)
    key = ("protocols", op, algo, names)
    cache = _plans.setdefault(topo, {})
    if key not in cache:
        cc = compute_capability(topo, names)
        if cc is None or algo in tune.IN_SWITCH:
            cache[key] = ["simple"]
        else:
            plan = plan_collective(topo, op, names, algo, "simple")
            # the distinct hops: transfers over one hop share its route object (the plans' hop cache), so
            # telling them apart by identity spares hashing every route (half a million at 16k GPUs)
            routes = {id(t.route): t.route for lane in plan.lanes for p in lane for t in p.transfers}
            classes = {hop_class(topo, route) for route in routes.values()}
            cache[key] = ["ll", "ll128", "simple"] if tune.ll128_default(cc, classes) else ["ll", "simple"]
    return list(cache[key])


def _check_proto_for(topo: Topology, gpus: list[str], algo: str, proto: str) -> None:
    if proto == "simple":
        return
    if compute_capability(topo, gpus) is None:
        raise TrainsimError(f"protocol {proto!r} is NCCL's, for NVIDIA GPUs; this group of {topo.name} has "
                            "none; "
                            "valid choices: auto, simple", field="proto")
    if algo in tune.IN_SWITCH:
        raise TrainsimError(f"{algo} runs only the simple protocol, not {proto!r}; valid choices: auto, "
                            "simple", field="proto")


def resolve_gpus(topo: Topology, gpus: Sequence[str | int] | None) -> list[str]:
    """GPU names (or global indices) -> names, checked; None -> every GPU of the topology."""
    if gpus is None:
        return list(topo.gpus)
    names = []
    for g in gpus:
        if isinstance(g, int) or (isinstance(g, str) and g.isdigit()):
            i = int(g)
            if not 0 <= i < len(topo.gpus):
                raise TrainsimError(f"GPU index {i} out of range: {topo.name} has {len(topo.gpus)} GPUs",
                                    field="gpus")
            names.append(topo.gpus[i])
        elif g in topo.gpu_index:
            names.append(g)
        else:
            raise unknown_name("GPU", str(g), topo.gpus, field="gpus")
    if len(set(names)) != len(names):
        raise TrainsimError(f"a GPU appears twice in {names}", field="gpus")
    return names


class _Resolved(tuple):
    """GPU names already checked by `resolve_gpus` (internal calls pass them on without checking again: a
    group of thousands of ranks is asked about many times per collective)."""


def _names(topo: Topology, gpus) -> _Resolved:
    return gpus if isinstance(gpus, _Resolved) else _Resolved(resolve_gpus(topo, gpus))


def feasible_algorithms(topo: Topology, op: str, gpus: list[str]) -> list[str]:
    """The algorithms ``op`` can run as on this group (NVLS only where one switch reduces for all; NVLSTree
    only across machines that each have one, with as many GPUs in every machine, on NVIDIA GPUs)."""
    algos = list(SUPPORTED[op])
    if "nvls" in algos:
        names = _names(topo, gpus)
        cache = _plans.setdefault(topo, {})
        key = ("nvls switch", names)
        if key not in cache:  # kept: every call of a collective asks
            cache[key] = nvls_switch(topo, list(names))
        if cache[key] is None:
            algos.remove("nvls")
    if "nvls_tree" in algos and _machine_switches(topo, gpus) is None:
        algos.remove("nvls_tree")
    return algos


def _machine_switches(topo: Topology, gpus) -> dict[int, str] | None:
    """The reducing NVSwitch of each machine of the group, where NVLSTree can run (several machines, as many
    GPUs, at least 2, in each, every one an NVIDIA GPU, each machine's GPUs on one reducing switch); else
    None. Cached with the plans."""
    names = _names(topo, gpus)
    cache = _plans.setdefault(topo, {})
    key = ("nvls tree switches", names)
    if key not in cache:
        groups = by_machine(topo, list(names))
        switches = None
        if len(groups) > 1 and len({len(g) for g in groups.values()}) == 1 and len(names) > len(groups) \
                and compute_capability(topo, names) is not None:
            switches = {m: nvls_switch(topo, g) for m, g in groups.items()}
            if None in switches.values():
                switches = None
        cache[key] = switches
    return cache[key]


def plan_collective(topo: Topology, op: str, gpus: Sequence[str | int] | None, algo: str,
                    proto: str = "simple") -> Plan:
    """The plan of one collective with a concrete algorithm and protocol (not "auto"); cached per topology."""
    return _cached(topo, op, gpus, algo, proto)[0]


def _cached(topo: Topology, op: str, gpus, algo: str, proto: str) -> tuple[Plan, tuple[float, float]]:
    _check_op(op)
    _check_algo(op, algo)
    _check_proto(proto)
    if algo == "auto" or proto == "auto":
        raise ValueError("plan_collective needs a concrete algorithm and protocol; use choose first")
    names = _names(topo, gpus)
    cache = _plans.setdefault(topo, {})
    key = (op, algo, proto, names)
    if key not in cache:
        _check_proto_for(topo, list(names), algo, proto)
        cache[key] = _build(topo, op, list(names), algo, proto)
    return cache[key]


def _build(topo: Topology, op: str, gpus: list[str], algo: str,
           proto: str) -> tuple[Plan, tuple[float, float]]:
    """The plan with NCCL's latencies of ``algo`` / ``proto``, then its protocol efficiency (NCCL's factor
    and caps against the plan's own bus bandwidth at full link rate)."""
    cc = compute_capability(topo, gpus)
    tuning = tune.tuning(cc, algo, proto)
    plan = _plan(topo, op, gpus, algo, tuning)
    # the shares on the links do not depend on the protocol: one bandwidth term per algorithm and group
    cache = _plans.setdefault(topo, {})
    key = ("bandwidth", op, algo, tuple(gpus))
    if key not in cache:
        cache[key] = bandwidth_term(topo, plan)
    fig = measured.figure(topo, op, algo, proto)
    if fig is not None and plan.lanes:  # the box's own figures over NCCL's tables
        group = measured.measured_group(topo)
        reference = plan if list(gpus) == group else _plan(topo, op, group, algo, tuning)
        plan = measured.apply(plan, reference, topo, fig, bus_factor(op, len(group)))
        return plan, alpha_beta(topo, plan, cache[key])
    alpha, beta = alpha_beta(topo, plan, cache[key])  # at full link rate (efficiency 1)
    if cc is not None and plan.lanes:
        busbw = bus_factor(op, len(gpus)) / beta / GB if beta > 0 else 0.0
        nodes = len({topo.machine_of(g) for g in gpus})
        eff = tune.efficiency(cc, op, algo, proto, nodes, len(gpus) / nodes, busbw)
        plan = dataclasses.replace(plan, efficiency=eff)
        beta /= eff  # alpha_beta of the plan with its efficiency
    return plan, (alpha, beta)


def _plan(topo: Topology, op: str, gpus: list[str], algo: str, tuning: tune.Tuning) -> Plan:
    if len(gpus) < 2:
        plan = Plan(op, algo, tuple(gpus), (), 0.0)  # one rank: nothing moves
    elif algo == "ring":
        plan = ring_plan(topo, op, gpus, tuning)
    elif algo == "tree":
        plan = tree_plan(topo, gpus, tuning)
    elif algo == "nvls":
        switch = nvls_switch(topo, gpus)
        if switch is None:
            valid = ", ".join(["auto", *feasible_algorithms(topo, op, gpus)])
            raise TrainsimError("nvls needs every GPU of the group linked to one NVSwitch with in-switch "
                                f"reduction (reduce: true); {topo.name} has none for this group; valid "
                                f"choices: {valid}", field="algo")
        plan = nvls_plan(topo, op, gpus, switch, tuning)
    elif algo == "nvls_tree":
        switches = _machine_switches(topo, gpus)
        if switches is None:
            valid = ", ".join(["auto", *feasible_algorithms(topo, op, gpus)])
            raise TrainsimError("nvls_tree needs NVIDIA GPUs in several machines, as many in each, "
                                "every machine's GPUs linked to one NVSwitch with in-switch reduction "
                                f"(reduce: true); {topo.name} has none here; valid choices: {valid}",
                                field="algo")
        plan = nvls_tree_plan(topo, gpus, switches, tuning)
    else:
        plan = p2p_plan(topo, op, gpus, tuning)
    return plan


def choose(topo: Topology, op: str, gpus: Sequence[str | int] | None, nbytes: float, *,
           algo: str = "auto", proto: str = "auto") -> tuple[str, str]:
    """(algorithm, protocol) that runs: as NCCL's tuner does, among the feasible ones (those not forced),
    the pair with the smallest modelled time alpha + beta x S."""
    _check_op(op)
    _check_algo(op, algo)
    _check_proto(proto)
    names = _names(topo, gpus)
    algos = feasible_algorithms(topo, op, names) if algo == "auto" else [algo]
    if proto != "auto":
        if algo == "auto" and proto != "simple":
            algos = [a for a in algos if a not in tune.IN_SWITCH] or algos
        pairs = [(a, proto) for a in algos]
    else:
        pairs = [(a, p) for a in algos for p in feasible_protocols(topo, op, names, a)]
    if len(names) < 2 or len(pairs) == 1:
        return pairs[0]

    return min(pairs, key=lambda pair: _nccl_time(topo, op, names, *pair, nbytes))


def full_rate_busbw(topo: Topology, op: str, gpus: Sequence[str | int] | None, algo: str,
                    proto: str = "simple") -> float:
    """GB/s of bus bandwidth the plan of ``algo`` reaches at its links' full rate (what NCCL's channel count
    follows, `nccl_tuning.channels`); 0 for one rank. Cached with the plans: the same for every protocol
    (give the one that runs, whose plan is built already)."""
    names = _names(topo, gpus)
    if len(names) < 2:
        return 0.0
    key = ("bandwidth", op, algo, tuple(names))
    if key not in _plans.setdefault(topo, {}):
        plan_collective(topo, op, names, algo, proto)  # builds the plan and its bandwidth term
    beta = _plans[topo][key]
    return bus_factor(op, len(names)) / beta / GB if beta > 0 else 0.0


def _correction(topo: Topology, names: list[str], algo: str, op: str, proto: str, nbytes: float) -> float:
    if measured.figure(topo, op, algo, proto) is not None:
        return 1.0  # a measured figure already is what the box does at every size
    return tune.size_correction(compute_capability(topo, names), algo, proto, nbytes)


def _nccl_time(topo: Topology, op: str, names: list[str], algo: str, proto: str, nbytes: float) -> float:
    """NCCL's tuner's time, which its choice minimises: alpha + beta x S / its size correction (trees at
    medium sizes)."""
    alpha, beta = _cached(topo, op, names, algo, proto)[1]
    return alpha + beta * nbytes / _correction(topo, names, algo, op, proto, nbytes)


def _fill(topo: Topology, op: str, names: list[str], algo: str, proto: str, nbytes: float) -> float:
    """Seconds the pipeline's fill and drain add (nccl_tuning.pipeline_fill at this group's stage rates);
    0 where a measured figure already is what the box does."""
    if measured.figure(topo, op, algo, proto) is not None or algo not in tune.IN_SWITCH:
        return 0.0
    rates, machines = _stage_rates(topo, op, names, algo, proto)
    return tune.pipeline_fill(compute_capability(topo, names), op, algo, nbytes, len(names) // machines,
                              machines, rates)


def _stage_rates(topo: Topology, op: str, names, algo: str, proto: str) -> tuple[tune.StageRates, int]:
    """The rates a pipeline stage reaches alone, from the plan's links at its protocol's efficiency: the
    slowest GPU's switch port (the one-link NVLink transfers) or its share of the switch's NVLS engine where
    that has a throughput of its own (the engine's rate over the GPUs that use it), the slowest tree hop
    (network routes; none in one machine), the slowest GPU's memory (a device the library does not know
    leaves its copies uncharged); and the group's number of machines. Cached with the plans (a collective
    asks on every call)."""
    key = ("stage rates", op, algo, proto, names)
    cache = _plans.setdefault(topo, {})
    if key not in cache:
        plan = plan_collective(topo, op, names, algo, proto)
        transfers = [t for lane in plan.lanes for phase in lane for t in phase.transfers]
        port = min((topo.bottleneck(t.route) for t in transfers if len(t.route) == 1), default=math.inf)
        engines: dict[Edge, int] = {}  # an NVLS engine -> the GPUs whose traffic it takes in
        for t in transfers:
            if t.route and t.route[-1][0] == t.route[-1][1]:
                engines[t.route[-1]] = engines.get(t.route[-1], 0) + 1
        # a GPU's stage through the switch runs at its port's rate or its share of the engine, the slower
        port = min([port] + [topo.bottleneck((e,)) / users for e, users in engines.items()])
        nic = min((topo.bottleneck(t.route) for t in transfers
                   if hop_class(topo, t.route) == "network"), default=math.inf)
        rates = tune.StageRates(port * plan.efficiency, nic * plan.efficiency,
                                min(_memory_bandwidth(topo, g) for g in names))
        cache[key] = rates, len(by_machine(topo, list(names)))
    return cache[key]


def _memory_bandwidth(topo: Topology, gpu: str) -> float:
    try:
        return get_device(topo.gpu_spec(gpu)).memory_bandwidth
    except TrainsimError:
        return math.inf


def _time(topo: Topology, op: str, names: list[str], algo: str, proto: str, nbytes: float) -> float:
    """What the collective takes: NCCL's tuner's time plus the pipeline's fill and drain."""
    return _nccl_time(topo, op, names, algo, proto, nbytes) + _fill(topo, op, names, algo, proto, nbytes)


def choose_algorithm(topo: Topology, op: str, gpus: Sequence[str | int] | None, nbytes: float,
                     proto: str = "auto") -> str:
    """The algorithm "auto" runs (see `choose`)."""
    return choose(topo, op, gpus, nbytes, proto=proto)[0]


def _resolve(topo: Topology, op: str, gpus, nbytes: float, algo: str, proto: str
             ) -> tuple[list[str], str, str]:
    _check_op(op)
    _check_algo(op, algo)
    _check_proto(proto)
    if not nbytes >= 0:
        raise TrainsimError(f"nbytes must be >= 0, got {nbytes}", field="nbytes")
    names = _names(topo, gpus)
    return (names, *choose(topo, op, names, nbytes, algo=algo, proto=proto))


def collective_time(topo: Topology, op: str, gpus: Sequence[str | int] | None, nbytes: float, *,
                    algo: str = "auto", proto: str = "auto") -> float:
    """Analytic alpha-beta time in seconds: t = alpha + beta x S, with beta from the most loaded edge of
    each phase of the same plan the flow path runs, over the protocol's efficiency (no simulation)."""
    names, algo, proto = _resolve(topo, op, gpus, nbytes, algo, proto)
    if len(names) < 2:
        return 0.0
    return _time(topo, op, names, algo, proto, nbytes)


def analytic_collective(topo: Topology, op: str, gpus: Sequence[str | int] | None, nbytes: float, *,
                        algo: str = "auto", proto: str = "auto"
                        ) -> tuple[float, tuple[Edge, ...], np.ndarray]:
    """`collective_time` and `collective_link_bytes` of one call, choosing the algorithm once: (seconds,
    links, bytes on each); the links tuple is the same object for every call of one plan (so a
    `FlowNetwork` can keep their positions)."""
    names, algo, proto = _resolve(topo, op, gpus, nbytes, algo, proto)
    if len(names) < 2:
        return 0.0, (), np.zeros(0)
    plan = plan_collective(topo, op, names, algo, proto)
    wire = nbytes / plan.efficiency / _correction(topo, names, algo, op, proto, nbytes)
    edges, shares = _edge_share_arrays(topo, plan)
    return _time(topo, op, names, algo, proto, nbytes), edges, shares * wire


def collective_link_bytes(topo: Topology, op: str, gpus: Sequence[str | int] | None, nbytes: float, *,
                          algo: str = "auto", proto: str = "auto") -> dict[tuple[str, str], float]:
    """Bytes each directed link carries in one collective: what the flow path's transfers move (share x S /
    efficiency / NCCL's size correction per step), summed over the plan; for the analytic path's link
    accounting."""
    names, algo, proto = _resolve(topo, op, gpus, nbytes, algo, proto)
    if len(names) < 2:
        return {}
    plan = plan_collective(topo, op, names, algo, proto)
    wire = nbytes / plan.efficiency / _correction(topo, names, algo, op, proto, nbytes)
    return {edge: share * wire for edge, share in _edge_shares(topo, plan).items()}


_shares: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # topology -> {id(plan): (plan, shares)}


def _edge_share_arrays(topo: Topology, plan: Plan) -> tuple[tuple[Edge, ...], np.ndarray]:
    """`_edge_shares` as (links, shares array), cached likewise."""
    cache = _shares.setdefault(topo, {})
    key = ("arrays", id(plan))
    entry = cache.get(key)
    if entry is None or entry[0] is not plan:
        shares = _edge_shares(topo, plan)
        values = np.fromiter(shares.values(), dtype=float, count=len(shares))
        entry = cache[key] = (plan, tuple(shares), values)
    return entry[1], entry[2]


def _edge_shares(topo: Topology, plan: Plan) -> dict[tuple[str, str], float]:
    """Per directed edge, the sum over the plan's transfers crossing it of share x repeat (cached per plan,
    which the plan cache keeps alive)."""
    cache = _shares.setdefault(topo, {})
    entry = cache.get(id(plan))
    if entry is None or entry[0] is not plan:
        shares: dict[tuple[str, str], float] = {}
        for lane in plan.lanes:
            for phase in lane:
                for t in phase.transfers:
                    share = t.share * phase.repeat  # once per transfer, not per edge: a million at scale
                    for edge in t.route:
                        shares[edge] = shares.get(edge, 0.0) + share
        entry = cache[id(plan)] = (plan, shares)
    return entry[1]


def run_collective(env: simpy.Environment, net: FlowNetwork, topo: Topology, op: str,
                   gpus: Sequence[str | int] | None, nbytes: float, *, algo: str = "auto",
                   proto: str = "auto", tag: object = None, max_flows: int = MAX_FLOWS) -> Generator:
    """A SimPy process body: the collective's transfers as flows on ``net`` (built from ``topo``).

    ``yield env.process(run_collective(...))``; the process's value is the algorithm that ran. The flows
    carry S / efficiency bytes (the protocol's share of the link rate), after NCCL's latencies.
    A plan that would start more than ``max_flows`` flows (a ring over many ranks: 2(n-1) steps of n flows
    per channel) runs its repeated steps in groups: each flow then carries several consecutive steps'
    bytes after their summed latency. Every edge carries the same bytes in the same order, so the time is
    unchanged where the steps are symmetric, with a fraction of the events.
    """
    names, algo, proto = _resolve(topo, op, gpus, nbytes, algo, proto)
    if len(names) < 2:
        return algo
    plan = plan_collective(topo, op, names, algo, proto)
    if not plan.lanes:
        return algo
    group = max(1.0, plan.flows / max_flows)
    yield env.timeout(plan.base_latency + _fill(topo, op, names, algo, proto, nbytes))
    # the protocol's flags and lost cycles (and NCCL's tree correction) cost link time as extra bytes
    wire = nbytes / plan.efficiency / _correction(topo, names, algo, op, proto, nbytes)
    lanes = [env.process(_run_lane(env, net, lane, wire, tag, group)) for lane in plan.lanes]
    yield simpy.AllOf(env, lanes)
    return algo


def _run_lane(env, net, lane, nbytes, tag, group: float) -> Generator:
    for phase in lane:
        runs = max(1, math.ceil(phase.repeat / group))
        per_run = phase.repeat / runs  # steps per flow (fractional steps keep the totals exact)
        for _ in range(runs):
            yield simpy.AllOf(env, [net.transfer(t.route, t.share * nbytes * per_run,
                                                 latency=t.latency * per_run, tag=tag)
                                    for t in phase.transfers])


def simulate_collective(topo: Topology, op: str, gpus: Sequence[str | int] | None, nbytes: float, *,
                        algo: str = "auto", proto: str = "auto") -> dict:
    """Run one collective alone on a fresh flow network: time, algo, proto, flows, recomputes, wall time."""
    import time

    env = simpy.Environment()
    net = FlowNetwork.from_topology(env, topo, record_flows=False)
    start = time.perf_counter()
    algo, proto = choose(topo, op, gpus, nbytes, algo=algo, proto=proto)
    proc = env.process(run_collective(env, net, topo, op, gpus, nbytes, algo=algo, proto=proto))
    env.run()
    return {"time_s": env.now, "algo": proc.value, "proto": proto, "flows": net.stats.flows_finished,
            "recomputes": net.stats.recomputes, "recompute_s": net.stats.recompute_seconds,
            "wall_s": time.perf_counter() - start}


def bench(topo: Topology, op: str, sizes: Iterable[int], *, algo: str = "auto", proto: str = "auto",
          gpus: Sequence[str | int] | None = None, methods: Sequence[str] = METHODS,
          progress: Callable[[], None] | None = None) -> list[dict]:
    """nccl-tests-style rows, one per size and method: size_bytes, time_s, algbw_gbps, busbw_gbps, method,
    algo and proto (what ran; "auto" resolves per size). ``progress`` is called after each row."""
    _check_op(op)
    _check_algo(op, algo)
    _check_proto(proto)
    for m in methods:
        if m not in METHODS:
            raise unknown_name("method", m, METHODS, field="method")
    names = resolve_gpus(topo, gpus)
    if len(names) < 2:
        raise TrainsimError("a collective benchmark needs at least 2 GPUs", field="gpus")
    factor = bus_factor(op, len(names))
    rows = []
    for size in sizes:
        used, how = choose(topo, op, names, size, algo=algo, proto=proto)
        for method in methods:
            if method == "flow":
                seconds = simulate_collective(topo, op, names, size, algo=used, proto=how)["time_s"]
            else:
                seconds = collective_time(topo, op, names, size, algo=used, proto=how)
            algbw = size / seconds / GB if seconds > 0 else 0.0
            rows.append({"size_bytes": int(size), "time_s": seconds, "algbw_gbps": algbw,
                         "busbw_gbps": algbw * factor, "method": method, "algo": used, "proto": how})
            if progress:
                progress()
    return rows


_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_size(text: str) -> int:
    """'1K' -> 1024, '256M', '1G', '4096' (binary units, as nccl-tests)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text, flags=re.IGNORECASE)
    if not match:
        raise TrainsimError(f"cannot read size {text!r}; write e.g. 4096, 1K, 256M, 1G", field="sizes")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def parse_sizes(text: str) -> list[int]:
    """'1K:1G' -> 1 KiB, 2 KiB, ..., 1 GiB (factor 2, as nccl-tests -f 2); 'MIN:MAX:FACTOR'; 'A,B,C'."""
    if ":" not in text:
        sizes = [parse_size(part) for part in text.split(",") if part.strip()]
    else:
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise TrainsimError(f"cannot read sizes {text!r}; write MIN:MAX or MIN:MAX:FACTOR", field="sizes")
        low, high = parse_size(parts[0]), parse_size(parts[1])
        factor = float(parts[2]) if len(parts) == 3 and _is_number(parts[2]) else 2.0
        if len(parts) == 3 and not _is_number(parts[2]) or factor <= 1 or low <= 0 or high < low:
            raise TrainsimError(f"cannot read sizes {text!r}: need 0 < MIN <= MAX and FACTOR > 1",
                                field="sizes")
        sizes = []
        size = float(low)
        while size <= high * (1 + 1e-12):
            sizes.append(int(size))
            size *= factor
    if not sizes:
        raise TrainsimError(f"no sizes in {text!r}", field="sizes")
    if any(s <= 0 for s in sizes):
        bad = next(s for s in sizes if s <= 0)
        raise TrainsimError(f"sizes must be positive; {text!r} has {bad}", field="sizes")
    return sizes


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def bench_lines(rows: list[dict], *, title: str = "") -> list[str]:
    """An nccl-tests-style table of `bench` rows: one line per size, the flow and analytic paths side by
    side, and how far apart they are."""
    methods = [m for m in METHODS if any(r["method"] == m for r in rows)]
    by_size: dict[int, dict[str, dict]] = {}
    for r in rows:
        by_size.setdefault(r["size_bytes"], {})[r["method"]] = r
    head1 = f"{'':>13} {'':>5} {'':>6}"
    head2 = f"{'size (B)':>13} {'algo':>5} {'proto':>6}"
    for m in methods:
        head1 += f" | {m + ' path':^31}"
        head2 += f" | {'time (us)':>11} {'algbw':>9} {'busbw':>9}"
    if len(methods) == 2:
        head1 += f" | {'flow vs':>8}"
        head2 += f" | {'analytic':>8}"
    lines = [f"# {title}"] if title else []
    units = f"{'':>26}" + "".join(f" | {'':>11} {'GB/s':>9} {'GB/s':>9}" for _ in methods)
    lines += [f"# {head1}", f"# {head2}", f"# {units}"]
    for size, per in by_size.items():
        first = next(iter(per.values()))
        line = f"{size:>15} {first['algo']:>5} {first.get('proto', ''):>6}"
        for m in methods:
            r = per.get(m)
            line += (f" | {r['time_s'] * 1e6:>11.2f} {r['algbw_gbps']:>9.2f} {r['busbw_gbps']:>9.2f}" if r
                     else f" | {'-':>11} {'-':>9} {'-':>9}")
        if len(methods) == 2 and all(m in per for m in methods):
            a = per["analytic"]["time_s"]
            diff = (per["flow"]["time_s"] - a) / a * 100 if a > 0 else 0.0
            line += f" | {diff:>+7.2f}%"
        lines.append(line)
    return lines
