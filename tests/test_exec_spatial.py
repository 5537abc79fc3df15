"""Spatial split geometry: which rows each rank holds and which rows its next layer reads."""

import pytest

pytest.importorskip("torch")

from trainsim.calibrate.execute.config import ExecConfig, infeasible_reason  # noqa: E402
from trainsim.calibrate.execute.spatial import HaloPlan, rows, spatial_front  # noqa: E402
from trainsim.errors import TrainsimError  # noqa: E402


def test_rows_cover_the_height_once():
    for height, ranks in ((32, 2), (30, 4), (7, 3)):
        slabs = [rows(r, height, ranks) for r in range(ranks)]
        assert slabs[0][0] == 0 and slabs[-1][1] == height
        assert all(a[1] == b[0] for a, b in zip(slabs, slabs[1:], strict=False))


def test_a_3x3_convolution_reads_one_row_from_each_neighbour():
    plan = HaloPlan(height_in=32, kernel=3, stride=1, padding=1, ranks=2, fill=0.0)
    assert plan.height_out == 32
    assert plan.needed(0) == (-1, 17) and plan.needed(1) == (15, 33)  # one padding row at the image edge
    assert plan.from_neighbour(0, 1) == (16, 17) and plan.from_neighbour(1, 0) == (15, 16)


def test_pooling_on_even_slabs_needs_no_halo():
    plan = HaloPlan(height_in=32, kernel=2, stride=2, padding=0, ranks=2, fill=float("-inf"))
    assert plan.height_out == 16 and plan.needed(0) == (0, 16) and plan.needed(1) == (16, 32)
    assert plan.from_neighbour(0, 1) == (0, 0)


def test_strided_and_uneven_layers():
    plan = HaloPlan(height_in=15, kernel=2, stride=2, padding=0, ranks=2, fill=0.0)  # 15 rows -> 7
    assert plan.height_out == 7
    assert plan.needed(0) == (0, 6) and plan.needed(1) == (6, 14)  # rank 1 reads rank 0's last row
    assert plan.from_neighbour(1, 0) == (6, 7)
    strided = HaloPlan(height_in=16, kernel=3, stride=2, padding=1, ranks=2, fill=0.0)
    assert strided.needed(1) == (7, 16)


def test_slabs_thinner_than_the_window_are_refused():
    plan = HaloPlan(height_in=8, kernel=11, stride=1, padding=5, ranks=4, fill=0.0)
    with pytest.raises(TrainsimError, match="halos would span more than one neighbour"):
        plan.needed(1)


def test_front_is_the_leading_convolutions_relus_and_pools():
    import torch

    from trainsim.calibrate import zoo
    from trainsim.calibrate.execute.pipeline import sequential_parts

    torch.manual_seed(0)
    assert spatial_front(sequential_parts(zoo.build_model("tiny-cnn"))) == 6


def test_models_with_batchnorm_are_skipped_with_the_reason():
    reason = infeasible_reason(ExecConfig(strategy="spatial", ranks=1, model="resnet18"))
    assert "BatchNorm" in reason and "tiny-cnn" in reason
    assert infeasible_reason(ExecConfig(strategy="spatial", ranks=1, model="tiny-cnn")) is None


def test_a_scenario_asking_for_overlapped_halos_is_skipped_with_the_field_to_set():
    from trainsim.calibrate.execute.config import exec_config_from_scenario

    scenario = {"workload": {"name": "tiny-cnn", "image_size": 32}, "strategy": {"name": "spatial"},
                "gpus": 2, "batch_size": 8}
    reason = infeasible_reason(exec_config_from_scenario(scenario))
    assert "strategy.halo_overlap: false" in reason
    scenario["strategy"]["halo_overlap"] = False
    assert "strategy.backward_halo: input-gradient" in infeasible_reason(exec_config_from_scenario(scenario))
    scenario["strategy"]["backward_halo"] = "input-gradient"
    assert infeasible_reason(exec_config_from_scenario(scenario)) is None
