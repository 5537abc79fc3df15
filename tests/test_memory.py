"""The GPU memory timeline: peak, what is held at the peak, running out as a result."""

from trainsim.sim.core.memory import GIB, MemoryTracker


def test_peak_and_categories_at_peak():
    mem = MemoryTracker(capacity=10 * GIB, name="gpu0")
    mem.alloc(0.0, 4 * GIB, "params")
    mem.alloc(1.0, 2 * GIB, "activations")
    mem.alloc(2.0, 1 * GIB, "activations")
    mem.free(3.0, 3 * GIB, "activations")
    mem.alloc(4.0, 2 * GIB, "buffers")  # below the earlier peak: the peak stays where it was
    assert mem.peak == 7 * GIB and mem.peak_time == 2.0
    assert mem.peak_by_category == {"params": 4 * GIB, "activations": 3 * GIB}
    assert mem.in_use == 6 * GIB
    assert [e.in_use / GIB for e in mem.timeline] == [4, 6, 7, 4, 6]
    assert not mem.out_of_memory and mem.oom_message() is None


def test_oom_is_reported_not_raised():
    mem = MemoryTracker(capacity=1 * GIB, name="gpu3")
    mem.alloc(0.0, 1.5 * GIB, "params")
    assert mem.out_of_memory
    assert mem.oom_message() == "gpu3 needs 1.50 GiB, has 1.00 GiB"


def test_free_never_goes_below_what_a_category_holds():
    mem = MemoryTracker(capacity=GIB, record=False)
    mem.alloc(0.0, 100, "input")
    mem.free(1.0, 500, "input")
    mem.free(1.0, 0, "input")
    assert mem.in_use == 0 and mem.timeline == []


def test_byte_seconds_integrate_what_is_held_over_time():
    m = MemoryTracker(capacity=100.0, record=False)
    m.alloc(1.0, 10.0, "params")  # 10 B from t=1
    assert m.byte_seconds(1.0) == 0.0
    m.alloc(3.0, 30.0, "activations")  # 40 B from t=3
    at_3 = m.byte_seconds(3.0)
    assert at_3 == 10 * 2
    m.free(4.0, 30.0, "activations")  # 10 B from t=4
    assert m.byte_seconds(4.0) == 20 + 40 * 1
    assert m.byte_seconds(6.0) == 60 + 10 * 2
    # the average over a window is two readings apart: 40 B for 1 s, then 10 B for 1 s
    assert (m.byte_seconds(5.0) - at_3) / 2 == 25.0
