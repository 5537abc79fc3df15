"""The torchrun-like launcher: N gloo ranks, results back in rank order, failures as one line."""


import pytest

pytest.importorskip("torch")

from trainsim.calibrate.launch import all_reduce_check, launch, plan_cores  # noqa: E402
from trainsim.errors import TrainsimError  # noqa: E402


def test_two_gloo_ranks_with_torchrun_environment_and_own_cores(rank_functions):
    infos = launch(rank_functions.describe, 2)
    assert [i["all_reduce"] for i in infos] == [1.0, 1.0]  # 0 + 1, on both ranks
    assert [i["rank"] for i in infos] == [0, 1]
    assert all(i["world"] == 2 and i["master"] == "127.0.0.1" for i in infos)
    assert [i["env_rank"] for i in infos] == ["0", "1"]
    for info in infos:
        assert info["affinity"] == info["cores"]  # pinned where planned
        assert info["threads"] == len(info["cores"])


def test_ranks_keep_freed_memory_unless_the_caller_says_otherwise(rank_functions, monkeypatch):
    from trainsim.calibrate.launch import ALLOCATOR_ENV

    (info,) = launch(rank_functions.describe, 1)
    assert info["allocator"] == ALLOCATOR_ENV
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    (info,) = launch(rank_functions.describe, 1)
    assert info["allocator"]["MALLOC_MMAP_THRESHOLD_"] == "65536"


def test_plan_cores_splits_disjointly_and_wraps_when_oversubscribed():
    assert plan_cores(2, [0, 1, 2, 3]) == [(0, 1), (2, 3)]
    assert plan_cores(3, [0, 1]) == [(0,), (1,), (0,)]


def test_a_failing_rank_fails_the_run_with_one_line(rank_functions):
    with pytest.raises(TrainsimError) as err:
        launch(rank_functions.fail_on, 2, args=(1,))
    message = str(err.value)
    assert "rank 1 failed: ValueError: rank 1 was told to fail" in message
    assert "\n" not in message


def test_a_rank_that_dies_fails_the_run(rank_functions):
    with pytest.raises(TrainsimError, match=r"rank 0 died \(exit code 3\)"):
        launch(rank_functions.crash_on, 1, args=(0,))


def test_timeout(rank_functions):
    with pytest.raises(TrainsimError, match="did not finish within"):
        launch(rank_functions.sleep, 1, args=(60,), timeout_s=3)


def test_bad_arguments():
    with pytest.raises(TrainsimError, match="ranks"):
        launch(all_reduce_check, 0)
    with pytest.raises(TrainsimError, match="valid choices"):
        launch(all_reduce_check, 2, device="tpu")


def test_plan_cores_per_rank_leaves_the_rest_free():
    from trainsim.calibrate.launch import plan_cores

    assert plan_cores(1, [0, 1, 2, 3], per_rank=1) == [(0,)]
    assert plan_cores(2, [0, 1, 2, 3], per_rank=1) == [(0,), (1,)]
    assert plan_cores(2, [0, 1, 2, 3]) == [(0, 1), (2, 3)]
    assert plan_cores(2, [0, 1, 2, 3], per_rank=3) == [(0, 1), (2, 3)]  # does not fit: an equal share
