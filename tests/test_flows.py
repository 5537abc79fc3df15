"""The fair-share flow network: exact on cases with known answers, and checked against an LP reference."""

import math

import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from trainsim.sim.core.flows import FlowNetwork, max_min_rates, run_transfers


def finish_times(capacities, transfers, latencies=None):
    return [r.finished for r in run_transfers(capacities, transfers, latencies=latencies)]


def test_lone_flow_gets_the_bottleneck_bandwidth():
    assert finish_times({"a": 10.0, "b": 5.0}, [(["a", "b"], 100.0)]) == [pytest.approx(20.0)]


def test_k_flows_on_one_link_get_one_kth_each():
    times = finish_times({"a": 10.0}, [(["a"], 30.0)] * 3)
    assert times == [pytest.approx(9.0)] * 3


def test_textbook_max_min_example_leaves_unused_share_to_others():
    # L1 (10) carries A and B; L2 (2) carries B and C. L2 is B's bottleneck: B = C = 1, A takes 9.
    rates, _ = max_min_rates([np.array([0]), np.array([0, 1]), np.array([1])], np.array([10.0, 2.0]))
    assert rates == pytest.approx([9.0, 1.0, 1.0])


def test_two_directions_of_a_link_never_interfere():
    caps = {("x", "y"): 10.0, ("y", "x"): 10.0}
    times = finish_times(caps, [([("x", "y")], 100.0), ([("y", "x")], 100.0)])
    assert times == [pytest.approx(10.0), pytest.approx(10.0)]


def test_route_latency_is_paid_once():
    times = finish_times({"a": 10.0, "b": 10.0}, [(["a", "b"], 10.0)], latencies={"a": 1.0, "b": 2.0})
    assert times == [pytest.approx(4.0)]


def test_rates_are_recomputed_when_flows_start_and_finish():
    env = simpy.Environment()
    net = FlowNetwork(env, {"a": 10.0})
    first = net.transfer(["a"], 100.0)

    def late():
        yield env.timeout(5.0)
        yield net.transfer(["a"], 25.0)
        assert env.now == pytest.approx(10.0)  # 25 bytes at 5 B/s once sharing

    env.process(late())
    env.run()
    assert first.value.finished == pytest.approx(12.5)  # 50 alone, 25 shared, 25 alone


def test_flow_rate_cap_leaves_the_rest_of_the_link_to_others():
    rates, _ = max_min_rates([np.array([0]), np.array([0])], np.array([10.0]), np.array([2.0, np.inf]))
    assert rates == pytest.approx([2.0, 8.0])


def test_zero_byte_and_empty_route_flows_finish_after_latency():
    env = simpy.Environment()
    net = FlowNetwork(env, {"a": 1.0})
    zero = net.transfer(["a"], 0.0, latency=0.5)
    local = net.transfer([], 10.0, latency=0.25)
    env.run()
    assert zero.value.finished == 0.5 and local.value.finished == 0.25


def test_bytes_delivered_equal_bytes_sent_per_link():
    env = simpy.Environment()
    net = FlowNetwork(env, {"a": 3.0, "b": 7.0, "c": 1.5})
    net.transfer(["a", "b"], 40.0)
    net.transfer(["b", "c"], 15.0)
    net.transfer(["b"], 70.0)
    env.run()
    assert net.bytes_on("a") == pytest.approx(40.0)
    assert net.bytes_on("b") == pytest.approx(125.0)
    assert net.bytes_on("c") == pytest.approx(15.0)


def test_leftover_below_clock_resolution_finishes():
    # 1000 B on a 1e15 B/s link starting at t=0.03: the rounding leftover drains in less than the clock
    # can resolve at that time; it must finish, not re-arm the timer at the same instant forever.
    env = simpy.Environment()
    net = FlowNetwork(env, {"a": 1e15})

    def later():
        yield env.timeout(0.03)
        yield net.transfer(["a"], 1000.0)

    env.process(later())
    env.run(until=1.0)
    assert net.stats.flows_finished == 1


def test_bad_transfers_are_rejected():
    env = simpy.Environment()
    net = FlowNetwork(env, {"a": 1.0})
    with pytest.raises(KeyError, match="unknown link"):
        net.transfer(["nope"], 1.0)
    with pytest.raises(ValueError):
        net.transfer(["a"], -1.0)
    with pytest.raises(ValueError):
        FlowNetwork(env, {"a": 0.0})


# -- property tests against an independent reference ----------------------------------------------------

def lp_max_min(flow_links, capacity, caps):
    """Max-min fair rates by lexicographic linear programming: raise the common floor of the unfixed flows
    as far as the constraints allow, fix the flows that cannot exceed it, repeat. Independent of
    water-filling."""
    n, m = len(flow_links), len(capacity)
    incidence = np.zeros((m, n))
    for f, links in enumerate(flow_links):
        incidence[links, f] = 1.0
    fixed = np.full(n, np.nan)
    bounds = [(0, None if math.isinf(c) else c) for c in caps]
    while np.isnan(fixed).any():
        free = np.isnan(fixed)
        # variables: x_0..x_{n-1}, t ; maximise t
        a_ub = [np.append(row, 0.0) for row in incidence]
        b_ub = list(capacity)
        for f in np.nonzero(free)[0]:  # t - x_f <= 0
            row = np.zeros(n + 1)
            row[f], row[n] = -1.0, 1.0
            a_ub.append(row)
            b_ub.append(0.0)
        fix_bounds = [(fixed[f], fixed[f]) if not free[f] else bounds[f] for f in range(n)]
        res = linprog(np.append(np.zeros(n), -1.0), A_ub=np.array(a_ub), b_ub=b_ub,
                      bounds=[*fix_bounds, (0, None)], method="highs")
        floor = res.x[n]
        for f in np.nonzero(free)[0]:  # can f alone go above the floor while others keep it?
            c = np.zeros(n)
            c[f] = -1.0
            lo = [(floor, b[1]) if free[g] else b for g, b in enumerate(fix_bounds)]
            res_f = linprog(c, A_ub=incidence, b_ub=capacity, bounds=lo, method="highs")
            if res_f.status != 0 or -res_f.fun <= floor * (1 + 1e-7) + 1e-9:
                fixed[f] = floor
    return fixed


@st.composite
def flow_sets(draw):
    n_links = draw(st.integers(1, 5))
    capacity = np.array(draw(st.lists(st.floats(1.0, 100.0), min_size=n_links, max_size=n_links)))
    n_flows = draw(st.integers(1, 7))
    flows = [np.array(sorted(draw(st.sets(st.integers(0, n_links - 1), min_size=1, max_size=n_links))))
             for _ in range(n_flows)]
    caps = np.array(draw(st.lists(st.one_of(st.just(math.inf), st.floats(0.5, 50.0)),
                                  min_size=n_flows, max_size=n_flows)))
    return flows, capacity, caps


@settings(max_examples=60, deadline=None)
@given(flow_sets())
def test_water_filling_matches_the_lp_reference(case):
    flows, capacity, caps = case
    rates, _ = max_min_rates(flows, capacity, caps)
    assert rates == pytest.approx(lp_max_min(flows, capacity, caps), rel=1e-6, abs=1e-7)
    load = np.zeros(len(capacity))
    for f, links in enumerate(flows):
        load[links] += rates[f]
    assert (load <= capacity * (1 + 1e-9)).all()


@settings(max_examples=40, deadline=None)
@given(flow_sets(), st.lists(st.floats(0.0, 5.0), min_size=7, max_size=7),
       st.lists(st.floats(1.0, 500.0), min_size=7, max_size=7))
def test_simulated_flows_conserve_bytes_and_respect_capacity(case, starts, sizes):
    flows, capacity, caps = case
    env = simpy.Environment()
    net = FlowNetwork(env, dict(enumerate(capacity)), record_link_rates=True)

    def start(i, links):
        yield env.timeout(starts[i])
        yield net.transfer([int(x) for x in links], sizes[i], max_rate=caps[i], tag=i)

    for i, links in enumerate(flows):
        env.process(start(i, links))
    env.run()
    expected = np.zeros(len(capacity))
    for i, links in enumerate(flows):
        expected[links] += sizes[i]
    assert net.link_bytes == pytest.approx(expected, rel=1e-7)
    assert all(c.rate <= capacity[c.link] * (1 + 1e-9) for c in net.link_rate_changes)
    for r in net.records:  # nobody beats their bottleneck
        bottleneck = min(capacity[list(r.route)].min(), caps[r.tag])
        assert r.finished - r.started >= r.nbytes / bottleneck * (1 - 1e-9)
