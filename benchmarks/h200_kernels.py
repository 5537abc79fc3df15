"""The kernel model against the kernel sweeps of a lent H200 (issue 42): held out, then Hopper's tensor-core
GEMM figures fitted on two sweeps and judged on the third.

    python benchmarks/h200_kernels.py [--write]

Reads ``benchmarks/data/h200-kernels/sweep{1,2,3}/kernels.csv`` and ``attention/`` (``trainsim calibrate
kernels`` on one H200, 2026-11-28; each folder's provenance.json gives the command, driver, CUDA, cuDNN and
torch; sweep 1:
named shapes at batch 64, sweep 2: 80 drawn GEMM shapes (seed 1), fp16 and batch 32, sweep 3: 120 drawn
GEMM shapes (seed 2) and batch 128). Each row is one kernel's GPU time per call, back to back in a CUDA
graph, with the kernels it launched. Prints:

1. **held out**: the shipped figures against every row (the attention, memory-bound and fp32 rows were never
   fitted on; the tensor-core GEMMs and convolutions were, and section 2 and 3 hold them out), per kernel
   class, precision and pass: median |predicted / measured - 1| and the signed 10th/50th/90th percentiles.
   Sweeps 1-2 timed unfused attention through SDPA's math backend ("SDPA math": it casts 16-bit inputs to
   fp32 and runs SIMT GEMMs); ``attention/`` times it written out, as the model's unfused path is;
2. **the H200's own tensor-core GEMM figures**: per precision, the figures `fit_gemm_table.py` fits (share
   of peak, a tile's K prologue, the small-tile penalty, a call's fixed GPU time, under the measured
   ceiling) on sweeps 1 and 2's GEMMs of that precision, the tile set chosen the same way, judged on sweep
   3's drawn shapes (never fitted on), against Hopper's figures; and XLA's H100 rows under them, how far
   the two Hoppers' sources agree (the H100 keeps Hopper's figures, fitted on XLA's table).

3. **tensor-core convolutions**: the implicit GEMM's share of the TF32 and bf16 peaks and the fixed GPU time
   of a pass's layout transforms (`matmul.conv_time`), fitted on sweeps 1 and 2 (batch 64 and 32) and
   judged on sweep 3 (batch 128), beside the shipped figures (fitted on all three);
4. the same convolutions timed again with cuDNN's heuristics (``heuristic-b*``) over benchmark mode;
5. **the H200's memory-bound figures**: the elementwise kernels' share of the bandwidth and softmax's passes
   and work per value (short rows, and more for the long rows' block kernel) fitted on sweeps 1-2's rows of
   16 Mi and 256 Mi values, judged on those of 64 Mi (and, outside what the model holds, on the smaller ones:
   L2-resident between the sweep's calls, and the GPU's fixed time per kernel).
6. **the causal mask**: the written-out unfused attention with and without it differs by one kernel,
   ``masked_fill`` with the mask broadcast over every head, which PyTorch runs unvectorised; its share of
   the bandwidth (`memory_bound`'s ``strided``) fitted on the 16-bit pairs at 512 and 2,048 tokens, judged
   on the others, and for fp32 on every other mask kernel of the GPT-2 step traced on the H200.
7. **the tensor-core GEMMs' memory floor**: the share of the bandwidth a tensor-core GEMM (1x1 convolutions
   run as one included) streams its operands at where memory bounds it, fitted on sweeps 1-2, judged on
   sweep 3 and on XLA's H100 rows.

``--write`` stores the GEMM figures fitted on all three sweeps as the H200's own (its device entry in the
shipped params.json, with its tensor tiles): a device's own figures come before its architecture's; its
memory floor fitted on all three; the convolution figures fitted on all three as the H200's, Hopper's and
the default's; the memory-bound figures fitted on all the sizes of 16 Mi values or more as the H200's; and
the mask's shares fitted on every pair and every traced fp32 mask as the default's (no other GPU has such
rows). Takes about a minute.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fit_gemm_table as table  # noqa: E402  (the same fitter, tile candidates and write-out)

from trainsim.sim.compute.kernels import gemm_fit  # noqa: E402
from trainsim.sim.compute.kernels.dataset import read_rows  # noqa: E402
from trainsim.sim.compute.kernels.model import kernel_time  # noqa: E402
from trainsim.sim.compute.kernels.params import PARAMS_FILE, load_params  # noqa: E402
from trainsim.sim.compute.kernels.specs import Gemm, Streaming  # noqa: E402
from trainsim.sim.core.devices import get_device  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SWEEPS = ROOT / "benchmarks" / "data" / "h200-kernels"
TENSOR = ("tf32", "bf16", "fp16", "fp8")


def sweep_rows(number: int):
    path = SWEEPS / f"sweep{number}" / "kernels.csv"
    return read_rows(path, shown=f"sweep{number}")


def _pass(row) -> str:
    spec = row.spec
    if row.kernel_class == "conv":
        return spec.pass_
    if row.kernel_class == "attention":
        how = " fused" if spec.fused else (" unfused" if row.source == "attention" else " SDPA math")
        return ("backward" if spec.backward else "forward") + how
    return ""


def _stats(errs) -> str:
    e = np.asarray(errs)
    return (f"rows {len(e):4d}  median |error| {np.median(abs(e)) * 100:6.1f} %  "
            f"p10 {np.quantile(e, .1) * 100:+7.1f} %  p50 {np.median(e) * 100:+7.1f} %  "
            f"p90 {np.quantile(e, .9) * 100:+7.1f} %")


def held_out(rows) -> None:
    print("1. held out: the shipped figures against every sweep row (GPU time per call)")
    groups, classes = defaultdict(list), defaultdict(list)
    for row in rows:
        error = kernel_time(row.spec, row.device).seconds / row.latency_s - 1
        groups[(row.kernel_class, row.dtype, _pass(row))].append(error)
        if not _pass(row).endswith("SDPA math"):  # another path than the model's unfused one
            classes[row.kernel_class].append(error)
    for (cls, dtype, how), errs in sorted(groups.items()):
        print(f"  {cls:11s} {dtype:5s} {how:16s} {_stats(errs)}")
    for cls, errs in sorted(classes.items()):
        print(f"  {cls:11s} all   {'':16s} {_stats(errs)}")


def gemm_series(rows) -> dict:
    """Tensor-core GEMM rows by (device, dtype), misaligned where the library ran its align1 kernels."""
    out = defaultdict(list)
    for r in rows:
        if r.kernel_class == "matmul" and r.dtype in TENSOR:
            s = r.spec
            misaligned = any("align1" in k for k in r.kernels)
            out[(r.device, s.dtype)].append(gemm_fit.GemmRow(
                r.source, r.device, s.dtype, s.batch, s.m, s.n, s.k, misaligned, r.latency_s))
    return dict(out)


def without_own_fit(params):
    """``params`` without the H200's own tensor-core GEMM figures and tiles (what ``--write`` stores), so
    that a refit starts from Hopper's."""
    data = copy.deepcopy(params.data)
    entry = data["devices"].get("h200", {})
    entry.get("tiles", {}).pop("tensor", None)
    for name in list(entry.get("matmul", {})):
        if name.rsplit("_", 1)[-1] in TENSOR:
            entry["matmul"].pop(name)
    return type(params)(data, file=params.file)


def without_own_streaming(params):
    """``params`` without the H200's own memory-bound figures (what ``--write`` stores)."""
    data = copy.deepcopy(params.data)
    for cls in STREAMING:
        data["devices"].get("h200", {}).pop(cls, None)
    return type(params)(data, file=params.file)


def _band(errs, how: str) -> dict:
    return {"how": how, "median_abs": round(float(np.median(abs(errs))), 4),
            "p10": round(float(np.quantile(errs, .1)), 4), "p50": round(float(np.median(errs)), 4),
            "p90": round(float(np.quantile(errs, .9)), 4), "rows": len(errs)}


def refit(fit_rows, judged_rows, title: str, shipped=None) -> tuple:
    """The H200's tensor-core GEMM figures and tiles fitted on ``fit_rows``'s GEMMs (`fit_gemm_table`'s
    fitter, starting from Hopper's other figures); the errors before and after on ``judged_rows``' GEMMs
    and on XLA's H100 rows (which keep Hopper's figures); the tiles, the figures, the rows per precision
    and the band of the judged errors per precision."""
    shipped = shipped or load_params()
    base = table.without_fit(without_own_fit(shipped), ["hopper"])
    name, tiles, figures, fitted = table.fit_architecture(gemm_series(fit_rows), "hopper", base)
    judged, bands = gemm_series(judged_rows), {}
    print(f"2. H200 tensor-core GEMMs fitted on sweeps {title}: tiles {name} {tiles}")
    for dtype, figs in sorted(figures.items()):
        print(f"  {dtype}: " + ", ".join(f"{k} {v:.4g}" for k, v in sorted(figs.items())))
    for (device, dtype), rows in sorted(judged.items()):
        spec = get_device(device)
        hopper = without_own_fit(shipped)  # what the H200 takes without figures of its own: Hopper's (XLA)
        print(f"  {dtype:5s} sweep 3  Hopper's    {_stats(gemm_fit.errors(rows, spec, hopper))}")
        errs = np.array(gemm_fit.errors(rows, spec, fitted))
        print(f"  {dtype:5s} sweep 3  fitted {title:4s} {_stats(errs)}")
        bands[dtype] = _band(errs, f"fitted on {title}, judged on sweep 3's drawn shapes")
    xla = {key: rows for key, rows in table.series().items() if key[0] == "h100-sxm"}
    for (device, dtype), rows in sorted(xla.items()):
        spec = get_device(device)
        print(f"  {dtype:5s} XLA's H100 under the H200's refit "
              f"{_stats(gemm_fit.errors(rows, spec, fitted))}")
    counts = {dtype: len(r) for (_, dtype), r in gemm_series(fit_rows).items()}
    return tiles, figures, counts, bands


def write(tiles, figures, rows: dict, held_out: dict) -> None:
    """The H200's own tensor-core GEMM figures and tiles in the shipped params.json, with their evidence
    and ``held_out``: the bands of the fit on sweeps 1-2 judged on sweep 3, which its GEMM estimates carry."""
    stored = json.loads(PARAMS_FILE.read_text())
    entry = stored["devices"].setdefault("h200", {})
    entry.setdefault("tiles", {})["tensor"] = tiles
    bands = entry.setdefault("held_out", {})
    bands.update({f"tensor.matmul.{dtype}": band for dtype, band in held_out.items()})
    matmul = entry.setdefault("matmul", {})
    notes = entry.setdefault("tensor_evidence", {})
    for dtype, figs in figures.items():
        matmul.update(figs)
        for name in figs:
            notes[f"matmul.{name}"] = (f"benchmarks/data/h200-kernels, sweeps 1-3 ({rows[dtype]} {dtype} "
                                       f"GEMM kernels; python benchmarks/h200_kernels.py --write)")
    PARAMS_FILE.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
    print(f"wrote the H200's tensor-core GEMM figures ({', '.join(sorted(figures))}) to {PARAMS_FILE.name}")


CONV_FIGURES = ("tensor_efficiency_tf32", "tensor_efficiency_bf16", "tensor_call_s")
CONV_START = {"tensor_efficiency_tf32": 0.5, "tensor_efficiency_bf16": 0.5, "tensor_call_s": 1e-5}
CONV_BOUNDS = {"tensor_efficiency_tf32": (0.02, 1.05), "tensor_efficiency_bf16": (0.02, 1.05),
               "tensor_call_s": (0.0, 2e-4)}


def with_conv(params, figures: dict):
    """``params`` with ``figures`` as the H200's own convolution figures."""
    data = copy.deepcopy(params.data)
    data["devices"].setdefault("h200", {}).setdefault("conv", {}).update(figures)
    return type(params)(data, file=params.file)


def conv_rows(rows):
    return [r for r in rows if r.kernel_class == "conv" and r.dtype != "fp32"]


def fit_conv(rows, params) -> dict:
    """The tensor-core convolution figures (`CONV_FIGURES`: the implicit GEMM's share of the TF32 and bf16
    peaks, the fixed GPU time of a pass's layout transforms) that best reproduce ``rows`` (least squares on
    log(predicted / measured), soft-L1 at 0.1, as the other fits), the rest of ``params`` as it is; fp16
    takes bf16's figure."""
    from scipy.optimize import least_squares  # only when fitting

    scale = np.array([CONV_START[n] for n in CONV_FIGURES])

    def residuals(x):
        fitted = with_conv(params, dict(zip(CONV_FIGURES, x * scale, strict=True)))
        return [np.log(kernel_time(r.spec, r.device, fitted).seconds / r.latency_s) for r in rows]

    lower = [CONV_BOUNDS[n][0] / s for n, s in zip(CONV_FIGURES, scale, strict=True)]
    upper = [CONV_BOUNDS[n][1] / s for n, s in zip(CONV_FIGURES, scale, strict=True)]
    fit = least_squares(residuals, np.ones(len(CONV_FIGURES)), bounds=(lower, upper), loss="soft_l1",
                        f_scale=0.1)
    return {n: float(f"{v * s:.4g}") for n, v, s in zip(CONV_FIGURES, fit.x, scale, strict=True)}


def refit_conv(fit_rows, judged_rows, params, title: str) -> tuple[dict, dict]:
    """The convolution figures fitted on ``fit_rows``; before and after on ``judged_rows``, per precision;
    and the band of the errors after, per precision (``held_out`` bands of params.json)."""
    figures, bands = fit_conv(conv_rows(fit_rows), params), {}
    fitted = with_conv(params, figures)
    print(f"3. H200 tensor-core convolutions fitted on {title}: "
          + ", ".join(f"{k} {v:.4g}" for k, v in figures.items()))
    for dtype in ("tf32", "bf16"):
        rows = [r for r in conv_rows(judged_rows) if r.dtype == dtype]
        for label, p in (("shipped (fitted on it too)", params), (f"fitted on {title}", fitted)):
            errs = np.array([kernel_time(r.spec, r.device, p).seconds / r.latency_s - 1 for r in rows])
            print(f"  {dtype:5s} sweep 3, batch 128, {label} {_stats(errs)}")
        bands[dtype] = {"how": "fitted on sweeps 1-2 (batch 32, 64), judged on sweep 3 (batch 128)",
                        "median_abs": round(float(np.median(abs(errs))), 4),
                        "p10": round(float(np.quantile(errs, .1)), 4),
                        "p50": round(float(np.median(errs)), 4),
                        "p90": round(float(np.quantile(errs, .9)), 4), "rows": len(errs)}
    return figures, bands


def write_conv(figures: dict, rows: int, bands: dict) -> None:
    """The convolution figures as the H200's, Hopper's and (a stated guess for other generations) the
    default's, as `fit_layer_figures.py` stored its layer fit before; ``bands``: the held-out error range
    per precision every tensor-core convolution estimate carries."""
    stored = json.loads(PARAMS_FILE.read_text())
    for dtype, band in bands.items():
        stored["held_out"][f"tensor.conv2d.{dtype}"] = band
    note = (f"benchmarks/data/h200-kernels, sweeps 1-3 ({rows} tensor-core convolution kernels; "
            f"python benchmarks/h200_kernels.py --write)")
    for entry in (stored["devices"]["h200"], stored["architectures"]["hopper"], stored["default"]):
        entry.setdefault("conv", {}).update(figures)
    notes = stored["devices"]["h200"].setdefault("tensor_evidence", {})
    notes.update({f"conv.{name}": note for name in figures})
    stored.get("unfitted", {}).pop("conv.tensor_efficiency_bf16", None)  # fitted here now
    PARAMS_FILE.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
    print(f"wrote the tensor-core convolution figures ({', '.join(figures)}) to {PARAMS_FILE.name}")


#: memory-bound figures the H200's own rows fit (class -> names), in this order: the elementwise kernels'
#: share of the bandwidth first, which the norms and softmax stream at
#: (layer norms are left out: fitted on the H200's rows they came out no better on those held out, 11.7 %
#: against 11.5 %)
STREAMING = {"elementwise": ("efficiency",),
             "softmax": ("long_row_passes", "flops_per_element", "long_row_flops_per_element")}
STREAMING_START = {"efficiency": 0.8, "long_row_passes": 1.2, "flops_per_element": 10.0,
                   "long_row_flops_per_element": 50.0}
STREAMING_BOUNDS = {"efficiency": (0.05, 1.2), "long_row_passes": (1.0, 6.0),
                    "flops_per_element": (0.0, 1000.0), "long_row_flops_per_element": (0.0, 1000.0)}
#: the fewest values a memory-bound row is fitted and judged on: smaller tensors stay in the 60 MB L2
#: between the sweep's back-to-back calls, and the smallest take the GPU's fixed time per kernel
STREAMING_MIN = 1 << 24


def with_device(params, cls: str, figures: dict):
    """``params`` with ``figures`` as the H200's own in class ``cls``."""
    data = copy.deepcopy(params.data)
    data["devices"].setdefault("h200", {}).setdefault(cls, {}).update(figures)
    return type(params)(data, file=params.file)


def fit_streaming(rows, params) -> tuple[dict, object]:
    """The H200's memory-bound figures (`STREAMING`) fitted on ``rows`` of at least `STREAMING_MIN` values
    (least squares on log(predicted / measured), soft-L1 at 0.1), class by class; the figures and the
    params holding them."""
    from scipy.optimize import least_squares  # only when fitting

    figures = {}
    for cls, names in STREAMING.items():
        mine = [r for r in rows if r.kernel_class == cls and r.spec.elements >= STREAMING_MIN]
        scale = np.array([STREAMING_START[n] for n in names])

        def residuals(x, cls=cls, names=names, mine=mine, scale=scale, base=params):
            fitted = with_device(base, cls, dict(zip(names, x * scale, strict=True)))
            return [np.log(kernel_time(r.spec, r.device, fitted).seconds / r.latency_s) for r in mine]

        bounds = ([STREAMING_BOUNDS[n][0] / s for n, s in zip(names, scale, strict=True)],
                  [STREAMING_BOUNDS[n][1] / s for n, s in zip(names, scale, strict=True)])
        fit = least_squares(residuals, np.ones(len(names)), bounds=bounds, loss="soft_l1", f_scale=0.1)
        figures[cls] = {n: float(f"{v * s:.4g}") for n, v, s in zip(names, fit.x, scale, strict=True)}
        params = with_device(params, cls, figures[cls])
    return figures, params


def refit_streaming(rows, params, title: str) -> tuple[dict, dict]:
    """Memory-bound figures fitted on the rows of 16 Mi and 256 Mi values, judged on those of 64 Mi (and,
    outside what the model holds, on the smaller ones); the figures and the band of the judged errors."""
    def size(r, which):
        return r.spec.elements in which

    fit_rows = [r for r in rows if size(r, (1 << 24, 1 << 28))]
    figures, fitted = fit_streaming(fit_rows, params)
    print(f"5. H200 memory-bound figures fitted on {title} (16 Mi and 256 Mi values): "
          + "; ".join(f"{c} " + ", ".join(f"{k} {v:.4g}" for k, v in f.items()) for c, f in figures.items()))
    bands = {}
    for cls in STREAMING:
        for label, which in (("64 Mi values", (1 << 26,)), ("256 Ki-4 Mi", (1 << 18, 1 << 20, 1 << 22))):
            judged = [r for r in rows if r.kernel_class == cls and size(r, which)]
            before = [kernel_time(r.spec, r.device, params).seconds / r.latency_s - 1 for r in judged]
            after = np.array([kernel_time(r.spec, r.device, fitted).seconds / r.latency_s - 1
                              for r in judged])
            print(f"  {cls:11s} {label:13s} shared figures {_stats(before)}")
            print(f"  {cls:11s} {label:13s} fitted         {_stats(after)}")
            if which == (1 << 26,):
                bands[cls] = after
    return figures, bands


def warp_softmax_limit(rows) -> int | None:
    """The longest row the kernels ran one warp per row for (``softmax_warp_forward``), where every row
    longer ran the block-per-row kernel (``cunn_SoftMaxForward``): the softmax's ``long_row``, read off the
    kernel names of the softmax rows and of the unfused attention's (rows of ``kv_len``)."""
    warp, block = [], []
    for r in rows:
        length = r.spec.kv_len if r.kernel_class == "attention" else getattr(r.spec, "row", None)
        if r.kernel_class not in ("softmax", "attention") or not length:
            continue
        if any("softmax_warp_forward" in k for k in r.kernels):
            warp.append(length)
        elif any("SoftMaxForward" in k for k in r.kernels):
            block.append(length)
    if warp and (not block or max(warp) < min(block)):
        return max(warp)
    return None


def write_streaming(figures: dict, rows: int, long_row: int | None = None) -> None:
    """The memory-bound figures as the H200's own, with their evidence; ``long_row``: where its softmax
    switches to the block-per-row kernel (`warp_softmax_limit`)."""
    stored = json.loads(PARAMS_FILE.read_text())
    entry = stored["devices"]["h200"]
    notes = entry.setdefault("tensor_evidence", {})
    if long_row:
        entry.setdefault("softmax", {})["long_row"] = long_row
        notes["softmax.long_row"] = ("benchmarks/data/h200-kernels: the longest softmax row run by "
                                     "softmax_warp_forward (the unfused attention's at 2,048), every longer "
                                     "one by cunn_SoftMaxForward")
    for cls, figs in figures.items():
        entry.setdefault(cls, {}).update(figs)
        note = (f"benchmarks/data/h200-kernels, sweeps 1-2 ({rows} memory-bound kernels of 16 Mi values or "
                f"more; python benchmarks/h200_kernels.py --write)")
        notes.update({f"{cls}.{name}": note for name in figs})
    PARAMS_FILE.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
    print(f"wrote the H200's memory-bound figures ({', '.join(figures)}) to {PARAMS_FILE.name}")


#: the unfused attention rows the causal mask's figure is fitted on (sequence lengths); the others judge it
MASK_FIT_LENGTHS = (512, 2048)


def mask_pairs(rows) -> list[tuple]:
    """(causal row, the same call without the mask) of the written-out unfused attention: the two differ by
    one kernel, ``masked_fill`` with the mask broadcast over every head (their kernel names show it, forward
    and backward), so the difference of their times is that kernel's."""
    def key(r):
        s = r.spec
        return r.dtype, s.batch, s.heads, s.q_len, s.kv_len, s.head_dim, s.backward

    unfused = [r for r in rows if r.kernel_class == "attention" and not r.spec.fused]
    plain = {key(r): r for r in unfused if not r.spec.causal}
    return [(r, plain[key(r)]) for r in unfused if r.spec.causal and key(r) in plain]


def mask_kernel(causal) -> object:
    """The ``strided`` kernel of a causal row's mask."""
    s = causal.spec
    return Streaming("strided", s.batch * s.heads * s.q_len * s.kv_len, dtype=s.dtype)


#: the GPT-2 step traced on the H200 (fp32, batch 8, 12 heads of 512 tokens): its masks are fp32 rows
GPT2_TRACE = ROOT / "tests" / "data" / "traces-h200" / "gpt2-small-fp32-step.json.gz"
GPT2_SCORES = 8 * 12 * 512 * 512


def with_strided(params, shares: dict):
    """``params`` with ``shares`` ({"efficiency_fp32": ..., "efficiency_16bit": ...}) as the default's."""
    data = copy.deepcopy(params.data)
    data["default"].setdefault("strided", {}).update(shares)
    return type(params)(data, file=params.file)


def share(seconds, spec, device) -> float:
    """The share of ``device``'s bandwidth a strided kernel ``spec`` streamed its bytes at in ``seconds``."""
    return spec.bytes / (seconds * device.memory_bandwidth)


def pair_shares(pairs) -> list[float]:
    return [share(c.latency_s - p.latency_s, mask_kernel(c), get_device(c.device)) for c, p in pairs]


def fp32_masks() -> list[float]:
    """GPU seconds of the fp32 ``masked_fill`` kernels of the traced GPT-2 step (forward and backward, in
    the order they ran): nanoGPT's causal mask broadcast over 8 x 12 score matrices of 512 x 512."""
    from trainsim.formats.kineto import load_traces

    trace = load_traces([GPT2_TRACE])[0]
    return [g.dur for g in sorted(trace.gpu_events, key=lambda g: g.ts) if "masked_fill" in g.name]


def refit_mask(rows, params) -> tuple[dict, int]:
    """Section 6: the causal mask's shares of the bandwidth. 16-bit: per pair, the difference's bytes per
    second, median over the pairs at `MASK_FIT_LENGTHS`, judged on the others (the mask kernel alone, and
    the causal rows whole against the mask streamed as a vectorised elementwise kernel, the model before);
    fp32: the traced GPT-2 step's masks, fitted on every other one and judged on the rest. Returns the
    shares fitted on everything and the rows they rest on."""
    h200 = get_device("h200")
    pairs = mask_pairs(rows)
    fit = [p for p in pairs if p[0].spec.q_len in MASK_FIT_LENGTHS]
    judged = [p for p in pairs if p[0].spec.q_len not in MASK_FIT_LENGTHS]
    spec32 = Streaming("strided", GPT2_SCORES, dtype="fp32")
    masks = fp32_masks()
    shares = {"efficiency_16bit": float(f"{np.median(pair_shares(fit)):.4g}"),
              "efficiency_fp32": float(f"{np.median([share(t, spec32, h200) for t in masks[::2]]):.4g}")}
    fitted = with_strided(params, shares)
    vectorised, _ = params.figure(h200, "elementwise", "efficiency")
    before = with_strided(params, {"efficiency_16bit": vectorised, "efficiency_fp32": vectorised})
    lengths = sorted({p[0].spec.q_len for p in judged})
    print(f"6. the causal mask (masked_fill broadcast over the heads): 16-bit share fitted on the unfused "
          f"attention pairs at {', '.join(map(str, MASK_FIT_LENGTHS))} tokens, judged at "
          f"{', '.join(map(str, lengths))}; fp32 share on every other mask of the traced GPT-2 step, judged "
          f"on the rest: " + ", ".join(f"{k} {v:.4g}" for k, v in shares.items()))
    for backward in (False, True):
        mine = [p for p in judged if p[0].spec.backward == backward]
        how = "backward" if backward else "forward"
        kernel = [kernel_time(mask_kernel(c), c.device, fitted).seconds / (c.latency_s - p.latency_s) - 1
                  for c, p in mine]
        print(f"  mask kernel 16-bit {how:8s} fitted         {_stats(kernel)}")
        for label, used in (("as elementwise", before), ("fitted", fitted)):
            errs = [kernel_time(c.spec, c.device, used).seconds / c.latency_s - 1 for c, _ in mine]
            print(f"  causal rows {how:8s}        {label:14s} {_stats(errs)}")
    for label, used in (("as elementwise", before), ("fitted", fitted)):
        errs = [kernel_time(spec32, h200, used).seconds / t - 1 for t in masks[1::2]]
        print(f"  mask kernel fp32 (GPT-2 step) {label:14s} {_stats(errs)}")
    everything = {"efficiency_16bit": float(f"{np.median(pair_shares(pairs)):.4g}"),
                  "efficiency_fp32": float(f"{np.median([share(t, spec32, h200) for t in masks]):.4g}")}
    return everything, 2 * len(pairs) + len(masks)


def write_mask(shares: dict, rows: int) -> None:
    """The strided kernel's shares fitted on everything, as the default's (the only GPU measured)."""
    stored = json.loads(PARAMS_FILE.read_text())
    stored["default"]["strided"] = {
        **shares, "rows": rows,
        "evidence": ("16-bit: benchmarks/data/h200-kernels/attention, the H200's unfused attention with and "
                     "without its causal mask (bf16 and fp16 pairs); fp32: the masked_fill kernels of "
                     "tests/data/traces-h200/gpt2-small-fp32-step.json.gz (python benchmarks/h200_kernels.py "
                     "--write); the only GPU measured, so every GPU takes them")}
    PARAMS_FILE.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
    print(f"wrote the strided kernel's shares ({', '.join(f'{k} {v:.4g}' for k, v in shares.items())}) "
          f"(the default's) to {PARAMS_FILE.name}")


def tensor_gemm_rows(rows):
    """The tensor-core GEMMs among ``rows``: matrix products and the convolutions cuBLAS runs as one
    (`matmul.runs_as_gemm`)."""
    from trainsim.sim.compute.kernels.matmul import runs_as_gemm

    return [r for r in rows if r.dtype in TENSOR and (
        r.kernel_class == "matmul" or (r.kernel_class == "conv" and runs_as_gemm(r.spec)))]


def with_memory(params, efficiency: float | None):
    """``params`` with ``efficiency`` as the H200's ``tensor_memory_efficiency`` (None: without one)."""
    data = copy.deepcopy(params.data)
    matmul = data["devices"].setdefault("h200", {}).setdefault("matmul", {})
    matmul.pop("tensor_memory_efficiency", None)
    if efficiency is not None:
        matmul["tensor_memory_efficiency"] = efficiency
    return type(params)(data, file=params.file)


def memory_bound(rows, params) -> list:
    """The rows memory bounds on the GPU under ``params``."""
    return [r for r in rows if kernel_time(r.spec, r.device, params).detail.get("gpu_bound") == "memory"]


def fit_memory(rows, params) -> float:
    """``tensor_memory_efficiency`` fitted on ``rows`` (least squares on log(predicted / measured), soft-L1
    at 0.1: the rows memory does not bound give a constant residual)."""
    from scipy.optimize import least_squares  # only when fitting

    def residuals(x):
        fitted = with_memory(params, float(x[0]))
        return [np.log(kernel_time(r.spec, r.device, fitted).seconds / r.latency_s) for r in rows]

    fit = least_squares(residuals, [0.6], bounds=([0.2], [1.0]), loss="soft_l1", f_scale=0.1)
    return float(f"{fit.x[0]:.4g}")


def refit_memory(sweeps: dict, params, floor: float) -> None:
    """Section 7: the tensor-core GEMMs' share of the bandwidth where memory bounds them, fitted on sweeps
    1-2, judged on sweep 3 (GEMMs and convolutions alike: every tensor-core pass streams through it) and on
    XLA's H100 rows (with the figure as the H100's: a cross-check only, the H100 keeps the SIMT one);
    ``floor``: the figure `fit_memory` gave on sweeps 1-2."""
    base = with_memory(params, None)
    fit_rows = tensor_gemm_rows(sweeps[1] + sweeps[2])
    fitted = with_memory(base, floor)
    simt = base.figure(get_device("h200"), "matmul", "memory_efficiency")[0]
    print(f"7. H200 tensor-core GEMMs where memory bounds them, fitted on sweeps 1-2 ({len(fit_rows)} rows): "
          f"tensor_memory_efficiency {floor:.4g} (the SIMT GEMMs' figure it replaces: {simt:.4g})")
    judged = [r for r in sweeps[3] if r.dtype in TENSOR and r.kernel_class in ("matmul", "conv")]
    for label, chosen in (("memory-bound GEMMs", memory_bound(tensor_gemm_rows(judged), base)),
                          ("all GEMMs", tensor_gemm_rows(judged)),
                          ("all convolutions", [r for r in judged if r.kernel_class == "conv"])):
        for how, used in (("SIMT figure", base), ("fitted", fitted)):
            errs = [kernel_time(r.spec, r.device, used).seconds / r.latency_s - 1 for r in chosen]
            print(f"  sweep 3 {label:18s} {how:11s} {_stats(errs)}")
    h100 = get_device("h100-sxm")
    for (device, dtype), rows in sorted(table.series().items()):
        if device != "h100-sxm":
            continue
        data = copy.deepcopy(base.data)
        data["devices"]["h100-sxm"].setdefault("matmul", {})["tensor_memory_efficiency"] = floor
        as_h200 = type(base)(data, file=base.file)
        bound = [r for r in rows if kernel_time(_gemm(r), h100, base).detail.get("gpu_bound") == "memory"]
        for how, used in (("SIMT figure", base), ("H200's", as_h200)):
            print(f"  XLA's H100 {dtype} memory-bound GEMMs ({len(bound)}) {how:11s} "
                  f"{_stats(gemm_fit.errors(bound, h100, used))}")


def _gemm(row):
    return Gemm(m=row.m, n=row.n, k=row.k, batch=row.batch, dtype=row.dtype)


def write_memory(efficiency: float, rows: int) -> None:
    """``tensor_memory_efficiency`` fitted on all three sweeps, as the H200's own."""
    stored = json.loads(PARAMS_FILE.read_text())
    entry = stored["devices"]["h200"]
    entry.setdefault("matmul", {})["tensor_memory_efficiency"] = efficiency
    entry.setdefault("tensor_evidence", {})["matmul.tensor_memory_efficiency"] = (
        f"benchmarks/data/h200-kernels, sweeps 1-3 ({rows} tensor-core GEMM kernels, 1x1 convolutions run as "
        "GEMMs included; python benchmarks/h200_kernels.py --write)")
    PARAMS_FILE.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
    print(f"wrote the H200's tensor_memory_efficiency {efficiency:.4g} to {PARAMS_FILE.name}")


def heuristic_against_benchmark() -> None:
    """The same convolutions under cuDNN's heuristics (PyTorch's default) over benchmark mode, per
    precision and pass: how much the algorithm choice moves a pass, and the measurement's repeatability."""
    def key(r):
        s = r.spec
        return r.dtype, s.batch, s.in_channels, s.out_channels, s.kernel, s.stride, s.height, s.pass_

    timed = {key(r): r for n in (1, 2, 3) for r in conv_rows(sweep_rows(n)) + [
        r for r in sweep_rows(n) if r.kernel_class == "conv" and r.dtype == "fp32"]}
    ratios = defaultdict(list)
    for batch in (32, 64, 128):
        path = SWEEPS / f"heuristic-b{batch}" / "kernels.csv"
        for r in read_rows(path, shown=path.parent.name):
            if key(r) in timed:
                ratios[(r.dtype, r.spec.pass_)].append(r.latency_s / timed[key(r)].latency_s)
    print("4. convolutions under cuDNN's heuristics over benchmark mode (the same shapes, timed again)")
    for (dtype, how), values in sorted(ratios.items()):
        v = np.asarray(values)
        print(f"  {dtype:5s} {how:16s} rows {len(v):3d}  median {np.median(v):.2f}  "
              f"p10 {np.quantile(v, .1):.2f}  p90 {np.quantile(v, .9):.2f}")


def report() -> dict:
    """Sections 1-7 (module doc), printed; the sweeps' rows by number, the bands of sections 2 and 3, the
    memory-bound rows fitted on, and the mask's shares fitted on everything with the rows they rest on."""
    sweeps = {n: sweep_rows(n) for n in (1, 2, 3)}
    attention = SWEEPS / "attention" / "kernels.csv"
    held_out([r for rows in sweeps.values() for r in rows] + read_rows(attention, shown="attention"))
    # sections 2 and 3 judge sweep 3 under the memory floor fitted on sweeps 1-2 only (section 7)
    floor = fit_memory(tensor_gemm_rows(sweeps[1] + sweeps[2]), with_memory(load_params(), None))
    held = with_memory(load_params(), floor)
    *_, gemm_bands = refit(sweeps[1] + sweeps[2], sweeps[3], "1-2", held)
    _, bands = refit_conv(sweeps[1] + sweeps[2], sweeps[3], held, "sweeps 1-2")
    heuristic_against_benchmark()
    streaming = [r for n in (1, 2) for r in sweeps[n] if r.kernel_class in STREAMING]
    refit_streaming(streaming, without_own_streaming(load_params()), "sweeps 1-2")
    mask = refit_mask(read_rows(attention, shown="attention"), load_params())
    refit_memory(sweeps, load_params(), floor)
    return {"sweeps": sweeps, "bands": bands, "streaming": streaming, "gemm_bands": gemm_bands, "mask": mask}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true",
                        help="store Hopper's GEMM figures fitted on all three sweeps in params.json")
    args = parser.parse_args(argv)
    reported = report()
    sweeps, bands = reported["sweeps"], reported["bands"]
    if args.write:
        everything = [r for rows in sweeps.values() for r in rows]
        write(*refit(everything, sweeps[3], "1-3")[:3], reported["gemm_bands"])
        gemms = tensor_gemm_rows(everything)
        write_memory(fit_memory(gemms, with_memory(load_params(PARAMS_FILE), None)), len(gemms))
        # each fit on the file as the step before left it (load_params() is the cached file as it began);
        # the convolutions last: their layout transforms stream at the elementwise figure
        streaming = reported["streaming"]
        figures, _ = fit_streaming(streaming, without_own_streaming(load_params(PARAMS_FILE)))
        attention = read_rows(SWEEPS / "attention" / "kernels.csv", shown="attention")
        write_streaming(figures, sum(1 for r in streaming if r.spec.elements >= STREAMING_MIN),
                        warp_softmax_limit([r for rows in sweeps.values() for r in rows] + attention))
        figures, _ = refit_conv(everything, sweeps[3], load_params(PARAMS_FILE), "all three sweeps")
        write_conv(figures, len(conv_rows(everything)), bands)
        write_mask(*reported["mask"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
