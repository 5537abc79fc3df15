"""The host data path: a real CPU transform per sample, and the cores to run it on."""

import numpy as np
import pytest

pytest.importorskip("torch")

from trainsim.calibrate.execute.data_prep import (
    cores_available,
    measure_prep,
    prepare_image,
    prepare_tokens,
    source_size,
)
from trainsim.errors import TrainsimError  # noqa: E402


def test_prepare_image_crops_flips_and_normalises():
    rng = np.random.default_rng(0)
    stored = np.full((source_size(32), source_size(32), 3), 255, dtype=np.uint8)
    out = prepare_image(stored, 32, rng)
    assert out.shape == (3, 32, 32) and out.dtype == np.float32
    # white pixels normalise to (1 - mean) / std per channel (ImageNet statistics)
    assert out[0, 0, 0] == pytest.approx((1 - 0.485) / 0.229, rel=1e-5)
    assert out[2, 5, 7] == pytest.approx((1 - 0.406) / 0.225, rel=1e-5)


def test_flip_happens_sometimes():
    stored = np.arange(36 * 36 * 3, dtype=np.uint8).reshape(36, 36, 3)
    rng = np.random.default_rng(3)
    # stored values grow along each row, so the order of two neighbours tells whether a crop was flipped
    directions = set()
    for _ in range(40):
        out = prepare_image(stored, 32, rng)
        directions.add(bool(out[0, 0, 1] > out[0, 0, 0]))
    assert directions == {True, False}


def test_prepare_tokens_targets_are_shifted_inputs():
    stream = np.arange(1000, dtype=np.uint16)
    x, y = prepare_tokens(stream, 16, np.random.default_rng(0))
    assert x.dtype == np.int64 and len(x) == len(y) == 16
    assert np.array_equal(x[1:], y[:-1])


def test_measure_prep_is_positive_for_images_and_tokens():
    assert measure_prep("tiny-cnn", 16) > 0
    assert measure_prep("gpt2-small", 16, block_size=32) > 0


def test_cores_and_bad_input():
    assert cores_available() >= 1
    with pytest.raises(TrainsimError):
        measure_prep("tiny-cnn", 0)
    with pytest.raises(TrainsimError):
        measure_prep("lenet", 4)
