"""The device figures kernel classes need: precisions an architecture lacks are refused, missing figures
named."""

import pytest

from trainsim.errors import TrainsimError
from trainsim.sim.compute.kernels.hardware import matrix_peak, precisions, require
from trainsim.sim.core.devices import DeviceSpec, get_device


def test_tf32_on_a_v100_is_refused_with_what_it_has():
    with pytest.raises(TrainsimError) as info:
        matrix_peak(get_device("v100"), "tf32")
    assert info.value.field == "dtype"
    assert str(info.value) == ("dtype: device 'v100-16gb' has no tf32 matrix units (a volta GPU); valid "
                               "choices: fp16, fp32")


def test_fp8_needs_ada_or_hopper():
    with pytest.raises(TrainsimError, match="no fp8 matrix units .*valid choices: fp16, fp32"):
        matrix_peak(get_device("v100"), "fp8")
    with pytest.raises(TrainsimError, match="no fp8 matrix units .*valid choices: bf16, fp16, fp32, tf32"):
        matrix_peak(get_device("a100"), "fp8")
    assert matrix_peak(get_device("h100"), "fp8") == 1979e12
    assert matrix_peak(get_device("l40s"), "fp8") == 733e12


def test_precisions_are_the_peaks_within_the_architecture():
    assert precisions(get_device("t4")) == ("fp32", "fp16")
    assert "tf32" in precisions(get_device("a100-pcie-40gb"))


def test_a_spec_without_the_sm_count_is_named():
    bare = DeviceSpec("mystery", {"fp32": 1e12}, 1e11, 2**30)
    with pytest.raises(TrainsimError) as info:
        require(bare, "sm_count", "matmul")
    assert info.value.field == "device.sm_count"
    assert "device 'mystery' has no sm_count, which the matmul kernel model needs" in str(info.value)


def test_a_spec_cannot_claim_a_precision_its_architecture_lacks():
    with pytest.raises(TrainsimError) as info:
        DeviceSpec("bad", {"fp32": 1e12, "tf32": 8e12}, 1e11, 2**30, architecture="volta")
    assert info.value.field == "peak_flops.tf32"
    assert "valid choices: fp32, fp16" in str(info.value)
