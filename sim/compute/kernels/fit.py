"""Fitting the kernel model's figures on kernel-level rows, and judging them on GPUs held out.

Each device is fitted alone, on its own rows (`dataset.KernelRow`), one kernel class at a time: the
figures of `FIGURES` and, per eager op of the class, its dispatch (`launch`), by least squares on
``log(predicted / measured)`` with a soft-L1 loss (scale 0.1: a row off by more than ~10 % counts less and
less, so a few throttled or noisy rows do not drag the rest). A convolution reuses its device's matmul
``tile_a``, ``k0`` and ``memory_efficiency``; a norm or softmax its elementwise ``efficiency``. A
convolution row is fitted as the algorithm its kernels show (implicit GEMM, Winograd non-fused or fused) and
judged, as predicted, by the fastest; its host time is fitted with the drift of `DRIFT_OPS`. Rows are
thinned to at most `MAX_FIT_ROWS` per device and class (every k-th row, so the fit is deterministic).
Nothing here sees whole-model throughput.

The board-power cap (`fit_power`) is then fitted across devices on their matmul efficiencies, and the
boards it limits are left out of the medians of compute efficiencies that GPUs never measured take.

A GPU never measured takes, figure by figure, the median over the measured devices of its architecture,
else over all of them (`assemble`); that is what `leave_one_gpu_out` checks: each GPU in turn is left out
of the figures, tiles included, and its rows predicted from the others'.

    python -m trainsim.sim.compute.kernels.fit DATA [--out PARAMS.json]

refits the shipped `params.json` from the NeuSight dataset folder ``DATA`` (its held-out band included).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from trainsim.errors import TrainsimError
from trainsim.sim.core.devices import ARCHITECTURES, DeviceSpec, get_device

from .dataset import KernelRow, load_neusight
from .launch import observed_seconds, op_of
from .matmul import (
    FUSED_WINOGRAD_KERNELS,
    IMPLICIT_KERNELS,
    WINOGRAD_KERNELS,
    fused_winograd_core,
    gemm_core,
    winograd_core,
)
from .memory_bound import streaming_core
from .params import SCHEMA, KernelParams
from .specs import Conv2d, Gemm

CLASSES = ("matmul", "conv", "elementwise", "layernorm", "softmax")
#: the fitted figures of each class: (start, lower bound, upper bound)
FIGURES = {
    "matmul": {"efficiency": (0.8, 0.02, 1.05), "memory_efficiency": (0.6, 0.05, 1.05),
               "tile_a": (10.0, 0.0, 64.0), "k0": (16.0, 0.0, 256.0)},
    "conv": {"efficiency": (0.8, 0.02, 1.05), "winograd_efficiency": (0.8, 0.02, 1.05),
             "fused_winograd_efficiency": (0.6, 0.02, 1.05), "kernel_s": (3e-6, 0.0, 1e-5)},
    "elementwise": {"efficiency": (0.8, 0.05, 1.05)},
    "layernorm": {"long_row_passes": (1.3, 1.0, 6.0), "flops_per_element": (10.0, 0.0, 1000.0)},
    "softmax": {"long_row_passes": (1.3, 1.0, 6.0), "flops_per_element": (10.0, 0.0, 1000.0)},
}
#: the eager ops of each class, each with its own dispatch
CLASS_OPS = {"matmul": ("bmm", "linear"), "conv": ("conv",), "elementwise": ("elementwise",),
             "layernorm": ("layernorm",), "softmax": ("softmax",)}
#: ops whose dispatch drifts over a collection. NeuSight's conv files list their shapes in random order,
#: and the fastest calls of each sixth of a file take longer the later the sixth (A100 119 to 383 us, P100
#: 188 to 828 us, at the same median FLOPs): the harness's host time per cuDNN call grows with the calls
#: made before it, which a GPU model must not absorb. Its other files are sorted by size, so that a drift
#: there cannot be told from the work (and their smallest calls show none).
DRIFT_OPS = ("conv",)
#: the figures the power cap scales (fractions of the fp32 peak)
COMPUTE_EFFICIENCIES = {"matmul": ("efficiency",),
                        "conv": ("efficiency", "winograd_efficiency", "fused_winograd_efficiency")}
MAX_FIT_ROWS = 4000
#: an op's dispatch is fitted on a device with at least TINY_ROWS calls of negligible GPU work
TINY_ROWS, TINY_FLOPS, TINY_BYTES = 20, 2e7, 2e6
#: a tile must be this share of an architecture's launches of a kind to be offered
TILE_SHARE = 0.03
DEFAULT_TILES = [[128, 128], [64, 128], [64, 64], [128, 32], [32, 128]]
_TILE = re.compile(r"(?:sgemm|scudnn|tilesize)_?(?:winograd_)?(\d+)x(\d+)", re.IGNORECASE)
US = 1e-6


def row_tile(row: KernelRow) -> tuple[int, int] | None:
    """The (rows, columns) output tile of a row's main kernel, from its name: cuBLAS/cuDNN name their tile
    in column-major terms (M first: the output's columns as PyTorch lays it out), so it is turned round."""
    match = _TILE.search(row.kernel)
    return (int(match.group(2)), int(match.group(1))) if match else None


def tile_kind(row: KernelRow) -> str:
    if row.kernel_class == "conv":
        return "conv"
    return "batched" if row.spec.batch > 1 and not row.spec.shared_b else "single"


def frequent_tiles(rows: list[KernelRow]) -> dict[str, list[list[int]]]:
    """Per GEMM kind, the tiles that make up at least `TILE_SHARE` of the rows' kernels (convolutions: both
    orientations, as cuDNN's names do not say which is which)."""
    counts: dict[str, Counter] = defaultdict(Counter)
    for row in rows:
        if row.kernel_class in ("matmul", "conv"):
            tile = row_tile(row)
            if tile:
                counts[tile_kind(row)][tile] += 1
    out = {}
    for kind, counter in counts.items():
        total = sum(counter.values())
        tiles = sorted({t for t, n in counter.items() if n >= TILE_SHARE * total}, reverse=True)
        if kind == "conv":
            tiles = sorted({*tiles, *((b, a) for a, b in tiles)}, reverse=True)
        out[kind] = [list(t) for t in tiles]
    return out


#: a convolution's algorithm as its kernels name it: the implicit GEMM, Winograd non-fused, Winograd fused
CONV_ALGORITHMS = ("implicit_gemm", "winograd", "fused_winograd")


def conv_algorithm(row: KernelRow) -> int:
    """The index in `CONV_ALGORITHMS` of the algorithm a convolution row's kernels show, -1 where they show
    none of them (no kernel names, or cuDNN's FFT: ``fft2d`` kernels around a complex GEMM)."""
    names = " ".join((row.kernel, *row.kernels)).lower()
    if not names.strip() or "fft" in names or "gcgemm" in names:
        return -1
    if "winograd_nonfused" in names:
        return 1
    if "winograd" in names:
        return 2
    return 0


class Pack:
    """The rows of one device and class as arrays."""

    def __init__(self, rows: list[KernelRow], device: DeviceSpec, cls: str):
        self.rows, self.device, self.cls = rows, device, cls
        self.measured = np.array([r.latency_s for r in rows])
        self.op = np.array([op_of(r.spec) for r in rows])
        self.nbytes = np.array([r.spec.bytes for r in rows])
        # rows its harness timed before each, in its file (`DRIFT_OPS`)
        self.calls_before = np.array([r.line - 2 for r in rows], dtype=float)
        if cls == "matmul":
            self.m, self.n, self.k, self.batch = (np.array([getattr(r.spec, a) for r in rows], dtype=float)
                                                  for a in ("m", "n", "k", "batch"))
            self.batched = np.array([tile_kind(r) == "batched" for r in rows])
        elif cls == "conv":
            specs: list[Conv2d] = [r.spec for r in rows]
            gemms: list[Gemm] = [s.as_gemm() for s in specs]
            self.m, self.n, self.k, self.batch = (np.array([getattr(g, a) for g in gemms], dtype=float)
                                                  for a in ("m", "n", "k", "batch"))
            self.conv = {a: np.array([getattr(s, a) for s in specs], dtype=float)
                         for a in ("batch", "in_channels", "out_channels", "height", "width", "out_h",
                                   "out_w")}
            self.winograd = np.array([s.winograd_eligible and s.pass_ == "forward" for s in specs])
            self.algorithm = np.array([conv_algorithm(r) for r in rows])
        else:
            self.row = np.array([r.spec.row or 0 for r in rows], dtype=float)
            self.elements = np.array([r.spec.elements for r in rows], dtype=float)

    def thinned(self, limit: int = MAX_FIT_ROWS) -> Pack:
        step = max(1, -(-len(self.rows) // limit))
        return Pack(self.rows[::step], self.device, self.cls) if step > 1 else self


def gpu_seconds(pack: Pack, fig: dict, tiles: dict, shared: dict | None = None, *,
                ran: bool = False) -> np.ndarray:
    """GPU seconds of a pack's rows under figures ``fig`` (its class's) and ``tiles`` per kind; ``shared``:
    the figures of its device's other classes it uses (a convolution: matmul ``tile_a``, ``k0``,
    ``memory_efficiency``; a norm or softmax: the elementwise ``efficiency``). A convolution takes its
    fastest algorithm, as a prediction does; ``ran``: the one its kernels show (`conv_algorithm`), as the
    fit does, so that each algorithm's figure rests on the rows that ran it."""
    device = pack.device
    if pack.cls in ("matmul", "conv"):
        source = fig if pack.cls == "matmul" else shared
        peak = device.peak("fp32")  # the evidence is fp32 (dataset rows are checked when packed)
        common = {"rate_per_sm": peak / device.sm_count, "sms": device.sm_count, "tile_a": source["tile_a"],
                  "k0": source["k0"], "bandwidth": device.memory_bandwidth * source["memory_efficiency"]}
    if pack.cls == "matmul":
        out = np.empty(len(pack.rows))
        for kind, mask in (("batched", pack.batched), ("single", ~pack.batched)):
            if mask.any():
                out[mask] = gemm_core(pack.m[mask], pack.n[mask], pack.k[mask], pack.batch[mask],
                                      pack.nbytes[mask], efficiency=fig["efficiency"], tiles=tiles[kind],
                                      **common)[0]
        return out
    if pack.cls == "conv":
        best = gemm_core(pack.m, pack.n, pack.k, pack.batch, pack.nbytes, efficiency=fig["efficiency"],
                         tiles=tiles["conv"], **common)[0] + IMPLICIT_KERNELS * fig["kernel_s"]
        c = pack.conv
        wino = winograd_core(c["batch"], c["in_channels"], c["out_channels"], c["height"], c["width"],
                             c["out_h"], c["out_w"], efficiency=fig["winograd_efficiency"],
                             tiles=tiles["conv"], **common) + WINOGRAD_KERNELS * fig["kernel_s"]
        fused = fused_winograd_core(c["batch"], c["in_channels"], c["out_channels"], c["height"], c["width"],
                                    c["out_h"], c["out_w"], efficiency=fig["fused_winograd_efficiency"],
                                    tiles=tiles["conv"], **common) + FUSED_WINOGRAD_KERNELS * fig["kernel_s"]
        fastest = np.where(pack.winograd, np.minimum(best, np.minimum(wino, fused)), best)
        if not ran:
            return fastest
        shown = np.choose(np.maximum(pack.algorithm, 0), [best, wino, fused])
        return np.where(pack.algorithm >= 0, shown, fastest)
    if pack.cls == "elementwise":
        return streaming_core(pack.nbytes, pack.elements, pack.row, bandwidth=device.memory_bandwidth,
                              efficiency=fig["efficiency"])
    return streaming_core(pack.nbytes, pack.elements, pack.row, bandwidth=device.memory_bandwidth,
                          efficiency=shared["efficiency"], peak=device.peak("fp32"), **fig)


def observed(pack: Pack, fig: dict, dispatch: dict, tiles: dict, shared: dict | None = None, *,
             ran: bool = False) -> np.ndarray:
    """What the evidence's timing shows for a pack's rows: dispatch and GPU time
    (`launch.observed_seconds`). ``dispatch``: {op: (dispatch_s, overlap_s[, drift_s])}, ``drift_s`` the
    host time a call gains per row the harness timed before it in its file (`DRIFT_OPS`)."""
    gpu = gpu_seconds(pack, fig, tiles, shared, ran=ran)
    pre = np.array([dispatch[op][0] for op in pack.op])
    drift = np.array([dispatch[op][2] if len(dispatch[op]) > 2 else 0.0 for op in pack.op])
    overlap = np.array([dispatch[op][1] for op in pack.op])
    return observed_seconds(gpu, pre + drift * pack.calls_before, overlap)


def _check_fp32(rows: list[KernelRow]) -> None:
    other = {r.dtype for r in rows} - {"fp32"}
    if other:  # the fit's matrix figures are the SIMT fp32 ones; tensor-core rows need their own figure
        raise NotImplementedError(f"rows in {sorted(other)}: only fp32 rows are fitted so far")


def identifiable_ops(pack: Pack) -> list[str]:
    """The eager ops of a pack whose dispatch its rows can tell from GPU time: those with at least
    `TINY_ROWS` calls of negligible work (under `TINY_FLOPS` FLOPs, or `TINY_BYTES` bytes if memory-bound)."""
    if pack.cls in ("matmul", "conv"):
        tiny = np.array([r.spec.flops for r in pack.rows]) < TINY_FLOPS
    else:
        tiny = pack.nbytes < TINY_BYTES
    return [op for op in CLASS_OPS[pack.cls] if ((pack.op == op) & tiny).sum() >= TINY_ROWS]


def fit_pack(pack: Pack, tiles: dict, shared: dict | None = None, *, fixed: dict | None = None,
             dispatch_fixed: dict | None = None) -> tuple[dict, dict, float]:
    """(figures, dispatch per op, median |error|) of one device's rows of one class; ``fixed`` figures and
    ``dispatch_fixed`` ops ({op: (dispatch_s, overlap_s)}) are held, the rest fitted."""
    from scipy.optimize import least_squares

    _check_fp32(pack.rows)
    fixed, dispatch_fixed = dict(fixed or {}), dict(dispatch_fixed or {})
    names = [n for n in FIGURES[pack.cls] if n not in fixed]
    ops = [op for op in CLASS_OPS[pack.cls] if (pack.op == op).any() and op not in dispatch_fixed]
    fit = pack.thinned()
    floor = float(np.quantile(fit.measured, 0.02)) / US
    start, lower, upper = ([FIGURES[pack.cls][n][i] for n in names] for i in range(3))
    for op in ops:  # microseconds: dispatch before the kernel, overlap after it, drift per 1,000 rows
        drift = op in DRIFT_OPS
        start += [max(floor - 5.0, 1.0), 5.0] + [50.0] * drift
        lower += [0.0, 0.0] + [0.0] * drift
        upper += [1000.0, 500.0] + [5000.0] * drift

    def unpack(x):
        fig = {**fixed, **dict(zip(names, x[:len(names)], strict=True))}
        rest, fitted = list(x[len(names):]), {}
        for op in ops:
            pre, after = rest.pop(0), rest.pop(0)
            drift = (rest.pop(0) * US / 1000,) if op in DRIFT_OPS else ()
            fitted[op] = ((pre + after) * US, after * US) + drift
        return fig, {**dispatch_fixed, **fitted}

    def residuals(x):
        fig, dispatch = unpack(x)
        return np.log(observed(fit, fig, dispatch, tiles, shared, ran=True) / fit.measured)

    x = least_squares(residuals, start, bounds=(lower, upper), loss="soft_l1", f_scale=0.1).x if start \
        else np.array([])
    fig, dispatch = unpack(x)
    error = np.abs(observed(pack, fig, dispatch, tiles, shared) / pack.measured - 1)
    return ({k: float(v) for k, v in fig.items()},
            {op: dict(zip(("dispatch_s", "overlap_s", "drift_s")[:len(d)], map(float, d), strict=True))
             for op, d in dispatch.items()},
            float(np.median(error)))


def _evidence(rows: list[KernelRow]) -> str:
    files = Counter(r.source for r in rows)
    return "; ".join(f"{f} ({n} rows)" for f, n in sorted(files.items()))


PLACEHOLDER_DISPATCH = (50 * US, 10 * US)  # held while a first pass fits what the rows can tell


class DeviceFitter:
    """Fits devices' entries on their own rows, remembering each fit, so that leaving one GPU out refits only
    what the figures shared between GPUs change.

    Two figures are shared: the matmul tile shape (``tile_a``, ``k0``: the median of each device's own free
    fit, so that every device's efficiency is measured against the same tiles) and the dispatch of an op a
    device's rows cannot tell from its GPU time (`identifiable_ops`: the median of the devices that can).
    A convolution's per-call cost is fitted with its other figures (no call in the evidence is small enough
    to show it alone), with the drift of the harness's host time over the file (`DRIFT_OPS`): 25-65 us at
    the file's first call. Without the drift it came out at 0.2-0.4 ms, more than the fastest calls take."""

    def __init__(self, rows: list[KernelRow]):
        self.rows: dict = defaultdict(lambda: defaultdict(list))
        for row in rows:
            if row.device:
                self.rows[row.device][row.kernel_class].append(row)
        self.devices = {name: get_device(name) for name in sorted(self.rows)}
        self.tiles = {name: frequent_tiles([r for rs in self.rows[name].values() for r in rs])
                      for name in self.devices}
        self.packs = {(name, cls): Pack(rs, self.devices[name], cls)
                      for name in self.devices for cls, rs in self.rows[name].items()}
        self._cache: dict = {}
        self._free_shape: dict = {}

    def _tiles(self, name):
        return {**{k: DEFAULT_TILES for k in ("batched", "single", "conv")}, **self.tiles[name]}

    def free_shape(self, name: str) -> dict | None:
        """A device's own matmul tile shape (everything free), None without matmul rows."""
        if name not in self._free_shape:
            pack = self.packs.get((name, "matmul"))
            if pack is None:
                self._free_shape[name] = None
            else:
                ops = identifiable_ops(pack)
                held = {op: PLACEHOLDER_DISPATCH for op in CLASS_OPS["matmul"] if op not in ops}
                fig, _, _ = fit_pack(pack, self._tiles(name), dispatch_fixed=held)
                self._free_shape[name] = {"tile_a": fig["tile_a"], "k0": fig["k0"]}
        return self._free_shape[name]

    def _fit(self, name, cls, fixed, dispatch_fixed, shared):
        key = (name, cls, tuple(sorted(fixed.items())), tuple(sorted(dispatch_fixed.items())),
               tuple(sorted((shared or {}).items())))
        if key not in self._cache:
            self._cache[key] = fit_pack(self.packs[(name, cls)], self._tiles(name), shared, fixed=fixed,
                                        dispatch_fixed=dispatch_fixed)
        return self._cache[key]

    def fit(self, names: list[str] | None = None) -> dict[str, dict]:
        """The entries of devices ``names`` (default: all), with the shared figures taken from them alone."""
        names = list(self.devices) if names is None else [n for n in self.devices if n in names]
        shapes = [s for s in (self.free_shape(n) for n in names) if s]
        shape = ({k: float(statistics.median(s[k] for s in shapes)) for k in ("tile_a", "k0")} if shapes
                 else {"tile_a": FIGURES["matmul"]["tile_a"][0], "k0": FIGURES["matmul"]["k0"][0]})
        own = {(n, cls): identifiable_ops(self.packs[(n, cls)]) for n in names for cls in CLASSES
               if (n, cls) in self.packs}
        first = {}
        for (n, cls), ops in own.items():  # first pass: a dispatch the rows cannot tell held at a placeholder
            if cls in ("matmul", "elementwise") and ops:
                held = {op: PLACEHOLDER_DISPATCH for op in CLASS_OPS[cls] if op not in ops}
                first[(n, cls)] = self._fit(n, cls, shape if cls == "matmul" else {}, held, None)
        for (n, cls), ops in own.items():
            if cls in ("layernorm", "softmax") and ops and (n, "elementwise") in first:
                held = {op: PLACEHOLDER_DISPATCH for op in CLASS_OPS[cls] if op not in ops}
                shared = {"efficiency": first[(n, "elementwise")][0]["efficiency"]}
                first[(n, cls)] = self._fit(n, cls, {}, held, shared)
        medians = {}
        for op in sorted({op for ops in CLASS_OPS.values() for op in ops}):
            values = [first[key][1][op] for key, ops in own.items() if key in first and op in ops]
            if values:
                medians[op] = tuple(float(statistics.median(v[k] for v in values))
                                    for k in ("dispatch_s", "overlap_s"))
        return {n: self._entry(n, own, shape, medians) for n in names}

    def _entry(self, n, own, shape, medians) -> dict:
        entry = {"architecture": self.devices[n].architecture, "tiles": self.tiles[n], "dispatch": {}}
        for cls in CLASSES:
            if (n, cls) not in self.packs:
                continue
            ops = own[(n, cls)]
            if cls == "conv":
                if "matmul" not in entry:
                    continue
                held = {}  # cuDNN's host work per call: fitted with the rest (no call is small enough)
                shared = {k: entry["matmul"][k] for k in ("tile_a", "k0", "memory_efficiency")}
            else:
                held = {op: medians.get(op, PLACEHOLDER_DISPATCH) for op in CLASS_OPS[cls] if op not in ops}
                shared = None
                if cls in ("layernorm", "softmax"):
                    if "elementwise" not in entry:
                        continue
                    shared = {"efficiency": entry["elementwise"]["efficiency"]}
            fig, dispatch, error = self._fit(n, cls, shape if cls == "matmul" else {}, held, shared)
            rows = self.rows[n][cls]
            entry[cls] = {**fig, "rows": len(rows), "median_abs_error": round(error, 4),
                          "evidence": _evidence(rows)}
            entry["dispatch"].update({op: d for op, d in dispatch.items() if op in ops or cls == "conv"})
        return entry


def fit_devices(rows: list[KernelRow]) -> dict[str, dict]:
    """Every device's entry, fitted on its own rows and the shared figures of all (rows of GPUs trainsim has
    no spec for are skipped)."""
    return DeviceFitter(rows).fit()


def _median_entry(entries: list[dict], uncapped: set[str]) -> dict:
    """Figure by figure, the median over ``entries``; compute efficiencies over the ``uncapped`` ones (all,
    where none is)."""
    out: dict = {"from": sorted(e["_name"] for e in entries)}
    for cls in CLASSES:
        have = [e[cls] for e in entries if cls in e]
        free = [e[cls] for e in entries if cls in e and e["_name"] in uncapped]
        figures = {}
        for name in FIGURES[cls]:
            among = free if name in COMPUTE_EFFICIENCIES.get(cls, ()) else have
            if among:  # a generation whose every board is power-capped gives no uncapped efficiency
                figures[name] = statistics.median(h[name] for h in among)
        if figures:
            out[cls] = figures
    ops = sorted({op for e in entries for op in e.get("dispatch", {})})
    out["dispatch"] = {}
    for op in ops:
        have = [e["dispatch"][op] for e in entries if op in e.get("dispatch", {})]
        keys = [key for key in ("dispatch_s", "overlap_s", "drift_s") if all(key in d for d in have)]
        out["dispatch"][op] = {key: statistics.median(d[key] for d in have) for key in keys}
    return out


def fit_power(devices: dict[str, dict]) -> dict | None:
    """The power cap on fp32 SIMT throughput, fitted on the devices' matmul efficiencies: each board runs
    at ``min(efficiency, flops_per_watt(process) x tdp / peak)`` of its fp32 peak, with
    ``flops_per_watt = flops_per_watt_16nm x (16 / process_nm) ** exponent``; least squares on the log.
    None with fewer than three boards that give their power and process."""
    from scipy.optimize import least_squares

    points = []
    for name, entry in sorted(devices.items()):
        spec = get_device(name)
        if "matmul" in entry and spec.tdp_watts and spec.process_nm:
            points.append((name, entry["matmul"]["efficiency"], spec.tdp_watts, spec.process_nm,
                           spec.peak("fp32")))
    if len(points) < 3:
        return None
    eff = np.array([p[1] for p in points])
    tdp, nm, peak = (np.array([p[i] for p in points]) for i in (2, 3, 4))

    def model(x):
        cap = np.exp(x[1]) * 1e9 * (16.0 / nm) ** x[2] * tdp / peak
        return np.minimum(x[0], cap)

    x = least_squares(lambda x: np.log(model(x) / eff), [0.9, np.log(60.0), 1.0],
                      bounds=([0.2, np.log(5.0), 0.0], [1.05, np.log(2000.0), 3.0])).x
    cap = np.exp(x[1]) * 1e9 * (16.0 / nm) ** x[2] * tdp / peak
    return {"efficiency": float(x[0]), "flops_per_watt_16nm": float(np.exp(x[1]) * 1e9),
            "exponent": float(x[2]),
            "capped": [p[0] for p, c in zip(points, cap, strict=True) if c < x[0]],
            "from": [p[0] for p in points],
            "evidence": "each device's fitted matmul efficiency (fp32 SIMT) against its datasheet board "
                        "power and process node"}


def _architecture_tiles(devices: dict[str, dict], rows_by_device: dict | None = None) -> dict:
    tiles: dict = defaultdict(dict)
    for arch in ARCHITECTURES:
        members = [e for e in devices.values() if e.get("architecture") == arch]
        for kind in ("batched", "single", "conv"):
            union = sorted({tuple(t) for e in members for t in e.get("tiles", {}).get(kind, [])},
                           reverse=True)
            if union:
                tiles[arch][kind] = [list(t) for t in union]
    tiles["default"] = {"batched": DEFAULT_TILES, "single": DEFAULT_TILES, "conv": DEFAULT_TILES}
    return dict(tiles)


def assemble(devices: dict[str, dict], *, held_out: dict | None = None, evidence: dict | None = None,
             fit_note: dict | None = None) -> dict:
    """A parameter file's data from fitted device entries: per-architecture and default medians."""
    named = [{**e, "_name": name} for name, e in devices.items()]
    power = fit_power(devices)
    uncapped = set(devices) - set(power["capped"] if power else [])
    architectures = {}
    for arch in ARCHITECTURES:
        members = [e for e in named if e.get("architecture") == arch]
        if members:
            architectures[arch] = _median_entry(members, uncapped)
    return {
        "schema": SCHEMA,
        "evidence": evidence or {},
        "fit": fit_note or {},
        "tiles": _architecture_tiles(devices),
        "devices": devices,
        "architectures": architectures,
        "default": _median_entry(named, uncapped),
        "power": power,
        "held_out": held_out or {},
        "unfitted": UNFITTED,
    }


UNFITTED = {
    "matmul.tensor_efficiency": "no tensor-core rows in the evidence (NeuSight is fp32 with TF32 off): tf32, "
                                "fp16, bf16 and fp8 products run at the fp32 efficiency of their device "
                                "until a tensor-core kernel sweep fits their own",
    "attention": "no attention kernels in the evidence: composed from the matmul and memory-bound figures",
    "streaming.optimizer, embedding, copy, reduction": "no rows of their own: the elementwise figure",
}


def predict(params: KernelParams, rows: list[KernelRow]) -> np.ndarray:
    """The model's observed latency (dispatch and GPU time, `launch.observed_seconds`) for every row, in row
    order, with ``params``' figures found as `kernel_time` finds them."""
    out = np.empty(len(rows))
    groups = defaultdict(list)
    for i, row in enumerate(rows):
        groups[(row.device, row.kernel_class)].append(i)
    for (name, cls), index in groups.items():
        device = get_device(name)
        pack = Pack([rows[i] for i in index], device, cls)
        fig = {n: (params.efficiency if n in COMPUTE_EFFICIENCIES.get(cls, ()) else params.figure)(
            device, cls, n)[0] for n in FIGURES[cls]}
        if cls in ("matmul", "conv"):
            shared = {n: params.figure(device, "matmul", n)[0] for n in ("tile_a", "k0", "memory_efficiency")}
        else:
            shared = {"efficiency": params.figure(device, "elementwise", "efficiency")[0]}
        tiles = {kind: params.tiles(device, kind) for kind in ("batched", "single", "conv")}
        dispatch = {op: (*params.dispatch(device, op)[:2], params.evidence_drift(device, op))
                    for op in set(pack.op)}
        out[index] = observed(pack, fig, dispatch, tiles, shared)
    return out


def leave_one_gpu_out(rows: list[KernelRow], fitter: DeviceFitter | None = None, *,
                      own_dispatch: bool = False) -> np.ndarray:
    """Each row predicted with its own GPU left out of the figures: the other devices refitted with the
    shared figures of those devices alone, its own entry absent (so its architecture's medians apply, else
    the default's), tiles included; in row order. ``own_dispatch``: keep the held-out GPU's own dispatch
    figures (its host's, fitted on its smallest calls), as a calibrated box measures its host: the GPU's
    figures are still the others'."""
    fitter = fitter or DeviceFitter(rows)
    full = fitter.fit() if own_dispatch else {}
    out = np.empty(len(rows))
    by_device = defaultdict(list)
    for i, row in enumerate(rows):
        by_device[row.device].append(i)
    for name, index in by_device.items():
        data = assemble(fitter.fit([n for n in fitter.devices if n != name]))
        if own_dispatch and name in full:
            data["devices"][name] = {"dispatch": full[name]["dispatch"]}
        out[index] = predict(KernelParams(data), [rows[i] for i in index])
    return out


def error_quantiles(predicted: np.ndarray, rows: list[KernelRow]) -> dict:
    """Per kernel class, the relative error (predicted / measured - 1) quantiles: p10, p50, p90 and the
    median and p90 of its magnitude, with the row count."""
    measured = np.array([r.latency_s for r in rows])
    classes = np.array([r.kernel_class for r in rows])
    out = {}
    for cls in CLASSES:
        mask = classes == cls
        if mask.any():
            rel = predicted[mask] / measured[mask] - 1
            out[cls] = {"p10": round(float(np.quantile(rel, 0.1)), 4), "p50": round(float(np.median(rel)), 4),
                        "p90": round(float(np.quantile(rel, 0.9)), 4),
                        "median_abs": round(float(np.median(np.abs(rel))), 4),
                        "p90_abs": round(float(np.quantile(np.abs(rel), 0.9)), 4), "rows": int(mask.sum())}
    return out


NEUSIGHT_EVIDENCE = {
    "neusight": {
        "what": "per-kernel latencies of PyTorch 2.1 ops (cuDNN 8.9, CUDA 12.1), fp32, timed with CUDA "
                "events around one eager call: the mean of the 5 fastest of 25",
        "paper": "Lee et al., Forecasting GPU Performance for Deep Learning Training and Inference, "
                 "ASPLOS 2025",
        "repository": "trsharm25/NeuSight", "commit": "db1fdc966633fe96c0717e0706e7621ad0921ed2",
        "folder": "scripts/asplos/data/dataset/", "licence": "MIT (Georgia Institute of Technology and "
                                                              "Microsoft Corporation)",
    }
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Refit the kernel model's figures from the NeuSight "
                                                 "dataset.")
    parser.add_argument("data", help="the NeuSight dataset folder (train/, test/)")
    parser.add_argument("--out", default=str(Path(__file__).with_name("params.json")))
    args = parser.parse_args(argv)
    try:
        rows = load_neusight(args.data)
    except TrainsimError as exc:  # one line, exit 2, nothing written
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    fitter = DeviceFitter(rows)
    devices = fitter.fit()
    held_out = error_quantiles(leave_one_gpu_out(rows, fitter), rows)
    data = assemble(devices, held_out=held_out, evidence=NEUSIGHT_EVIDENCE, fit_note={
        "command": "python -m trainsim.sim.compute.kernels.fit DATA", "rows": len(rows),
        "loss": "soft-L1 on log(predicted / measured), scale 0.1, per device and class",
        "max_rows_per_fit": MAX_FIT_ROWS, "held_out": "leave one GPU out, every row of every class"})
    Path(args.out).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out}: {len(devices)} devices, {len(rows)} rows")


if __name__ == "__main__":
    main()
