"""A gloo call's latency as measured: samples per size, bandwidth term out, the mean around its size; fast or
stalled until the timer tick."""

import pytest

from trainsim.sim.hosts.call_latency import MeasuredLatency, TimerTick, cost, from_points


def test_samples_lose_their_bytes_time_and_never_go_negative():
    beta = 1e9  # 1 GB/s: 1 MB takes 1 ms on the wire
    points = [{"bytes": 1000, "samples_s": [1e-4, 5e-3]}, {"bytes": 1_000_000, "samples_s": [0.5e-3, 2e-3]}]
    measured = from_points(points, beta)
    assert measured.sizes == (1000.0, 1_000_000.0)
    assert measured.samples[0] == pytest.approx((1e-4 - 1e-6, 5e-3 - 1e-6))
    assert measured.samples[1] == pytest.approx((0.0, 1e-3))  # faster than the fit's bandwidth: zero


def test_a_call_is_charged_the_mean_of_the_sizes_around_its_own():
    fast, slow = 2e-4, 5e-3
    measured = MeasuredLatency((1e3, 1e6), ((fast,) * 3 + (slow,), (slow,) * 3 + (fast,)))
    assert measured.at(1e3) == (fast,) * 3 + (slow,) and measured.at(1e6) == (slow,) * 3 + (fast,)
    assert measured.at(5e5) == measured.samples[0] + measured.samples[1]  # between two sizes: both
    assert measured.at(10) == measured.samples[0] and measured.at(1e9) == measured.samples[1]  # the end's
    # a stall one time in four at 1 KB, three in four at 1 MB: the mean lies between the modes
    assert cost(measured, 1e3) == pytest.approx(0.75 * fast + 0.25 * slow)
    assert cost(measured, 5e5) == pytest.approx((fast + slow) / 2)
    assert cost(measured, 1e6) == pytest.approx(0.25 * fast + 0.75 * slow)
    assert cost(2.5e-3, 1e6) == 2.5e-3  # a plain number (an old bundle's alpha) is charged as it is


def test_no_samples_no_measured_latency():
    assert from_points([{"bytes": 1000, "time_s": 1e-3}], 1e9) is None
    assert from_points([{"bytes": 1000, "samples_s": []}], 1e9) is None
    with pytest.raises(ValueError, match="samples"):
        MeasuredLatency((1e3,), ((),))


def test_fast_samples_and_the_share_that_stalled_per_size():
    fast, slow = 2e-4, 5e-3
    measured = MeasuredLatency((1e3, 1e6), ((fast,) * 3 + (slow,), (fast, slow, slow, slow)), 1e9)
    assert measured.fast_and_stall_chance(1e3) == pytest.approx((fast, 0.25))
    assert measured.fast_and_stall_chance(5e5) == pytest.approx((fast, 0.5))  # both sizes pooled
    assert measured.fast_and_stall_chance(1e6) == pytest.approx((fast, 0.75))
    assert measured.wire_s(1e6) == pytest.approx(1e-3)


def test_a_stalled_call_ends_on_the_first_tick_past_its_dead_time_and_its_fast_end():
    tick = TimerTick(period_s=4e-3, offset_s=2.5e-4, dead_time_s=1.5e-3)
    assert tick.first_after(0.0) == pytest.approx(2.5e-4)
    assert tick.first_after(2.5e-4) == pytest.approx(2.5e-4)  # on a tick: that one
    assert tick.first_after(3e-4) == pytest.approx(4.25e-3)
    # began 2 ms before a tick: that tick wakes it; 1 ms before: the next one
    assert tick.stalled_end(2.25e-3, 2.5e-3) == pytest.approx(4.25e-3)
    assert tick.stalled_end(3.25e-3, 3.5e-3) == pytest.approx(8.25e-3)
    # a call whose bytes alone take past the dead time ends on the tick after its fast end
    assert tick.stalled_end(0.0, 9e-3) == pytest.approx(12.25e-3)
    with pytest.raises(ValueError):
        TimerTick(period_s=4e-3, offset_s=5e-3)
    with pytest.raises(ValueError):
        TimerTick(period_s=4e-3, stall_together=1.5)


def test_how_the_ranks_met_an_all_reduce_sets_its_chance_of_a_stall():
    tick = TimerTick(4e-3, together_s=5e-5, stall_together=0.7, stall_apart=0.5, probe_bytes=1e5)
    assert tick.met_chance(1e-5, 0.4, 0.4) == pytest.approx(0.7)  # at the probe's size: the probe's share
    assert tick.met_chance(5e-5, 0.4, 0.4) == pytest.approx(0.5)  # from together_s on: apart
    assert tick.met_chance(1e-3, 0.2, 0.4) == pytest.approx(0.25)  # half as often at this size
    assert tick.met_chance(0.0, 0.9, 0.3) == 1.0  # never over 1
    assert tick.met_chance(0.0, 0.2, 0.0) == pytest.approx(0.7)  # nothing stalled at the probe's size
    assert TimerTick(4e-3).met_chance(0.0, 0.4, 0.4) is None  # not probed: the caller keeps its own
