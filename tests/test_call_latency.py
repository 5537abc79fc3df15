"""A gloo call's latency as measured: samples per size, bandwidth term out, the mean around its size."""

import pytest

from trainsim.sim.call_latency import MeasuredLatency, cost, from_points


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
