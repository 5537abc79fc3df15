"""`plan`: the per-layer decomposition search, its performance model against the simulator, and the CLI."""

import itertools
import json
import math

import pytest
from typer.testing import CliRunner

from trainsim.cli import app
from trainsim.formats.workload import load_workload
from trainsim.sim.planning.spatial_plan import candidate_grids, choose, make_model, plan
from trainsim.sim.spatial.decomposition import trunk_end
from trainsim.topologies import load_topology

runner = CliRunner()


@pytest.fixture(scope="module")
def dgx1():
    return load_topology("dgx1-v100")


def test_plan_picks_data_parallelism_for_a_large_batch(dgx1):
    p = choose(load_workload("vgg16"), dgx1, 256, 8)
    assert set(p.grids) == {(8, 1, 1)}
    assert p.model_s == pytest.approx(p.model_dp_s)


def test_plan_goes_spatial_below_one_sample_per_gpu(dgx1):
    wl = load_workload("vgg16")
    p = choose(wl, dgx1, 4, 8)  # half a sample per GPU: data parallelism alone would leave 4 GPUs idle
    trunk = p.grids[: trunk_end(wl)]
    assert all(g[1] * g[2] > 1 and math.prod(g) == 8 for g in trunk)
    assert p.model_dp_s is None  # batch 4 cannot split over 8 GPUs


def test_dynamic_program_finds_the_brute_force_optimum(dgx1):
    wl = load_workload("tiny-cnn")
    model = make_model(wl, dgx1, 2, 4)
    candidates = candidate_grids(wl, 4, 2)

    def objective(grids):
        return (
            model.input_time(grids[0])
            + sum(model.layer_cost(i, g) for i, g in enumerate(grids))
            + sum(model.move_cost(i, grids[i - 1], grids[i]) for i in range(1, len(grids)))
        )

    brute = min(objective(list(grids)) for grids in itertools.product(*candidates))
    grids, _ = model.best(candidates)
    assert objective(grids) == pytest.approx(brute, rel=1e-12)
    assert math.prod(len(c) for c in candidates) > 100  # the search had something to choose from


@pytest.mark.parametrize("workload, batch", [("vgg16", 4), ("vgg16", 64), ("resnet50", 4)])
def test_the_model_agrees_with_the_simulator(dgx1, workload, batch):
    # the model leaves out link sharing and the all-reduce competing with halos: within 5 % on DGX-1
    p = plan(load_workload(workload), dgx1, batch, 8)
    assert p.model_s == pytest.approx(p.simulated_s, rel=0.05)
    if batch < 8:
        assert p.simulated_s < p.simulated_dp_s  # beats data parallelism on the GPUs the batch can use


def test_plan_cli_prints_the_plan_and_the_comparison():
    result = runner.invoke(
        app,
        [
            "plan",
            "--workload",
            "tiny-cnn",
            "--topology",
            "dgx1-v100",
            "--batch",
            "2",
            "--gpus",
            "4",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["schema"] == "trainsim.plan/1" and doc["gpus"] == 4
    assert set(doc["layer_grids"]) == {layer.name for layer in load_workload("tiny-cnn").layers}
    assert doc["simulated_s"] > 0 and doc["simulated_dp_s"] > 0 and doc["data_parallel_gpus"] == 2
    text = runner.invoke(app, ["plan", "ddp-resnet50-dgx1-v100", "--gpus", "4", "--no-simulate"])
    assert text.exit_code == 0, text.output
    assert "4x1x1" in text.output and "data parallel" in text.output


def test_plan_cli_writes_the_plan(tmp_path):
    out = tmp_path / "plan.json"
    result = runner.invoke(
        app,
        [
            "plan",
            "--workload",
            "tiny-cnn",
            "--topology",
            "dgx1-v100",
            "--batch",
            "8",
            "--gpus",
            "2",
            "--no-simulate",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["provenance"]["tool"] == "trainsim" and doc["plan"][0]["grid"] == [2, 1, 1]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--workload", "tiny-cnn", "--batch", "4"], "--topology"),
        (["ddp-resnet50-dgx1-v100", "--batch", "4"], "not both"),
        (["--workload", "tiny-cnn", "--topology", "dgx1-v100", "--batch", "4", "--gpus", "9"], "has 8"),
        (["ddp-resnet50-dgx1-v100", "--precision", "fp8"], "--precision: unknown precision 'fp8'"),
        (["validate-cpu"], "--set topology=DIR/topology.yaml"),  # plan has no --calibration to suggest
        (["--workload", "tiny-cnn", "--topology", "dgx1-v100", "--batch", "4", "--set", "batch_size=8"],
         "--set: overrides a scenario's fields, and none is given"),
    ],
)
def test_plan_cli_bad_input_is_one_line(args, message):
    result = runner.invoke(app, ["plan", *args])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_plan_cli_says_when_a_plan_does_not_fit_the_gpus():
    args = ["plan", "--workload", "vgg16", "--topology", "pcie-4gpu-gen3", "--batch", "4096"]
    doc = json.loads(runner.invoke(app, [*args, "--json"]).output)
    assert doc["memory_peak_bytes"] > doc["memory_capacity_bytes"] == 16 * 2**30
    assert doc["fits"] is False and doc["data_parallel_fits"] is False
    text = runner.invoke(app, args).output
    assert "OUT OF MEMORY (a result, not an error): the plan needs" in text and "16.00 GiB" in text
    doc = json.loads(runner.invoke(app, [*args[:-1], "64", "--json"]).output)
    assert doc["fits"] is True and doc["data_parallel_fits"] is True


def test_plan_cli_takes_the_precision_over_the_scenarios():
    def model_s(*extra):
        result = runner.invoke(app, ["plan", "single-gpu-resnet50", "--no-simulate", "--json", *extra])
        assert result.exit_code == 0, result.output
        return json.loads(result.output)["model_s"]

    tf32, bf16 = model_s(), model_s("--precision", "bf16")  # the scenario's is tf32
    assert bf16 < tf32 and model_s("--precision", "tf32") == tf32
