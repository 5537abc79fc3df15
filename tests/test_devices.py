"""Device specs: lookup, figures, the CPU device and the JSON form."""

import json

import pytest
from typer.testing import CliRunner

from trainsim.cli import app
from trainsim.errors import TrainsimError
from trainsim.sim.core.devices import (
    DEVICES,
    DeviceSpec,
    cpu_device,
    device_from_json,
    get_device,
    list_devices,
    match_cuda_name,
)


def test_library_has_the_required_gpus():
    for name in ("k80", "p100", "v100-16gb", "v100-32gb", "a100-40gb", "a100-80gb", "h100-sxm", "rtx4090",
                 "rtx3090", "t4"):
        assert name in list_devices()


def test_lookup_is_case_insensitive_and_knows_aliases():
    assert get_device("V100") is DEVICES["v100-16gb"]
    assert get_device("A100-80GB").memory_bytes == 80 * 2**30
    assert get_device(" h100 ").name == "h100-sxm"
    spec = get_device("t4")
    assert get_device(spec) is spec


def test_unknown_device_lists_valid_ones():
    with pytest.raises(TrainsimError, match="unknown device 'v200'; valid choices: .*a100-40gb"):
        get_device("v200")


def test_figures_from_reference_md():
    # REFERENCE.md "Device specs": V100 15.7 fp32 / 125 fp16 TFLOP/s and 900 GB/s; A100 19.5 / 156 tf32
    # / 312 fp16; H100 SXM5 67 / 495 / 990, 3.35 TB/s; K80 per GK210 ~4.4, 240 GB/s; P100 10.6 / 21.2, 732.
    v100, a100, h100 = get_device("v100"), get_device("a100"), get_device("h100")
    assert (v100.peak("fp32"), v100.peak("fp16"), v100.memory_bandwidth) == (15.7e12, 125e12, 900e9)
    assert (a100.peak("tf32"), a100.peak("fp16")) == (156e12, 312e12)
    assert (h100.peak("fp32"), h100.peak("tf32"), h100.peak("bf16"), h100.memory_bandwidth) == \
        (67e12, 495e12, 990e12, 3350e9)
    assert get_device("k80").peak() == pytest.approx(4.4e12, rel=0.01)
    assert get_device("k80").memory_bandwidth == 240e9
    assert get_device("p100").peak("fp16") == 21.2e12


def test_missing_precision_lists_what_the_device_has():
    with pytest.raises(TrainsimError, match="unknown precision on k80 'bf16'; valid choices: fp32"):
        get_device("k80").peak("bf16")


def test_ridge_point():
    v100 = get_device("v100")
    assert v100.ridge_point == pytest.approx(15.7e12 / 900e9)


def test_cpu_device_and_json_round_trip():
    cpu = cpu_device(16, 50e9, 100e9, memory_bytes=64 * 2**30, name="box-cpu")
    assert cpu.kind == "cpu" and cpu.peak() == 800e9 and cpu.sm_count == 16
    again = device_from_json(json.loads(json.dumps(cpu.to_json_dict())))
    assert again == cpu
    record = get_device("a100").to_json_dict()
    assert record["schema"] == "trainsim.device/1"
    assert record["memory_bandwidth_gbps"] == pytest.approx(1555)
    assert device_from_json(record) == get_device("a100")


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.update(memory_bandwidth_gbps=-1), "memory_bandwidth_gbps"),
    (lambda d: d.update(colour="red"), "colour"),
    (lambda d: d["peak_tflops"].update(fp8=1000), "peak_tflops.fp8"),
    (lambda d: d["peak_tflops"].update(fp32=0), "peak_tflops.fp32"),
    (lambda d: d["peak_tflops"].pop("fp32"), "peak_tflops.fp32"),
])
def test_bad_device_json_names_file_and_field(mutate, field):
    record = get_device("v100").to_json_dict()
    mutate(record)
    with pytest.raises(TrainsimError) as info:
        device_from_json(record, file="device.json")
    assert info.value.file == "device.json"
    assert info.value.field == field


def test_spec_validation():
    with pytest.raises(TrainsimError, match="memory_bandwidth"):
        DeviceSpec("x", {"fp32": 1e12}, 0.0, 2**30)
    with pytest.raises(TrainsimError, match="cores"):
        cpu_device(0, 1e9, 1e9)


@pytest.mark.parametrize("cuda_name, memory, expected", [
    ("NVIDIA A100-SXM4-80GB", None, "a100-80gb"),
    ("NVIDIA A100-SXM4-40GB", None, "a100-40gb"),
    ("Tesla V100-SXM2-32GB", None, "v100-32gb"),
    ("Tesla V100-SXM2", 16 * 2**30 - 300 * 2**20, "v100-16gb"),
    ("NVIDIA H100 80GB HBM3", None, "h100-sxm"),
    ("NVIDIA H100 PCIe", None, "h100-pcie"),
    ("NVIDIA H200", None, "h200"),
    ("NVIDIA GeForce RTX 4090", None, "rtx4090"),
    ("Tesla T4", None, "t4"),
    ("Tesla K80", None, "k80"),
    ("Tesla V100-PCIE-16GB", None, "v100-pcie"),
    ("Tesla P100-PCIE-16GB", None, "p100-pcie"),
    ("Tesla K40m", None, "k40"),
    ("NVIDIA GeForce GTX TITAN X", None, "titanx-maxwell"),
    ("NVIDIA TITAN X (Pascal)", None, None),
    ("NVIDIA L4", None, None),
])
def test_match_cuda_name(cuda_name, memory, expected):
    spec = match_cuda_name(cuda_name, memory)
    assert (spec.name if spec else None) == expected


def test_cli_device_list_and_show():
    runner = CliRunner()
    result = runner.invoke(app, ["device", "list", "--json"])
    assert result.exit_code == 0, result.output
    assert {record["name"] for record in json.loads(result.output)} == set(list_devices())
    result = runner.invoke(app, ["device", "show", "V100"])
    assert result.exit_code == 0 and "v100-16gb" in result.output
    result = runner.invoke(app, ["device", "show", "v200"])
    assert result.exit_code == 2
    assert result.output.startswith("error: DEVICE: unknown device 'v200'; valid choices")


def test_knl_7250_is_a_cpu_compute_device_with_mcdram():
    knl = get_device("Xeon Phi 7250")
    assert knl is DEVICES["knl-7250"] and get_device("knl") is knl
    assert knl.kind == "cpu" and knl.sm_count == 68
    # 68 cores x 1.4 GHz x (2 AVX-512 VPUs x 16 fp32 lanes x 2 for FMA): twice the ~3 TFLOP/s fp64 peak
    assert knl.peak("fp32") == pytest.approx(6.09e12, rel=1e-3)
    assert knl.memory_bandwidth == 450e9 and knl.memory_bytes == 16 * 2**30  # MCDRAM, flat mode
    assert "NERSC" in knl.source
