"""Nothing lost, nothing hung (issue 41): each class of bad input is refused by one mechanism at its
boundary, and every case of the catalogue exits 2 (130 for Ctrl-C) with exactly one `error:` line naming
the file and field, leaving every file as it was.

- outputs that are, link to or hold an input: `trainsim.files.check_not_input` with `trainsim.inputs`;
- values nested past the parsers, YAML aliases that explode, symbolic link loops: `trainsim.yamlio`,
  `trainsim.files.read_text`;
- numbers beyond their unit: `trainsim.units`; trees that are not trees: topologies.validation;
  damaged Kineto traces: `trainsim.formats.kineto`;
- sweeps that would never start, a second Ctrl-C: `trainsim.sweeps`, the CLI's interrupt handler.
"""

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from trainsim.cli import app
from trainsim.errors import TrainsimError

runner = CliRunner()
ROOT = Path(__file__).parents[1]
TRACE = Path(__file__).parent / "data" / "traces-h200" / "resnet50-fp32-step.json.gz"
SCENARIO = ("name: s\ntopology: pcie-4gpu-gen3\nworkload: tiny-cnn\nstrategy: {name: single}\nbatch_size: 8\n"
            "iterations: 1\n")


def fails(args, *expected: str, code: int = 2) -> str:
    """Run the CLI; assert exit ``code``, one `error:` line holding every ``expected`` text; return it."""
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def snapshot(folder: Path) -> dict:
    """Every file under ``folder`` (links as links) with its content: what a refused run must leave."""
    out = {}
    for path in sorted(folder.rglob("*")):
        if path.is_symlink():
            out[str(path)] = ("link", os.readlink(path))
        elif path.is_file():
            out[str(path)] = path.read_bytes()
        else:
            out[str(path)] = "folder"
    return out


@pytest.fixture
def place(tmp_path, monkeypatch):
    """A working folder with a scenario file and a trace, as a user's would be."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(SCENARIO)
    shutil.copy(TRACE, tmp_path / "t.json.gz")
    return tmp_path


# ---- 1. an output that is, links to or holds an input is refused before any work -----------------------

@pytest.mark.parametrize("args, expected", [
    (["simulate", "s.yaml", "--records", "s.yaml"], ("s.yaml: --records: is the SCENARIO file",)),
    (["simulate", "s.yaml", "--trace", "s.yaml"], ("--trace", "SCENARIO")),
    (["plan", "s.yaml", "--no-simulate", "--out", "s.yaml"], ("s.yaml: --out: is the SCENARIO file",)),
    (["replay", "t.json.gz", "--trace", "t.json.gz"], ("t.json.gz: --trace: is the TRACE file",)),
    (["execute", "s.yaml", "--out", "s.yaml"], ("--out", "SCENARIO")),
    (["simulate", "single-gpu-resnet50", "--set", "workload=wl.json", "--records", "wl.json"],
     ("wl.json: --records", "--set workload")),
    (["simulate", "s.yaml", "--trace", "."], (".: --trace: holds the SCENARIO file",)),
])
def test_an_output_that_is_an_input(place, args, expected):
    (place / "wl.json").write_text((ROOT / "scenarios" / "workloads" / "tiny-cnn.json").read_text())
    before = snapshot(place)
    line = fails(args, *expected, "an output must not overwrite an input")
    assert snapshot(place) == before, line


def test_an_output_that_links_to_an_input(place):
    (place / "link.csv").symlink_to("s.yaml")
    os.link(place / "s.yaml", place / "hard.csv")
    before = snapshot(place)
    fails(["simulate", "s.yaml", "--records", "link.csv"], "link.csv: --records: links to the SCENARIO file")
    fails(["simulate", "s.yaml", "--records", "hard.csv"], "hard.csv: --records: is the SCENARIO file")
    assert snapshot(place) == before


def test_a_file_a_scenario_or_sweep_names_is_an_input_too(place):
    topology = yaml.safe_load((ROOT / "topologies" / "pcie-4gpu-gen3.yaml").read_text())
    (place / "t.yaml").write_text(yaml.safe_dump(topology))
    (place / "s.yaml").write_text(SCENARIO.replace("pcie-4gpu-gen3", "t.yaml"))
    (place / "sw.yaml").write_text("schema: trainsim.sweep/1\nname: sw\nscenario: s.yaml\n"
                                   "grid: {gpus: [1]}\n")
    before = snapshot(place)
    fails(["simulate", "s.yaml", "--records", "t.yaml"], "t.yaml: --records: is the topology file that")
    fails(["sweep", "sw.yaml", "-o", "s.yaml"], "s.yaml: --out: is the scenario file that sw.yaml names")
    fails(["sweep", "sw.yaml", "-o", "sw.yaml"], "sw.yaml: --out: is the SPEC file")
    assert snapshot(place) == before


def test_a_trace_folder_output_that_is_or_holds_an_input(place):
    (place / "run").mkdir()
    shutil.copy(TRACE, place / "run" / "rank-0.json.gz")
    before = snapshot(place)
    fails(["replay", "run", "--trace", "run"], "run: --trace: is the TRACE folder")
    fails(["replay", "run/rank-0.json.gz", "--trace", "run"], "run: --trace: holds the TRACE file")
    fails(["replay", "run", "--trace", "run/rank-0.json.gz"], "--trace: is a file in the TRACE folder")
    fails(["replay", "run", "--chakra", "run"], "run: --chakra: is the TRACE folder")
    assert snapshot(place) == before


def test_an_output_folder_that_is_an_input_folder(place):
    bundle = place / "bundle"
    shutil.copytree(ROOT / "tests" / "data" / "bundle-cpu-2rank", bundle)
    before = snapshot(place)
    fails(["validate", "validate-cpu", "--calibration", bundle, "--report", bundle],
          "--report: is the --calibration folder")
    fails(["simulate", "validate-cpu", "--calibration", bundle, "--records", bundle / "meta.json"],
          "--records: is a file in the --calibration folder")
    assert snapshot(place) == before


def test_an_output_through_a_symbolic_link_is_written_through(place):
    # not an input: the link's target gets the data and the link stays, for every writer
    (place / "real").mkdir()
    (place / "out.png").symlink_to(place / "real" / "topo.png")
    (place / "out.csv").symlink_to(place / "real" / "records.csv")
    assert runner.invoke(app, ["topo", "show", "pcie-4gpu-gen3", "--png", "out.png"]).exit_code == 0
    assert runner.invoke(app, ["simulate", "s.yaml", "--records", "out.csv"]).exit_code == 0
    assert (place / "out.png").is_symlink() and (place / "real" / "topo.png").read_bytes()[:4] == b"\x89PNG"
    assert (place / "out.csv").is_symlink()
    assert (place / "real" / "records.csv").read_text().startswith("iteration,")


def test_an_output_that_is_a_link_loop_or_leads_nowhere(place):
    (place / "a.csv").symlink_to("b.csv")
    (place / "b.csv").symlink_to("a.csv")
    (place / "d").symlink_to("e")
    (place / "e").symlink_to("d")
    (place / "lost.csv").symlink_to("nowhere/x.csv")
    before = snapshot(place)
    fails(["simulate", "s.yaml", "--records", "a.csv"], "a.csv: --records: is a symbolic link loop")
    fails(["replay", "t.json.gz", "--trace", "d"], "d: --trace: is a symbolic link loop")
    fails(["simulate", "s.yaml", "--records", "lost.csv"], "lost.csv: --records: folder 'nowhere' does not")
    assert snapshot(place) == before


def test_check_not_input_alone(tmp_path):
    from trainsim.files import check_not_input

    given = tmp_path / "in.yaml"
    given.write_text("x")
    check_not_input(tmp_path / "other.yaml", "--out", [("the X file", given)])  # another file: fine
    check_not_input(tmp_path, "--report", [("the X file", given)], folder=True)  # written into: fine
    with pytest.raises(TrainsimError, match="holds the X file"):
        check_not_input(tmp_path, "--trace", [("the X file", given)], folder=True, whole=True)
    with pytest.raises(TrainsimError, match="is the X file"):
        check_not_input(tmp_path / "." / "in.yaml", "--out", [("the X file", given)])


# ---- 2. what became a traceback is one line naming the file and the field --------------------------------

def test_a_cluster_whose_node_is_itself(tmp_path):
    cluster = {"schema": "trainsim.topology/1", "name": "c", "generator": "cluster", "nodes": 2,
               "network": "ib", "generation": "hdr"}
    (tmp_path / "self.yaml").write_text(yaml.safe_dump({**cluster, "node": "self.yaml"}))
    (tmp_path / "a.yaml").write_text(yaml.safe_dump({**cluster, "node": "b.yaml"}))
    (tmp_path / "b.yaml").write_text(yaml.safe_dump({**cluster, "node": "a.yaml"}))
    fails(["topo", "show", tmp_path / "self.yaml"], "self.yaml: node: names", "cannot contain itself")
    fails(["topo", "show", tmp_path / "a.yaml"], "b.yaml: node: names", "a.yaml")
    fails(["simulate", "single-gpu-resnet50", "--set", f"topology={tmp_path / 'self.yaml'}"], "node: names")


def test_values_nested_past_the_parsers(tmp_path):
    deep = "[" * 100_000 + "]" * 100_000
    (tmp_path / "t.yaml").write_text(f"name: {deep}\n")
    (tmp_path / "wl.json").write_text(f'{{"name": {deep}}}')
    (tmp_path / "sw.yaml").write_text(f"schema: trainsim.sweep/1\nset: {deep}\n")
    fails(["topo", "show", tmp_path / "t.yaml"], "t.yaml: line 1, column", "nested deeper than 100 levels")
    fails(["simulate", tmp_path / "t.yaml"], "t.yaml", "nested deeper than 100 levels")
    fails(["sweep", tmp_path / "sw.yaml"], "sw.yaml", "nested deeper than 100 levels")
    fails(["workload", "show", tmp_path / "wl.json"], "wl.json", "nested deeper than a workload file has")
    doc = json.loads(gzip.decompress(TRACE.read_bytes()))
    text = json.dumps(doc).replace('"traceEvents": [', f'"traceEvents": [{{"a": {deep}}}, ', 1)
    (tmp_path / "t.json").write_text(text)
    fails(["replay", tmp_path / "t.json"], "t.json", "nested thousands of levels deep")


def test_an_integer_of_400_digits_in_a_workload(tmp_path):
    data = json.loads((ROOT / "scenarios" / "workloads" / "tiny-cnn.json").read_text())
    data["layers"][0]["param_bytes"] = int("9" * 400)
    path = tmp_path / "wl.json"
    path.write_text(json.dumps(data))
    expected = (str(path), "layers.0(conv1).param_bytes", "at most 2^50 bytes", "about 400 digits")
    fails(["workload", "show", path], *expected)
    fails(["simulate", "single-gpu-resnet50", "--set", f"workload={path}"], *expected)


@pytest.mark.parametrize("args", [["sweep", "{loop}.yaml"], ["simulate", "{loop}.yaml"],
                                  ["scenarios", "show", "{loop}.yaml"], ["topo", "show", "{loop}.yaml"],
                                  ["workload", "show", "{loop}.json"], ["replay", "{loop}.json.gz"],
                                  ["simulate", "single-gpu-resnet50", "--set", "topology={loop}.yaml"]])
def test_a_symbolic_link_loop_as_an_input(tmp_path, args):
    for ext in (".yaml", ".json", ".json.gz"):
        (tmp_path / f"a{ext}").symlink_to(tmp_path / f"b{ext}")
        (tmp_path / f"b{ext}").symlink_to(tmp_path / f"a{ext}")
    line = fails([a.format(loop=tmp_path / "a") for a in args], str(tmp_path / "a"))
    assert "symbolic links" in line


def test_a_results_file_with_a_cell_over_the_csv_limit(tmp_path):
    from trainsim.sweeps import load_spec
    from trainsim.sweeps.results import columns

    spec = tmp_path / "sw.yaml"
    spec.write_text("schema: trainsim.sweep/1\nname: sw\nscenario: single-gpu-resnet50\ngrid: {gpus: [1]}\n")
    out = tmp_path / "r.csv"
    out.write_text(",".join(columns(load_spec(spec).fields)) + "\n" + "x" * 200_000 + "\n")
    before = out.read_bytes()
    fails(["sweep", spec, "-o", out], str(out), "not a results file", "field larger than field limit")
    assert out.read_bytes() == before


# ---- 3. what was silently accepted is refused -----------------------------------------------------------

def _topology(tmp_path, links, cpus=1) -> Path:
    nodes = [{"name": f"cpu{i}", "kind": "cpu", "cores": 4, "dram_bandwidth_gbps": 50} for i in range(cpus)]
    nodes += [{"name": "sw0", "kind": "pcie_switch"}, {"name": "sw1", "kind": "pcie_switch"}]
    nodes += [{"name": f"gpu{i}", "kind": "gpu", "spec": "V100"} for i in range(2)]
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({"schema": "trainsim.topology/1", "name": "t", "nodes": nodes,
                                    "links": [{"a": a, "b": b, "kind": kind, "generation": gen}
                                              for a, b, kind, gen in links]}))
    return path


def test_pcie_links_must_form_a_tree_per_socket(tmp_path):
    gpus = [("sw0", "gpu0", "pcie", 3), ("sw1", "gpu1", "pcie", 3)]
    cycle = _topology(tmp_path, [("cpu0", "sw0", "pcie", 3), ("sw0", "sw1", "pcie", 3),
                                 ("sw1", "cpu0", "pcie", 3), *gpus])
    fails(["topo", "show", cycle], str(cycle), "links[2]", "sw1 - cpu0 closes a cycle")
    roots = _topology(tmp_path, [("cpu0", "cpu1", "upi", "skl"), ("cpu0", "sw0", "pcie", 3),
                                 ("cpu1", "sw0", "pcie", 3), ("cpu0", "sw1", "pcie", 3), *gpus], cpus=2)
    fails(["topo", "show", roots], str(roots), "links[2]", "joins the PCIe trees of cpu1 and cpu0")
    fails(["simulate", "single-gpu-resnet50", "--set", f"topology={roots}"], str(roots), "links[2]")


def _events(doc):
    return [i for i, e in enumerate(doc["traceEvents"]) if e.get("ph") == "X"]


def _damaged(tmp_path, how) -> Path:
    doc = json.loads(gzip.decompress(TRACE.read_bytes()))
    kernel = next(i for i in _events(doc) if doc["traceEvents"][i].get("cat") == "kernel")
    how(doc["traceEvents"], doc["traceEvents"][kernel])
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    return path


def _one_id(events, _kernel):
    for e in events:
        if isinstance(e.get("args"), dict) and "correlation" in e["args"]:
            e["args"]["correlation"] = 1


def _one_gpu_id(events, _kernel):
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and isinstance(e.get("args"), dict):
            e["args"]["correlation"] = 7


@pytest.mark.parametrize("how, expected", [
    (lambda events, k: k.update(ts=1e30), ("ts 1e+30 us is past 2^63 ns",)),
    (lambda events, k: k.update(ts=-5), ("ts -5 is negative",)),
    (lambda events, k: k.update(dur=1e18), ("dur 1e+18 us is longer than a day",)),
    (lambda events, k: k.update(ts=k["ts"] + 2 * 86_400e6), ("].ts:", "span 2 days")),
    (_one_id, (".args.correlation:", "correlation id 1 of", "each launch has its own")),
    (_one_gpu_id, (".args.correlation:", "has correlation id 7", "no launch in the trace has it")),
], ids=["ts-1e30", "ts-negative", "dur-1e18", "span-2-days", "one-id", "one-gpu-id"])
def test_a_damaged_kineto_trace(tmp_path, how, expected):
    path = _damaged(tmp_path, how)
    fails(["replay", path], str(path), "traceEvents[", *expected)


def test_a_cuda_graphs_kernels_share_its_id(shared_file):
    from trainsim.formats.kineto import load_trace

    trace = load_trace(shared_file("traces", "v100-ddp2-rank1-cudagraph.json.gz"))
    assert len({g.correlation for g in trace.gpu_events}) < len(trace.gpu_events)


def test_flops_of_1e308_are_refused_not_printed_as_nan(tmp_path):
    data = json.loads((ROOT / "scenarios" / "workloads" / "tiny-cnn.json").read_text())
    data["layers"][0]["flops_forward_per_sample"] = 1e308
    path = tmp_path / "wl.json"
    path.write_text(json.dumps(data))
    fails(["simulate", "single-gpu-resnet50", "--set", f"workload={path}"], str(path),
          "layers.0(conv1).flops_forward_per_sample", "at most 1e21 FLOPs")


def test_a_result_with_a_time_that_is_not_finite_is_refused():
    from trainsim.sim.core.result import Result

    with pytest.raises(TrainsimError, match="iteration_times_s: .* nan s, not a finite number"):
        Result("s", "single", "t", "w", [], 8, "fp32", 1, 1, [float("nan")], {"compute": 1.0}, "gpu0", [],
               (0.0, 1.0))


@pytest.mark.parametrize("args, expected", [
    (["simulate", "ddp-resnet50-pcie-4gpu-gen3", "--set", "strategy.bucket_cap_mb=26214400"],
     ("strategy.bucket_cap_mb: should be at most 65536 MiB (64 GiB), got 26214400", "in MiB, not bytes")),
    (["simulate", "single-gpu-resnet50", "--set", "host.memory_gib=85899345920"],
     ("host.memory_gib", "in GiB, not bytes")),
    (["simulate", "single-gpu-resnet50", "--set", "optimizations.offload_chunk_mb=67108864"],
     ("optimizations.offload_chunk_mb", "MiB")),
])
def test_a_unit_field_given_in_another_unit(args, expected):
    fails(args, *expected)


def test_a_topology_figure_given_in_another_unit(tmp_path):
    path = _topology(tmp_path, [("cpu0", "sw0", "pcie", 3), ("sw0", "gpu0", "pcie", 3),
                                ("sw0", "gpu1", "pcie", 3)])
    data = yaml.safe_load(path.read_text())
    data["links"][0] = {"a": "cpu0", "b": "sw0", "kind": "pcie", "bandwidth_gbps": 16e9}
    path.write_text(yaml.safe_dump(data))
    fails(["topo", "show", path], str(path), "links[0].bandwidth_gbps", "in GB/s (1e9 bytes/s), not bytes/s")
    data["links"][0] = {"a": "cpu0", "b": "sw0", "kind": "pcie", "generation": 3, "latency_us": 5e9}
    path.write_text(yaml.safe_dump(data))
    fails(["topo", "show", path], str(path), "links[0].latency_us", "in microseconds")


def test_every_unit_field_of_the_schemas_is_bounded():
    from trainsim.formats import bundle, device, scenario
    from trainsim.topologies import fabrics, generators, schema
    from trainsim.units import unbounded_unit_fields

    models = [m for module in (scenario, schema, generators, fabrics, device) for m in vars(module).values()
              if isinstance(m, type) and hasattr(m, "model_fields") and m.__module__ == module.__name__]
    assert unbounded_unit_fields(models) == []
    assert unbounded_unit_fields([bundle.Fit]) == ["Fit.bandwidth_gbps", "Fit.busbw_gbps", "Fit.latency_us"]


@pytest.mark.parametrize("text, expected", [
    ("generator: cluster\nnode: dgx-a100\nnodes: " + "9" * 400 + "\nnetwork: ib\n",
     ("nodes: should be less than or equal to 65536",)),
    ("generator: cluster\nnode: dgx-a100\nnodes: 40000\nnetwork: ib\n",
     ("nodes: 40,000 machines of 8 GPUs",)),
    ("generator: pcie_tree\ngpus: 100000000\n", ("gpus: should be less than or equal to 4096",)),
])
def test_a_generated_topology_too_large_to_build(tmp_path, text, expected):
    path = tmp_path / "t.yaml"
    path.write_text(f"schema: trainsim.topology/1\nname: t\n{text}")
    fails(["topo", "show", path], str(path), *expected)


@pytest.mark.parametrize("args, expected", [
    (["workload", "generate", "gpt2-small", "--set", "n_layer=100000000"],
     ("n_layer: the options make a model of more than 100,000 layers",)),
    (["simulate", "single-gpu-resnet50", "--set", "workload.image_size=" + "9" * 400],
     ("single-gpu-resnet50.yaml: workload.image_size: the options make a model out of range",)),
])
def test_an_analytic_model_too_large_to_build(args, expected):
    start = time.perf_counter()
    fails(args, *expected)
    assert time.perf_counter() - start < 10


# ---- 4. nothing hung --------------------------------------------------------------------------------------

def _sweep(tmp_path, grid: dict, set_: dict | None = None) -> Path:
    path = tmp_path / "sw.yaml"
    path.write_text(yaml.safe_dump({"schema": "trainsim.sweep/1", "name": "sw",
                                    "scenario": "single-gpu-resnet50",
                                    "set": set_ or {"iterations": 1, "warmup_iterations": 0}, "grid": grid}))
    return path


def test_a_sweep_of_a_million_points_is_refused_at_once(tmp_path):
    spec = _sweep(tmp_path, {"batch_size": list(range(1, 1001)), "iterations": list(range(1, 1001))})
    start = time.perf_counter()
    fails(["sweep", spec, "-o", tmp_path / "r.csv"], str(spec), "grid", "1,000,000 points (1000 x 1000)",
          "at most 100,000")
    assert time.perf_counter() - start < 5
    assert not (tmp_path / "r.csv").exists()


def test_the_points_of_a_large_sweep_are_made_when_asked_for(tmp_path):
    import itertools

    from trainsim.sweeps import load_spec

    grid = {"batch_size": list(range(1, 401)), "iterations": list(range(1, 251))}
    start = time.perf_counter()
    sweep = load_spec(_sweep(tmp_path, grid))
    assert len(sweep.points) == 100_000 and time.perf_counter() - start < 5
    combos = list(itertools.product(grid["batch_size"], grid["iterations"]))
    for index in (0, 1, 250, 99_999):
        point = sweep.points[index]
        assert point.index == index and point.values == dict(zip(grid, combos[index], strict=True))


def test_a_sweep_writes_rows_before_its_last_point_resolves(tmp_path, monkeypatch):
    from trainsim.sweeps import load_spec, run_sweep
    from trainsim.sweeps.spec import Sweep

    sweep = load_spec(_sweep(tmp_path, {"gpus": [1, 2, 3, 4]}))
    resolved, seen = [], []
    real = Sweep.resolve
    monkeypatch.setattr(Sweep, "resolve",
                        lambda self, point: resolved.append(point.index) or real(self, point))

    def progress(done, total, row):
        seen.append((done, total, len(resolved)))

    out = tmp_path / "r.csv"
    run_sweep(sweep, out, workers=1, progress=progress)
    assert [total for _, total, _ in seen] == [4] * 4  # the total is known from the first point on
    assert seen[0][2] <= 2  # the first row came when one point (and the one after) had resolved, not all
    rerun = []
    run_sweep(sweep, out, workers=1, progress=lambda done, total, row: rerun.append((done, total, row)))
    assert rerun == [(1, 4, None), (2, 4, None), (3, 4, None), (4, 4, None)]  # resumed points count too


def _bomb(levels: int = 9) -> str:
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(lines)


def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path):
    bomb = _bomb().replace("\n", "\n    ")
    scenario = tmp_path / "s.yaml"
    scenario.write_text(f"{SCENARIO}variants:\n  v:\n    {bomb}\n")
    spec = tmp_path / "sw.yaml"
    spec.write_text("schema: trainsim.sweep/1\nname: sw\nscenario: single-gpu-resnet50\n"
                    f"grid: {{gpus: [1]}}\nset:\n  x:\n    {bomb}\n")
    start = time.perf_counter()
    fails(["scenarios", "show", scenario], str(scenario), "line 1, column 1", "aliases expand", "alias bomb")
    fails(["sweep", spec], str(spec), "aliases expand", "at most 100,000 may be repeated")
    fails(["simulate", scenario], str(scenario), "aliases expand")
    assert time.perf_counter() - start < 10
    cyclic = tmp_path / "c.yaml"
    cyclic.write_text(SCENARIO + "x: &a [*a]\n")
    fails(["scenarios", "show", cyclic], str(cyclic), "an alias inside the value it names")


def test_aliases_that_repeat_a_little_are_fine(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(f"{SCENARIO}variants:\n  a: &v {{batch_size: 16}}\n  b: *v\n")
    result = runner.invoke(app, ["scenarios", "show", str(scenario)])
    assert result.exit_code == 0, result.output


def test_topo_show_says_what_it_is_doing():
    from trainsim.topologies import load_topology
    from trainsim.topologies.analysis import describe

    steps = []
    describe(load_topology("dgx-a100-2node"), progress=steps.append)
    assert [s.split(":")[0].split(" of ")[0] for s in steps] == [
        "links and nodes", "bisection", "network bisection", "the paths between GPUs"]


@pytest.mark.slow
def test_a_second_ctrl_c_ends_a_sweep_at_once(tmp_path):
    # a real process: Ctrl-C reaches it and its worker processes as a terminal sends it, to the group
    spec = tmp_path / "sw.yaml"  # 24 points of a second or two each
    spec.write_text(yaml.safe_dump({"schema": "trainsim.sweep/1", "name": "sw", "set": {"iterations": 300},
                                    "scenario": "ddp-resnet50-pcie-4gpu-gen3",
                                    "grid": {"batch_size": [64 * i for i in range(1, 9)],
                                             "gpus": [1, 2, 4]}}))
    out = tmp_path / "r.csv"
    command = [sys.executable, "-m", "trainsim", "sweep", str(spec), "-o", str(out), "-j", "2"]
    # as a terminal's foreground process has it, whatever this test run inherited (a job started in the
    # background of a script ignores SIGINT, and so would the sweep and its workers)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
                               start_new_session=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while not (out.exists() and out.read_text().count("\n") >= 2) and time.monotonic() < deadline:
            assert process.poll() is None, process.communicate()
            time.sleep(0.05)
        os.killpg(process.pid, signal.SIGINT)
        time.sleep(0.05)
        os.killpg(process.pid, signal.SIGINT)
        _, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    lines = [line for line in err.decode().splitlines() if line.strip()]
    assert process.returncode == 130
    assert len(lines) == 1 and lines[0].startswith("error: interrupted"), lines
    rows = out.read_text().splitlines()
    assert len(rows) >= 2 and all(row.count(",") == rows[0].count(",") for row in rows)  # whole rows kept
