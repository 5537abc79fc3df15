"""Extract XLA's measured GEMM table into a trainsim kernel table (issue 42's GEMM evidence).

    python benchmarks/extract_xla_gemm_table.py SOURCE [--out benchmarks/data/xla-gemm-table.csv]

XLA ships a table of GEMMs it timed on real GPUs (the text proto ``xla.GemmPerfTable`` of its source file
``matmul_interpolator_data.h``, which its cost model interpolates): per GPU, 375 shapes (batch 1, 2, 4 by
m, n, k each 256 ... 4096) with the FLOP/s each precision reached. SOURCE is that header, the text proto,
or a ``jax-cuda12-pjrt`` wheel (or its ``xla_cuda_plugin.so``), which embeds the text verbatim; the table
shipped under benchmarks/data was taken from the jax-cuda12-pjrt 0.12.0.1 wheel.

Rows written (op ``gemm`` for batch 1, ``bmm`` above; latency = 2 b m n k / FLOP/s):

- the GPUs trainsim has a spec for: ``sm_90`` as ``h100-sxm`` (its bf16 rate reaches 805 TFLOP/s, above
  the PCIe board's 756 peak, so an SXM Hopper; H100 and H200 share the compute) and ``sm_100_B200`` as
  ``b200``. Others (``sm_107``, AMD's ``gfx942``/``gfx950``) are left out: trainsim has no spec for them.
- precisions: ``bf16xbf16->bf16`` as bf16; ``f32xf32->f32`` as tf32 (XLA runs f32 dots on tensor cores by
  default: sm_90's f32 reaches 403 TFLOP/s against a 67 TFLOP/s SIMT peak, about half its bf16 rate, as
  TF32 is); ``f8e4m3fnxf8e4m3fn->bf16`` as fp8.
- a series any of whose rows runs above the device's peak for its precision is left out whole (sm_90's
  fp8 reaches 2,620 TFLOP/s against H100's 1,979 dense peak: not a dense GEMM as 2 m n k counts it).

A source without the table, or with one this script cannot parse, is refused in one line.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
import zipfile
from pathlib import Path

from trainsim.sim.core.devices import get_device

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "data" / "xla-gemm-table.csv"
#: XLA's GPU keys -> trainsim's device spec
GPUS = {"sm_90": "h100-sxm", "sm_100_B200": "b200"}
#: XLA's precision keys -> trainsim's dtype
PRECISIONS = {"bf16xbf16->bf16": "bf16", "f32xf32->f32": "tf32", "f8e4m3fnxf8e4m3fn->bf16": "fp8"}
MARK = b"proto-message: xla.GemmPerfTable"
ENTRY = re.compile(r"entries \{\s*b: (\d+)\s*m: (\d+)\s*n: (\d+)\s*k: (\d+)\s*((?:flops \{[^}]*\}\s*)+)\}")
RATE = re.compile(r'key: "([^"]+)" value: (\d+)')


def table_text(source: Path) -> str:
    """The GemmPerfTable text proto held by ``source`` (header, text proto, wheel or shared object)."""
    raw = source.read_bytes()
    if zipfile.is_zipfile(source):
        with zipfile.ZipFile(source) as wheel:
            raw = b"".join(wheel.read(n) for n in wheel.namelist() if n.endswith(".so"))
    at = raw.find(MARK)
    if at < 0:
        at = raw.find(b"kDefaultMatmulPTable")
    if at < 0:
        raise SystemExit(f"error: {source}: no GemmPerfTable in it (expected XLA's "
                         "matmul_interpolator_data.h, its text proto, or a jax-cuda12-pjrt wheel)")
    start = raw.rfind(b"\x00", 0, at) + 1
    end = raw.find(b"\x00", at)
    return raw[start:end if end > 0 else len(raw)].decode("utf-8", errors="replace")


def gpu_blocks(text: str) -> dict[str, str]:
    """Each GPU key's block of entries."""
    keys = list(re.finditer(r'\n\s*entries \{\s*key: "([^"]+)"', text))
    return {m.group(1): text[m.end():(keys[i + 1].start() if i + 1 < len(keys) else len(text))]
            for i, m in enumerate(keys)}


def rows(text: str) -> tuple[list[dict], list[str]]:
    """The table's rows for `GPUS` and `PRECISIONS`, and one line per series left out and why."""
    out, left = [], []
    for key, block in gpu_blocks(text).items():
        if key not in GPUS:
            left.append(f"{key}: no trainsim device spec")
            continue
        device = get_device(GPUS[key])
        series: dict[str, list[dict]] = {}
        for b, m, n, k, rates in ENTRY.findall(block):
            b, m, n, k = int(b), int(m), int(n), int(k)
            for name, value in RATE.findall(rates):
                if name in PRECISIONS:
                    series.setdefault(name, []).append(
                        {"op": "gemm" if b == 1 else "bmm", "device": device.name, "dtype": PRECISIONS[name],
                         "batch": b, "m": m, "n": n, "k": k, "flops_per_s": float(value)})
        for name, found in series.items():
            dtype = PRECISIONS[name]
            peak = device.peak_flops.get(dtype)
            top = max(r["flops_per_s"] for r in found)
            if peak is None or top > peak:
                left.append(f"{key} {name}: {top / 1e12:.0f} TFLOP/s above {device.name}'s {dtype} peak "
                            f"{(peak or 0) / 1e12:.0f}")
                continue
            out += found
    if not out:
        raise SystemExit("error: the GemmPerfTable holds no rows for " + ", ".join(GPUS))
    return out, left


def write(found: list[dict], path: Path) -> None:
    """The rows as a trainsim kernel table (trainsim.sim.compute.kernels.dataset), latency in seconds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = ["op", "device", "dtype", "batch", "m", "n", "k", "latency_s"]
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        for r in sorted(found, key=lambda r: (r["device"], r["dtype"], r["batch"], r["m"], r["n"], r["k"])):
            seconds = 2.0 * r["batch"] * r["m"] * r["n"] * r["k"] / r["flops_per_s"]
            writer.writerow([r["op"], r["device"], r["dtype"], r["batch"], r["m"], r["n"], r["k"],
                             f"{seconds:.6e}"])
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    found, left = rows(table_text(args.source))
    write(found, args.out)
    counts: dict[tuple, int] = {}
    for r in found:
        counts[(r["device"], r["dtype"])] = counts.get((r["device"], r["dtype"]), 0) + 1
    for (device, dtype), n in sorted(counts.items()):
        print(f"{device:9s} {dtype:5s} {n} rows")
    for line in left:
        print(f"left out: {line}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
