"""Launch and dispatch: which eager op a kernel is charged, and what an event-timed call shows."""

import pytest

from trainsim.sim.compute.kernels.launch import observed_seconds, op_of
from trainsim.sim.compute.kernels.specs import Attention, Conv2d, Gemm, Streaming


def test_each_kernel_is_charged_its_eager_op():
    assert op_of(Gemm(8, 8, 8, batch=4)) == "bmm"
    assert op_of(Gemm(8, 8, 8, batch=4, shared_b=True)) == "linear"
    assert op_of(Gemm(8, 8, 8)) == "linear"
    assert op_of(Conv2d(1, 3, 8, 8, 8)) == "conv"
    assert op_of(Streaming("softmax", 10, row=10)) == "softmax"
    assert op_of(Streaming("optimizer", 10)) == "elementwise"
    assert op_of(Attention(1, 1, 8, 8, 8)) == "bmm"
    with pytest.raises(TypeError):
        op_of("gemm")


def test_a_kernel_shorter_than_the_overlap_is_hidden():
    # 30 us of dispatch, 10 of them after the kernel starts
    assert observed_seconds(4e-6, 30e-6, 10e-6) == pytest.approx(30e-6)
    assert observed_seconds(100e-6, 30e-6, 10e-6) == pytest.approx(120e-6)
