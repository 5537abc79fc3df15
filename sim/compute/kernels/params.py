"""The kernel model's fitted figures: a JSON data file (`params.json`), each figure with the rows it rests on.

Layout (``"schema": "trainsim.kernel-params/1"``)::

    evidence      the datasets the figures were fitted on (repository, commit, licence, files)
    fit           how: the command, the loss, the rows used
    tiles         per architecture and GEMM kind: the thread-block tiles its libraries launched
    devices       per device spec name: per class {figure: value, ..., "rows": n, "evidence": "..."},
                  "dispatch" per eager op: {dispatch_s, overlap_s}, and the "tiles" it launched
    architectures per architecture: the median of its devices' figures, "from": [device names]
    default       the median over every device: for a GPU whose generation has no measured device
    power         the power cap on fp32 SIMT throughput: a board sustains at most
                  ``flops_per_watt_16nm x (16 / process_nm) ** exponent x tdp_watts`` FLOP/s; fitted on the
                  measured devices' matmul efficiencies with ``efficiency`` (the uncapped one), "capped": the
                  boards it limits
    held_out      per class, the relative error quantiles of leave-one-GPU-out prediction (low/high)
    unfitted      figures the evidence cannot give yet, with what they are set to and why

A figure is looked up by the device's name, then its architecture, then the default: a GPU that was measured
uses its own, a GPU never measured those of its generation (compute efficiencies: of its generation's boards
that power does not cap, then capped by its own board's power, `efficiency`). Bad files name the file and
the field.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path

from trainsim.errors import TrainsimError

SCHEMA = "trainsim.kernel-params/1"
PARAMS_FILE = Path(__file__).with_name("params.json")
#: figures that may be 0 (no penalty, no fixed cost); the others (efficiencies, passes) must be > 0
MAY_BE_ZERO = ("tile_a", "k0", "flops_per_element", "forward_block_keys", "backward_block_keys",
               "causal_block_keys", *(f"{figure}_{dtype}" for figure in ("k0", "tile_a", "call_s", "ceiling")
                                      for dtype in ("tf32", "bf16", "fp16", "fp8")))
SECTIONS = ("evidence", "fit", "tiles", "devices", "architectures", "default", "held_out")


def lineage(device) -> list[str]:
    """``device``'s architecture, then the older ones, newest first (later GPUs run earlier kernels: an
    H100 runs sm80 SGEMMs); empty for a device of no known architecture."""
    from trainsim.sim.core.devices import ARCHITECTURES

    architecture = getattr(device, "architecture", None)
    if architecture not in ARCHITECTURES:
        return []
    return list(reversed(ARCHITECTURES[:ARCHITECTURES.index(architecture) + 1]))


class KernelParams:
    """A loaded, checked parameter file. ``figure(device, cls, name)`` finds a figure and says where from."""

    def __init__(self, data: dict, *, file: str | None = None):
        self.file = file
        self.data = data
        _check(data, file)

    @property
    def devices(self) -> dict:
        return self.data["devices"]

    def figure(self, device, cls: str, name: str) -> tuple[float, str]:
        """The figure ``name`` of class ``cls`` for ``device`` (a `DeviceSpec`) and where it comes from
        (``device:<name>``, ``architecture:<arch>`` or ``default``)."""
        for where, entry in self._chain(device):
            value = entry.get(cls, {}).get(name)
            if value is not None:
                return float(value), where
        raise TrainsimError(f"no {cls} figure {name!r} for {device.name!r}, its architecture or the default",
                            file=self.file, field=f"default.{cls}.{name}")

    def efficiency(self, device, cls: str, name: str) -> tuple[float, str]:
        """A compute efficiency of fp32 SIMT work (``matmul`` or ``conv`` figure ``name``): the device's own
        where measured; else its architecture's or the default (boards power does not cap), times the
        share of it that the device's own board power sustains (`power_cap`), where that is less."""
        value, where = self.figure(device, cls, name)
        if where.startswith("device:"):
            return value, where
        cap = self.power_cap(device)
        if cap is None:
            return value, where
        matmul, _ = self.figure(device, "matmul", "efficiency")
        scale = min(1.0, cap / matmul)
        return value * scale, (where if scale == 1.0 else f"{where}, power cap x{scale:.3f}")

    def power_cap(self, device) -> float | None:
        """The fraction of its fp32 peak ``device``'s board power sustains (`power` section), None where the
        file has no power fit or the spec no ``tdp_watts`` / ``process_nm``."""
        power = self.data.get("power")
        tdp, nm = getattr(device, "tdp_watts", None), getattr(device, "process_nm", None)
        if not power or tdp is None or nm is None:
            return None
        per_watt = power["flops_per_watt_16nm"] * (16.0 / nm) ** power["exponent"]
        return per_watt * tdp / device.peak("fp32")

    def dispatch(self, device, op: str) -> tuple[float, float, str]:
        """(dispatch_s, overlap_s, where) of eager op ``op`` for ``device``: its own where measured, else the
        default (the median of all): dispatch is the measuring host's as much as the GPU's, so a GPU's
        architecture says nothing of it."""
        for where, entry in self._chain(device, architecture=False):
            record = entry.get("dispatch", {}).get(op)
            if record is not None:
                return float(record["dispatch_s"]), float(record["overlap_s"]), where
        raise TrainsimError(f"no dispatch figure for op {op!r}", file=self.file,
                            field=f"default.dispatch.{op}")

    def evidence_drift(self, device, op: str) -> float:
        """Seconds the evidence's host time for op ``op`` grew per row its harness timed before (``drift_s``
        of the dispatch record `dispatch` finds; 0 where none): an artifact of how the evidence was
        collected (`fit.DRIFT_OPS`), used to reproduce the evidence, never in a prediction."""
        for _, entry in self._chain(device, architecture=False):
            record = entry.get("dispatch", {}).get(op)
            if record is not None:
                return float(record.get("drift_s", 0.0))
        return 0.0

    def lineage_figure(self, device, cls: str, name: str) -> tuple[float, str]:
        """The figure ``name`` of class ``cls`` as `figure` finds it, else that of the newest architecture
        older than the device's that has it (`lineage`: for kernels that run unchanged on later GPUs); a
        `TrainsimError` where none has."""
        try:
            return self.figure(device, cls, name)
        except TrainsimError:
            for arch in lineage(device)[1:]:
                value = self.data["architectures"].get(arch, {}).get(cls, {}).get(name)
                if value is not None:
                    return float(value), f"architecture:{arch} (its kernels, run on {device.architecture})"
            raise

    def tiles(self, device, kind: str, fallback: str | None = None) -> list[tuple[int, int]]:
        """The (rows, columns) output tiles ``device``'s libraries launch for ``kind`` GEMMs (``batched``,
        ``single``, ``conv``, ``tensor``): its own where it was measured, else its architecture's, else the
        default list; where none has ``kind``, those of ``fallback``. Not an older architecture's: which
        tiles a library launches is its heuristic's choice for that GPU, and it differs between
        generations even where they share kernels (an H100 launched sm80 SGEMM tiles of 256x128 to 64x64
        where an A100 launched 128x32 and 32x128; a V100 given Pascal's lone 64x128 ran skinny batched
        GEMMs 2.5x slower than it measured)."""
        own = self.data["devices"].get(device.name, {}).get("tiles", {}).get(kind)
        if own:
            return [tuple(t) for t in own]
        tiles = self.data["tiles"]
        for where in (getattr(device, "architecture", None), "default"):
            if kind in tiles.get(where, {}):
                return [tuple(t) for t in tiles[where][kind]]
        if fallback is not None:
            return self.tiles(device, fallback)
        raise TrainsimError(f"no {kind} tiles for {device.name!r}, its architecture or the default",
                            file=self.file, field=f"tiles.default.{kind}")

    def held_out(self, cls: str, device=None) -> tuple[float, float]:
        """The (low, high) relative error of class ``cls`` under leave-one-GPU-out (0, 0 when not
        measured); with ``device``, its own band where its entry has one (the figures fitted on its own
        kernels, judged on the shapes they were not fitted on)."""
        own = self.data["devices"].get(device.name, {}).get("held_out", {}) if device is not None else {}
        record = own.get(cls) or self.data["held_out"].get(cls)
        if not record:
            return 0.0, 0.0
        return float(record["p10"]), float(record["p90"])

    def _chain(self, device, architecture: bool = True):
        entry = self.data["devices"].get(device.name)
        if entry is not None:
            yield f"device:{device.name}", entry
        arch = getattr(device, "architecture", None)
        if architecture and arch and arch in self.data["architectures"]:
            yield f"architecture:{arch}", self.data["architectures"][arch]
        yield "default", self.data["default"]


def _check(data, file) -> None:
    if not isinstance(data, dict):
        raise TrainsimError("a kernel parameter file is a JSON object", file=file, field="schema")
    if data.get("schema") != SCHEMA:
        raise TrainsimError(f"should be {SCHEMA!r}, got {data.get('schema')!r}", file=file, field="schema")
    for section in SECTIONS:
        if not isinstance(data.get(section), dict):
            raise TrainsimError(f"missing (required); sections: {', '.join(SECTIONS)}", file=file,
                                field=section)
    for section in ("devices", "architectures"):
        for name, entry in data[section].items():
            _check_entry(entry, file, f"{section}.{name}")
    _check_entry(data["default"], file, "default")
    for arch, kinds in data["tiles"].items():
        for kind, tiles in kinds.items():
            for i, tile in enumerate(tiles):
                if not (isinstance(tile, list) and len(tile) == 2 and all(isinstance(v, int) and v > 0
                                                                          for v in tile)):
                    raise TrainsimError(f"a tile is [rows, columns] of whole numbers > 0, got {tile!r}",
                                        file=file, field=f"tiles.{arch}.{kind}[{i}]")


def _check_entry(entry, file, where) -> None:
    if not isinstance(entry, dict):
        raise TrainsimError("should be a mapping", file=file, field=where)
    for cls, figures in entry.items():
        if cls in ("from", "architecture", "tiles", "tensor_evidence"):
            continue
        if cls == "held_out":  # a GPU's own error bands: {band: {p10, p90, ...}}
            for band, record in (figures.items() if isinstance(figures, dict) else [(None, figures)]):
                if not isinstance(record, dict) or not all(
                        isinstance(record.get(k), (int, float)) and not isinstance(record.get(k), bool)
                        and math.isfinite(record[k]) for k in ("p10", "p90")):
                    raise TrainsimError("should give p10 and p90 (relative errors)", file=file,
                                        field=f"{where}.held_out" + (f".{band}" if band else ""))
            continue
        if not isinstance(figures, dict):
            raise TrainsimError("should be a mapping of figures", file=file, field=f"{where}.{cls}")
        for name, value in figures.items():
            if cls == "dispatch":
                if not isinstance(value, dict) or {"dispatch_s", "overlap_s"} - set(value):
                    raise TrainsimError("should give dispatch_s and overlap_s (seconds)", file=file,
                                        field=f"{where}.dispatch.{name}")
                for key in ("dispatch_s", "overlap_s", "drift_s"):
                    if key in value:
                        _number(value[key], file, f"{where}.dispatch.{name}.{key}", zero=True)
                continue
            if name in ("rows", "evidence", "median_abs_error", "files"):
                continue
            _number(value, file, f"{where}.{cls}.{name}", zero=name.endswith("_s") or name in MAY_BE_ZERO)


def _number(value, file, field, *, zero=False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or (
            value < 0 if zero else value <= 0):
        raise TrainsimError(f"should be a number {'>= 0' if zero else '> 0'}, got {value!r}", file=file,
                            field=field)


def load_params(path: str | Path | None = None) -> KernelParams:
    """The kernel parameters in ``path`` (default: the shipped `params.json`); bad JSON names the file."""
    if path is None:
        return _shipped()
    return _read(Path(path))


@lru_cache(maxsize=1)
def _shipped() -> KernelParams:
    return _read(PARAMS_FILE, shown=PARAMS_FILE.name)


def _read(path: Path, shown: str | None = None) -> KernelParams:
    name = shown or str(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise TrainsimError(f"cannot read: {exc.strerror or exc}", file=name) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TrainsimError(f"not JSON: {exc.msg} at line {exc.lineno}", file=name) from None
    return KernelParams(data, file=name)
