"""A gloo call's latency as measured: samples per size, bandwidth term out, one draw per call."""

import numpy as np
import pytest

from trainsim.sim.call_latency import MeasuredLatency, draw, from_points


def test_samples_lose_their_bytes_time_and_never_go_negative():
    beta = 1e9  # 1 GB/s: 1 MB takes 1 ms on the wire
    points = [{"bytes": 1000, "samples_s": [1e-4, 5e-3]}, {"bytes": 1_000_000, "samples_s": [0.5e-3, 2e-3]}]
    measured = from_points(points, beta)
    assert measured.sizes == (1000.0, 1_000_000.0)
    assert measured.samples[0] == pytest.approx((1e-4 - 1e-6, 5e-3 - 1e-6))
    assert measured.samples[1] == pytest.approx((0.0, 1e-3))  # faster than the fit's bandwidth: zero


def test_a_call_draws_from_the_size_nearest_its_own():
    measured = MeasuredLatency((1e3, 1e6), ((1e-4,), (4e-3,)))
    rng = np.random.default_rng(0)
    assert draw(measured, rng, 2e3) == 1e-4
    assert draw(measured, rng, 5e5) == 4e-3  # nearer 1 MB than 1 KB on a log scale
    assert draw(measured, rng, 1e9) == 4e-3
    assert draw(2.5e-3, rng, 1e6) == 2.5e-3  # a plain number (an old bundle's alpha) is charged as it is


def test_draws_follow_the_measured_mix():
    slow, fast = 5e-3, 2e-4
    measured = MeasuredLatency((1e5,), ((fast,) * 7 + (slow,) * 3,))
    rng = np.random.default_rng(1)
    drawn = np.array([measured.draw(rng, 1e5) for _ in range(4000)])
    assert set(drawn) == {fast, slow}
    assert np.mean(drawn == slow) == pytest.approx(0.3, abs=0.03)
    assert np.median(drawn) == fast and measured.mean(1e5) == pytest.approx(0.7 * fast + 0.3 * slow)


def test_no_samples_no_measured_latency():
    assert from_points([{"bytes": 1000, "time_s": 1e-3}], 1e9) is None
    assert from_points([{"bytes": 1000, "samples_s": []}], 1e9) is None
    with pytest.raises(ValueError, match="samples"):
        MeasuredLatency((1e3,), ((),))
