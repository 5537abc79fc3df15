"""Link microbenchmarks: a tiny CPU sweep, the guards on its fits, and the CUDA sweep where a GPU exists."""

import pytest

pytest.importorskip("torch")

import torch  # noqa: E402

from trainsim.calibrate.measure.alphabeta import AlphaBeta  # noqa: E402
from trainsim.calibrate.measure.linkbench import (
    KIB,
    MIB,
    LinkClass,
    SweepConfig,
    batch_sizes,
    cpu_links,
    cuda_links,
    dram_bandwidth,
    gemm_flops_per_core,
    last_level_cache_bytes,
    loader_batch_points,
    quick_memory_bandwidth,
    scales_with_size,
    sweep_for,
)
from trainsim.errors import TrainsimError  # noqa: E402

TINY = SweepConfig(min_bytes=KIB, max_bytes=4 * MIB, factor=16, repeats=2, target_s=0.0005)


def test_cpu_sweep_points_and_fits():
    links = cpu_links(TINY)
    assert [link.kind for link in links] == ["rank_copy", "dram_copy"]
    rank_copy, dram = links
    assert [p[0] for p in rank_copy.points] == TINY.sizes()
    assert all(p[1] > 0 and p[2] >= 0 for p in rank_copy.points)
    # Copying 4 MiB takes longer than copying 1 KiB; the fit says so with a positive latency.
    assert rank_copy.points[-1][1] > rank_copy.points[0][1]
    assert rank_copy.fit.alpha_s > 0 and rank_copy.fit.beta_bytes_per_s > 1e8
    # dram_copy counts bytes read + written.
    assert dram.points[0][0] == 2 * min(4 * MIB, TINY.max_bytes // 4)
    if scales_with_size(rank_copy):  # the socket delivers at least what one core's copy pulled through
        assert dram_bandwidth(links) >= 2 * rank_copy.fit.beta_bytes_per_s * (1 - 1e-9)
    assert torch.get_num_threads() >= 1  # restored


def test_stalls_are_not_read_as_bandwidth():
    stall = LinkClass(
        "dram_copy",
        "dram_copy",
        "dram",
        "dram",
        points=[(8 * MIB, 8e-3, 0), (128 * MIB, 8e-3, 0)],
        fit=AlphaBeta(alpha_s=8e-3, beta_bytes_per_s=2e12, rel_rms=0.0, points=2),
    )
    copy = LinkClass(
        "rank_copy",
        "rank_copy",
        "a",
        "b",
        points=[(KIB, 1e-6, 0), (64 * MIB, 6e-3, 0)],
        fit=AlphaBeta(alpha_s=1e-6, beta_bytes_per_s=11e9, rel_rms=0.0, points=2),
    )
    assert not scales_with_size(stall) and scales_with_size(copy)
    assert dram_bandwidth([copy, stall]) == pytest.approx(22e9)
    with pytest.raises(TrainsimError):
        dram_bandwidth([stall])


def test_sweeps_and_host_figures():
    assert sweep_for("cuda", False).sizes()[0] == KIB and sweep_for("cuda", False).sizes()[-1] == 1024**3
    assert sweep_for("cpu", True).max_bytes > 32 * MIB  # beyond a typical last-level cache
    assert last_level_cache_bytes() >= 64 * KIB
    assert gemm_flops_per_core(n=128, repeats=2) > 1e8
    assert quick_memory_bandwidth(repeats=1) > 1e8
    with pytest.raises(ValueError):
        SweepConfig(min_bytes=10, max_bytes=5)


def test_loader_batches_come_from_a_worker_in_shared_memory_and_are_timed_per_size():
    sizes = [MIB, 4 * MIB]
    dst = torch.empty(max(sizes), dtype=torch.uint8)
    seen = []

    def copy(batch):
        seen.append((batch.numel(), batch.is_shared()))
        dst[: batch.numel()].copy_(batch)

    points = loader_batch_points(sizes, 2, copy)
    assert seen == [(MIB, True)] * 3 + [(4 * MIB, True)] * 3  # each size's first batch is a warm-up
    assert [p[0] for p in points] == sizes and all(p[1] > 0 and p[2] >= 0 for p in points)
    assert int(dst[: 4 * MIB].sum()) == 4 * MIB  # the copies moved the worker's bytes


def test_loader_batch_sizes_are_input_batch_sizes():
    assert batch_sizes(SweepConfig()) == [MIB, 4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB]
    assert batch_sizes(TINY) == [4 * MIB]  # the sweep's sizes (1K, 16K, 256K, 4M) between 1 and 256 MiB
    assert batch_sizes(SweepConfig(max_bytes=64 * KIB)) == [MIB]  # none: one size still


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_sweep():
    cfg = SweepConfig(min_bytes=KIB, max_bytes=16 * MIB, factor=16, repeats=2, target_s=0.0005)
    links = cuda_links(cfg)
    kinds = {link.kind for link in links}
    assert {"h2d_pinned", "h2d_pageable", "h2d_batch", "d2h_pinned", "d2h_pageable", "d2d"} <= kinds
    batch = next(link for link in links if link.kind == "h2d_batch")
    assert batch.fit.beta_bytes_per_s > 1e8 and [p[0] for p in batch.points] == batch_sizes(cfg)
    pinned = next(link for link in links if link.kind == "h2d_pinned")
    assert pinned.fit.beta_bytes_per_s > 1e9
    n = torch.cuda.device_count()
    assert sum(link.kind == "p2p" for link in links) == n * (n - 1) // 2
