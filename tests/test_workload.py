"""The workload format: time models, validation, files, errors."""

import json
import os

import pytest

from trainsim.errors import TrainsimError
from trainsim.formats.workload import (
    SCHEMA,
    SpatialShape,
    TimeModel,
    Workload,
    dumps_workload,
    fit_time,
    list_workloads,
    load_workload,
    parse_workload,
    save_workload,
)
from trainsim.sim.compute.analytic_models import build_analytic

# --- TimeModel ---------------------------------------------------------------------------------------


def test_interpolates_piecewise_linearly_between_points():
    tm = TimeModel(points=[(1, 1.0, 0.1), (4, 2.5, 0.1), (8, 4.0, 0.0)])
    assert tm.at(1) == 1.0
    assert tm.at(4) == 2.5
    assert tm.at(2) == pytest.approx(1.5)
    assert tm.at(6) == pytest.approx(3.25)


def test_extrapolates_with_the_fit_anchored_at_the_nearest_point():
    tm = TimeModel(points=[(2, 1.6, 0.0), (4, 2.5, 0.0)], fit={"model": "affine", "a": 0.5, "b": 0.5})
    assert tm.at(8) == pytest.approx(2.5 + (4.5 - 2.5))  # last point + fit increase
    assert tm.at(1) == pytest.approx(1.6 - 0.5)


def test_extrapolates_without_a_fit_from_the_end_segment_or_proportionally():
    assert TimeModel(points=[(1, 1.0, 0), (4, 2.5, 0), (8, 4.0, 0)]).at(16) == pytest.approx(7.0)
    assert TimeModel(points=[(4, 2.0, 0)]).at(8) == pytest.approx(4.0)


def test_fit_only_time_model_evaluates_the_fit():
    tm = TimeModel(fit={"model": "affine", "a": 1e-3, "b": 2e-4})
    assert tm.at(10) == pytest.approx(3e-3)
    power = TimeModel(fit={"model": "power", "a": 0.0, "b": 1.0, "c": 0.5})
    assert power.at(16) == pytest.approx(4.0)


def test_points_are_sorted():
    assert TimeModel(points=[(8, 4.0, 0), (1, 1.0, 0)]).points[0][0] == 1


def test_affine_fit_recovers_exact_affine_data():
    points = [(b, 2e-3 + 5e-4 * b, 0.0) for b in (1, 2, 8, 32)]
    fit = TimeModel.from_points(points).fit
    assert fit["model"] == "affine"
    assert fit["a"] == pytest.approx(2e-3, rel=1e-6)
    assert fit["b"] == pytest.approx(5e-4, rel=1e-6)


def test_power_fit_recovers_sublinear_data():
    points = [(b, 1e-3 + 1e-3 * b**0.7, 0.0) for b in (1, 2, 4, 8, 16, 64)]
    fit = fit_time(points, "power")
    assert fit["c"] == pytest.approx(0.7, rel=1e-3)


def test_single_point_fit_is_proportional():
    assert TimeModel.from_points([(4, 2.0, 0.0)]).at(8) == pytest.approx(4.0)


@pytest.mark.parametrize("kwargs, message", [
    ({"points": [(1, 0.0, 0.0)]}, "time must be > 0"),
    ({"points": [(0, 1.0, 0.0)]}, "batch must be >= 1"),
    ({"points": [(1, 1.0, -1.0)]}, "spread must be >= 0"),
    ({"points": [(1, 1.0, 0.0), (1, 2.0, 0.0)]}, "unique"),
    ({"fit": {"model": "cubic"}}, "fit.model"),
    ({"fit": {"model": "affine", "a": 1.0}}, "fit.b"),
    ({}, "points or a fit"),
])
def test_time_model_rejects_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TimeModel(**kwargs)


def test_spatial_shape_checks_output_size():
    SpatialShape(in_h=32, in_w=32, in_c=3, out_c=16, kernel_h=3, kernel_w=3, padding=1, out_h=32, out_w=32)
    with pytest.raises(ValueError, match="out_h must be 32"):
        SpatialShape(in_h=32, in_w=32, in_c=3, out_c=16, kernel_h=3, kernel_w=3, padding=1, out_h=30,
                     out_w=32)


# --- workloads and files -----------------------------------------------------------------------------


def _measured_tiny() -> Workload:
    wl = build_analytic("tiny-cnn")
    layers = [layer.model_copy(update={"forward": TimeModel.from_points([(1, 1e-4, 1e-6), (8, 4e-4, 1e-6)]),
                                       "backward": TimeModel.from_points([(1, 2e-4, 0), (8, 8e-4, 0)])})
              for layer in wl.layers]
    return wl.model_copy(update={"layers": layers, "optimizer_step": TimeModel(points=[(1, 1e-4, 0)])})


def test_json_round_trip(tmp_path):
    wl = _measured_tiny()
    path = save_workload(wl, tmp_path / "sub" / "tiny.json")
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in path.parent.iterdir()] == ["tiny.json"]  # no temp file left behind
    again = load_workload(str(path))
    assert again == wl
    assert dumps_workload(again) == path.read_text()
    assert json.loads(path.read_text())["schema"] == SCHEMA
    assert again.measured and not build_analytic("tiny-cnn").measured


def test_derived_figures():
    wl = build_analytic("tiny-cnn")
    assert wl.num_params == 448 + 4640 + 20490
    assert wl.param_bytes == 4 * wl.num_params
    # per sample, plus what is kept once per batch (the loss's total weight)
    assert wl.saved_activation_bytes(10) == 10 * wl.saved_activation_bytes_per_sample + 4
    assert wl.layer("conv2").kind == "conv2d"
    with pytest.raises(TrainsimError, match="valid choices: conv1"):
        wl.layer("conv9")


def test_builtin_workloads_are_listed_and_load():
    names = list_workloads()
    for expected in ("alexnet", "vgg16", "resnet18", "resnet50", "googlenet", "gpt2-small", "tiny-cnn"):
        assert expected in names
    assert load_workload("resnet50").num_params == 25_557_032


def test_unknown_workload_name_lists_valid_ones():
    with pytest.raises(TrainsimError, match="unknown workload 'resnet51'; valid choices: alexnet"):
        load_workload("resnet51")


def _write(tmp_path, data) -> str:
    path = tmp_path / "wl.json"
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return str(path)


def _tiny_dict():
    return build_analytic("tiny-cnn").to_json_dict()


def test_unknown_field_names_file_and_layer(tmp_path):
    data = _tiny_dict()
    data["layers"][1]["colour"] = "red"
    path = _write(tmp_path, data)
    with pytest.raises(TrainsimError) as info:
        load_workload(path)
    assert info.value.file == path
    assert info.value.field == "layers.1(relu1).colour"
    assert "unknown field" in str(info.value)


def test_negative_bytes_rejected(tmp_path):
    data = _tiny_dict()
    data["layers"][0]["param_bytes"] = -4
    with pytest.raises(TrainsimError) as info:
        load_workload(_write(tmp_path, data))
    assert info.value.field == "layers.0(conv1).param_bytes"
    assert "greater than or equal to 0" in str(info.value)


def test_missing_layer_field_rejected(tmp_path):
    data = _tiny_dict()
    del data["layers"][2]["output_bytes_per_sample"]
    with pytest.raises(TrainsimError,
                       match=r"layers.2\(pool1\).output_bytes_per_sample: missing \(required\)"):
        load_workload(_write(tmp_path, data))


def test_bad_time_model_in_file_names_the_field(tmp_path):
    data = _tiny_dict()
    data["layers"][0]["forward"] = {"points": [[1, -1.0, 0.0]]}
    with pytest.raises(TrainsimError, match=r"layers.0\(conv1\).forward.points"):
        load_workload(_write(tmp_path, data))


def test_duplicate_layer_names_rejected(tmp_path):
    data = _tiny_dict()
    data["layers"][1]["name"] = "conv1"
    with pytest.raises(TrainsimError, match="appears twice"):
        load_workload(_write(tmp_path, data))


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(schema="trainsim.workload/9"), "unsupported schema"),
    (lambda d: d["input"].update(bytes_per_sample=-1), "input.bytes_per_sample"),
    (lambda d: d.update(layers=[]), "layers"),
    (lambda d: d.pop("provenance"), r"provenance: missing \(required\)"),
])
def test_other_bad_documents(tmp_path, mutate, message):
    data = _tiny_dict()
    mutate(data)
    with pytest.raises(TrainsimError, match=message):
        load_workload(_write(tmp_path, data))


def test_not_json_and_missing_file(tmp_path):
    with pytest.raises(TrainsimError, match="not valid JSON"):
        load_workload(_write(tmp_path, "{nope"))
    with pytest.raises(TrainsimError, match="no such workload file"):
        load_workload(str(tmp_path / "absent.json"))
    with pytest.raises(TrainsimError, match="must be a JSON object"):
        parse_workload([1, 2], file="x.json")


def test_provenance_keeps_extra_keys():
    data = _tiny_dict()
    data["provenance"]["torch"] = "2.13.0"
    assert parse_workload(data).provenance.torch == "2.13.0"


# --- CLI ---------------------------------------------------------------------------------------------


def test_cli_workload_list_and_show():
    from typer.testing import CliRunner

    from trainsim.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["workload", "list", "--json"])
    assert result.exit_code == 0, result.output
    assert "resnet50" in json.loads(result.output)
    result = runner.invoke(app, ["workload", "show", "tiny-cnn", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["params"] == 25578
    result = runner.invoke(app, ["workload", "show", "tiny-cnn", "--layers"])
    assert result.exit_code == 0 and "pool2" in result.output
    result = runner.invoke(app, ["workload", "show", "nope"])
    assert result.exit_code == 2
    assert "valid choices" in result.output


def test_cli_workload_generate_and_times(tmp_path):
    from typer.testing import CliRunner

    from trainsim.cli import app

    runner = CliRunner()
    out = tmp_path / "gpt.json"
    result = runner.invoke(app, ["workload", "generate", "gpt", "--set", "n_layer=2", "--set", "n_embd=64",
                                 "--set", "n_head=4", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert os.path.exists(out)
    assert sum(name.endswith("attn.core") for name in (la.name for la in load_workload(str(out)).layers)) == 2
    result = runner.invoke(app, ["workload", "times", str(out), "--device", "a100", "--batch", "4", "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.output)
    assert record["forward_s"] > 0 and len(record["layers"]) == 2 * 8 + 5
    result = runner.invoke(app, ["workload", "generate", "gpt", "--set", "n_layers=2"])
    assert result.exit_code == 2 and "valid choices" in result.output
