"""What a validation produces: one row per variant (predicted, measured, error, speedups), the result of a
whole run with its accuracy figures, and the comparison arithmetic (no simulation, no execution here)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from trainsim.errors import TrainsimError

SCHEMA = "trainsim.validation/1"
RESULT_FILE = "validation.json"
TRACES = "traces"

Progress = Callable[[str], None]


# ---------------------------------------------------------------- the comparison (pure arithmetic)


def percent_error(predicted: float | None, measured: float | None) -> float | None:
    """Signed error of a prediction, in % of the measurement (positive: the simulator is slower)."""
    if predicted is None or measured is None or measured <= 0:
        return None
    return 100.0 * (predicted - measured) / measured


@dataclass
class ValidationRow:
    """One variant, both ways. Times in seconds: the mean over the iterations (what sets samples/s; on a
    gloo box a step is bimodal, fast or held to the next timer tick, and the median jumps between the modes
    as their shares cross one half), with the measured interquartile range as the spread."""

    variant: str
    strategy: str
    ranks: int
    predicted_s: float | None = None
    measured_s: float | None = None
    measured_iqr_s: float | None = None
    measured_iterations_s: list[float] = field(default_factory=list)  # every round's iterations, pooled
    measured_rounds: int = 0
    measured_round_means_s: list[float] = field(default_factory=list)  # each round's mean on its own
    # the measurement's own reproducibility, from two rounds on: the farthest a round's mean lies from the
    # other rounds' (%), and how far apart the rounds put the speedup (pp, each round over the baseline's)
    measured_round_spread_pct: float | None = None
    measured_speedup_range_pp: float | None = None
    predicted_iterations_s: list[float] = field(default_factory=list)  # every round's prediction, pooled
    error_pct: float | None = None
    predicted_speedup: float | None = None  # baseline time / this time, as predicted
    measured_speedup: float | None = None
    speedup_error_pp: float | None = None  # (predicted - measured speedup) x 100 percentage points
    skipped: str | None = None  # this box cannot run it: why
    not_simulated: str | None = None  # the simulator cannot model it: why
    failed: str | None = None  # the real run crashed: the one-line error
    prep_s_per_sample: float | None = None  # this variant's input pipeline measured here (None: the bundle's)
    loader_overlap: dict | None = None  # CPU preload: step and preparation slowdowns, measured here
    codec_s: float | None = None  # CPU ranks: what the DDP comm hook costs per step, measured here
    predicted_breakdown_s: dict = field(default_factory=dict)
    measured_breakdown_s: dict = field(default_factory=dict)
    # peak device memory, the largest rank's: simulated, and measured over the measured iterations (the
    # largest round's) with how (cuda.max_memory_allocated, or a CPU rank's resident-set growth)
    predicted_peak_memory_bytes: int | None = None
    measured_peak_memory_bytes: int | None = None
    memory_measure: str | None = None
    # against cuda.max_memory_allocated, or a mesh CPU rank's allocator peak (cpu.allocator_peak) only
    memory_error_pct: float | None = None
    sim_trace: str | None = None  # relative to the report folder
    real_trace: str | None = None

    @property
    def status(self) -> str:
        if self.skipped:
            return "skipped"
        if self.failed:
            return "failed"
        if self.not_simulated:
            return "not simulated"
        if self.predicted_s is None or self.measured_s is None:
            return "pending"
        return "ok"

    @property
    def reason(self) -> str | None:
        return self.skipped or self.failed or self.not_simulated

    def to_dict(self) -> dict:
        return {**asdict(self), "status": self.status}


def round_spread_pct(means: list[float]) -> float | None:
    """The farthest one round's mean lies from the mean of the other rounds, in % of it (None under two)."""
    if len(means) < 2:
        return None
    return max(abs(100.0 * (m / ((sum(means) - m) / (len(means) - 1)) - 1.0)) for m in means)


def compare(rows: list[ValidationRow], baseline: str | None) -> None:
    """Fill each row's error and its speedups over ``baseline`` (both ways) in place, and how far the rounds
    of the measurement itself lie apart."""
    base = next((r for r in rows if r.variant == baseline), None)
    for row in rows:
        row.error_pct = percent_error(row.predicted_s, row.measured_s)
        row.predicted_speedup = row.measured_speedup = row.speedup_error_pp = None
        row.measured_round_spread_pct = round_spread_pct(row.measured_round_means_s)
        row.measured_speedup_range_pp = None
        if base is None:
            continue
        # round k of the baseline against round k of this variant (a round runs every variant once); a
        # variant that failed in a later round has fewer
        paired = list(zip(base.measured_round_means_s, row.measured_round_means_s, strict=False))
        if len(paired) > 1 and row is not base:
            speedups = [100.0 * b / m for b, m in paired]
            row.measured_speedup_range_pp = max(speedups) - min(speedups)
        if base.predicted_s and row.predicted_s:
            row.predicted_speedup = base.predicted_s / row.predicted_s
        if base.measured_s and row.measured_s:
            row.measured_speedup = base.measured_s / row.measured_s
        if row.predicted_speedup is not None and row.measured_speedup is not None:
            row.speedup_error_pp = 100.0 * (row.predicted_speedup - row.measured_speedup)


def accuracy(rows: list[ValidationRow], baseline: str | None = None) -> dict:
    """The headline figures: median and worst |error|, speedup errors, and speedups on the wrong side of 1."""
    compared = [r for r in rows if r.error_pct is not None]
    speedups = [r for r in compared if r.speedup_error_pp is not None and r.variant != baseline]
    worst = max(compared, key=lambda r: abs(r.error_pct), default=None)
    worst_pp = max(speedups, key=lambda r: abs(r.speedup_error_pp), default=None)

    def wrong_side(r: ValidationRow) -> bool:
        # the prediction says faster (>1) and it is slower, or the reverse; exactly 1.0 counts as either side
        return (r.predicted_speedup - 1.0) * (r.measured_speedup - 1.0) < 0

    memory = [r for r in rows if r.memory_error_pct is not None]
    worst_memory = max(memory, key=lambda r: abs(r.memory_error_pct), default=None)
    spreads = [r.measured_round_spread_pct for r in compared if r.measured_round_spread_pct is not None]
    ranges = [r.measured_speedup_range_pp for r in speedups if r.measured_speedup_range_pp is not None]
    return {
        "compared": len(compared),
        "median_abs_error_pct": statistics.median(abs(r.error_pct) for r in compared) if compared else None,
        "worst_error_pct": worst.error_pct if worst else None,
        "worst_variant": worst.variant if worst else None,
        "speedup_error_pp": {r.variant: r.speedup_error_pp for r in speedups},
        "max_abs_speedup_error_pp": abs(worst_pp.speedup_error_pp) if worst_pp else None,
        "speedups_on_wrong_side": [r.variant for r in speedups if wrong_side(r)],
        # the measurement against itself (two rounds or more): medians over the variants
        "measured_round_spread_pct": statistics.median(spreads) if spreads else None,
        "measured_speedup_range_pp": statistics.median(ranges) if ranges else None,
        # peak GPU memory, simulated vs torch.cuda.max_memory_allocated
        "memory_compared": len(memory),
        "median_abs_memory_error_pct": statistics.median(abs(r.memory_error_pct) for r in memory)
        if memory else None,
        "worst_memory_error_pct": worst_memory.memory_error_pct if worst_memory else None,
        "worst_memory_variant": worst_memory.variant if worst_memory else None,
    }


@dataclass
class ValidationResult:
    scenario: str
    calibration: str
    baseline: str | None
    device: str
    rows: list[ValidationRow]
    notes: list[str] = field(default_factory=list)
    status: str = "complete"  # or "interrupted", "running"

    def accuracy(self) -> dict:
        return accuracy(self.rows, self.baseline)

    def row(self, variant: str) -> ValidationRow:
        return next(r for r in self.rows if r.variant == variant)

    def to_dict(self, *, provenance: dict | None = None) -> dict:
        out = {"schema": SCHEMA, "scenario": self.scenario, "calibration": self.calibration,
               "baseline": self.baseline, "device": self.device, "status": self.status,
               "accuracy": self.accuracy(), "rows": [r.to_dict() for r in self.rows],
               "notes": list(self.notes)}
        if provenance is not None:
            out["provenance"] = provenance
        return out


class ValidationInterrupted(TrainsimError):
    """Ctrl-C during a validation: the rows so far are in ``partial`` (and in the report folder, if any)."""

    def __init__(self, partial: ValidationResult, where: str | None):
        self.partial = partial
        done = sum(r.status != "pending" for r in partial.rows)
        kept = f"; the {done} finished row(s) are in {where}" if where else ""
        super().__init__(f"interrupted{kept}")
