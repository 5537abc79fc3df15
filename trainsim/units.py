"""Plausibility bounds per unit, shared by every file format: the types of the numbers whose unit is in
their field's name (``bucket_cap_mb``, ``memory_gib``, ``bandwidth_gbps``, ``latency_us``; DESIGN: units in
YAML live in the field names) and of a workload's per-layer figures.

A number beyond its unit's bound is not a machine or a model but a unit slip (``bucket_cap_mb: 26214400``,
25 MiB given in bytes) or a typo (FLOPs of 1e308, whose times come out as inf and nan): it is refused with
the unit named, so that every figure reaching the simulator is finite. The bounds are far above any real
value (a DDP bucket of 64 GiB, a link of 1 PB/s, a layer of 1e21 FLOPs per sample).

    bucket_cap_mb: MiB = Field(default=25.0, gt=0)
    memory_gib: GiB | None = Field(default=None, gt=0)

`UNIT_SUFFIXES` maps a field name's ending to its type, so that a test can check every field of the
schemas that names a unit carries its bound (`unbounded_unit_fields`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated

from pydantic import AfterValidator, BaseModel


@dataclass(frozen=True)
class Unit:
    """A unit's largest plausible value, how that bound reads, and what a larger value usually is."""

    name: str
    most: float
    shown: str
    hint: str

    def check(self, value):
        if value is not None and not (abs(value) <= self.most):  # nan too (a model without allow_inf_nan)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"should be a finite number, got {value}")
            raise ValueError(f"should be at most {self.shown}, got {_shown(value)}: {self.hint}")
        return value


MIB_UNIT = Unit("MiB", 64 * 1024, "65536 MiB (64 GiB)", "the field is in MiB, not bytes")
GIB_UNIT = Unit("GiB", 2**20, "1048576 GiB (1 PiB)", "the field is in GiB, not bytes or MiB")
GBPS_UNIT = Unit("GB/s", 1e6, "1e6 GB/s (1 PB/s)", "the field is in GB/s (1e9 bytes/s), not bytes/s")
US_UNIT = Unit("us", 1e6, "1e6 us (1 s)", "the field is in microseconds")
MT_S_UNIT = Unit("MT/s", 1e5, "1e5 MT/s", "the field is in megatransfers per second")
SECONDS_UNIT = Unit("s", 1e6, "1e6 s (11.6 days)", "the field is in seconds")
BYTES_UNIT = Unit("bytes", 2**50, "2^50 bytes (1 PiB)", "no layer holds or moves that much")
FLOPS_UNIT = Unit("FLOPs", 1e21, "1e21 FLOPs", "no layer computes that much per sample")
COUNT_UNIT = Unit("elements", 2**31, "2^31", "no tensor dimension is that large")

MiB = Annotated[float, AfterValidator(MIB_UNIT.check)]
GiB = Annotated[float, AfterValidator(GIB_UNIT.check)]
GBps = Annotated[float, AfterValidator(GBPS_UNIT.check)]
Microseconds = Annotated[float, AfterValidator(US_UNIT.check)]
MTps = Annotated[float, AfterValidator(MT_S_UNIT.check)]
Seconds = Annotated[float, AfterValidator(SECONDS_UNIT.check)]
Bytes = Annotated[int, AfterValidator(BYTES_UNIT.check)]
ByteTraffic = Annotated[float, AfterValidator(BYTES_UNIT.check)]
Flops = Annotated[float, AfterValidator(FLOPS_UNIT.check)]
Dimension = Annotated[int, AfterValidator(COUNT_UNIT.check)]

def _shown(value) -> str:
    """A number as a message gives it: whole numbers whole, others to 6 digits, and an integer too long to
    print (``int('9' * 400)``) by its length."""
    if isinstance(value, int) and abs(value) >= 10**16:
        return f"a number of about {int((value.bit_length() - 1) * math.log10(2)) + 1} digits"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) < 1e16):
        return str(int(value))
    return f"{value:.6g}"


#: a field name's ending -> the unit it promises (checked by `unbounded_unit_fields`)
UNIT_SUFFIXES = {"_mb": MIB_UNIT, "_gib": GIB_UNIT, "_gbps": GBPS_UNIT, "_us": US_UNIT, "_mt_s": MT_S_UNIT,
                 "_s_per_sample": SECONDS_UNIT}


def bounded_by(annotation) -> set[Unit]:
    """The units whose bound an annotation (``MiB | None``, ``GBps``) carries."""
    import typing

    found = set()
    for meta in getattr(annotation, "__metadata__", ()):
        check = getattr(meta, "func", None)
        if getattr(check, "__self__", None) in (*UNIT_SUFFIXES.values(), BYTES_UNIT, FLOPS_UNIT, COUNT_UNIT):
            found.add(check.__self__)
    for arg in typing.get_args(annotation):
        found |= bounded_by(arg)
    return found


def unbounded_unit_fields(models: list[type[BaseModel]]) -> list[str]:
    """``Model.field`` of each field among ``models`` (and the models their fields hold) whose name ends in
    a unit of `UNIT_SUFFIXES` without that unit's bound."""
    import typing

    missing, seen, todo = [], set(), list(models)
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        for name, info in model.model_fields.items():
            annotation = info.rebuild_annotation()
            for suffix, unit in UNIT_SUFFIXES.items():
                if name.endswith(suffix) and unit not in bounded_by(annotation):
                    missing.append(f"{model.__name__}.{name}")
            stack = [annotation]
            while stack:
                kind = stack.pop()
                if isinstance(kind, type) and issubclass(kind, BaseModel):
                    todo.append(kind)
                stack += typing.get_args(kind)
    return sorted(missing)
