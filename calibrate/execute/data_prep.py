"""The host data path: CPU time to prepare one sample of a zoo model's input, and the cores to do it on.

The transforms are the real work of a typical input pipeline, done on synthetic data so no dataset is
needed:

- images: a stored uint8 HWC image a little larger than the model's input (256 for 224, as ImageNet
  pipelines resize before cropping; +12.5 % in general) -> random crop -> random horizontal flip -> CHW
  float32 in [0, 1] -> per-channel normalise (ImageNet mean/std);
- tokens: a random window of ``block_size + 1`` tokens from a uint16 token stream -> int64 inputs and
  next-token targets (what nanoGPT's loader does).

One sample at a time on one core, as one data-loader worker does it: the simulator spreads samples over
the cores available (``cores_available``).
"""

from __future__ import annotations

import os
import time

import numpy as np

from trainsim.calibrate import zoo
from trainsim.errors import TrainsimError

_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(3, 1, 1)
_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(3, 1, 1)


def cores_available() -> int:
    """CPU cores this process may run on (its affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def source_size(image_size: int) -> int:
    """Side of the stored image that a random crop of ``image_size`` is taken from."""
    return image_size + max(1, image_size // 8)


def prepare_image(stored: np.ndarray, image_size: int, rng: np.random.Generator) -> np.ndarray:
    """Random crop, random flip, to CHW float32, normalise: one training sample from a uint8 HWC image."""
    h, w, _ = stored.shape
    top = int(rng.integers(0, h - image_size + 1))
    left = int(rng.integers(0, w - image_size + 1))
    crop = stored[top:top + image_size, left:left + image_size]
    if rng.random() < 0.5:
        crop = crop[:, ::-1]
    chw = np.ascontiguousarray(crop.transpose(2, 0, 1), dtype=np.float32) * (1.0 / 255.0)
    return (chw - _MEAN) / _STD


def prepare_tokens(stream: np.ndarray, block_size: int,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A random window of the token stream as int64 (inputs, targets)."""
    start = int(rng.integers(0, len(stream) - block_size - 1))
    window = stream[start:start + block_size + 1].astype(np.int64)
    return window[:-1], window[1:]


def measure_prep(name: str, samples: int = 256, *, seed: int = 0, **cfg) -> float:
    """Mean CPU seconds to prepare one sample of zoo model ``name`` (one core, after warm-up).

    Samples are drawn from a small pool of stored inputs (8 images, or a token stream) so the measurement
    reads memory the way a page-cache-resident dataset does.
    """
    if samples < 1:
        raise TrainsimError(f"samples must be >= 1, got {samples}", field="samples")
    spec = zoo.model_spec(name)
    merged = zoo.model_config(name, **cfg)
    rng = np.random.default_rng(seed)
    if spec.kind == "tokens":
        block = zoo.sequence_length(merged)
        stream = rng.integers(0, merged["vocab_size"], size=max(64 * block, 1 << 16), dtype=np.uint16)

        def one(i):
            return prepare_tokens(stream, block, rng)
    else:
        size = merged["image_size"]
        side = source_size(size)
        pool = rng.integers(0, 256, size=(8, side, side, 3), dtype=np.uint8)

        def one(i):
            return prepare_image(pool[i % len(pool)], size, rng)

    for i in range(min(8, samples)):  # warm-up: first-touch page faults, allocator pools
        one(i)
    start = time.perf_counter()
    for i in range(samples):
        one(i)
    return (time.perf_counter() - start) / samples
