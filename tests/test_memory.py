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
