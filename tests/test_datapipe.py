"""The executor's input pipeline: deterministic samples whoever prepares them, and the prefetcher."""

import threading
import time

import pytest

torch = pytest.importorskip("torch")

from trainsim.calibrate.execute.config import DataConfig  # noqa: E402
from trainsim.calibrate.execute.datapipe import Prefetcher, SyntheticSource, loader_batches  # noqa: E402
from trainsim.errors import TrainsimError  # noqa: E402


def test_a_sample_is_the_same_whoever_loads_it():
    source = SyntheticSource("tiny-cnn", {}, DataConfig(augment_repeats=2))
    whole_x, whole_y = source.batch(3, range(8), 8)
    shard_x, shard_y = source.batch(3, range(4, 8), 8)
    assert whole_x.shape == (8, 3, 32, 32) and whole_x.dtype == torch.float32
    assert torch.equal(whole_x[4:], shard_x) and torch.equal(whole_y[4:], shard_y)
    other = SyntheticSource("tiny-cnn", {}, DataConfig(augment_repeats=2))  # e.g. another rank
    assert torch.equal(other.batch(3, range(8), 8)[0], whole_x)
    assert not torch.equal(source.batch(4, range(8), 8)[0], whole_x)  # the next iteration differs


def test_images_are_normalised_crops_of_stored_uint8():
    source = SyntheticSource("tiny-cnn", {"image_size": 16}, DataConfig(source_size=24, compress=True))
    x, y = source.batch(0, range(16), 16)
    assert x.shape == (16, 3, 16, 16)
    assert -3.0 < float(x.min()) < 0.0 < float(x.max()) < 3.0  # (v/255 - mean)/std
    assert int(y.min()) >= 0 and int(y.max()) < 10
    raw = SyntheticSource("tiny-cnn", {"image_size": 16}, DataConfig(source_size=24, compress=False))
    assert torch.equal(raw.batch(0, range(16), 16)[0], x)  # decoding gives back the stored image


def test_source_smaller_than_image_is_an_error():
    with pytest.raises(TrainsimError) as err:
        SyntheticSource("tiny-cnn", {}, DataConfig(source_size=8))
    assert err.value.field == "data.source_size"


def test_tokens_are_shifted_windows():
    source = SyntheticSource("gpt2-small", {"n_layer": 1, "block_size": 16, "vocab_size": 100}, DataConfig())
    x, y = source.batch(0, range(4), 4)
    assert x.shape == y.shape == (4, 16) and x.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_prefetcher_delivers_in_order_with_several_workers():
    with Prefetcher(lambda i: i * i, total=10, depth=4, workers=3) as pf:
        assert [pf.get(i) for i in range(10)] == [i * i for i in range(10)]


def test_prefetcher_stays_within_depth():
    made = []
    lock = threading.Lock()

    def make(i):
        with lock:
            made.append(i)
        return i

    pf = Prefetcher(make, total=50, depth=2, workers=1)
    time.sleep(0.3)
    # one in the consumer's hands is not possible yet: at most depth queued + one being put
    assert len(made) <= 3
    assert pf.get(0) == 0
    pf.close()


def test_prefetcher_raises_the_workers_error():
    def make(i):
        if i == 2:
            raise ValueError("bad sample")
        return i

    with Prefetcher(make, total=5, depth=2) as pf:
        assert pf.get(0) == 0 and pf.get(1) == 1
        with pytest.raises(ValueError, match="bad sample"):
            pf.get(2)


def test_prefetcher_workers_run_on_the_given_cores():
    import os

    cores = tuple(sorted(os.sched_getaffinity(0)))[-1:]
    with Prefetcher(lambda it: tuple(sorted(os.sched_getaffinity(0))), 2, depth=1, cores=cores) as pre:
        assert [pre.get(0), pre.get(1)] == [cores, cores]


def test_loader_processes_hand_back_every_batch_in_order():
    source = SyntheticSource("tiny-cnn", {"image_size": 16}, DataConfig())

    def make(it):
        return source.batch(it, range(4), 4)

    got = list(loader_batches(make, 5, workers=2, pin=False))
    assert len(got) == 5
    for it, (inputs, targets) in enumerate(got):
        want = make(it)
        assert torch.equal(inputs, want[0]) and torch.equal(targets, want[1])
