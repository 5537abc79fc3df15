"""Classifying time by precedence, and the Result's JSON form."""

import pytest

from trainsim.sim.core.machine import Op
from trainsim.sim.core.result import breakdown, busy_time, classify


def test_classify_precedence_and_idle():
    # class 0 beats class 1 where they overlap; nothing covers 8..10
    intervals = [(0.0, 4.0, 1), (2.0, 6.0, 0), (5.0, 8.0, 1)]
    assert classify(intervals, 0.0, 10.0, 2) == [4.0, 4.0, 2.0]
    # clipped to the window: 3..5.5 is all class 0
    assert classify(intervals, 3.0, 5.5, 2) == pytest.approx([2.5, 0.0, 0.0])
    assert classify(intervals, 5.0, 5.0, 2) == [0.0, 0.0, 0.0]


def test_busy_time_is_the_union():
    assert busy_time([(0, 2), (1, 3), (5, 6)], 0, 10) == 4
    assert busy_time([(0, 2), (1, 3), (5, 6)], 1.5, 5.5) == pytest.approx(2.0)
    assert busy_time([], 0, 1) == 0


def _op(resource, category, start, end, peer=None):
    return Op(
        iteration=0, resource=resource, stream="x", op="x", start=start, end=end, category=category, peer=peer
    )


def test_breakdown_counts_peer_copies_for_both_gpus_and_adds_up():
    ops = [
        _op("gpu0", "compute", 0, 4),
        _op("gpu1", "communication", 3, 6, peer="gpu0"),
        _op("gpu0", "transfer", 5, 7),
        _op("gpu0", "data", 6.5, 9),
        _op("cpu0", None, 0, 10),
    ]
    parts = breakdown(ops, "gpu0", [(0, 5), (5, 10)])
    assert parts == {
        "compute": 4,
        "exposed_communication": 2,
        "exposed_transfer": 1,
        "data_preparation": 2,
        "idle": 1,
    }
    assert sum(parts.values()) == 10
    assert breakdown(ops, "gpu1", [(0, 10)])["exposed_communication"] == 3
