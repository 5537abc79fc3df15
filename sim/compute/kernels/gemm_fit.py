"""Tensor-core GEMM figures fitted on GEMM kernels timed in real profiler traces.

A row is one GEMM kernel a Kineto trace recorded with its op's shapes: GPU, precision, (batch, m, n, k),
whether the library ran its misaligned variant (the kernel's name says ``align1`` where an operand is not
16-byte aligned) and the kernel's measured time. `fit_tensor_gemm` finds the share of the precision's
tensor-core peak (``tensor_efficiency_<dtype>``) and the factor on it of the misaligned kernels
(``misaligned_<dtype>``) that best reproduce the rows through the kernel model's own GEMM timing
(`matmul.gemm_time`: tiles in waves, split-K, the memory floor), by least squares on the log of predicted
over measured time. `held_out_errors` predicts each shape from figures fitted on the other shapes. Reading
traces is the caller's business (sim/ reads no file).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

from trainsim.sim.core.devices import DeviceSpec

from .matmul import gemm_time
from .params import KernelParams
from .specs import Gemm


@dataclass(frozen=True)
class GemmRow:
    """One GEMM kernel measured in a trace."""

    source: str
    device: str
    dtype: str
    batch: int
    m: int
    n: int
    k: int
    misaligned: bool
    seconds: float

    @property
    def shape(self) -> tuple:
        return self.dtype, self.batch, self.m, self.n, self.k, self.misaligned

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k


def with_figures(params: KernelParams, device: DeviceSpec, dtype: str, figures: dict) -> KernelParams:
    """A copy of ``params`` whose ``device``'s architecture entry holds ``figures`` (name -> value) in the
    matmul class."""
    data = copy.deepcopy(params.data)
    entry = data["architectures"].setdefault(device.architecture, {})
    entry.setdefault("matmul", {}).update(figures)
    return KernelParams(data, file=params.file)


def predict(row: GemmRow, device: DeviceSpec, params: KernelParams) -> float:
    """The kernel model's time for ``row`` under ``params``."""
    spec = Gemm(m=row.m, n=row.n, k=row.k, batch=row.batch, dtype=row.dtype)
    return gemm_time(spec, device, params, misaligned=row.misaligned).seconds


#: the optional figures `fit_tensor_gemm` may fit beside the efficiency and k0: (start, upper bound)
EXTRA = {"call_s": (4e-6, 50e-6), "tile_a": (10.0, 400.0)}


def fit_tensor_gemm(rows: list[GemmRow], device: DeviceSpec, params: KernelParams,
                    extra: tuple[str, ...] = ()) -> dict:
    """``tensor_efficiency_<dtype>``, ``k0_<dtype>`` (a tile's fixed cost in steps of K), where misaligned
    rows exist ``misaligned_<dtype>``, and each of ``extra`` (`EXTRA`: ``call_s``, a call's fixed GPU time;
    ``tile_a``, the operand-load penalty of small tiles) as ``<name>_<dtype>``, fitted on ``rows`` of one
    GPU and one precision, the other figures as ``params`` has them."""
    from scipy.optimize import least_squares  # only when fitting

    dtypes = {r.dtype for r in rows}
    if len(dtypes) != 1:
        raise ValueError(f"rows of one precision, got {sorted(dtypes)}")
    dtype = dtypes.pop()
    names = [f"tensor_efficiency_{dtype}", f"k0_{dtype}"]
    names += [f"misaligned_{dtype}"] if any(r.misaligned for r in rows) else []
    names += [f"{name}_{dtype}" for name in extra]
    start = {f"k0_{dtype}": 32.0, **{f"{name}_{dtype}": EXTRA[name][0] for name in extra}}
    upper = {f"k0_{dtype}": 4096.0, **{f"{name}_{dtype}": EXTRA[name][1] for name in extra}}
    lower = {f"{name}_{dtype}": 0.0 for name in extra}
    scale = [start.get(n, 0.5) for n in names]

    def residuals(x):
        fitted = with_figures(params, device, dtype, dict(zip(names, x * scale, strict=True)))
        return [math.log(predict(r, device, fitted) / r.seconds) for r in rows]

    fit = least_squares(residuals, [1.0] * len(names),
                        bounds=([lower.get(n, 0.01) / s for n, s in zip(names, scale, strict=True)],
                                [upper.get(n, 1.0) / s for n, s in zip(names, scale, strict=True)]))
    return {name: float(f"{v * s:.4g}") for name, v, s in zip(names, fit.x, scale, strict=True)}


def ceiling(rows: list[GemmRow], device: DeviceSpec) -> dict:
    """``ceiling_<dtype>``: the largest share of ``device``'s peak any of ``rows`` (one precision)
    reached, as measured (not fitted)."""
    dtype = rows[0].dtype
    return {f"ceiling_{dtype}": round(max(r.flops / r.seconds for r in rows) / device.peak_flops[dtype], 4)}


def errors(rows: list[GemmRow], device: DeviceSpec, params: KernelParams) -> list[float]:
    """Predicted over measured time minus one, per row."""
    return [predict(r, device, params) / r.seconds - 1.0 for r in rows]


def held_out_errors(rows: list[GemmRow], device: DeviceSpec, params: KernelParams, folds: int = 10,
                    extra: tuple[str, ...] = (), with_ceiling: bool = False) -> list[float]:
    """Every row predicted by figures fitted without its shape: the distinct shapes dealt into ``folds``
    groups, each group's rows predicted from a fit on the others (``with_ceiling``: under the `ceiling`
    of the others)."""
    shapes = sorted({r.shape for r in rows})
    out = []
    for fold in range(min(folds, len(shapes))):
        left = set(shapes[fold::folds])
        rest = [r for r in rows if r.shape not in left]
        top = ceiling(rest, device) if with_ceiling else {}
        figures = {**fit_tensor_gemm(rest, device, with_figures(params, device, rest[0].dtype, top), extra),
                   **top}
        dtype = rest[0].dtype
        scored = [r for r in rows if r.shape in left and (not r.misaligned or f"misaligned_{dtype}" in figures)]
        out += errors(scored, device, with_figures(params, device, dtype, figures))
    return out
