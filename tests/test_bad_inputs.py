"""The bad-input catalogue, class by class, through the CLI: every case exits non-zero with exactly one
`error:` line on stderr naming the file and/or field and what is wrong, no traceback, and no output file
half-written. With ``--json`` the error is also a JSON object on stdout."""

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from trainsim.cli import app
from trainsim.formats.scenario import MAX_ITERATIONS

runner = CliRunner()
BUNDLE = Path(__file__).parent / "data" / "bundle-cpu-2rank"
BINARY = bytes(range(256)) * 4  # 0x80.. is never valid UTF-8 on its own
SMALL = ["--set", "workload=tiny-cnn", "--set", "batch_size=8", "--set", "iterations=1"]


def fails(args, *expected: str):
    """Run the CLI; assert one clean error line containing every ``expected`` text; return the line."""
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code != 0, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def _write(path: Path, data) -> Path:
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def _topology(**gpu) -> dict:
    return {"name": "t", "nodes": [{"name": "cpu0", "kind": "cpu", "cores": 4, "dram_bandwidth_gbps": 50},
                                   {"name": "gpu0", "kind": "gpu", "spec": "V100", **gpu}],
            "links": [{"a": "cpu0", "b": "gpu0", "kind": "pcie", "generation": 3}]}


def _workload(tmp_path, mutate) -> Path:
    data = json.loads((Path(__file__).parents[1] / "scenarios" / "workloads" / "tiny-cnn.json").read_text())
    mutate(data)
    path = tmp_path / "wl.json"
    path.write_text(json.dumps(data))  # json writes inf/nan as Infinity/NaN
    return path


def _scenario(tmp_path, text: str | None = None) -> Path:
    body = text or ("name: s\ntopology: pcie-4gpu-gen3\nworkload: tiny-cnn\nstrategy: {name: single}\n"
                    "batch_size: 8\niterations: 1\n")
    return _write(tmp_path / "s.yaml", body)


# ---- binary files and folders given as input files -------------------------------------------------------

def test_binary_files_are_refused(tmp_path):
    blob = tmp_path / "blob.yaml"
    blob.write_bytes(BINARY)
    jblob = tmp_path / "blob.json"
    jblob.write_bytes(BINARY)
    fails(["simulate", blob], str(blob), "not a text scenario file")
    fails(["topo", "show", blob], str(blob), "not a text topology file")
    fails(["simulate", "single-gpu-resnet50", "--set", f"topology={blob}"], str(blob), "not a text")
    fails(["workload", "show", jblob], str(jblob), "not a text workload file")
    fails(["simulate", "single-gpu-resnet50", "--set", f"workload={jblob}"], str(jblob), "not a text")


def test_folders_are_refused(tmp_path):
    folder = tmp_path / "folder"
    folder.mkdir()
    for args, what in ((["simulate", folder], "scenario"), (["topo", "show", folder], "topology"),
                       (["workload", "show", folder], "workload"), (["execute", folder], "scenario")):
        fails(args, str(folder), f"is a folder, not a {what} file")


# ---- output paths: checked before any work ---------------------------------------------------------------

def _outputs(tmp_path, bad: str) -> list[list]:
    good = tmp_path / "good"
    return [
        ["simulate", "single-gpu-resnet50", *SMALL, "--trace", f"{good}.json.gz", "--records", bad],
        ["simulate", "single-gpu-resnet50", *SMALL, "--trace", bad, "--records", f"{good}.csv"],
        ["workload", "generate", "tiny-cnn", "-o", bad],
        ["plan", "--workload", "tiny-cnn", "--topology", "pcie-4gpu-gen3", "--batch", "8", "--no-simulate",
         "--out", bad],
    ]


@pytest.mark.parametrize("case", ["folder", "missing", "read-only"])
def test_bad_output_paths_fail_before_the_run(tmp_path, case):
    if case == "folder":   # named as a file: --trace takes any other name as a folder of per-rank traces
        bad, expected = tmp_path / "out.json", "is a folder"
        bad.mkdir()
    elif case == "missing":
        bad, expected = tmp_path / "nope" / "out.json", "does not exist"
    else:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o555)
        if os.access(locked, os.W_OK):  # root: chmod does not stop writes
            pytest.skip("running as root: a read-only folder is writable")
        bad, expected = locked / "out.json", "not writable"
    for args in _outputs(tmp_path, str(bad)):
        fails(args, str(bad), expected)
        assert not any(tmp_path.glob("good*")), f"half-written outputs of {args}"


def test_a_place_no_file_can_be_created_fails_before_the_run(tmp_path):
    # /proc takes no new files even from root, to whom os.access says yes: the check tries, not asks
    if not Path("/proc/self").is_dir():
        pytest.skip("no /proc on this system")
    trace_file, trace_folder = "/proc/trainsim-out.json.gz", "/proc/trainsim-out"
    for args, option in ((["simulate", "single-gpu-resnet50", *SMALL, "--trace", trace_file], "--trace"),
                         (["simulate", "single-gpu-resnet50", *SMALL, "--trace", trace_folder], "--trace"),
                         (["replay", tmp_path / "no-trace.json", "--trace", trace_folder], "--trace"),
                         (["execute", "validate-cpu", "--profile", trace_folder], "--profile"),
                         (["workload", "generate", "tiny-cnn", "-o", "/proc/wl.json"], "-o")):
        fails(args, "/proc", option, "not writable")


def test_a_pipe_or_device_is_not_an_output_file(tmp_path):
    pipe = tmp_path / "out.json"
    os.mkfifo(pipe)
    fails(["workload", "generate", "tiny-cnn", "-o", pipe], str(pipe), "not a regular file")
    fails(["simulate", "single-gpu-resnet50", *SMALL, "--trace", pipe], str(pipe), "not a regular file")
    assert pipe.is_fifo()
    from trainsim.errors import TrainsimError
    from trainsim.files import write_atomic

    with pytest.raises(TrainsimError, match="not a regular file"):
        write_atomic(pipe, "data")
    assert pipe.is_fifo()


def test_an_output_through_a_symbolic_link_keeps_the_link(tmp_path):
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "wl.json"
    link = tmp_path / "wl.json"
    link.symlink_to(target)
    result = runner.invoke(app, ["workload", "generate", "tiny-cnn", "-o", str(link)])
    assert result.exit_code == 0, result.output
    assert link.is_symlink() and json.loads(target.read_text())["name"] == "tiny-cnn"


def test_a_file_system_failure_mid_run_is_one_line(tmp_path, monkeypatch):
    import errno

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "replace", full)
    out = tmp_path / "wl.json"
    fails(["workload", "generate", "tiny-cnn", "-o", out], str(out), "No space left on device")
    assert list(tmp_path.iterdir()) == []  # the temporary file is gone too

    def unreadable(*args, **kwargs):
        raise OSError(errno.EIO, os.strerror(errno.EIO), "scenarios/workloads/tiny-cnn.json")
    monkeypatch.setattr("trainsim.formats.workload.save_workload", unreadable)
    fails(["workload", "generate", "tiny-cnn", "-o", out], "tiny-cnn.json", "Input/output error")


def test_a_trace_folder_that_cannot_be_replaced_fails_before_the_run(tmp_path):
    # --trace DIR writes rank-N.json.gz files and replaces the folder whole: other files there are refused
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    taken = tmp_path / "taken"
    taken.write_text("a file, not a folder")
    for command in (["simulate", "single-gpu-resnet50", *SMALL], ["replay", tmp_path / "no-trace.json"]):
        fails([*command, "--trace", mine], str(mine), "--trace", "not rank traces")
        fails([*command, "--trace", taken], str(taken), "--trace", "is a file")
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_an_output_folder_that_is_a_file_fails_before_the_run(tmp_path):
    blocker = tmp_path / "taken"
    blocker.write_text("a file, not a folder")
    # validate would simulate and run every variant before writing its report; execute would run them all
    fails(["validate", "validate-cpu", "--calibration", tmp_path / "no-bundle", "--report", blocker],
          str(blocker), "--report", "is a file")
    fails(["execute", "validate-cpu", "--profile", blocker / "traces"], str(blocker), "--profile",
          "not a folder")


# ---- topologies: GPUs ------------------------------------------------------------------------------------

def test_topology_without_gpus(tmp_path):
    data = _topology()
    data["nodes"].pop()
    data["links"] = []
    path = _write(tmp_path / "t.yaml", data)
    fails(["topo", "show", path], str(path), "nodes", "at least one node of kind gpu")
    fails(["simulate", "single-gpu-resnet50", "--set", f"topology={path}"], "at least one node of kind gpu")
    fails(["plan", "--workload", "tiny-cnn", "--topology", path, "--batch", "8"], "at least one node")


def test_unknown_gpu_spec_lists_the_devices(tmp_path):
    path = _write(tmp_path / "t.yaml", _topology(spec="V999", memory_gib=16))
    fails(["topo", "show", path], str(path), "nodes[1].spec", "unknown GPU spec 'V999'", "v100-16gb", "cpu")


# ---- non-finite numbers ----------------------------------------------------------------------------------

@pytest.mark.parametrize("field, value", [("param_bytes", True), ("flops_forward_per_sample", False),
                                          ("output_bytes_per_sample", 12.5)])
def test_a_workload_number_that_is_not_one(tmp_path, field, value):
    # JSON true is not a byte count, nor 12.5 bytes: the reader says which layer and field
    path = _workload(tmp_path, lambda d: d["layers"][0].update({field: value}))
    fails(["workload", "show", path], str(path), f"layers.0(conv1).{field}")


@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_non_finite_flops_in_a_workload(tmp_path, value):
    path = _workload(tmp_path, lambda d: d["layers"][0].update(flops_forward_per_sample=value))
    fails(["workload", "show", path], str(path), "layers.0(conv1).flops_forward_per_sample", "finite")


def test_non_finite_topology_and_scenario_numbers(tmp_path):
    topo = _topology()
    topo["links"][0] = {"a": "cpu0", "b": "gpu0", "kind": "pcie", "bandwidth_gbps": ".inf"}
    path = _write(tmp_path / "t.yaml", yaml.safe_dump(topo).replace("'.inf'", ".inf"))
    fails(["topo", "show", path], str(path), "links[0].bandwidth_gbps", "finite")
    fails(["simulate", "ddp-resnet50-pcie-4gpu-gen3", *SMALL, "--set", "strategy.bucket_cap_mb=.inf"],
          "strategy.bucket_cap_mb", "finite")
    fails(["simulate", "single-gpu-resnet50", *SMALL, "--set", "host.memory_gib=.nan"], "host.memory_gib",
          "finite")


# ---- time fits that give no time at the batch asked ------------------------------------------------------

def test_fit_not_positive_at_the_batch(tmp_path):
    def measured(d):
        d["provenance"].update(device="v100", device_spec="v100-16gb")
        d["layers"][0]["forward"] = {"fit": {"model": "affine", "a": -1.0, "b": 1e-3}}
    path = _workload(tmp_path, measured)
    field = "layers.0(conv1).forward.fit"
    fails(["workload", "times", path, "--device", "v100", "--batch", "64"], str(path), field, ">= 0")
    fails(["simulate", "single-gpu-resnet50", "--set", f"workload={path}", "--set", "batch_size=64",
           "--set", "iterations=1"], str(path), field, "batch 64")


# ---- duplicate YAML keys ---------------------------------------------------------------------------------

def test_duplicate_keys(tmp_path):
    path = _scenario(tmp_path, "name: s\ntopology: pcie-4gpu-gen3\nworkload: tiny-cnn\nstrategy:\n"
                               "  name: single\n  name: ddp\nbatch_size: 8\n")
    fails(["simulate", path], str(path), "line 6", "duplicate key 'name'")
    topo = _write(tmp_path / "t.yaml", yaml.safe_dump(_topology()) + "name: again\n")
    fails(["topo", "show", topo], str(topo), "duplicate key 'name'", "line ")


# ---- bools where numbers are meant -----------------------------------------------------------------------

@pytest.mark.parametrize("setting, field", [
    ("batch_size=true", "batch_size"), ("iterations=true", "iterations"), ("gpus=true", "gpus"),
    ("host.data_workers=false", "host.data_workers"),
    ("host.prep_s_per_sample=true", "host.prep_s_per_sample"),
    ("strategy.bucket_cap_mb=true", "strategy.bucket_cap_mb"),
])
def test_bool_for_a_number(setting, field):
    fails(["simulate", "ddp-resnet50-pcie-4gpu-gen3", *SMALL, "--set", setting], field)


def test_unknown_loader_layout_lists_the_valid_ones():
    fails(["simulate", "ddp-resnet50-pcie-4gpu-gen3", *SMALL, "--set", "host.loader=both"],
          "ddp-resnet50-pcie-4gpu-gen3.yaml", "host.loader", "'per-gpu' or 'shared'")


def test_negative_data_preparation_cost():
    fails(["simulate", "ddp-resnet50-pcie-4gpu-gen3", *SMALL, "--set", "host.prep_s_per_sample=-1"],
          "ddp-resnet50-pcie-4gpu-gen3.yaml", "host.prep_s_per_sample", "greater than or equal to 0")


def test_bool_for_a_number_in_a_topology(tmp_path):
    data = _topology()
    data["nodes"][0]["cores"] = True
    path = _write(tmp_path / "t.yaml", data)
    fails(["topo", "show", path], str(path), "nodes[0].cores")


# ---- validate-cpu without a bundle, absurd iterations ----------------------------------------------------

def test_calibrated_topology_needs_a_bundle():
    fails(["simulate", "validate-cpu"], "validate-cpu.yaml", "topology", "--calibration")


def test_iterations_are_capped():
    fails(["simulate", "single-gpu-resnet50", "--set", "iterations=100000000"], "iterations",
          str(MAX_ITERATIONS))
    fails(["simulate", "single-gpu-resnet50", "--set", "warmup_iterations=100000000"], "warmup_iterations")


# ---- --json: the error as a JSON object too --------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ["topo", "show", "{folder}"], ["topo", "route", "{folder}", "gpu0", "gpu1"],
    ["topo", "bench", "{folder}"],
    ["simulate", "{folder}"], ["max-batch", "{folder}"], ["plan", "{folder}"], ["execute", "{folder}"],
    ["workload", "show", "{folder}"], ["workload", "times", "{folder}", "--device", "v100"],
    ["workload", "generate", "nope-model"], ["device", "show", "nope-device"], ["replay", "{folder}/x.json"],
    ["reproduce", "nope-paper"], ["calibrate"], ["calibrate", "describe", "tiny-cnn", "-o", "{folder}"],
    ["validate", "{folder}", "--calibration", "{folder}"],
])
def test_json_errors(tmp_path, args):
    folder = tmp_path / "folder"
    folder.mkdir()
    args = [a.format(folder=folder) for a in args]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    doc = json.loads(result.stdout)
    assert set(doc) == {"error", "file", "field", "exit_code"} and doc["exit_code"] == 2
    assert doc["error"] and doc["error"] in lines[0]


# ---- calibration bundles (read by trainsim.formats.bundle) -----------------------------------------------

def _bundle(tmp_path) -> Path:
    copy = tmp_path / "bundle"
    shutil.copytree(BUNDLE, copy)
    return copy


def _break_meta(how):
    def apply(root: Path):
        meta = root / "meta.json"
        if how == "missing":
            meta.unlink()
        elif how == "corrupt":
            meta.write_text("{nope")
        elif how == "empty":
            meta.write_text("")
        else:
            meta.write_text(json.dumps({**json.loads(meta.read_text()), "schema": "trainsim.calibration/2"}))
    return apply


def _machine_cores(root: Path):
    machine = root / "machine.json"
    data = json.loads(machine.read_text())
    data["cores"] = "two"
    machine.write_text(json.dumps(data))


@pytest.mark.parametrize("breaker, expected", [
    (_break_meta("missing"), "meta.json"), (_break_meta("corrupt"), "meta.json"),
    (_break_meta("empty"), "meta.json"), (_break_meta("schema"), "trainsim.calibration/2"),
    (_machine_cores, "cores"),
    (lambda root: (root / "collectives.json").write_bytes(BINARY), "collectives.json"),
], ids=["meta-missing", "meta-corrupt", "meta-empty", "meta-schema", "machine-cores", "collectives-binary"])
def test_broken_bundles(tmp_path, breaker, expected):
    root = _bundle(tmp_path)
    breaker(root)
    fails(["simulate", "validate-cpu", "--calibration", root, "--set", "iterations=1"], expected)


def test_bundle_of_another_workload(tmp_path):
    root = _bundle(tmp_path)
    fails(["simulate", "validate-cpu", "--calibration", root, "--set", "workload=resnet50"], "resnet50",
          "tiny-cnn")


def test_json_errors_of_typer_checks():
    result = runner.invoke(app, ["execute", "validate-cpu", "--iterations", "0", "--json"])
    assert result.exit_code == 2
    doc = json.loads(result.stdout)
    assert doc["field"] == "--iterations" and "greater than or equal to 1" in doc["error"]


# ---- messages name the user's fields, not the schema's inner names -------------------------------------

@pytest.mark.parametrize("setting, expected", [
    ("topology=5", ("topology: should be a string or a mapping, got 5",)),
    ("gpus=abc", ("gpus: should be a list or an integer, got 'abc'",)),
    ("gpus=[a]", ("gpus.0:", "integer")),
    ("workload=nope", ("single-gpu-resnet50.yaml", "workload: unknown workload 'nope'", "tiny-cnn")),
    ("workload.image_size=abc", ("single-gpu-resnet50.yaml", "workload.image_size", "'abc'")),
    ("strategy.collective_algo=zzz", ("strategy.collective_algo", "'ring'", "'nvls_tree'")),
])
def test_scenario_errors_name_the_users_field(setting, expected):
    line = fails(["simulate", "single-gpu-resnet50", "--set", setting], *expected)
    assert "list[int]" not in line and ".str" not in line


def test_an_unknown_gpu_spec_is_named_wherever_the_topology_is_used(tmp_path):
    path = _write(tmp_path / "t.yaml", _topology(spec="V999", memory_gib=16))
    expected = (str(path), "nodes[1].spec", "unknown GPU spec 'V999'", "v100-16gb")
    fails(["simulate", "single-gpu-resnet50", "--set", f"topology={path}"], *expected)
    trace = tmp_path / "no-trace.json"  # the options are checked before the traces are read
    fails(["replay", trace, "--topology", path], *expected)
    fails(["replay", trace, "--set", f"ran_on={path}"], *expected)
    fails(["replay", trace, "--topology", "nope"], "--topology: unknown topology 'nope'", "dgx-a100")


@pytest.mark.parametrize("setting", ["compression=zzz", "algo=zzz", "network=zzz", "collectives=zzz",
                                     "ran_on=zzz"])
def test_replay_set_errors_name_the_option(tmp_path, setting):
    key = setting.split("=")[0]
    fails(["replay", tmp_path / "no-trace.json", "--set", setting], f"--set {key}: unknown", "valid choices")


@pytest.mark.parametrize("args, expected", [
    (["topo", "bench"], ("Missing argument 'topology'", "topo bench --help`")),
    (["validate", "validate-cpu"], ("Missing option '--calibration'",)),
    (["simulate", "single-gpu-resnet50", "--no-such-option"], ("No such option: --no-such-option",)),
    (["no-such-command"], ("No such command 'no-such-command'", "--help`")),
])
def test_usage_errors_are_one_line(args, expected):
    fails(args, *expected)


@pytest.mark.parametrize("args", [["reproduce", "nope"], ["sweep", "no-such-sweep"]])
def test_an_error_is_all_that_stderr_holds(args):
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and result.stderr.startswith("error: ") and result.stderr.count("\n") == 1


def test_an_empty_output_name_is_an_error(tmp_path):
    fails(["simulate", "single-gpu-resnet50", *SMALL, "--trace", ""], "--trace: empty file name")
    fails(["simulate", "single-gpu-resnet50", *SMALL, "--records", " "], "--records: empty file name")
    fails(["sweep", "ddp-resnet50-scaling", "-o", ""], "--out: empty file name")


def test_a_route_from_a_node_to_itself_is_an_error():
    fails(["topo", "route", "dgx-a100", "gpu0", "0"], "DST", "same node (gpu0)")


@pytest.mark.parametrize("key", ["1", "true", "null", "''"])
def test_a_variant_name_that_is_not_a_string(tmp_path, key):
    base = _scenario(tmp_path).read_text()
    scenario = _scenario(tmp_path, f"{base}variants:\n  a: {{}}\n  {key}: {{}}\n")
    for args in (["simulate", scenario, "--variant", "a"], ["simulate", scenario, "--variant", "zz"],
                 ["max-batch", scenario, "--variant", "zz"]):
        fails(args, str(scenario), "variants", "name must be a non-empty string")
    if key != "''":  # without --variant the schema checks the keys' kind
        fails(["simulate", scenario], str(scenario), "variants", "should be a string")


def test_a_variant_of_a_scenario_without_variants(tmp_path):
    fails(["simulate", _scenario(tmp_path), "--variant", "x"], "variants", "has no variants", "'x'")


def test_two_outputs_in_one_place_fail_before_the_run(tmp_path):
    same = tmp_path / "same"
    run = ["simulate", "single-gpu-resnet50", *SMALL]
    fails([*run, "--trace", same, "--records", same], "--records and --trace name the same place")
    fails([*run, "--trace", f"{same}.json.gz", "--records", f"{same}.json.gz"], "same place")
    fails([*run, "--trace", same, "--records", same / "r.csv"], "same place")  # inside the trace folder
    fails(["sweep", "ddp-resnet50-scaling", "-o", same, "--plot", same], "--plot and --out")
    fails(["execute", "validate-cpu", "--out", same, "--profile", same], "--profile and --out")
    assert list(tmp_path.iterdir()) == []


def test_messages_say_what_the_path_is(tmp_path):
    blocker = tmp_path / "file.txt"
    blocker.write_text("a file")
    fails(["workload", "generate", "tiny-cnn", "-o", blocker / "x.json"], "file.txt' is a file, not a folder")
    fails(["simulate", "/dev/null"], "/dev/null", "not a regular file")
    fails(["topo", "bench", "dgx-a100", "--sizes", "0,5"], "sizes must be positive", "has 0")


def test_an_empty_list_of_names_is_an_error(tmp_path):
    fails(["validate", "validate-cpu", "--calibration", tmp_path, "--variants", ","], "--variants: no names")
    fails(["max-batch", "single-gpu-resnet50", "--offload", ""], "--offload: no names")
