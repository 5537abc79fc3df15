"""`trainsim simulate` and `trainsim scenarios list` through the CLI."""

import json

import pytest
from simtools import tiny_topology
from typer.testing import CliRunner

from trainsim.cli import app

runner = CliRunner()
SMALL = ["--set", "workload=tiny-cnn", "--set", "batch_size=64", "--set", "iterations=1"]


def run(args):
    return runner.invoke(app, args, catch_exceptions=False)


def test_summary_table():
    result = run(["simulate", "ddp-resnet50-pcie-4gpu-gen3", *SMALL])
    assert result.exit_code == 0, result.output
    for text in ("iteration", "samples/s", "exposed communication", "idle", "GPUs", "gpu3", "Busiest links"):
        assert text in result.output


def test_json_trace_records_and_determinism(tmp_path):
    outputs = []
    for i in range(2):
        trace, records = tmp_path / f"t{i}.json.gz", tmp_path / f"r{i}.csv"
        result = run(
            [
                "simulate",
                "dp-gpu0-resnet50-pcie-4gpu-gen3",
                *SMALL,
                "--json",
                "--trace",
                str(trace),
                "--records",
                str(records),
            ]
        )
        assert result.exit_code == 0, result.output
        data = json.loads(result.output)
        data["stats"].pop("wall_s")
        outputs.append((data, trace.read_bytes(), records.read_bytes()))
    assert outputs[0] == outputs[1]
    data = outputs[0][0]
    assert data["schema"] == "trainsim.simulation/1" and data["strategy"] == "dp-gpu0"
    assert sum(data["breakdown_s"].values()) == pytest.approx(data["iteration_time_s"], rel=1e-6)
    assert data["provenance"]["tool"] == "trainsim" and "date" not in data["provenance"]


def test_oom_is_printed_as_a_result_and_exits_3_unless_allowed(tmp_path):
    args = ["simulate", "single-gpu-resnet50", "--set", "batch_size=4096", "--set", "iterations=1"]
    result = run(args)
    assert result.exit_code == 3, result.output
    assert "OUT OF MEMORY" in result.output and "needs" in result.output and "has 40.00 GiB" in result.output
    headline = next(line for line in result.output.splitlines() if "does not fit" in line)
    assert headline.startswith("OUT OF MEMORY") and "samples/s" not in headline
    assert run([*args, "--allow-oom"]).exit_code == 0
    as_json = run([*args, "--json"])
    assert as_json.exit_code == 3 and json.loads(as_json.output)["oom"]
    fits = run(["simulate", "single-gpu-resnet50", "--set", "iterations=1"])
    assert fits.exit_code == 0 and "samples/s" in fits.output


def test_scenarios_list():
    result = run(["scenarios", "list", "--json"])
    assert result.exit_code == 0
    names = {row["name"] for row in json.loads(result.output)}
    assert {"single-gpu-resnet50", "ddp-resnet50-dgx-a100", "dp-gpu0-vgg16-dgx1-v100"} <= names


def _bad_workload(tmp_path):
    data = json.loads(
        json.dumps(
            {
                "schema": "trainsim.workload/1",
                "name": "broken",
                "dtype": "float32",
                "input": {"shape": [3], "dtype": "uint8", "bytes_per_sample": 3},
                "layers": [{"name": "fc", "kind": "linear", "output_bytes_per_sample": 4}],
                "provenance": {"device": "analytic"},
            }
        )
    )
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--set", "workload=resnet5"], "unknown workload 'resnet5'; valid choices: alexnet"),
        (["--set", "topology=dgx-z"], "unknown topology 'dgx-z'; valid choices: "),
        (["--set", "strategy.name=zero"], "strategy.name: should be 'single', 'dp-gpu0', 'ddp'"),
        (["--set", "batch_size=100", "--set", "gpus=3"], "batch_size 100 does not divide over 3 GPUs"),
        (["--set", "gpus=9"], "asks for 9 GPUs but topology 'pcie-4gpu-gen3' has 4"),
        (["--set", "strategy.bucket=1"],
         "unknown key at strategy 'bucket'; valid choices: backward_halo, bucket_cap_mb"),
        (["--variant", "nope"], "has no variants, so none is called 'nope'"),
    ],
)
def test_bad_input_is_one_line(args, message):
    result = runner.invoke(app, ["simulate", "ddp-resnet50-pcie-4gpu-gen3", *args])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.output
    assert "Traceback" not in result.output


def _meta(bundle) -> None:
    """The meta.json every bundle has (a finished run that lists no files)."""
    (bundle / "meta.json").write_text(json.dumps({
        "schema": "trainsim.calibration/1", "provenance": {}, "config": {}, "status": "complete",
        "steps_planned": []}))


def test_workload_lacking_fields_and_corrupt_bundle(tmp_path):
    result = runner.invoke(
        app, ["simulate", "ddp-resnet50-pcie-4gpu-gen3", "--set", f"workload={_bad_workload(tmp_path)}"]
    )
    assert result.exit_code == 2
    assert "layers.0(fc).param_bytes: missing (required)" in result.output
    assert len(result.output.strip().splitlines()) == 1
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    _meta(bundle)
    (bundle / "topology.yaml").write_text("nodes: [\n")
    (bundle / "workload-tiny-cnn.json").write_text("{}")
    result = runner.invoke(app, ["simulate", "single-gpu-resnet50", "--calibration", str(bundle)])
    assert result.exit_code == 2 and "topology.yaml: not valid YAML" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_calibration_bundle_replaces_topology_and_workload(tmp_path):
    import yaml

    bundle = tmp_path / "bundle"
    bundle.mkdir()
    _meta(bundle)
    (bundle / "topology.yaml").write_text(yaml.safe_dump(tiny_topology(gpus=2)))
    from trainsim.formats.workload import dumps_workload, load_workload

    (bundle / "workload-tiny-cnn.json").write_text(dumps_workload(load_workload("tiny-cnn")))
    # the scenario's workload must be the bundle's: resnet50 is not in it
    result = runner.invoke(app, ["simulate", "ddp-resnet50-dgx-a100", "--calibration", str(bundle)])
    assert result.exit_code == 2 and "'resnet50' is not in the calibration bundle (it has: tiny-cnn)" in (
        result.output)
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    result = runner.invoke(
        app,
        [
            "simulate",
            "ddp-resnet50-dgx-a100",
            "--calibration",
            str(bundle),
            "--set",
            "batch_size=64",
            "--set",
            "workload=tiny-cnn",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["topology"] == "tiny" and data["workload"] == "tiny-cnn" and data["num_gpus"] == 2


def test_asked_to_stop_covers_the_iterations_finished_by_then():
    from trainsim import api

    overrides = ["workload=tiny-cnn", "batch_size=64", "iterations=3"]
    full = api.simulate("ddp-resnet50-pcie-4gpu-gen3", overrides=overrides)
    run_ = api.simulation("ddp-resnet50-pcie-4gpu-gen3", overrides=overrides)
    run_.request_stop()  # before it starts: it stops after the first measured iteration
    stopped = run_.run()
    assert stopped.stopped_early and not full.stopped_early
    assert stopped.iterations == 1 and full.iterations == 3
    assert stopped.iteration_times_s == full.iteration_times_s[:1]
    assert stopped.iteration_ends_s == full.iteration_ends_s[:stopped.warmup_iterations + 1]
    assert stopped.to_dict()["stopped_early"] is True and "stopped_early" not in full.to_dict()


def test_first_ctrl_c_asks_to_stop_a_second_interrupts(capsys):
    import os
    import signal

    from trainsim.cli.common import stop_on_interrupt

    asked = []
    before = signal.getsignal(signal.SIGINT)  # default_int_handler, or SIG_IGN in a background job
    with pytest.raises(KeyboardInterrupt), stop_on_interrupt(lambda: asked.append(1), "soon"):
        os.kill(os.getpid(), signal.SIGINT)
        assert asked == [1]
        os.kill(os.getpid(), signal.SIGINT)
    assert "stopping soon; Ctrl-C again" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is before  # put back as it was


def test_interrupt_is_one_line_and_exit_130(monkeypatch):
    from trainsim import api

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "simulation", interrupted)
    result = run(["simulate", "ddp-resnet50-pcie-4gpu-gen3", *SMALL])
    assert result.exit_code == 130
    assert result.output.strip() == "error: interrupted (Ctrl-C)"


@pytest.mark.parametrize("override, message", [
    ("strategy.ps_socket=5", "ps-resnet50-pcie-4gpu-gen3.yaml: strategy.ps_socket: the topology has 1 CPU "
                             "socket (0..0), no socket 5"),
    ("strategy.ps_cores=500", "ps-resnet50-pcie-4gpu-gen3.yaml: strategy.ps_cores: socket 0 (cpu0) has 20 "
                              "cores, fewer than 500"),
])
def test_a_strategy_field_the_machine_cannot_satisfy_names_the_scenario(override, message):
    result = run(["simulate", "ps-resnet50-pcie-4gpu-gen3", *SMALL, "--set", override])
    assert result.exit_code == 2 and result.output.strip() == f"error: {message}"


@pytest.mark.parametrize("topology, message", [
    ("{generator: pcie_tree, gpus: 4, lanes: 7}",
     "topology.lanes: should be 1, 2, 4, 8, 12, 16 or 32, got 7"),
    ("{generator: nvswitch, gpus: 4}", "topology.links_per_gpu: missing (required)"),
    ("{generator: cluster, nodes: 2, node: zz}", "topology.node: unknown topology 'zz'; valid choices: "),
    ("{generator: cluster, nodes: 2, node: {generator: pcie_tree, gpus: 2, lanes: 3}}",
     "topology.node.lanes: should be 1, 2, 4, 8, 12, 16 or 32, got 3"),
])
def test_a_generated_topologys_error_names_its_field_in_the_scenario(topology, message):
    result = run(["simulate", "ddp-resnet50-pcie-4gpu-gen3", *SMALL, "--set", f"topology={topology}"])
    assert result.exit_code == 2
    assert result.output.startswith(f"error: ddp-resnet50-pcie-4gpu-gen3.yaml: {message}"), result.output


def test_scenarios_show_prints_what_the_simulator_reads():
    import yaml

    result = run(["scenarios", "show", "validate-gpu", "--variant", "ddp-2", "--set", "batch_size=64"])
    assert result.exit_code == 0, result.output
    shown = yaml.safe_load(result.output)
    assert shown["strategy"]["name"] == "ddp" and shown["gpus"] == 2 and shown["batch_size"] == 64
    listed = run(["scenarios", "show", "validate-gpu"]).output.splitlines()[-1]
    assert listed.startswith("# variants (--variant NAME): single, ") and "offload-prefetch-1" in listed
    doc = json.loads(run(["scenarios", "show", "ddp-resnet50-dgx-a100", "--json"]).output)
    assert doc["schema"] == "trainsim.scenario/1" and doc["strategy"]["name"] == "ddp"


def test_an_algorithm_the_machine_lacks_names_the_scenarios_field():
    # raised inside a SimPy process, which re-raises a copy without the field: the original is reported
    result = run(["simulate", "ddp-resnet50-dgx-a100", *SMALL, "--set", "strategy.collective_algo=nvls"])
    assert result.exit_code == 2
    assert result.output.startswith("error: ddp-resnet50-dgx-a100.yaml: strategy.collective_algo: nvls needs")
