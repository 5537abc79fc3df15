"""The alpha-beta fit recovers known latency and bandwidth, and weighs every size by relative error."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainsim.calibrate.measure.alphabeta import AlphaBeta, fit_alpha_beta, log_sizes
from trainsim.errors import TrainsimError

SIZES = log_sizes(1024, 1024**3, 4)


@pytest.mark.parametrize(("alpha", "beta"), [(5e-6, 12e9), (2e-3, 0.5e9), (0.0, 25e9), (1.5e-6, 300e9)])
def test_recovers_known_alpha_beta_exactly(alpha, beta):
    times = [alpha + s / beta for s in SIZES]
    fit = fit_alpha_beta(SIZES, times)
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-6, abs=1e-12)
    assert fit.beta_bytes_per_s == pytest.approx(beta, rel=1e-6)
    assert fit.rel_rms < 1e-6
    assert fit.points == len(SIZES)


@settings(max_examples=50, deadline=None)
@given(alpha=st.floats(1e-7, 1e-2), beta=st.floats(1e8, 1e12))
def test_recovers_any_alpha_beta(alpha, beta):
    times = [alpha + s / beta for s in SIZES]
    fit = fit_alpha_beta(SIZES, times)
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-4)
    assert fit.beta_bytes_per_s == pytest.approx(beta, rel=1e-4)


def test_noisy_points_recovered_within_the_noise():
    rng = np.random.default_rng(0)
    alpha, beta = 20e-6, 10e9
    times = [(alpha + s / beta) * (1 + 0.03 * rng.standard_normal()) for s in SIZES]
    fit = fit_alpha_beta(SIZES, times)
    assert fit.alpha_s == pytest.approx(alpha, rel=0.1)
    assert fit.beta_bytes_per_s == pytest.approx(beta, rel=0.1)
    assert 0.005 < fit.rel_rms < 0.08


def test_relative_error_keeps_the_latency_of_small_sizes():
    # An ordinary least-squares fit is decided by the largest times; a 10 % error on the largest point
    # would swamp alpha. On relative error the small sizes still pin alpha.
    alpha, beta = 10e-6, 10e9
    times = [alpha + s / beta for s in SIZES]
    times[-1] *= 1.1
    fit = fit_alpha_beta(SIZES, times)
    assert fit.alpha_s == pytest.approx(alpha, rel=0.1)


def test_bounds_keep_alpha_and_bandwidth_physical():
    # Times that shrink with size (pure noise) must not give a negative latency or bandwidth.
    fit = fit_alpha_beta([1000, 2000, 4000], [3e-6, 2e-6, 1e-6])
    assert fit.alpha_s >= 0 and fit.beta_bytes_per_s > 0


def test_prediction_and_units():
    fit = AlphaBeta(alpha_s=2e-6, beta_bytes_per_s=25e9, rel_rms=0.0, points=2)
    assert fit.time(25e9) == pytest.approx(1.0 + 2e-6)
    assert fit.latency_us == pytest.approx(2.0)
    assert fit.bandwidth_gbps == pytest.approx(25.0)
    assert AlphaBeta.from_json(fit.to_json()) == fit


@pytest.mark.parametrize(
    ("sizes", "times"),
    [([1024], [1e-6]), ([1024, 1024], [1e-6, 2e-6]), ([1024, 2048], [1e-6, 0.0]), ([1024, 2048], [1e-6])],
)
def test_bad_points_are_one_line_errors(sizes, times):
    with pytest.raises(TrainsimError):
        fit_alpha_beta(sizes, times)


def test_log_sizes():
    assert log_sizes(1024, 16384, 4) == [1024, 4096, 16384]
    assert log_sizes(1024, 10000, 4) == [1024, 4096, 10000]
    assert SIZES[0] == 1024 and SIZES[-1] == 1024**3
    with pytest.raises(TrainsimError):
        log_sizes(0, 10)
