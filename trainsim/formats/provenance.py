"""Named records a calibration keeps in a workload's provenance (`Workload.provenance`).

``iteration`` (written by `trainsim.calibrate.measure.layer_profile`): per batch size, the whole iteration
without hooks (``plain``) and with them (``hooked``), the layers' sum, the optimizer step and what no layer
accounts for (``unattributed``). ``skipped``: the batch sizes the profile could not run, and why.
``trainsim.workload/1`` files stored each of those points as an unnamed list ``[batch, seconds(, iqr)]``;
reading converts them to the named form that ``trainsim.workload/2`` writes.

``layer_host_s`` (written by the same profile): each layer's host time per phase and batch size, as
``{"forward"|"backward": {layer: [[batch, median_s, iqr_s], ...]}}``; on a GPU, the time its thread took to
dispatch the layer's work (`trainsim.sim.compute.dispatch` reads it).

``rank_step`` (written by `trainsim.calibrate.execute.rank_step`): the whole training step of a pinned CPU
rank, as the runs run it, per batch size. ``trainsim.workload/1`` files stored each point as an unnamed list
``[batch, alone_s, together_s, sigma_log, data_alone_s, data_together_s, data_warm_s, sigma_rank_log]``
(shorter in early files); reading converts it to the named form `trainsim.workload/2` writes.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveInt, model_validator

#: ``provenance.layer_host_s``: phase -> layer name -> [batch, median seconds, iqr seconds] per batch size
LayerHostTimes = dict[Literal["forward", "backward"],
                      dict[str, list[tuple[PositiveInt, NonNegativeFloat, NonNegativeFloat]]]]


class BatchTime(BaseModel):
    """Seconds at one batch size (a median), with its interquartile range where measured."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    batch: int = Field(ge=1)
    s: float
    iqr_s: float | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_v1_list(cls, data):
        if isinstance(data, list | tuple):
            if not 2 <= len(data) <= 3:
                raise ValueError("a /1 point is [batch, seconds] or [batch, seconds, iqr]")
            data = dict(zip(("batch", "s", "iqr_s"), data, strict=False))
        return data


class _ListsRecord(BaseModel):
    """A record of named lists; the words a /1 file described them with (``note``) are dropped."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _drop_v1_note(cls, data):
        if isinstance(data, dict) and "note" in data:  # /1 described its lists in words
            data = {k: v for k, v in data.items() if k != "note"}
        return data


class IterationRecord(_ListsRecord):
    """``provenance.iteration``: plain = layers_sum + optimizer + unattributed (medians); hooked - plain is
    what the per-layer hooks cost. The host's side (``time.perf_counter``; on a GPU, dispatch, not the
    GPU's work): ``plain_host``, the plain iteration's, and ``layers_host_sum``, the layers' in the hooked
    iterations (empty in calibrations that predate them)."""

    plain: list[BatchTime] = Field(default_factory=list)
    hooked: list[BatchTime] = Field(default_factory=list)
    layers_sum: list[BatchTime] = Field(default_factory=list)
    optimizer: list[BatchTime] = Field(default_factory=list)
    unattributed: list[BatchTime] = Field(default_factory=list)
    plain_host: list[BatchTime] = Field(default_factory=list)
    layers_host_sum: list[BatchTime] = Field(default_factory=list)


class SkippedBatch(BaseModel):
    """A batch size the profile did not measure, and why (out of memory, a smaller one did not fit)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    batch: int = Field(ge=1)
    reason: str

#: the order of a ``trainsim.workload/1`` point's entries
POINT_FIELDS_V1 = ("batch", "alone_s", "together_s", "sigma_log", "data_alone_s", "data_together_s",
                   "data_warm_s", "sigma_rank_log")


class RankStepPoint(BaseModel):
    """One batch size: the median step of one pinned rank alone and with every rank computing at once
    (None for one rank), the spread of the step from step to step (sigma of its log, and the part of it
    that is the rank's own), and preparing the step's batch with the executor's default pipeline in the
    loop alone, together, and back to back with nothing in between (None where not measured)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    batch: int = Field(ge=1)
    alone_s: float = Field(ge=0)
    together_s: float | None = Field(default=None, ge=0)
    sigma_log: float = Field(default=0.0, ge=0)
    data_alone_s: float | None = Field(default=None, ge=0)
    data_together_s: float | None = Field(default=None, ge=0)
    data_warm_s: float | None = Field(default=None, ge=0)
    sigma_rank_log: float | None = Field(default=None, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _from_v1_list(cls, data):
        if isinstance(data, list | tuple):
            if len(data) > len(POINT_FIELDS_V1):
                raise ValueError(f"a rank_step point has at most {len(POINT_FIELDS_V1)} entries")
            data = {k: v for k, v in zip(POINT_FIELDS_V1, data, strict=False) if v is not None}
        return data


class RankStepRecord(_ListsRecord):
    """``provenance.rank_step``: how many ranks ran at once, with how many threads each, and the points."""

    ranks: int = Field(default=1, ge=1)
    threads_per_rank: int = Field(default=1, ge=1)
    points: list[RankStepPoint] = Field(default_factory=list)


def rank_step_of(provenance) -> RankStepRecord | None:
    """A workload provenance's rank_step record in the named form (whatever form it was given in)."""
    raw = getattr(provenance, "rank_step", None)
    if raw is None:
        raw = (provenance.model_extra or {}).get("rank_step")
    if raw is None or isinstance(raw, RankStepRecord):
        return raw
    return RankStepRecord.model_validate(raw)
