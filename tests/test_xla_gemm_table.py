"""benchmarks/extract_xla_gemm_table.py: XLA's GEMM table text to a trainsim kernel table."""

import importlib.util
from pathlib import Path

import pytest

from trainsim.sim.compute.kernels.dataset import read_rows

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "extract_xla_gemm_table.py"


def _script():
    spec = importlib.util.spec_from_file_location("extract_xla_gemm_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _entry(b, m, n, k, rates):
    flops = "\n".join(f'      flops {{ key: "{key}" value: {int(value)} }}' for key, value in rates.items())
    return f"    entries {{\n      b: {b}\n      m: {m}\n      n: {n}\n      k: {k}\n{flops}\n    }}\n"


PROTO = ("# proto-message: xla.GemmPerfTable\n\nentries {\n  key: \"sm_90\"\n  value {\n"
         + _entry(1, 256, 512, 1024, {"bf16xbf16->bf16": 100e12, "f32xf32->f32": 50e12,
                                      "f8e4m3fnxf8e4m3fn->bf16": 3000e12})
         + _entry(2, 4096, 4096, 4096, {"bf16xbf16->bf16": 800e12, "f32xf32->f32": 400e12,
                                        "f8e4m3fnxf8e4m3fn->bf16": 1000e12})
         + "  }\n}\nentries {\n  key: \"gfx942\"\n  value {\n"
         + _entry(1, 256, 256, 256, {"bf16xbf16->bf16": 5e12}) + "  }\n}\n")


def test_the_table_becomes_kernel_rows_and_a_series_above_its_peak_is_left_out(tmp_path, capsys):
    source, out = tmp_path / "table.txtpb", tmp_path / "rows.csv"
    source.write_text(PROTO)
    assert _script().main([str(source), "--out", str(out)]) == 0
    rows = read_rows(out)
    assert sorted((r.op, r.device, r.dtype, r.spec.batch) for r in rows) == [
        ("bmm", "h100-sxm", "bf16", 2), ("bmm", "h100-sxm", "tf32", 2),
        ("gemm", "h100-sxm", "bf16", 1), ("gemm", "h100-sxm", "tf32", 1)]
    small = next(r for r in rows if r.dtype == "bf16" and r.spec.batch == 1)
    assert small.latency_s == pytest.approx(2 * 256 * 512 * 1024 / 100e12, rel=1e-5)
    printed = capsys.readouterr().out
    assert "sm_90 f8e4m3fnxf8e4m3fn->bf16: 3000 TFLOP/s above h100-sxm's fp8 peak 1979" in printed
    assert "gfx942: no trainsim device spec" in printed


def test_a_source_without_the_table_is_refused_in_one_line(tmp_path):
    source = tmp_path / "other.so"
    source.write_bytes(b"\x00nothing here\x00")
    with pytest.raises(SystemExit, match="no GemmPerfTable in it"):
        _script().main([str(source), "--out", str(tmp_path / "rows.csv")])
    assert not (tmp_path / "rows.csv").exists()
