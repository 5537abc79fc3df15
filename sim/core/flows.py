"""Bytes moving over links: flows sharing a network by max-min fairness.

A transfer is a *flow* of bytes on a *route* (a list of directed links). All active flows share every
link by max-min fairness, computed by progressive filling (water-filling): every unfrozen flow's rate
rises together until some link saturates (or a flow reaches its own rate cap); the flows crossing that
link freeze; repeat. Rates are recomputed whenever a flow starts or finishes and the next completion is
re-armed. A route's latency is paid once, before the first byte moves.

Flows that start at the same simulated instant are coalesced into one recompute, so a collective that
launches thousands of flows at once costs one water-filling pass, not thousands. The pass itself is
vectorised over a sparse flow-link incidence (numpy ``bincount``), O(hops) per flow per bottleneck level.
"""

from __future__ import annotations

import math
import time
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import simpy

# Finishing tolerance: a flow whose remaining bytes would drain within this fraction of the next
# completion interval finishes with it (floating-point dust must not schedule an extra event).
_REL_EPS = 1e-9


@dataclass(frozen=True)
class FlowRecord:
    """One finished transfer: what moved where, and when."""

    tag: object
    route: tuple
    nbytes: float
    requested: float  # when transfer() was called
    started: float  # when the first byte moved (after the route latency)
    finished: float


@dataclass
class _Flow:
    route: tuple
    links: np.ndarray  # link indices
    nbytes: float
    max_rate: float
    requested: float
    started: float
    tag: object
    done: simpy.Event


@dataclass
class LinkRateChange:
    """The aggregate rate on a link changed at `time` (for bandwidth counter tracks)."""

    time: float
    link: Hashable
    rate: float


@dataclass
class FlowStats:
    recomputes: int = 0
    flows_started: int = 0
    flows_finished: int = 0
    water_filling_levels: int = 0
    recompute_seconds: float = 0.0  # wall time spent in water-filling (for benchmarks)


def max_min_rates(flow_links: Sequence[np.ndarray], capacity: np.ndarray,
                  max_rate: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """Max-min fair rates of flows on links, by progressive filling.

    ``flow_links[f]`` holds the link indices flow f crosses; ``capacity[l]`` is link l's capacity;
    ``max_rate[f]`` an optional cap of flow f's own (inf for none). Returns (rates, levels), levels being
    the number of water-filling rounds. A flow with no links and no cap gets rate inf.
    """
    n_flows = len(flow_links)
    lengths = np.fromiter((len(x) for x in flow_links), dtype=np.int64, count=n_flows)
    link_idx = np.concatenate(flow_links).astype(np.int64) if lengths.sum() else np.zeros(0, np.int64)
    flow_idx = np.repeat(np.arange(n_flows), lengths)
    caps = np.full(n_flows, np.inf) if max_rate is None else np.asarray(max_rate, dtype=float)
    return water_fill(flow_idx, link_idx, n_flows, np.asarray(capacity, dtype=float), caps)


def water_fill(flow_idx: np.ndarray, link_idx: np.ndarray, n_flows: int, capacity: np.ndarray,
               caps: np.ndarray) -> tuple[np.ndarray, int]:
    """Progressive filling on a sparse incidence: entry k says flow ``flow_idx[k]`` crosses link
    ``link_idx[k]``. Returns (rates, levels).

    All unfrozen flows share one rate, the water level, so a round costs O(links) plus the entries of the
    flows it freezes: the level rises to the first link that saturates (capacity left by frozen flows,
    divided by its unfrozen users) or the first flow cap, and the flows there freeze at that level.
    """
    rates = np.zeros(n_flows)
    if n_flows == 0:
        return rates, 0
    n_links = len(capacity)
    by_flow = np.argsort(flow_idx, kind="stable")
    flow_ptr = np.searchsorted(flow_idx[by_flow], np.arange(n_flows + 1))
    by_link = np.argsort(link_idx, kind="stable")
    link_ptr = np.searchsorted(link_idx[by_link], np.arange(n_links + 1))
    users = np.diff(link_ptr).astype(float)  # unfrozen flows per link
    left = capacity.astype(float).copy()  # capacity not taken by frozen flows
    active = np.ones(n_flows, dtype=bool)
    cap_order = np.argsort(caps, kind="stable")
    next_cap = 0  # first not-yet-frozen flow in cap order
    n_active = n_flows
    level = 0.0
    levels = 0
    while n_active:
        levels += 1
        used = users > 0
        with np.errstate(divide="ignore", invalid="ignore"):
            saturation = np.where(used, left / users, np.inf)
        link_level = saturation.min()
        while next_cap < n_flows and not active[cap_order[next_cap]]:
            next_cap += 1
        cap_level = caps[cap_order[next_cap]] if next_cap < n_flows else np.inf
        level = min(link_level, cap_level)
        if not math.isfinite(level):  # the rest have neither links nor caps
            rates[active] = np.inf
            break
        freeze = np.zeros(n_flows, dtype=bool)
        if link_level <= cap_level * (1 + 1e-12):
            for link in np.nonzero(saturation <= link_level * (1 + 1e-12))[0]:
                freeze[flow_idx[by_link[link_ptr[link]:link_ptr[link + 1]]]] = True
        if cap_level <= link_level * (1 + 1e-12):
            freeze |= caps <= level * (1 + 1e-12)
        frozen = np.nonzero(freeze & active)[0]
        active[frozen] = False
        n_active -= len(frozen)
        rates[frozen] = level
        # The entries of the newly frozen flows: their links lose a user and keep that flow's rate.
        lengths = flow_ptr[frozen + 1] - flow_ptr[frozen]
        offsets = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        entries = by_flow[np.repeat(flow_ptr[frozen], lengths) + offsets]
        hit = np.bincount(link_idx[entries], minlength=n_links)
        users -= hit
        left -= hit * level
    return rates, levels


class FlowNetwork:
    """Links with capacities, shared by flows under max-min fairness, inside a SimPy environment.

    >>> env = simpy.Environment()
    >>> net = FlowNetwork(env, {"a": 10.0})
    >>> done = net.transfer(["a"], 100.0)
    >>> env.run(); env.now
    10.0
    """

    def __init__(self, env: simpy.Environment, capacities: Mapping[Hashable, float],
                 latencies: Mapping[Hashable, float] | None = None, *, record_flows: bool = True,
                 record_link_rates: bool = False):
        self.env = env
        self.links: list[Hashable] = list(capacities)
        self._index = {link: i for i, link in enumerate(self.links)}
        self.capacity = np.array([float(capacities[link]) for link in self.links])
        bad = np.flatnonzero(~(self.capacity > 0))
        if bad.size:
            link, cap = self.links[bad[0]], self.capacity[bad[0]]
            raise ValueError(f"link {link!r} has capacity {cap}; capacities must be > 0")
        self._latency = dict(latencies or {})
        self.link_bytes = np.zeros(len(self.links))
        self.credited = np.zeros(len(self.links))  # the part of link_bytes `credit` added (no flows)
        self._positions: dict[int, tuple[Sequence, np.ndarray]] = {}  # id(links) -> (links, positions)
        self.records: list[FlowRecord] | None = [] if record_flows else None
        self.link_rate_changes: list[LinkRateChange] | None = [] if record_link_rates else None
        self.stats = FlowStats()
        # Active flows, with their state in arrays aligned to the list (vectorised draining), and the
        # flow-link incidence kept in sparse form (entry k: flow _inc_flow[k] crosses link _inc_link[k]).
        self._active: list[_Flow] = []
        self._remaining = np.zeros(0)
        self._rates = np.zeros(0)
        self._caps = np.zeros(0)
        self._inc_flow = np.zeros(0, np.int64)
        self._inc_link = np.zeros(0, np.int64)
        self._admitted: list[_Flow] = []
        self._last_update = env.now
        # The links the active flows cross (sorted) and their aggregate rates: draining and refilling work on
        # these alone, not on every link of a cluster. Every link's rate only where rate changes are kept.
        self._used = np.zeros(0, np.int64)
        self._used_rate = np.zeros(0)
        self._link_rate = np.zeros(len(self.links)) if record_link_rates else None
        self._timer_version = 0
        self._recompute_pending = False

    @classmethod
    def from_topology(cls, env: simpy.Environment, topology, **kwargs) -> FlowNetwork:
        """A network with one link per directed edge of a topology graph (edge attrs bandwidth, latency)."""
        edges = topology.edge_attrs  # edge -> attributes, kept by the topology
        caps = {e: d["bandwidth"] for e, d in edges.items()}
        lats = {e: d.get("latency", 0.0) for e, d in edges.items()}
        return cls(env, caps, lats, **kwargs)

    # -- public API -------------------------------------------------------------------------------

    def route_latency(self, route: Iterable[Hashable]) -> float:
        return sum(self._latency.get(link, 0.0) for link in route)

    def transfer(self, route: Sequence[Hashable], nbytes: float, *, latency: float | None = None,
                 max_rate: float = math.inf, tag: object = None) -> simpy.Event:
        """Start moving `nbytes` along `route`; the returned event fires (value: a FlowRecord) when the last
        byte arrives.

        `latency` defaults to the sum of the route's link latencies; `max_rate` caps this flow's own rate
        (e.g. a copy engine or a CPU-driven pageable copy slower than the links).
        """
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        route = tuple(route)
        try:
            links = np.array([self._index[link] for link in route], dtype=np.int64)
        except KeyError as exc:
            raise KeyError(f"route uses unknown link {exc.args[0]!r}") from None
        if latency is None:
            latency = self.route_latency(route)
        done = self.env.event()
        flow = _Flow(route, links, float(nbytes), float(max_rate), self.env.now, math.nan, tag, done)
        self.stats.flows_started += 1
        if latency > 0:
            self.env.timeout(latency).callbacks.append(lambda _ev: self._admit(flow))
        else:
            self._admit(flow)
        return done

    def credit(self, links: Sequence[Hashable], nbytes: Sequence[float]) -> None:
        """Count ``nbytes[i]`` on ``links[i]``, bytes that moved without flows here (an analytic collective:
        its plan's bytes per link), so link bytes and utilisation include them. The positions of a links
        sequence are kept (with it) for the next call that passes the same object."""
        entry = self._positions.get(id(links))
        if entry is None or entry[0] is not links:
            index = self._index
            entry = (links, np.fromiter((index[link] for link in links), dtype=np.int64, count=len(links)))
            self._positions[id(links)] = entry
        at, nbytes = entry[1], np.asarray(nbytes, dtype=float)
        np.add.at(self.link_bytes, at, nbytes)
        np.add.at(self.credited, at, nbytes)

    def drain(self) -> None:
        """Count the bytes the active flows moved up to now in ``link_bytes``."""
        self._advance()

    def utilisation(self, elapsed: float | None = None) -> dict[Hashable, float]:
        """Average fraction of each link's capacity used since time 0 (or over `elapsed` seconds)."""
        self._advance()
        span = self.env.now if elapsed is None else elapsed
        if span <= 0:
            return {link: 0.0 for link in self.links}
        return {link: float(b / (c * span)) for link, b, c in
                zip(self.links, self.link_bytes, self.capacity, strict=True)}

    def index_of(self, link: Hashable) -> int:
        """The position of ``link`` in ``links`` (and in ``link_bytes``, ``capacity``)."""
        return self._index[link]

    def bytes_on(self, link: Hashable) -> float:
        self._advance()
        return float(self.link_bytes[self._index[link]])

    def rate_of(self, link: Hashable) -> float:
        """The aggregate rate on a link right now (bytes/s)."""
        i = self._index[link]
        k = int(np.searchsorted(self._used, i))
        return float(self._used_rate[k]) if k < len(self._used) and self._used[k] == i else 0.0

    @property
    def active_flows(self) -> int:
        return len(self._active) + len(self._admitted)

    # -- the machinery ----------------------------------------------------------------------------

    def _admit(self, flow: _Flow) -> None:
        flow.started = self.env.now
        if flow.nbytes == 0 or (len(flow.links) == 0 and math.isinf(flow.max_rate)):
            self._finish(flow)
            return
        self._admitted.append(flow)
        self._request_recompute()

    def _request_recompute(self) -> None:
        # Coalesce all starts/finishes of this instant into one water-filling pass, run after the
        # events already queued for now.
        if not self._recompute_pending:
            self._recompute_pending = True
            self.env.timeout(0).callbacks.append(self._recompute)

    def _advance(self) -> None:
        """Drain bytes at the current rates up to now."""
        dt = self.env.now - self._last_update
        if dt > 0 and self._active:
            self._remaining -= self._rates * dt
            self.link_bytes[self._used] += self._used_rate * dt
        self._last_update = self.env.now

    def _take_admitted(self) -> None:
        new = self._admitted
        if not new:
            return
        self._admitted = []
        base = len(self._active)
        lengths = [len(f.links) for f in new]
        new_ids = np.repeat(np.arange(base, base + len(new)), lengths)
        self._inc_flow = np.concatenate([self._inc_flow, new_ids])
        self._inc_link = np.concatenate([self._inc_link, *(f.links for f in new)])
        self._remaining = np.concatenate([self._remaining, [f.nbytes for f in new]])
        self._caps = np.concatenate([self._caps, [f.max_rate for f in new]])
        self._rates = np.concatenate([self._rates, np.zeros(len(new))])
        self._active.extend(new)

    def _recompute(self, _event=None) -> None:
        self._recompute_pending = False
        self._advance()
        self._take_admitted()
        t0 = time.perf_counter()
        # on the links in use only (numbered in order): the same rates, at a cost that does not grow with
        # the links of the whole cluster
        used, local = np.unique(self._inc_link, return_inverse=True)
        rates, levels = water_fill(self._inc_flow, local, len(self._active), self.capacity[used], self._caps)
        self.stats.recompute_seconds += time.perf_counter() - t0
        self.stats.recomputes += 1
        self.stats.water_filling_levels += levels
        self._rates = rates
        self._used = used
        self._used_rate = np.bincount(local, weights=rates[self._inc_flow], minlength=len(used))
        if self.link_rate_changes is not None:
            new_link_rate = np.zeros(len(self.links))
            new_link_rate[used] = self._used_rate
            changed = np.nonzero(np.abs(new_link_rate - self._link_rate) > 1e-9 * self.capacity)[0]
            self.link_rate_changes.extend(LinkRateChange(self.env.now, self.links[i], float(new_link_rate[i]))
                                          for i in changed)
            self._link_rate = new_link_rate
        self._arm_next_completion()

    def _arm_next_completion(self) -> None:
        self._timer_version += 1
        if not self._active:
            return
        with np.errstate(divide="ignore", invalid="ignore"):
            eta = np.where(self._rates > 0, np.maximum(self._remaining, 0.0) / self._rates, np.inf)
        dt = float(eta.min())
        if not math.isfinite(dt):
            raise RuntimeError("flows are active but none can make progress")
        version = self._timer_version
        self.env.timeout(dt).callbacks.append(lambda _ev: self._on_timer(version))

    def _on_timer(self, version: int) -> None:
        if version != self._timer_version:
            return  # superseded by a later recompute
        self._advance()
        sizes = np.fromiter((f.nbytes for f in self._active), dtype=float, count=len(self._active))
        done = self._remaining <= _REL_EPS * np.maximum(sizes, 1.0)
        # Leftovers that would drain in less than the clock can resolve at this time are done too;
        # otherwise the timer would re-arm at the same instant forever.
        with np.errstate(divide="ignore", invalid="ignore"):
            eta = np.where(self._rates > 0, self._remaining / self._rates, np.inf)
        done |= self.env.now + eta <= self.env.now
        if done.any():
            finished = [f for f, d in zip(self._active, done, strict=True) if d]
            keep = ~done
            new_index = np.cumsum(keep) - 1
            on_kept = keep[self._inc_flow]
            self._inc_link = self._inc_link[on_kept]
            self._inc_flow = new_index[self._inc_flow[on_kept]]
            self._active = [f for f, d in zip(self._active, done, strict=True) if not d]
            self._remaining = self._remaining[keep]
            self._rates = self._rates[keep]
            self._caps = self._caps[keep]
            for flow in finished:
                self._finish(flow)
        self._request_recompute()

    def _finish(self, flow: _Flow) -> None:
        self.stats.flows_finished += 1
        record = FlowRecord(flow.tag, flow.route, flow.nbytes, flow.requested, flow.started, self.env.now)
        if self.records is not None:
            self.records.append(record)
        flow.done.succeed(record)


def run_transfers(capacities: Mapping[Hashable, float], transfers: Iterable[tuple[Sequence, float]],
                  *, latencies: Mapping[Hashable, float] | None = None) -> list[FlowRecord]:
    """Convenience: start every (route, nbytes) at time 0 and run to completion; the finished records."""
    env = simpy.Environment()
    net = FlowNetwork(env, capacities, latencies)
    for i, (route, nbytes) in enumerate(transfers):
        net.transfer(route, nbytes, tag=i)
    env.run()
    return sorted(net.records, key=lambda r: r.tag)

