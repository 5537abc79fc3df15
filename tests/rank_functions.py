"""Functions the launcher tests run on ranks (a plain module, importable by the rank processes)."""

import os
import time


def sleep(ctx, seconds):
    time.sleep(seconds)
    return ctx.rank


def fail_on(ctx, rank):
    if ctx.rank == rank:
        raise ValueError(f"rank {rank} was told to fail")
    return ctx.rank


def crash_on(ctx, rank):
    if ctx.rank == rank:
        os._exit(3)
    return ctx.rank


def describe(ctx):
    import torch

    from trainsim.calibrate.launch import all_reduce_check

    return {
        "all_reduce": all_reduce_check(ctx),
        "rank": ctx.rank,
        "world": ctx.world_size,
        "env_rank": os.environ["RANK"],
        "master": os.environ["MASTER_ADDR"],
        "affinity": sorted(os.sched_getaffinity(0)),
        "threads": torch.get_num_threads(),
        "cores": list(ctx.cores),
        "allocator": {k: os.environ.get(k) for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")},
    }



def swap_rank_ids(ctx):
    """collbench's halo exchange of a buffer holding this rank's id: what came back from the partner."""
    import torch

    from trainsim.calibrate.measure.collbench import _swap

    inbox = torch.full((4,), -1.0)
    _swap(torch.full((4,), float(ctx.rank)), inbox, ctx.rank, ctx.world_size)()
    return inbox.tolist()
