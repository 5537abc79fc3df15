"""SM-wave quantisation of convolutions on hand-computable cases."""

import pytest

from trainsim.errors import TrainsimError
from trainsim.formats.workload import SpatialShape
from trainsim.sim.compute.waves import wave_efficiency, workload_wave_efficiency
from trainsim.sim.core.devices import DeviceSpec


class _Layer:
    def __init__(self, spatial, flops=1.0):
        self.spatial = spatial
        self.flops_forward_per_sample = flops


class _Workload:
    def __init__(self, layers):
        self.layers = layers


GPU = DeviceSpec("gpu4", {"fp32": 1e12}, 1e11, 2**30, sm_count=4)
CONV = SpatialShape(in_h=8, in_w=8, in_c=16, out_c=128, kernel_h=3, kernel_w=3, padding=1, out_h=8, out_w=8)


def test_a_partial_last_wave_leaves_sms_idle():
    # batch 2: 2 x 8 x 8 = 128 output rows, one 128x128 tile: one wave on 4 SMs, 3 of them idle
    assert wave_efficiency(_Layer(CONV), 2, GPU) == pytest.approx(1 / 4)
    # batch 10: 640 rows, 5 tiles, 2 waves of 4 SMs
    assert wave_efficiency(_Layer(CONV), 10, GPU) == pytest.approx(5 / 8)
    # batch 16: 1024 rows, 8 tiles, 2 full waves
    assert wave_efficiency(_Layer(CONV), 16, GPU) == 1.0


def test_layers_without_a_convolution_are_not_quantised_and_convolutions_weigh_by_flops():
    assert wave_efficiency(_Layer(None), 1, GPU) == 1.0
    workload = _Workload([_Layer(CONV, flops=3.0), _Layer(None, flops=100.0),
                          _Layer(CONV.model_copy(update={"out_c": 512}), flops=1.0)])
    # batch 2: the first conv 1/4 busy; the second has 4 tiles, one full wave
    assert workload_wave_efficiency(workload, 2, GPU) == pytest.approx((3 * 0.25 + 1 * 1.0) / 4)


def test_a_device_without_an_sm_count_is_named():
    cpu = DeviceSpec("cpu", {"fp32": 1e11}, 1e10, 2**30, kind="cpu")
    with pytest.raises(TrainsimError, match="SM count"):
        wave_efficiency(_Layer(CONV), 2, cpu)
