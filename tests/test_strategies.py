"""The strategy registry and DDP's gradient buckets."""

import pytest

from trainsim.errors import TrainsimError
from trainsim.sim.strategies.ddp import assign_buckets
from trainsim.sim.strategies.registry import get_strategy, strategies


def test_registry_has_the_base_strategies():
    assert {"single", "ddp", "dp-gpu0", "parameter-server"} <= set(strategies())
    with pytest.raises(TrainsimError, match="unknown strategy 'zero'; valid choices: .*parameter-server"):
        get_strategy("zero")


def test_buckets_fill_in_reverse_layer_order():
    grads = [10, 0, 30, 5, 5, 20]  # layer 1 has no parameters
    assert assign_buckets(grads, cap=25) == [[5, 4], [3, 2], [0]]
    # a small first bucket (PyTorch's first_bucket_cap) goes out early
    assert assign_buckets(grads, cap=25, first_cap=1) == [[5], [4, 3, 2], [0]]
    assert assign_buckets([0, 0], cap=1) == []
    assert assign_buckets([7], cap=100) == [[0]]
