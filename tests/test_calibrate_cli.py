"""`trainsim calibrate`: a --quick run of tiny-cnn on 2 gloo ranks, interrupted and resumed; bad input."""

import json

import pytest
from typer.testing import CliRunner

pytest.importorskip("torch")

import torch  # noqa: E402

from trainsim.api import load_bundle  # noqa: E402
from trainsim.calibrate.measure import runner  # noqa: E402
from trainsim.calibrate.measure.timer_tick import PROBE_CALLS  # noqa: E402
from trainsim.cli import app  # noqa: E402

cli = CliRunner()


def one_line_error(result, code=2):
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, result.output
    return lines[0]


def calibrate(*args):
    return cli.invoke(
        app, ["calibrate", "--model", "tiny-cnn", "--device", "cpu", "--ranks", "2", "--quick", *args]
    )


@pytest.mark.slow
def test_quick_run_interrupted_then_resumed(tmp_path, monkeypatch):
    out = tmp_path / "bundle"

    # Ctrl-C during the collectives step: probe and links are kept, meta.json says partial, exit 130.
    def interrupt(run):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setitem(runner._STEP_FUNCTIONS, "collectives", interrupt)
        result = calibrate("--out", str(out), "--batch-sizes", "4,8,100000000")
    line = one_line_error(result, code=130)
    assert "interrupted" in line and "--resume" in line
    partial = load_bundle(out)
    assert partial.meta.status == "partial" and list(partial.meta.steps_done) == ["probe", "links"]
    assert partial.topology.gpus == ["gpu0", "gpu1"] and partial.links is not None
    probe_done = partial.meta.steps_done["probe"].finished

    # --resume skips what is done and finishes the bundle.
    result = calibrate("--out", str(out), "--batch-sizes", "4,8,100000000", "--resume", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["status"] == "complete"
    assert list(summary["steps"]) == list(runner.STEPS)
    bundle = load_bundle(out)
    assert bundle.complete and bundle.meta.steps_done["probe"].finished == probe_done
    assert {p.name for p in out.iterdir()} == {
        "meta.json",
        "machine.json",
        "topology.yaml",
        "links.json",
        "collectives.json",
        "workload-tiny-cnn.json",
    }
    # The calibrated topology's rank links carry what gloo delivers (its all-reduce bus bandwidth, never more
    # than the measured memory copy) and no latency: the simulator charges each gloo call its own)
    rank_copy = next(c for c in bundle.links.classes if c.kind == "rank_copy")
    all_reduce = next(r for r in bundle.collectives.results if r.collective == "all_reduce")
    assert all_reduce.ranks == 2 and all_reduce.backend == "gloo" and all_reduce.fit is not None
    # (the route's other links, e.g. the DRAM one, are measured separately and may be slower on a busy box)
    route = bundle.topology.route("gpu0", "gpu1")
    rank_links = [bundle.topology.graph.edges[e] for e in route if "gpu" in e[0] or "gpu" in e[1]]
    busbw = all_reduce.fit.beta_bytes_per_s * all_reduce.bus_factor
    assert rank_links and all(link["bandwidth"] == pytest.approx(min(busbw, rank_copy.fit.beta_bytes_per_s))
                              for link in rank_links)
    assert all(link["latency"] == 0 for link in rank_links)
    assert {r.collective for r in bundle.collectives.results} >= {"reduce", "gather", "scatter", "send_recv",
                                                                   "exchange"}
    # the timer tick probe ran (whether this box's stalls land on a tick is the box's business)
    tick = bundle.collectives.timer_tick
    assert tick is not None and tick.calls == PROBE_CALLS and (tick.period_s is not None or tick.reason)
    assert bundle.workload.provenance.rank_step is not None  # the pinned step, alone and together
    assert bundle.machine.cpu.gemm_flops_per_core > 0 and bundle.machine.cpu.threads_per_rank >= 1
    # The batch size that cannot fit is reported, the others measured.
    assert bundle.meta.steps_done["layers"].results["batch_sizes_measured"] == [4, 8]
    assert any("100000000" in note for note in summary["notes"])
    assert bundle.workload.name == "tiny-cnn" and bundle.workload.input.prep_s_per_sample > 0
    assert bundle.meta.provenance["torch"] and "command_line" in bundle.meta.provenance

    # Resuming a complete bundle measures nothing; other options than the bundle's are refused.
    result = calibrate("--out", str(out), "--batch-sizes", "4,8,100000000", "--resume")
    assert result.exit_code == 0 and "complete" in result.output
    assert load_bundle(out).meta.steps_done["links"].finished == bundle.meta.steps_done["links"].finished
    line = one_line_error(calibrate("--out", str(out), "--batch-sizes", "16", "--resume"))
    assert "config.batch_sizes" in line


def test_subcommands_still_work_beside_the_options():
    result = cli.invoke(app, ["calibrate", "describe", "tiny-cnn", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["name"] == "tiny-cnn"
    result = cli.invoke(app, ["calibrate", "--help"])
    assert result.exit_code == 0 and "--model" in result.output and "describe" in result.output


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--model", "lenet-9000"], "unknown model 'lenet-9000'"),
        (
            ["--model", "tiny-cnn", "--device", "tpu"],
            "--device: unknown device 'tpu'; valid choices: auto, cpu, cuda",
        ),
        (["--model", "tiny-cnn", "--batch-sizes", "8,x"], "--batch-sizes: expected comma-separated integers"),
        (["--model", "tiny-cnn", "--batch-sizes", "0"], "--batch-sizes: batch sizes must be positive"),
        (["--model", "tiny-cnn", "--ranks", "0"], "--ranks: must be >= 1"),
        (["--model", "tiny-cnn", "--device", "cpu", "--ranks", "1000"], "--ranks: 1000 CPU ranks on"),
        (["--device", "cpu"], "--model: give --model NAME"),
    ],
)
def test_bad_input_is_one_line(args, expected, tmp_path):
    result = cli.invoke(app, ["calibrate", *args, "--out", str(tmp_path / "b")])
    assert expected in one_line_error(result)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this box has a GPU")
def test_cuda_without_a_gpu(tmp_path):
    result = cli.invoke(app, ["calibrate", "--model", "tiny-cnn", "--device", "cuda", "--out", str(tmp_path)])
    assert "cuda requested but no CUDA GPU is available" in one_line_error(result)


def test_unwritable_output_folder(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    result = calibrate("--out", str(blocker / "bundle"))
    assert "--out: cannot write to the output folder" in one_line_error(result)


def test_a_folder_of_other_files_is_refused(tmp_path):
    out = tmp_path / "documents"
    out.mkdir()
    (out / "thesis.tex").write_text("mine")
    line = one_line_error(calibrate("--out", str(out)))
    assert str(out) in line and "--out" in line and "thesis.tex" in line
    assert "not a calibration bundle" in line
    assert [p.name for p in out.iterdir()] == ["thesis.tex"]


def test_a_fresh_run_replaces_the_previous_bundle(tmp_path, monkeypatch):
    # a complete bundle (of another model) and a note of the user's in its folder
    import shutil
    from pathlib import Path

    out = tmp_path / "bundle"
    shutil.copytree(Path(__file__).parent / "data" / "bundle-cpu-2rank", out)
    (out / "workload-resnet18.json").write_text((out / "workload-tiny-cnn.json").read_text())
    (out / "notes.txt").write_text("calibrated after the BIOS update")

    def interrupt(run):  # Ctrl-C in the first step of the new run
        raise KeyboardInterrupt

    monkeypatch.setitem(runner._STEP_FUNCTIONS, "probe", interrupt)
    one_line_error(calibrate("--out", str(out)), code=130)
    # what is left is the new run's partial bundle: none of the old measurements beside it
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "notes.txt"]
    partial = load_bundle(out)
    assert partial.meta.status == "partial" and not partial.meta.steps_done
    assert partial.links is None and partial.topology is None and not partial.workloads
