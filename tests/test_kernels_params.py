"""The kernel parameter file: figures found by device, then architecture, then default; bad files named."""

import json

import pytest
from kernel_fixtures import GPU4, data

from trainsim.errors import TrainsimError
from trainsim.sim.compute.kernels.params import KernelParams, load_params
from trainsim.sim.core.devices import DeviceSpec, get_device


def _with(**sections):
    d = data()
    d.update(sections)
    return KernelParams(d, file="p.json")


def test_figures_come_from_the_device_then_its_architecture_then_the_default():
    d = data()
    d["devices"]["a100-pcie-40gb"] = {"matmul": {"efficiency": 0.9}}
    d["architectures"]["ampere"] = {"matmul": {"efficiency": 0.8}, "dispatch": {"bmm": {
        "dispatch_s": 1.0, "overlap_s": 0.0}}}
    p = KernelParams(d)
    assert p.figure(get_device("a100-pcie-40gb"), "matmul", "efficiency") == (0.9, "device:a100-pcie-40gb")
    assert p.figure(get_device("a100-80gb"), "matmul", "efficiency") == (0.8, "architecture:ampere")
    assert p.figure(get_device("v100"), "matmul", "efficiency") == (1.0, "default")
    # dispatch is the measuring host's: a GPU's architecture says nothing of it
    assert p.dispatch(get_device("a100-80gb"), "bmm") == (10e-6, 4e-6, "default")


def test_tiles_come_from_the_device_then_its_architecture_then_the_default():
    d = data()
    d["tiles"]["volta"] = {"single": [[64, 64]]}
    d["tiles"]["ampere"] = {"single": [[128, 32]]}
    d["devices"]["t4"] = {"tiles": {"single": [[32, 32]]}}
    p = KernelParams(d)
    assert p.tiles(get_device("t4"), "single") == [(32, 32)]  # its own
    assert p.tiles(get_device("a100"), "single") == [(128, 32)]  # its architecture's
    # an older architecture's choice is not taken: a library's heuristic picks tiles per GPU
    assert p.tiles(get_device("h100"), "single") == [(128, 128)]
    assert p.tiles(get_device("h100"), "tensor", fallback="single") == [(128, 128)]
    with pytest.raises(TrainsimError, match="no tensor tiles"):
        p.tiles(get_device("h100"), "tensor")


def test_the_power_cap_limits_a_board_never_measured():
    power = {"efficiency": 0.9, "flops_per_watt_16nm": 40e9, "exponent": 1.0}
    p = _with(power=power)
    board = DeviceSpec("board", {"fp32": 10e12}, 1e11, 2**30, sm_count=10, architecture="ampere",
                       tdp_watts=50, process_nm=8)
    # 40 GFLOP/s/W at 16 nm x (16 / 8) x 50 W = 4 TFLOP/s: 0.4 of the peak, against the default 1.0
    assert p.power_cap(board) == pytest.approx(0.4)
    value, where = p.efficiency(board, "matmul", "efficiency")
    assert value == pytest.approx(0.4) and "power cap x0.400" in where
    assert p.power_cap(GPU4) is None  # no tdp_watts / process_nm: no cap
    assert _with(power=None).power_cap(board) is None


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.update(schema="trainsim.kernel-params/0"), "schema"),
    (lambda d: d.pop("tiles"), "tiles"),
    (lambda d: d["default"]["matmul"].update(efficiency=-0.5), "default.matmul.efficiency"),
    (lambda d: d["default"]["matmul"].update(efficiency="high"), "default.matmul.efficiency"),
    (lambda d: d["default"]["dispatch"]["bmm"].pop("overlap_s"), "default.dispatch.bmm"),
    (lambda d: d["tiles"]["default"]["batched"].append([128]), "tiles.default.batched[1]"),
    (lambda d: d["devices"].update(t4={"matmul": 0.5}), "devices.t4.matmul"),
    (lambda d: d["devices"].update(t4={"held_out": {"tensor.matmul.bf16": {"p10": -0.1}}}),
     "devices.t4.held_out.tensor.matmul.bf16"),
])
def test_a_bad_file_names_its_field(tmp_path, mutate, field):
    d = data()
    mutate(d)
    path = tmp_path / "params.json"
    path.write_text(json.dumps(d))
    with pytest.raises(TrainsimError) as info:
        load_params(path)
    assert info.value.file == str(path) and info.value.field == field


def test_not_json_names_the_file(tmp_path):
    path = tmp_path / "params.json"
    path.write_text("{schema: ")
    with pytest.raises(TrainsimError, match="params.json: not JSON"):
        load_params(path)
    with pytest.raises(TrainsimError, match="cannot read"):
        load_params(tmp_path / "absent.json")


def test_a_missing_figure_names_the_default_field():
    d = data()
    del d["default"]["conv"]["kernel_s"]
    with pytest.raises(TrainsimError) as info:
        KernelParams(d, file="p.json").figure(GPU4, "conv", "kernel_s")
    assert (info.value.file, info.value.field) == ("p.json", "default.conv.kernel_s")


def test_the_shipped_file_loads():
    shipped = load_params()
    assert shipped.file == "params.json" and shipped.data["power"]["capped"]


def test_a_gpu_s_own_error_band_comes_before_the_shared_one():
    d = data()
    d["held_out"]["tensor.matmul.bf16"] = {"p10": -0.05, "p90": 0.1}
    d["devices"]["gpu4"] = {"held_out": {"tensor.matmul.bf16": {"p10": -0.3, "p90": 0.4, "rows": 148}}}
    p = KernelParams(d, file="t.json")
    assert p.held_out("tensor.matmul.bf16", GPU4) == (-0.3, 0.4)
    assert p.held_out("tensor.matmul.bf16") == (-0.05, 0.1)
    other = DeviceSpec("other", {"fp32": 1e12}, 1e11, 2**30, sm_count=4, architecture="ampere")
    assert p.held_out("tensor.matmul.bf16", other) == (-0.05, 0.1)
    # the shipped H200 carries its own GEMM bands: fitted on two sweeps, judged on the third's shapes
    shipped, h200 = load_params(), get_device("h200")
    assert shipped.held_out("tensor.matmul.bf16", h200) != shipped.held_out("tensor.matmul.bf16")
