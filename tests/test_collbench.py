"""Collective benchmarks on 2 gloo ranks: points, nccl-tests bandwidth factors, fits."""

import pytest

pytest.importorskip("torch")

import torch  # noqa: E402

from trainsim.calibrate.measure.collbench import (
    COLLECTIVES,
    CPU_P2P_SHOTS,
    CPU_SINGLE_SHOTS,
    P2P,
    TrainingStep,
    bus_factor,
    measure_collectives,
    results_from_report,
)
from trainsim.errors import TrainsimError  # noqa: E402


def test_bus_factors_follow_nccl_tests():
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor("all_gather", 4) == pytest.approx(3 / 4)
    assert bus_factor("reduce_scatter", 2) == pytest.approx(1 / 2)
    assert bus_factor("broadcast", 8) == 1.0
    with pytest.raises(TrainsimError, match="valid choices"):
        bus_factor("all_to_some", 2)


def test_two_gloo_ranks():
    sizes = [4096, 65536]
    results = measure_collectives("cpu", 2, sizes, repeats=2, target_s=0.001)
    assert [r.collective for r in results] == list(COLLECTIVES)
    for r in results:
        assert r.backend == "gloo" and r.ranks == 2
        if r.skipped:  # a gloo without this collective: the reason is recorded
            assert "gloo" in r.skipped and not r.points
            continue
        assert [p["bytes"] for p in r.points] == sizes
        for p in r.points:
            assert p["time_s"] > 0
            # gloo keeps every call it timed, and the point is their mean
            shots = CPU_P2P_SHOTS if r.collective in P2P else CPU_SINGLE_SHOTS
            assert len(p["samples_s"]) == shots and min(p["samples_s"]) >= 0
            assert p["time_s"] == pytest.approx(sum(p["samples_s"]) / shots, rel=1e-4)
            assert p["algbw_gbps"] == pytest.approx(p["bytes"] / p["time_s"] / 1e9)
            assert p["busbw_gbps"] == pytest.approx(p["algbw_gbps"] * bus_factor(r.collective, 2))
        assert r.fit is not None and r.fit.beta_bytes_per_s > 0
        record = r.to_json()
        assert record["fit"]["busbw_gbps"] == pytest.approx(r.fit.bandwidth_gbps * record["bus_factor"])
    assert results[0].skipped is None  # gloo always has all-reduce


def test_the_halo_exchange_swaps_each_ranks_buffer_with_its_partner(rank_functions):
    from trainsim.calibrate.launch import launch

    assert launch(rank_functions.swap_rank_ids, 2) == [[1.0] * 4, [0.0] * 4]
    assert bus_factor("exchange", 2) == 1.0  # S is what each rank sends


def test_needs_two_ranks_and_known_collectives():
    with pytest.raises(TrainsimError, match="at least 2 ranks"):
        measure_collectives("cpu", 1, [1024])
    with pytest.raises(TrainsimError, match="unknown collective"):
        measure_collectives("cpu", 2, [1024], collectives=("gossip",))


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_nccl_all_reduce():
    results = measure_collectives("cuda", 2, [1 << 20, 1 << 24], repeats=2, collectives=("all_reduce",))
    assert results[0].backend == "nccl" and results[0].fit.beta_bytes_per_s > 1e9


def test_send_recv_fit_recovered_from_a_synthetic_ping_pong():
    # one-way message times of alpha + S / beta (gloo on a VM: ~1.7 ms per message, ~1 GB/s)
    alpha, beta = 1.7e-3, 1e9
    sizes = [1024, 65536, 1 << 20, 1 << 22]
    report = [
        {
            "collective": "send_recv",
            "skipped": None,
            "points": [{"bytes": s, "time_s": alpha + s / beta, "spread_s": 0.0} for s in sizes],
        }
    ]
    (result,) = results_from_report(report, 2, "gloo")
    assert result.fit.alpha_s == pytest.approx(alpha, rel=1e-6)
    assert result.fit.beta_bytes_per_s == pytest.approx(beta, rel=1e-6)
    assert result.to_json()["bus_factor"] == 1.0  # one message: bus bandwidth is the algorithm bandwidth


@pytest.mark.slow
def test_calls_met_after_a_training_step():
    step = TrainingStep("tiny-cnn", 4)
    results = measure_collectives("cpu", 2, [4096], repeats=2, collectives=("all_reduce", "send_recv"),
                                  training=step)
    for r in results:
        (point,) = r.points
        assert point["bytes"] == 4096 and len(point["samples_s"]) >= CPU_SINGLE_SHOTS
        assert min(point["samples_s"]) >= 0
