"""`trainsim calibrate kernels`: the sweep's cases, its table (read back as kernel rows) and its bad input."""

import json

import pytest
from typer.testing import CliRunner

from trainsim.calibrate.measure.kernel_cases import (
    CLASSES,
    RESNET50_CONVS,
    check_precisions,
    sampled_gemm_shapes,
    sweep_cases,
)
from trainsim.cli import app
from trainsim.errors import TrainsimError
from trainsim.sim.compute.kernels.dataset import read_rows
from trainsim.sim.compute.kernels.specs import Attention, Conv2d, Gemm, Streaming

cli = CliRunner()


def test_the_sweep_covers_every_class_in_each_precision_that_has_it():
    cases = sweep_cases(["fp32", "tf32", "bf16", "fp8"], list(CLASSES))
    by = {(c.op, c.dtype) for c in cases}
    assert {("gemm", d) for d in ("fp32", "tf32", "bf16", "fp8")} <= by
    assert ("conv", "fp8") not in by and ("attention", "tf32") not in by and ("softmax", "fp8") not in by
    convs = [c for c in cases if c.op == "conv" and c.dtype == "bf16"]
    assert len(convs) == 3 * len(RESNET50_CONVS)  # every distinct ResNet-50 convolution, in its three passes
    # fp8 products only where cuBLASLt takes them: k and n in multiples of 16
    assert all(c.dims["k"] % 16 == 0 and c.dims["n"] % 16 == 0 for c in cases if c.dtype == "fp8")
    assert len({c.key for c in cases}) == len(cases)


def test_drawn_gemm_shapes_repeat_with_their_seed_and_stay_in_range():
    shapes = sampled_gemm_shapes(30, seed=3)
    assert shapes == sampled_gemm_shapes(30, seed=3) != sampled_gemm_shapes(30, seed=4)
    assert all(8 <= side <= 16384 for m, n, k, _ in shapes for side in (m, n, k))
    assert all(side % 64 == 0 for m, n, k, _ in shapes[::3] for side in (m, n, k))
    more = sweep_cases(["fp32"], ["matmul"], gemm_samples=30, seed=3)
    assert len(more) - len(sweep_cases(["fp32"], ["matmul"])) == 30


def test_a_cpu_sweep_writes_a_kernel_table_the_model_reads(tmp_path):
    out = tmp_path / "sweep"
    result = cli.invoke(app, ["calibrate", "kernels", "--device", "cpu", "--quick", "--out", str(out),
                              "--dtypes", "fp32,bf16", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["failed"] == [] and summary["not_reached"] == 0 and summary["rows"] == summary["cases"]
    rows = read_rows(out / "kernels.csv")
    assert len(rows) == summary["rows"]
    assert {r.dtype for r in rows} == {"fp32"}  # the CPU times fp32 alone
    kinds = {type(r.spec) for r in rows}
    assert kinds == {Gemm, Conv2d, Attention, Streaming}
    assert {r.spec.pass_ for r in rows if isinstance(r.spec, Conv2d)} == {"forward", "backward_data",
                                                                          "backward_weight"}
    assert {r.spec.backward for r in rows if isinstance(r.spec, Attention)} == {False, True}
    assert all(r.latency_s > 0 and r.device == "cpu" for r in rows)
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["gpu"] == "cpu" and provenance["rows"] == len(rows) and provenance["quick"] is True


def test_a_spent_budget_keeps_what_was_measured(tmp_path):
    from trainsim.calibrate.measure.kernel_sweep import run_sweep

    summary = run_sweep(tmp_path, device="cpu", dtypes=["fp32"], classes=["memory"], quick=True, budget_s=0)
    assert summary["rows"] == 0 and summary["not_reached"] == summary["cases"] > 0
    assert (tmp_path / "kernels.csv").read_text().startswith("op,device,gpu,dtype")


@pytest.mark.parametrize("args, field", [
    (["--dtypes", "fp64"], "--dtypes"), (["--classes", "fft"], "--classes"), (["--conv-batch", "0"],
                                                                              "--conv-batch"),
    (["--gemm-samples", "-1"], "--gemm-samples"), (["--device", "tpu"], "--device"),
])
def test_bad_sweep_options_are_one_line_and_write_nothing(tmp_path, args, field):
    result = cli.invoke(app, ["calibrate", "kernels", "--quick", "--out", str(tmp_path / "o"), *args])
    assert result.exit_code == 2
    assert field in result.output and "Traceback" not in result.output
    assert not (tmp_path / "o").exists()


def test_a_bad_pass_names_its_line(tmp_path):
    head = "op,device,dtype,batch,in_channels,out_channels,height,width,kernel,stride,padding,pass,latency_us"
    (tmp_path / "t.csv").write_text(head + "\nconv,x,fp32,1,3,4,8,8,3,1,1,sideways,2\n")
    with pytest.raises(TrainsimError) as info:
        read_rows(tmp_path / "t.csv", shown="t.csv")
    assert (info.value.file, info.value.field) == ("t.csv:2", "pass")
    assert "valid choices: backward_data, backward_weight, forward" in str(info.value)


def test_a_precision_the_gpu_has_no_matrix_units_for_is_refused_up_front():
    check_precisions(["fp32", "tf32", "bf16", "fp8"], "NVIDIA H200", (9, 0))
    with pytest.raises(TrainsimError) as info:
        check_precisions(["fp32", "tf32"], "Tesla V100-SXM2-32GB", (7, 0))
    assert info.value.field == "--dtypes"
    assert "Tesla V100-SXM2-32GB (compute capability 7.0) has no tf32" in str(info.value)
    assert "valid choices: fp32, fp16" in str(info.value)
    with pytest.raises(TrainsimError, match="no fp8 matrix units; valid choices: fp32, tf32, bf16, fp16$"):
        check_precisions(["fp8"], "NVIDIA A100-SXM4-80GB", (8, 0))
