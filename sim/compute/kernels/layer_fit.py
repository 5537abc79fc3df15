"""Tensor-core efficiency fitted on measured layers: each layer pass of a calibrated workload is a kernel
group whose shape the workload records (`layers.layer_kernels`), timed on the GPU that measured it.

Evidence: the per-layer forward and backward times of ``trainsim calibrate`` bundles measured on a GPU, in
fp32 and under autocast to bf16 (``benchmarks/data/h200-run3``: ResNet-18, ResNet-50 and GPT-2 small on one
H200). An fp32 run's convolutions are cuDNN's TF32 kernels (``provenance.tf32_cudnn``), its linear layers
fp32 SIMT GEMMs (``tf32_matmul`` off); a bf16 run's are bf16 tensor-core kernels. The figures fitted:

- ``conv.tensor_efficiency_<dtype>`` and ``matmul.tensor_efficiency_<dtype>`` for each tensor-core precision
  the rows run (tf32, bf16): the share of that precision's peak the tiles reach (`matmul`);
- ``matmul.misaligned``: the factor on it where a GEMM's dimensions are not multiples of 16 bytes (GPT-2's
  vocabulary of 50,257 words);

each by least squares on ``log(predicted / measured)`` with a soft-L1 loss (scale 0.1), over the layers of
the conv2d, linear and attention kinds, forward and backward.

The times were taken by CUDA events at each layer's hooks, so a layer whose kernels take less time than the
host takes to dispatch them (and to run the hooks) shows the host's time: the GPU waited. A row's model is
therefore ``max(GPU seconds, floor)``, with one floor per workload file and pass (forward, backward) fitted
with the figures as a nuisance: it stands for that run's hooks and dispatch, not for the GPU, and is not
kept. A figure rests only on the rows above their floor; rows under it bound it from one side.

Held out: the rows of ``HELD_OUT`` (by default ResNet-18 for convolutions, GPT-2's attention projections,
attention core and LM head for matrix products; the figures fitted on ResNet-50 and GPT-2's MLP) are
predicted with the figures fitted without them, their own floors fitted with the figures fixed; the error is
reported for all of them and for those above their floor.

    python benchmarks/fit_layer_figures.py BUNDLE_DIR... [--device h200] [--write]

reads the bundles' workloads (this module reads no file), prints the fit and its held-out error; ``--write``
stores the figures in the shipped `params.json` (`store`: the device's entry, its architecture's and, as a
stated guess for generations without tensor-core rows, the default), with the rows each rests on.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from trainsim.errors import TrainsimError
from trainsim.sim.core.devices import DeviceSpec, get_device

from .layers import LayerUnknown, layer_kernels, runs_as
from .model import kernel_time
from .params import KernelParams, load_params

MATRIX_KINDS = ("conv2d", "linear", "attention", "flash_attention")
#: efficiency grid the matrix kernels are timed on once (the fit interpolates in log space)
GRID = np.exp(np.linspace(np.log(0.01), np.log(1.2), 72))
#: the fixed GPU time of a tensor-core convolution pass (`matmul.tensor_call_seconds`), fitted with them
CALL = ("conv", "tensor_call_s")
CALL_BOUNDS, CALL_START = (0.0, 2e-4), 1e-5
FIGURE_BOUNDS = (0.02, 1.05)
SOFT_L1_SCALE = 0.1


@dataclass
class LayerRow:
    """One measured layer pass: where it comes from, what it runs and how long it took."""

    source: str          # the workload file (as given)
    model: str           # the workload's name
    layer: str
    kind: str
    phase: str           # forward | backward
    batch: int
    measured_s: float
    kernels: list        # specs in the precision they ran in on the device
    device: str
    run_ratio: float = 1.0  # the run's hooked layers summed over its plain iteration (> 1: host-bound hooks)

    @property
    def floor_key(self) -> tuple[str, str]:
        return self.source, self.phase


def _flags(workload) -> dict:
    prov = workload.provenance.model_dump() if workload.provenance else {}
    return {"tf32_conv": bool(prov.get("tf32_cudnn", True)),
            "tf32_matmul": bool(prov.get("tf32_matmul", False))}


def layer_rows(workload, source: str, device: DeviceSpec | None = None) -> list[LayerRow]:
    """The measured matrix layer passes of a calibrated ``workload`` (a `Workload`, read by the caller)."""
    device = device or get_device(workload.provenance.device_spec)
    precision = workload.provenance.precision or {"float32": "fp32", "bfloat16": "bf16",
                                                  "float16": "fp16"}[workload.dtype]
    flags = _flags(workload)
    ratio = _run_ratio(workload)
    rows = []
    for layer in workload.layers:
        if layer.kind not in MATRIX_KINDS:
            continue
        for phase, model in (("forward", layer.forward), ("backward", layer.backward)):
            if model is None:
                continue
            for batch, seconds, _ in model.points:
                try:
                    forward, backward = layer_kernels(layer, int(batch), precision, workload.dtype,
                                                      config=workload.provenance.config)
                except LayerUnknown:
                    continue
                kernels = [runs_as(k, device, **flags) for k in (forward if phase == "forward" else backward)]
                rows.append(LayerRow(source, workload.name, layer.name, layer.kind, phase, int(batch),
                                     float(seconds), kernels, device.name, ratio.get(int(batch), np.inf)))
    return rows


def _run_ratio(workload) -> dict:
    """Per batch, the calibration's hooked layers summed over its plain iteration less the optimizer step
    (``provenance.iteration``); a batch without both is taken as host-bound (inf)."""
    iteration = workload.provenance.iteration
    if iteration is None:
        return {}
    plain = {p.batch: p.s for p in iteration.plain}
    step = {p.batch: p.s for p in iteration.optimizer}
    return {p.batch: p.s / (plain[p.batch] - step.get(p.batch, 0.0)) for p in iteration.layers_sum
            if p.batch in plain and plain[p.batch] > step.get(p.batch, 0.0)}


def figure_of(kernel, device: DeviceSpec) -> tuple[str, str] | None:
    """The (class, figure) a kernel's time depends on among the fitted ones, None for the others."""
    dtype = getattr(kernel, "dtype", "fp32")
    if kernel.kernel_class == "memory" or dtype == "fp32":
        return None
    cls = "conv" if kernel.kernel_class == "conv" else "matmul"
    return cls, f"tensor_efficiency_{dtype}"


def _with(params: KernelParams, device: str, figures: dict) -> KernelParams:
    data = json.loads(json.dumps(params.data))
    entry = data["devices"].setdefault(device, {})
    for (cls, name), value in figures.items():
        entry.setdefault(cls, {})[name] = float(value)
    return KernelParams(data)


class Table:
    """Each row's kernels timed once per grid point of the figure they depend on, so a fit interpolates."""

    def __init__(self, rows: list[LayerRow], params: KernelParams | None = None):
        self.rows = rows
        self.params = params or load_params()
        self.fixed = np.zeros(len(rows))                 # kernels no fitted figure moves
        self.calls = np.zeros(len(rows))                 # tensor-core convolution passes (tensor_call_s)
        self.parts: dict[tuple, list] = defaultdict(list)  # (cls, figure, misaligned) -> [(row, times)]
        by_device = defaultdict(list)
        for i, row in enumerate(rows):
            by_device[row.device].append(i)
        for name, index in by_device.items():
            device = get_device(name)
            for i in index:
                for kernel in rows[i].kernels:
                    which = figure_of(kernel, device)
                    if which is None:
                        self.fixed[i] += kernel_time(kernel, device, self.params).seconds
                        continue
                    times = np.array([kernel_time(kernel, device, _grid(self.params, name, which, g)).seconds
                                      for g in GRID])
                    misaligned = which[0] == "matmul" and _misaligned(kernel)
                    self.parts[(*which, misaligned)].append((i, times))
                    self.calls[i] += which[0] == "conv"
        self.figures = sorted({k[:2] for k in self.parts})
        if self.calls.any():
            self.figures.append(CALL)

    def gpu_seconds(self, figures: dict, misaligned: float = 1.0) -> np.ndarray:
        out = self.fixed + self.calls * figures.get(CALL, 0.0)
        log_grid = np.log(GRID)
        for (cls, name, bad), parts in self.parts.items():
            value = figures[(cls, name)] * (misaligned if bad else 1.0)
            x = np.log(np.clip(value, GRID[0], GRID[-1]))
            for i, times in parts:
                out[i] += np.exp(np.interp(x, log_grid, np.log(times)))
        return out


def _misaligned(kernel) -> bool:
    from .matmul import aligned
    from .specs import Gemm

    return isinstance(kernel, Gemm) and not aligned(kernel)


_GRID_CACHE: dict = {}


def _grid(params: KernelParams, device: str, which: tuple[str, str], value: float) -> KernelParams:
    key = (id(params), device, which, float(value))
    if key not in _GRID_CACHE:
        _GRID_CACHE[key] = _with(params, device, {which: value, ("matmul", "misaligned"): 1.0, CALL: 0.0})
    return _GRID_CACHE[key]


#: a run whose hooked layers sum to at most this much of its plain iteration was GPU-bound under the hooks
GPU_BOUND_RUN = 1.2
#: in a GPU-bound run a layer pass counts from this many times its group's floor; in any run from ALONE times
ABOVE_FLOOR, ALONE = 1.0, 10.0
FLOOR_QUANTILE = 0.1


def floors(rows: list[LayerRow]) -> dict:
    """Per (workload file, pass, layer kind) the time the hooks and the host's dispatch take at least: the
    10th percentile of the group's measured times (its fastest layers, whose GPU work the host outlasts)."""
    groups = defaultdict(list)
    for row in rows:
        groups[(row.source, row.phase, row.kind)].append(row.measured_s)
    return {key: float(np.quantile(values, FLOOR_QUANTILE)) for key, values in groups.items()}


def gpu_bound(rows: list[LayerRow]) -> list[bool]:
    """Which rows the GPU's time sets, not the host's: in a run the hooks did not stretch
    (`LayerRow.run_ratio` at most `GPU_BOUND_RUN`), those at least `ABOVE_FLOOR` times their group's floor;
    in any run, a layer pass at least `ALONE` times it (one long kernel the host cannot outlast)."""
    floor = floors(rows)
    out = []
    for row in rows:
        times = row.measured_s / floor[(row.source, row.phase, row.kind)]
        out.append(times >= ALONE or (row.run_ratio <= GPU_BOUND_RUN and times >= ABOVE_FLOOR))
    return out


@dataclass
class FitResult:
    figures: dict          # (cls, figure) -> value
    misaligned: float | None
    predicted: np.ndarray  # per row: GPU seconds
    rows: int              # rows the figures rest on


def fit(table: Table, *, fixed: dict | None = None, fixed_misaligned: float | None = None,
        tied: dict | None = None) -> FitResult:
    """Fit the table's figures (those not in ``fixed`` or ``tied``: figure -> the figure it takes, or a
    number) and the misalignment factor (unless given or no row is misaligned) on its rows."""
    from scipy.optimize import least_squares

    fixed = dict(fixed or {})
    tied = dict(tied or {})
    names = [f for f in table.figures if f not in fixed and f not in tied]
    has_bad = any(key[2] for key in table.parts)
    fit_bad = has_bad and fixed_misaligned is None
    measured = np.array([r.measured_s for r in table.rows])

    def unpack(x):
        figures = {**fixed, **dict(zip(names, x[:len(names)], strict=True))}
        for figure, source in tied.items():
            figures[figure] = source if isinstance(source, float) else figures[source]
        bad = x[len(names)] if fit_bad else (fixed_misaligned or 1.0)
        return figures, bad

    def residuals(x):
        figures, bad = unpack(x)
        return np.log(table.gpu_seconds(figures, bad) / measured)

    def bound(name, which):
        if name == CALL:
            return {"start": CALL_START, "lower": CALL_BOUNDS[0], "upper": CALL_BOUNDS[1]}[which]
        return {"start": 0.5, "lower": FIGURE_BOUNDS[0], "upper": FIGURE_BOUNDS[1]}[which]

    start = [bound(n, "start") for n in names] + ([0.5] if fit_bad else [])
    if start:
        lower = [bound(n, "lower") for n in names] + ([0.02] if fit_bad else [])
        upper = [bound(n, "upper") for n in names] + ([1.0] if fit_bad else [])
        x = least_squares(residuals, start, bounds=(lower, upper), loss="soft_l1", f_scale=SOFT_L1_SCALE,
                          x_scale=[1e-5 if n == CALL else 0.1 for n in names] + ([0.1] if fit_bad else [])).x
    else:
        x = np.array([])
    figures, bad = unpack(x)
    return FitResult({k: float(v) for k, v in figures.items() if k not in tied},
                     float(bad) if has_bad else None, table.gpu_seconds(figures, bad), len(table.rows))


#: a figure is fitted on at least this many GPU-bound layer passes; with fewer it takes its stand-in
MIN_ROWS = 10


def supported(rows: list[LayerRow], params: KernelParams | None = None) -> tuple[list[LayerRow], dict]:
    """The rows a fit can use and the ties of the figures it cannot fit: a figure with fewer than `MIN_ROWS`
    rows takes its stand-in (`matmul.TENSOR_STAND_IN`'s next precision where that is fitted here, else the
    value ``params`` (default: the shipped ones) hold for the rows' device from other evidence, such as
    Hopper's bf16 GEMMs from XLA's table, else `matmul.ROOFLINE_FRACTION`), and only its misaligned GEMMs'
    rows are kept (they fit ``misaligned`` against the stand-in)."""
    from .matmul import ROOFLINE_FRACTION, TENSOR_STAND_IN

    params = params or load_params()

    count = defaultdict(int)
    uses = []
    for row in rows:
        device = get_device(row.device)
        figures = {f for k in row.kernels if (f := figure_of(k, device)) is not None}
        figures |= {CALL} if any(f[0] == "conv" for f in figures) else set()
        bad = any(_misaligned(k) for k in row.kernels)
        uses.append((figures, bad))
        for f in figures:
            count[f] += 1
    enough = {f for f, n in count.items() if n >= MIN_ROWS}
    tied = {}
    for cls, name in set(count) - enough - {CALL}:
        dtype = TENSOR_STAND_IN.get(name.rsplit("_", 1)[1])
        while dtype and (cls, f"tensor_efficiency_{dtype}") not in enough:
            dtype = TENSOR_STAND_IN.get(dtype)
        tied[(cls, name)] = (cls, f"tensor_efficiency_{dtype}") if dtype else _elsewhere(
            params, rows, cls, name, ROOFLINE_FRACTION)
    kept = [r for r, (figures, bad) in zip(rows, uses, strict=True) if figures <= enough or bad]
    return kept, tied


def _elsewhere(params: KernelParams, rows: list[LayerRow], cls: str, name: str, otherwise: float) -> float:
    """The figure ``cls.name`` as ``params`` hold it for the rows' device where another fit gave it (not the
    default's guess), else ``otherwise``."""
    try:
        value, where = params.figure(get_device(rows[0].device), cls, name)
    except TrainsimError:
        return otherwise
    return value if where != "default" else otherwise


def default_held_out(row: LayerRow) -> bool:
    """The rows held out by default: ResNet's second and fourth stages (``layer2``, ``layer4``: 28x28 and 7x7
    maps of 128-2048 channels), whose shapes the stem, the first and the third stage (56x56 and 14x14) do
    not have; ResNet-18 whole; every other row is fitted."""
    return row.model == "resnet18" or row.layer.startswith(("layer2.", "layer4."))


def split_fit(rows: list[LayerRow], held_out=default_held_out, params: KernelParams | None = None) -> dict:
    """Fit on the GPU-bound rows not ``held_out``, predict the GPU-bound held-out ones with those figures
    (a held-out figure no fitted row has is fitted on nothing: reported as such)."""
    keep = gpu_bound(rows)
    usable, tied = supported([r for r, k in zip(rows, keep, strict=True) if k], params)
    train = [r for r in usable if not held_out(r)]
    test = [r for r in usable if held_out(r)]
    fitted = fit(Table(train, params), tied=tied)
    out = {"fit": fitted, "train": train, "test": test, "unjudged": [], "tied": tied}
    if test:
        table = Table(test, params)
        known = {k: v for k, v in fitted.figures.items() if k in table.figures}
        out["unjudged"] = [f for f in table.figures if f not in known and f not in tied]
        out["held"] = fit(table, fixed=known, fixed_misaligned=fitted.misaligned,
                          tied={k: v for k, v in tied.items() if k in table.figures})
    return out


def errors(rows: list[LayerRow], result: FitResult) -> dict:
    """Per (kind, dtype) the relative errors of ``result``'s predictions."""
    measured = np.array([r.measured_s for r in rows])
    rel = result.predicted / measured - 1
    groups = defaultdict(list)
    for i, row in enumerate(rows):
        dtypes = sorted({getattr(k, "dtype", "") for k in row.kernels if k.kernel_class != "memory"})
        groups[(row.kind, "/".join(dtypes))].append(i)
    out = {}
    for key, index in sorted(groups.items()):
        r = rel[np.array(index)]
        out[key] = {"rows": len(index), "median_abs": float(np.median(np.abs(r))),
                    "p10": float(np.quantile(r, 0.1)), "p50": float(np.median(r)),
                    "p90": float(np.quantile(r, 0.9))}
    return out


def evidence_note(rows: list[LayerRow], which: tuple[str, str], table: Table, *, misaligned=False) -> str:
    """Which rows a figure rests on: the workload files and how many of their layer passes."""
    counts = defaultdict(int)
    index = {i for key, parts in table.parts.items() if key[:2] == which and (key[2] or not misaligned)
             for i, _ in parts}
    for i in sorted(index):
        counts[rows[i].source] += 1
    return "; ".join(f"{src} ({n} GPU-bound layer passes)" for src, n in sorted(counts.items()))


def store(data: dict, device: str, architecture: str, figures: dict, notes: dict, held: dict,
          tied: dict | None = None) -> dict:
    """``data`` (a params file's) with the fitted figures in the device's entry, its architecture's and the
    default's (the stated guess for generations without tensor-core rows), the rows behind each, the
    held-out band in ``held_out`` and the ``unfitted`` note replaced."""
    data = json.loads(json.dumps(data))
    for (cls, name), value in figures.items():
        for entry in (data["devices"].setdefault(device, {}),
                      data["architectures"].setdefault(architecture, {}), data["default"]):
            entry.setdefault(cls, {})[name] = float(f"{float(value):.4g}")
        evidence = data["devices"][device].setdefault("tensor_evidence", {})
        evidence[f"{cls}.{name}"] = notes.get((cls, name), "")
    data["held_out"].update({f"tensor.{k}": v for k, v in held.items()})
    data["unfitted"].pop("matmul.tensor_efficiency", None)
    # the notes other fits keep up to date (fit_gemm_table.py, fit_trace_gemms.py) stay theirs
    data["unfitted"].setdefault("tensor_efficiency.other_generations", (
        f"tensor-core efficiencies rest on one GPU ({device}, {architecture}); every other generation takes "
        "the same fractions of its own tensor-core peaks (the default's), a guess until a sweep of its own: "
        "no tensor-core row of another generation is in the evidence"))
    data["unfitted"].setdefault("tensor_efficiency.fp16, fp8", (
        "no fp16 or fp8 rows: fp16 takes bf16's figure (one peak for both since Ampere), fp8 too"))
    from .matmul import ROOFLINE_FRACTION

    for (cls, name), source in sorted((tied or {}).items()):
        if not isinstance(source, tuple) and source != ROOFLINE_FRACTION:
            continue  # fitted on other evidence, which says so itself
        take = f"{source[0]}.{source[1]}" if isinstance(source, tuple) else \
            f"the roofline fraction {source:g} (matmul.ROOFLINE_FRACTION)"
        data["unfitted"][f"{cls}.{name}"] = (
            f"fewer than {MIN_ROWS} GPU-bound layer passes: the bf16 bundles' layers were timed with the "
            "host behind the GPU (their hooked layers sum to 1.2-1.6x the plain iteration, and layers of any "
            f"size take the same ~0.1/0.2 ms), so they only bound it from below; it takes {take}")
    return data
