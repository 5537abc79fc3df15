"""Choosing the time-vs-batch model: affine unless the data demand a power law."""

import pytest

pytest.importorskip("scipy")

from trainsim.calibrate.measure.time_fit import choose_fit, rel_rms, time_model  # noqa: E402
from trainsim.errors import TrainsimError  # noqa: E402


def test_affine_recovered_from_synthetic_points():
    points = [(b, 2e-4 + 3e-5 * b, 0.0) for b in (1, 4, 16, 64)]
    fit = choose_fit(points)
    assert fit["model"] == "affine"
    assert fit["a"] == pytest.approx(2e-4, rel=1e-6) and fit["b"] == pytest.approx(3e-5, rel=1e-6)
    assert fit["rel_rms"] < 1e-9


def test_power_law_chosen_when_affine_is_poor():
    points = [(b, 1e-5 + 1e-4 * b ** 0.5, 0.0) for b in (1, 2, 4, 8, 16, 32, 64)]
    fit = choose_fit(points)
    assert fit["model"] == "power"
    assert fit["c"] == pytest.approx(0.5, rel=1e-3)


def test_power_law_needs_enough_points():
    points = [(b, 1e-5 + 1e-4 * b ** 0.5, 0.0) for b in (1, 16, 64)]
    assert choose_fit(points)["model"] == "affine"


def test_single_point_is_proportional():
    fit = choose_fit([(8, 4e-3, 1e-4)])
    assert fit == {"model": "affine", "a": 0.0, "b": 5e-4, "rel_rms": 0.0}


def test_rel_rms_by_hand():
    assert rel_rms({"model": "affine", "a": 0.0, "b": 1.0}, [(1, 2.0, 0.0), (2, 1.0, 0.0)]) == \
        pytest.approx(((0.5 ** 2 + 1.0) / 2) ** 0.5)


def test_time_model_interpolates_points_and_extrapolates_fit():
    model = time_model([(4, 0.5, 0.0), (2, 0.3, 0.0)])
    assert model.points[0][0] == 2
    assert model.at(3) == pytest.approx(0.4)
    assert model.at(8) == pytest.approx(0.9)  # affine slope 0.1 per sample


def test_no_points_is_an_error():
    with pytest.raises(TrainsimError):
        choose_fit([])
