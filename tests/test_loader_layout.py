"""host.loader: a DataLoader per rank (per-gpu) or one per machine feeding its ranks in turn (shared), on
hand-computable loader-bound cases (the stated cost per sample far above the compute)."""

import json

import pytest
from simtools import scenario as make_scenario
from simtools import tiny_topology, tiny_workload

from trainsim.api import simulate

# small parameters: the all-reduce is a few microseconds, the compute 0.03 s a step
LAYERS = [
    {"name": "a", "fwd": 0.005, "bwd": 0.010, "params": 4_000, "saved": 1_000},
    {"name": "b", "fwd": 0.005, "bwd": 0.010, "params": 4_000, "saved": 1_000},
]
STEP = 0.001
PER_GPU = 8  # samples per GPU
PREP = 0.05  # s per sample on one core: a rank's batch is 0.4 s of one core, far above its 0.031 s step


def run(tmp_path, layout, *, gpus=4, workers=2, strategy="ddp", **extra):
    path = tmp_path / "wl.json"
    path.write_text(json.dumps(tiny_workload(LAYERS, batch=PER_GPU, input_bytes=1_000, step_s=STEP)))
    host = {"prep_s_per_sample": PREP, "data_workers": workers, "loader": layout}
    return simulate(make_scenario(tiny_topology(gpus=gpus, nvlink=False, cores=16), str(path), strategy,
                                  PER_GPU * gpus, iterations=4, warmup_iterations=4, host=host, **extra))


def prep_ops(result):
    return [op for op in result.machine.ops
            if op.op == "data_prep" and op.iteration >= result.warmup_iterations]


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_shared_loader_serves_four_gpus_with_one_pool(tmp_path, workers):
    # per-gpu: each rank's pool makes workers batches per 0.4 s; shared: the one pool makes them for all
    # four ranks, so each rank waits four times as long
    batch_s = PER_GPU * PREP
    per_gpu = run(tmp_path, "per-gpu", workers=workers)
    shared = run(tmp_path, "shared", workers=workers)
    assert per_gpu.iteration_time_s == pytest.approx(batch_s / workers, rel=0.01)
    assert shared.iteration_time_s == pytest.approx(4 * batch_s / workers, rel=0.01)
    # the same decoding work per batch, done on the same socket's cores, for every rank in turn
    assert sorted(op.args["gpu"] for op in prep_ops(shared)) == sorted(op.args["gpu"] for op in
                                                                        prep_ops(per_gpu))


def test_shared_loader_without_workers_is_one_loop_preparing_each_rank_in_turn(tmp_path):
    # num_workers=0: per rank the loop prepares its own batch beside the others'; shared, the one process's
    # loop prepares the four ranks' batches one after another before the all-reduce lets them step
    per_gpu = run(tmp_path, "per-gpu", workers=0)
    shared = run(tmp_path, "shared", workers=0)
    assert shared.iteration_time_s - per_gpu.iteration_time_s == pytest.approx(3 * PER_GPU * PREP, rel=1e-3)


def test_shared_loader_of_one_rank_is_its_own_loader(tmp_path):
    per_gpu = run(tmp_path, "per-gpu", gpus=1, strategy="single")
    shared = run(tmp_path, "shared", gpus=1, strategy="single")
    assert shared.iteration_time_s == pytest.approx(per_gpu.iteration_time_s, rel=1e-12)
    assert shared.iteration_time_s == pytest.approx(PER_GPU * PREP / 2, rel=0.01)


@pytest.mark.parametrize("split", [False, True])
def test_dp_gpu0_loads_the_whole_batch_once_either_way_with_a_shared_loader(tmp_path, split):
    # DataParallel's one loader prepares 32 samples a batch; ScaleDNN's split on a shared loader prepares
    # the same 32 as four shards handed out in turn: the same cores, the same rate
    result = run(tmp_path, "shared", strategy="dp-gpu0", optimizations={"cpu_batch_split": split})
    assert result.iteration_time_s == pytest.approx(4 * PER_GPU * PREP / 2, rel=0.01)
