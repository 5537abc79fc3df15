"""Fused attention's figures fitted on published per-kernel measurements (`attention.fused_seconds`).

A row is one attention call as its source benchmarked it: GPU, pass (forward or backward), causal mask or
not, head dimension, sequence length, batch and heads, and the TFLOP/s it reached, with FLOPs counted as
FlashAttention's benchmarks count them (forward ``4 b h s^2 d``, halved under a causal mask; backward 2.5x
forward). `fit_attention` finds, per pass, the efficiency (fraction of the 16-bit tensor-core peak) and the
per-block cost in keys (`attention.fused_seconds`) that best reproduce a GPU's rows (least squares on the
log of the ratio), and one causal per-block cost shared by both passes (only forward rows carry a mask in
the evidence). `held_out_errors` refits with each head dimension left out and predicts it, then predicts the
rows of every other source with the figures of the fitting source: how the figures do on calls they were not
fitted on. Reading the data file is the caller's business (sim/ reads no file).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainsim.sim.core.devices import DeviceSpec

from .attention import fused_seconds
from .hardware import matrix_peak, require
from .specs import Attention

PASSES = ("forward", "backward")


@dataclass(frozen=True)
class AttentionRow:
    """One published measurement of a fused attention call."""

    source: str
    device: str
    backward: bool
    causal: bool
    head_dim: int
    seq_len: int
    batch: int
    heads: int
    tflops: float

    def spec(self) -> Attention:
        return Attention(batch=self.batch, heads=self.heads, q_len=self.seq_len, kv_len=self.seq_len,
                         head_dim=self.head_dim, causal=self.causal, dtype="bf16", backward=self.backward)

    def seconds(self) -> float:
        """The call's measured time, from its TFLOP/s and the benchmark's FLOP count."""
        flops = 4.0 * self.batch * self.heads * self.seq_len ** 2 * self.head_dim
        flops *= (0.5 if self.causal else 1.0) * (2.5 if self.backward else 1.0)
        return flops / (self.tflops * 1e12)


def rows_from(data: dict) -> list[AttentionRow]:
    """The rows of a ``trainsim.kernel-rows/1`` mapping (series of sequence lengths expanded; a series with
    ``tokens`` has ``tokens / seq_len`` samples of ``2048 / head_dim`` heads, FlashAttention's setting)."""
    rows = []
    for series in data["rows"]:
        for seq_len, tflops in zip(series["seq_len"], series["tflops"], strict=True):
            if "tokens" in series:
                batch, heads = series["tokens"] // seq_len, series.get("hidden", 2048) // series["head_dim"]
            else:
                batch, heads = series["batch"], series["heads"]
            rows.append(AttentionRow(series["source"], series["device"], series["pass"] == "backward",
                                     bool(series["causal"]), int(series["head_dim"]), int(seq_len), int(batch),
                                     int(heads), float(tflops)))
    return rows


def predict(row: AttentionRow, device: DeviceSpec, figures: dict) -> float:
    """The fitted model's time for ``row`` on ``device`` with ``figures`` (as `fit_attention` returns)."""
    direction = "backward" if row.backward else "forward"
    seconds, _ = fused_seconds(row.spec(), int(require(device, "sm_count", "attention")),
                               matrix_peak(device, "bf16"), figures[f"{direction}_efficiency"],
                               figures[f"{direction}_block_keys"], figures["causal_block_keys"])
    return seconds


def fit_attention(rows: list[AttentionRow], device: DeviceSpec) -> dict:
    """Figures (``forward_efficiency``, ``forward_block_keys``, ``backward_efficiency``,
    ``backward_block_keys``, ``causal_block_keys``) fitted on ``rows`` of one GPU; a pass without rows takes
    the other's figures."""
    from scipy.optimize import least_squares  # only when fitting

    have = [p for p in PASSES if any(r.backward == (p == "backward") for r in rows)]
    if not have:
        raise ValueError("no rows to fit")

    def unpack(x) -> dict:
        figures = {"causal_block_keys": x[-1]}
        for i, p in enumerate(have):
            figures[f"{p}_efficiency"], figures[f"{p}_block_keys"] = x[2 * i], x[2 * i + 1]
        for p in PASSES:
            if p not in have:
                figures[f"{p}_efficiency"] = figures[f"{have[0]}_efficiency"]
                figures[f"{p}_block_keys"] = figures[f"{have[0]}_block_keys"]
        return figures

    def residuals(x):
        figures = unpack(x)
        return [math.log(predict(r, device, figures) / r.seconds()) for r in rows]

    start = [0.5, 64.0] * len(have) + [64.0]
    lower = [0.01, 0.0] * len(have) + [0.0]
    upper = [1.0, 8192.0] * len(have) + [8192.0]
    fit = least_squares(residuals, start, bounds=(lower, upper))
    return {k: round(float(v), 4) for k, v in unpack(fit.x).items()}


def errors(rows: list[AttentionRow], device: DeviceSpec, figures: dict) -> list[float]:
    """Predicted over measured time minus one, per row."""
    return [predict(r, device, figures) / r.seconds() - 1.0 for r in rows]


def held_out_errors(rows: list[AttentionRow], device: DeviceSpec, source: str) -> dict:
    """Relative errors on rows the figures were not fitted on: ``head_dim`` (``source``'s rows of each head
    dimension, predicted by figures fitted on its other head dimensions) and ``other_sources`` (every other
    source's rows, predicted by figures fitted on all of ``source``'s)."""
    own = [r for r in rows if r.source == source]
    by_dim = []
    for dim in sorted({r.head_dim for r in own}):
        rest = [r for r in own if r.head_dim != dim]
        by_dim += errors([r for r in own if r.head_dim == dim], device, fit_attention(rest, device))
    others = [r for r in rows if r.source != source]
    return {"head_dim": by_dim,
            "other_sources": errors(others, device, fit_attention(own, device)) if others else []}
