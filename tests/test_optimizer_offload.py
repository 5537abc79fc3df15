"""sim/optimizations/optimizer_offload.py by hand: a single rank's and DDP ranks' optimizer state streamed
through the GPU in chunks (two buffers, H2D in, step, D2H out), and what the GPU no longer holds."""

import json

import pytest
from simtools import scenario as make_scenario
from simtools import tiny_topology, tiny_workload

from trainsim.api import simulate
from trainsim.errors import TrainsimError
from trainsim.formats.scenario_loader import load_scenario
from trainsim.sim.compute.costs import STATE_BYTES
from trainsim.topologies import load_topology

PARAM_BYTES = 4_000_000  # fp32: 1 M parameters per layer
LAYERS = [{"name": n, "fwd": 0.010, "bwd": 0.020, "params": PARAM_BYTES, "saved": 1000} for n in "ab"]
STEP = 0.002
PCIE = 10e9  # bytes/s each way, no latency (tiny_topology)


def _run(tmp_path, strategy="single", gpus=1, **optimizations):
    path = tmp_path / "wl.json"
    path.write_text(json.dumps(tiny_workload(LAYERS, batch=8, step_s=STEP)))
    sc = make_scenario(tiny_topology(gpus=gpus, nvlink=False, pcie_gbps=PCIE / 1e9), str(path), strategy,
                       8 * gpus, optimizer={"name": "adam"}, optimizations=optimizations)
    return simulate(sc)


def test_a_single_ranks_state_streams_in_two_chunks(tmp_path):
    plain = _run(tmp_path)
    state = 2 * PARAM_BYTES / 4 * STATE_BYTES["adam"]  # m and v: 16 MB
    off = _run(tmp_path, offload_optimizer_state=True, offload_chunk_mb=state / 2 / 2**20)
    topo = load_topology(tiny_topology(gpus=1, nvlink=False))
    latency = topo.route_latency(topo.route(topo.host_memory("gpu0"), "gpu0"))  # the DRAM edge's 0.1 us
    chunk_in = latency + state / 2 / PCIE  # 0.8 ms a chunk each way, less than its half of the step (1 ms)
    # chunk 0 in; it steps while chunk 1 comes in; chunk 1 steps while chunk 0 goes out; chunk 1 out
    streamed = chunk_in + STEP + chunk_in
    assert off.iteration_time_s - plain.iteration_time_s == pytest.approx(streamed - STEP, rel=1e-9)
    ops = [op for op in off.machine.ops if op.iteration == 1 and op.resource == "gpu0"]
    for name in ("h2d_optimizer_state", "d2h_optimizer_state"):
        assert sum(op.nbytes for op in ops if op.op == name) == pytest.approx(state)
    assert sum(op.op == "optimizer" for op in ops) == 2
    before, after = plain.gpus[0], off.gpus[0]
    assert "optimizer_state" not in after.memory_at_peak and after.memory_at_peak["offload_buffers"] == state
    assert before.memory_peak_bytes - after.memory_peak_bytes == pytest.approx(0)  # two buffers = all of it
    small = _run(tmp_path, offload_optimizer_state=True, offload_chunk_mb=state / 8 / 2**20)
    assert plain.gpus[0].memory_peak_bytes - small.gpus[0].memory_peak_bytes == pytest.approx(state * 3 / 4)


def test_ddp_ranks_stream_their_state_after_the_all_reduce(tmp_path):
    plain = _run(tmp_path, "ddp", 2)
    off = _run(tmp_path, "ddp", 2, offload_optimizer_state=True, offload_chunk_mb=1)
    state = 2 * PARAM_BYTES / 4 * STATE_BYTES["adam"]
    for gpu in ("gpu0", "gpu1"):
        ops = [op for op in off.machine.ops if op.iteration == 1 and op.resource == gpu]
        assert sum(op.nbytes for op in ops if op.op == "h2d_optimizer_state") == pytest.approx(state)
        last_reduce = max(op.end for op in ops if op.op == "allreduce")
        assert min(op.start for op in ops if op.op == "h2d_optimizer_state") >= last_reduce
    assert off.iteration_time_s > plain.iteration_time_s  # 16 MB each way over 10 GB/s is not free


def test_a_strategy_that_cannot_stream_its_state_is_refused():
    base = {"topology": "pcie-4gpu-gen3", "workload": "tiny-cnn", "batch_size": 8, "gpus": 2}
    with pytest.raises(TrainsimError, match="modelled for strategy.name single, ddp, pipeline, not "
                                            "parameter-server"):
        load_scenario({**base, "strategy": {"name": "parameter-server"},
                       "optimizations": {"offload_optimizer_state": True}})
