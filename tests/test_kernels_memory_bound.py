"""Memory-bound kernels: bytes at the achieved bandwidth, the passes of long rows, the arithmetic floor."""

import pytest
from kernel_fixtures import GPU4, params

from trainsim.sim.compute.kernels.memory_bound import LONG_ROW, streaming_core, streaming_time
from trainsim.sim.compute.kernels.specs import Streaming


def test_elementwise_time_is_bytes_over_achieved_bandwidth():
    add = Streaming("elementwise", elements=1_000_000, reads=2, writes=1)
    estimate = streaming_time(add, GPU4, params(elementwise={"efficiency": 0.5}))
    assert estimate.seconds == pytest.approx(12e6 / (1e11 * 0.5))
    assert estimate.bound == "memory" and estimate.achieved == pytest.approx(1e11 * 0.5)
    assert (estimate.low, estimate.high) == pytest.approx((0.95 * estimate.seconds, 1.05 * estimate.seconds))


def test_a_long_row_costs_its_extra_passes():
    short = streaming_time(Streaming("layernorm", 1_000_000, row=LONG_ROW), GPU4, params())
    long = streaming_time(Streaming("layernorm", 1_000_000, row=LONG_ROW + 1), GPU4, params())
    assert short.seconds == pytest.approx(8e6 / 1e11)
    assert long.seconds == pytest.approx(2 * 8e6 / 1e11)  # long_row_passes 2 in the fixture
    assert long.detail["passes_used"] == 2.0


def test_arithmetic_per_value_adds_at_the_fp32_peak():
    fig = params(softmax={"flops_per_element": 40.0})
    estimate = streaming_time(Streaming("softmax", 1_000_000, row=128), GPU4, fig)
    assert estimate.seconds == pytest.approx(8e6 / 1e11 + 40 * 1e6 / 4e12)


def test_kinds_without_figures_stream_as_elementwise():
    step = Streaming("optimizer", 1_000_000, reads=4, writes=3)  # Adam: p, g, m, v in; p, m, v out
    estimate = streaming_time(step, GPU4, params(elementwise={"efficiency": 0.8}))
    assert estimate.seconds == pytest.approx(28e6 / (1e11 * 0.8))
    assert estimate.kernel_class == "elementwise"


def test_the_core_takes_arrays():
    seconds = streaming_core([1e6, 2e6], [1, 1], [0, 2048], bandwidth=1e9, efficiency=1.0,
                             long_row_passes=3.0)
    assert list(seconds) == pytest.approx([1e-3, 6e-3])


def test_a_long_row_block_kernel_does_more_work_per_value_whatever_its_bytes():
    fig = params(softmax={"flops_per_element": 40.0, "long_row_flops_per_element": 100.0})
    short = streaming_time(Streaming("softmax", 1_000_000, row=LONG_ROW), GPU4, fig)
    long = streaming_time(Streaming("softmax", 1_000_000, row=LONG_ROW + 1), GPU4, fig)
    assert short.seconds == pytest.approx(8e6 / 1e11 + 40 * 1e6 / 4e12)  # short rows: no extra work
    assert long.seconds == pytest.approx(2 * 8e6 / 1e11 + 140 * 1e6 / 4e12)
    half = streaming_time(Streaming("softmax", 1_000_000, row=LONG_ROW + 1, dtype="bf16"), GPU4, fig)
    assert long.seconds - half.seconds == pytest.approx(2 * 4e6 / 1e11)  # the work per value stays
    # where no GPU's rows gave the figure, a long row does only the shared work per value
    plain = streaming_time(Streaming("softmax", 1_000_000, row=LONG_ROW + 1), GPU4,
                           params(softmax={"flops_per_element": 40.0}))
    assert plain.seconds == pytest.approx(2 * 8e6 / 1e11 + 40 * 1e6 / 4e12)


def test_a_gpu_s_own_long_row_moves_where_the_block_kernel_takes_over():
    fig = params(softmax={"long_row": 2048})
    warp = streaming_time(Streaming("softmax", 1_000_000, row=2048), GPU4, fig)
    block = streaming_time(Streaming("softmax", 1_000_000, row=2049), GPU4, fig)
    assert warp.seconds == pytest.approx(8e6 / 1e11) and warp.detail["passes_used"] == 1.0
    assert block.seconds == pytest.approx(2 * 8e6 / 1e11)
    # elsewhere the switch stays at LONG_ROW
    assert streaming_time(Streaming("softmax", 1_000_000, row=2048), GPU4, params()).seconds == pytest.approx(
        2 * 8e6 / 1e11)


def test_a_strided_kernel_streams_at_its_own_share_by_the_size_of_its_values():
    # a mask broadcast over the other operand: PyTorch's generic kernel loads a value at a time, so its
    # bytes stream at a share of their own, lower for 2-byte values than for 4-byte ones
    fig = params(elementwise={"efficiency": 0.8},
                 strided={"efficiency_fp32": 0.5, "efficiency_16bit": 0.2})
    half = streaming_time(Streaming("strided", elements=1_000_000, dtype="bf16"), GPU4, fig)
    assert half.seconds == pytest.approx(4e6 / (1e11 * 0.2))
    assert half.kernel_class == "elementwise" and half.detail["efficiency"] == 0.2
    single = streaming_time(Streaming("strided", elements=1_000_000, dtype="fp32"), GPU4, fig)
    assert single.seconds == pytest.approx(8e6 / (1e11 * 0.5))
    vectorised = streaming_time(Streaming("elementwise", elements=1_000_000, dtype="bf16"), GPU4, fig)
    assert half.seconds > vectorised.seconds


def test_a_batch_norm_of_few_channels_is_bound_by_its_rows():
    # GPU4: 4 SMs sharing 100 GB/s; a channel is a row; 2 rows to an SM, each at 18.75 GB/s
    fig = params(batchnorm={"passes": 1.0, "row_bytes_per_s": 18.75e9, "rows_per_sm": 2.0})
    few = Streaming("batchnorm", elements=4 * 1_000_000, reads=2, writes=1, row=1_000_000)  # 4 channels
    estimate = streaming_time(few, GPU4, fig)
    assert estimate.seconds == pytest.approx(12e6 / 18.75e9)  # one wave of rows, 12 MB per row
    assert estimate.detail["rows_bound"] and estimate.kernel_class == "layernorm"
    # 64 channels of the same bytes: 8 waves of rows of 1/16 of the bytes, 0.32 ms: HBM bounds it (0.48 ms)
    many = streaming_time(Streaming("batchnorm", elements=4 * 1_000_000, reads=2, writes=1, row=62_500),
                          GPU4, fig)
    assert many.seconds == pytest.approx(48e6 / 1e11)
    assert "rows_bound" not in many.detail
