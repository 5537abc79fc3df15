"""cuDNN's training batch norm (NCHW) fitted on the batch-norm kernels of a real H200 training step.

    python benchmarks/fit_batchnorm.py [--write]

Evidence: the ResNet-50 step traced on an H200 (`tests/data/traces-h200/resnet50-fp32-step.json.gz`, batch
64, fp32, H200 run 3) and the same run's calibrated workload (`benchmarks/data/h200-run3/resnet50`), which
gives each batch-norm layer's shape and recorded bytes. The trace holds one forward kernel
(``bn_fw_tr_1C11_*``) and one backward kernel (``bn_bw_1C11_*``) per layer: the forward ones in the order
the layers run, the backward ones in reverse. Each is paired with the kernel spec the model makes of its layer
(`layers.layer_kernels`: ``batchnorm`` and ``batchnorm_backward``, a row per channel).

Per kind the model (`memory_bound`) takes the longer of two times: the layer's recorded bytes streamed
``passes`` times at the elementwise kernels' share of the bandwidth, and its channels' rows, ``rows_per_sm``
to an SM at once, each streaming its bytes at ``row_bytes_per_s``. Printed:

1. the kernels against the model before (the layer-norm figures, no row bound) and the implied figures per
   shape (passes at the elementwise share; nanoseconds per value of a row);
2. ``passes`` and ``row_bytes_per_s`` fitted on the even-numbered layers (least squares on log(predicted /
   measured)) with ``rows_per_sm`` 1, 2 and 4, judged on the odd-numbered ones;
3. the figures fitted on every layer at the ``rows_per_sm`` that judged best.

``--write`` stores (3) as the H200's own and as the default's (the only GPU measured: other GPUs stream the
same passes at their own share of their bandwidth, and a row at the same rate: what one channel's blocks keep
in flight per memory latency, which a faster HBM does not raise).
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from pathlib import Path

import numpy as np

from trainsim.formats.kineto import load_traces
from trainsim.formats.workload import load_workload
from trainsim.sim.compute.kernels.layers import layer_kernels
from trainsim.sim.compute.kernels.memory_bound import streaming_time
from trainsim.sim.compute.kernels.params import PARAMS_FILE, load_params
from trainsim.sim.core.devices import get_device

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "tests" / "data" / "traces-h200" / "resnet50-fp32-step.json.gz"
RUN3 = ROOT / "benchmarks" / "data" / "h200-run3"
WORKLOAD = RUN3 / "resnet50" / "calibration-0" / "workload-resnet50.json"
BATCH = 64
KINDS = ("batchnorm", "batchnorm_backward")
NAMES = ("passes", "row_bytes_per_s")
START = {"passes": 1.3, "row_bytes_per_s": 20e9}
BOUNDS = {"passes": (0.5, 5.0), "row_bytes_per_s": (1e9, 1e12)}


def rows() -> dict[str, list[tuple]]:
    """Per kind, (layer name, kernel spec, measured seconds) of every batch-norm layer of the traced step."""
    trace = load_traces([TRACE])[0]
    workload = load_workload(WORKLOAD)
    layers = [layer for layer in workload.layers if layer.kind == "batchnorm"]
    forward = sorted((g for g in trace.gpu_events if re.search(r"bn_fw", g.name)), key=lambda g: g.ts)
    backward = sorted((g for g in trace.gpu_events if re.search(r"bn_bw", g.name)), key=lambda g: -g.ts)
    if not len(layers) == len(forward) == len(backward):
        sys.exit(f"{TRACE.name}: {len(forward)} forward and {len(backward)} backward batch-norm kernels for "
                 f"{len(layers)} layers")
    out = {kind: [] for kind in KINDS}
    for layer, fwd, bwd in zip(layers, forward, backward, strict=True):
        specs = layer_kernels(layer, BATCH, "fp32", workload.dtype)
        for kind, (spec,), kernel in zip(KINDS, specs, (fwd, bwd), strict=True):
            assert spec.kind == kind, spec
            out[kind].append((layer.name, spec, kernel.dur))
    return out


def with_figures(params, figures: dict):
    """``params`` with ``figures`` ({kind: {name: value}}) as the H200's own and the default's."""
    data = copy.deepcopy(params.data)
    for kind, figs in figures.items():
        data["default"].setdefault(kind, {}).update(figs)
        data["devices"].setdefault("h200", {}).setdefault(kind, {}).update(figs)
    return type(params)(data, file=params.file)


def errors(chosen, params) -> np.ndarray:
    h200 = get_device("h200")
    return np.array([streaming_time(spec, h200, params).seconds / seconds - 1 for _, spec, seconds in chosen])


def fit(kind: str, chosen, params, rows_per_sm: float) -> dict:
    from scipy.optimize import least_squares  # only when fitting

    scale = np.array([START[n] for n in NAMES])

    def figures(x):
        values = {n: float(v) for n, v in zip(NAMES, x * scale, strict=True)}
        return {kind: {"rows_per_sm": rows_per_sm, **values}}

    def residuals(x):
        return np.log1p(errors(chosen, with_figures(params, figures(x))))

    bounds = ([BOUNDS[n][0] / s for n, s in zip(NAMES, scale, strict=True)],
              [BOUNDS[n][1] / s for n, s in zip(NAMES, scale, strict=True)])
    best = least_squares(residuals, np.ones(len(NAMES)), bounds=bounds)
    return {n: float(f"{v:.4g}") for n, v in figures(best.x)[kind].items()}


def _stats(errs) -> str:
    return (f"rows {len(errs):3d}  median |error| {np.median(abs(errs)) * 100:5.1f} %  "
            f"p10 {np.quantile(errs, .1) * 100:+6.1f} %  p90 {np.quantile(errs, .9) * 100:+6.1f} %")


def before(params):
    """``params`` as the model had them: batch norm streamed with the layer norm's figures, no row bound."""
    norm = params.data["default"]["layernorm"]
    unbound = {"passes": norm["long_row_passes"], "row_bytes_per_s": 1e18, "rows_per_sm": 1}
    return with_figures(params, {kind: dict(unbound) for kind in KINDS})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="store the figures in the shipped params.json")
    args = parser.parse_args(argv)
    by_kind = rows()
    params = load_params()
    h200 = get_device("h200")
    efficiency, _ = params.figure(h200, "elementwise", "efficiency")
    print(f"{TRACE.name}: {len(by_kind['batchnorm'])} batch-norm layers at batch {BATCH} (fp32, NCHW)")
    print("1. the kernels, and what they imply")
    seen = set()
    for kind in KINDS:
        print(f"  {kind:18s} model before    {_stats(errors(by_kind[kind], before(params)))}")
        for name, spec, seconds in by_kind[kind]:
            channels = round(spec.elements / spec.row)
            if (kind, channels, spec.row) in seen:
                continue
            seen.add((kind, channels, spec.row))
            passes = seconds * h200.memory_bandwidth * efficiency / spec.bytes
            print(f"    {kind:18s} {channels:5d} channels, rows of {spec.row:7d}: {seconds * 1e6:7.1f} us, "
                  f"{passes:4.2f} passes, {seconds / spec.row * 1e9:6.3f} ns per value of a row  ({name})")
    print("2. fitted on the even-numbered layers, judged on the odd-numbered ones")
    best, chosen = {}, {}
    for kind in KINDS:
        even, odd = by_kind[kind][::2], by_kind[kind][1::2]
        for per_sm in (1, 2, 4):
            figs = fit(kind, even, params, per_sm)
            errs = errors(odd, with_figures(params, {kind: figs}))
            print(f"  {kind:18s} rows_per_sm {per_sm}: passes {figs['passes']:.3g}, row "
                  f"{figs['row_bytes_per_s'] / 1e9:.3g} GB/s; judged {_stats(errs)}")
            score = float(np.median(abs(errs)))
            if kind not in best or score < best[kind]:
                best[kind], chosen[kind] = score, per_sm
    print("3. fitted on every layer")
    figures = {kind: fit(kind, by_kind[kind], params, chosen[kind]) for kind in KINDS}
    fitted = with_figures(params, figures)
    for kind in KINDS:
        print(f"  {kind:18s} {figures[kind]}  {_stats(errors(by_kind[kind], fitted))}")
    if args.write:
        stored = json.loads(PARAMS_FILE.read_text())
        layers = len(by_kind["batchnorm"])
        note = (f"tests/data/traces-h200/{TRACE.name}: the {layers} batch-norm layers' cuDNN kernels of a "
                "traced ResNet-50 step (python benchmarks/fit_batchnorm.py --write)")
        for kind, figs in figures.items():
            stored["devices"]["h200"][kind] = dict(figs)
            stored["devices"]["h200"].setdefault("tensor_evidence", {}).update(
                {f"{kind}.{name}": note for name in figs})
            stored["default"][kind] = {**figs, "rows": len(by_kind[kind]),
                                       "evidence": note + "; the only GPU measured, so every GPU takes it"}
        PARAMS_FILE.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
        print(f"wrote the batch-norm figures to {PARAMS_FILE.name} (the H200's own and the default's)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
