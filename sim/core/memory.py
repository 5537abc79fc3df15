"""GPU memory: an allocation timeline with a peak, and running out as a result rather than a crash.

Allocations are named by category (``params``, ``grads``, ``optimizer_state``, ``activations``,
``activation_grads``, ``output``, ``buckets``, ``input``, ``buffers``, ``workspaces``). A request beyond the
capacity is still granted: the timeline keeps going so the run finishes and the result can say "needs X GiB,
has Y GiB". The tracker also integrates bytes over time (always, without the timeline), so a window's average
use is two readings of `byte_seconds` apart (vDNN reports average use over an iteration, not the peak).
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30


@dataclass(frozen=True)
class MemoryEvent:
    time: float
    in_use: float  # bytes after this event
    delta: float
    category: str


class MemoryTracker:
    """Bytes in use on one device over time; ``peak`` and what was held then (``peak_by_category``)."""

    def __init__(self, capacity: float, name: str = "", *, record: bool = True):
        self.capacity = capacity
        self.name = name
        self.record = record
        self.in_use = 0.0
        self.peak = 0.0
        self.peak_time = 0.0
        self.timeline: list[MemoryEvent] = []
        self._by_category: dict[str, float] = {}
        self._peak_by_category: dict[str, float] = {}
        self._at_peak = False  # the current state is the peak; snapshot it lazily, when it is left
        self._area = 0.0  # byte-seconds held up to ``_area_time``
        self._area_time = 0.0

    def alloc(self, time: float, nbytes: float, category: str) -> None:
        if nbytes <= 0:
            return
        self._change(time, nbytes, category)

    def free(self, time: float, nbytes: float, category: str) -> None:
        if nbytes <= 0:
            return
        held = self._by_category.get(category, 0.0)
        # never below zero for a category (a free of more than held is a modelling slip, not a user error)
        self._change(time, -min(nbytes, held), category)

    def _change(self, time: float, delta: float, category: str) -> None:
        if delta < 0 and self._at_peak:
            self._peak_by_category = {k: v for k, v in self._by_category.items() if v > 0}
            self._at_peak = False
        self._area += self.in_use * (time - self._area_time)
        self._area_time = time
        self.in_use += delta
        self._by_category[category] = self._by_category.get(category, 0.0) + delta
        if self.record:
            self.timeline.append(MemoryEvent(time, self.in_use, delta, category))
        if self.in_use > self.peak * (1 + 1e-12):
            self.peak = self.in_use
            self.peak_time = time
            self._at_peak = True

    def byte_seconds(self, time: float) -> float:
        """Bytes held integrated over time from 0 to ``time`` (no earlier than the last change)."""
        return self._area + self.in_use * (time - self._area_time)

    @property
    def peak_by_category(self) -> dict[str, float]:
        if self._at_peak:
            return {k: v for k, v in self._by_category.items() if v > 0}
        return dict(self._peak_by_category)

    @property
    def out_of_memory(self) -> bool:
        return self.peak > self.capacity

    def oom_message(self) -> str | None:
        if not self.out_of_memory:
            return None
        return f"{self.name or 'device'} needs {self.peak / GIB:.2f} GiB, has {self.capacity / GIB:.2f} GiB"
