"""ScaleDNN's switches on hand-computable cases: preload, cpu_batch_split, param_compression."""

import json
from itertools import pairwise
from pathlib import Path

import pytest
import yaml
from simtools import scenario as make_scenario
from simtools import tiny_topology, tiny_workload
from typer.testing import CliRunner

from trainsim.api import simulate
from trainsim.cli import app
from trainsim.sim.compute.roofline import DEFAULT_EFFICIENCY
from trainsim.topologies import load_topology

LAYERS = [
    {"name": "a", "fwd": 0.010, "bwd": 0.020, "params": 4_000_000, "saved": 100_000},
    {"name": "b", "fwd": 0.005, "bwd": 0.007, "params": 40_000_000, "saved": 50_000},
    {"name": "c", "fwd": 0.001, "bwd": 0.003, "params": 0, "saved": 10_000},
]
COMPUTE = sum(layer["fwd"] + layer["bwd"] for layer in LAYERS)
STEP = 0.002
A100_STREAMING = 1555e9 * DEFAULT_EFFICIENCY.memory  # bytes/s an elementwise pass reaches on an A100


def write(tmp_path, data, name="wl.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def h2d_time(topo_dict, nbytes, gpu="gpu0"):
    topo = load_topology(topo_dict)
    route = topo.route(topo.host_memory(gpu), gpu)
    return nbytes / topo.bottleneck(route) + topo.route_latency(route)


def link_bytes(result, name):
    return next((link.bytes for link in result.links if link.name == name), 0.0)


def ops(result, name):
    return [op for op in result.machine.ops if op.op == name and op.iteration >= result.warmup_iterations]


# ---- preload ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("input_bytes", [100_000, 10_000_000])  # copy 0.08 s < or > compute 0.048 s
def test_preload_turns_sum_into_max(tmp_path, input_bytes):
    topo = tiny_topology(gpus=1, nvlink=False)
    wl = write(tmp_path, tiny_workload(LAYERS, batch=8, input_bytes=input_bytes, step_s=STEP))
    copy = h2d_time(topo, 8 * input_bytes)
    plain = simulate(make_scenario(topo, wl, "single", 8))
    assert plain.iteration_time_s == pytest.approx(copy + COMPUTE + STEP, rel=1e-9)
    loaded = simulate(make_scenario(topo, wl, "single", 8, iterations=3, optimizations={"preload": 1}))
    assert loaded.iteration_time_s == pytest.approx(max(copy, COMPUTE + STEP), rel=1e-9)


def test_preload_holds_one_more_batch_per_depth(tmp_path):
    topo = tiny_topology(gpus=1, nvlink=False)
    wl = write(tmp_path, tiny_workload(LAYERS, batch=8, input_bytes=10_000, step_s=STEP))
    peaks = {
        depth: simulate(make_scenario(topo, wl, "single", 8, iterations=4, optimizations={"preload": depth}))
        .gpus[0].memory_at_peak["input"]
        for depth in (1, 2)
    }
    assert peaks[1] == pytest.approx(2 * 8 * 10_000)  # the batch computing + the one copied ahead
    assert peaks[2] == pytest.approx(3 * 8 * 10_000)


# ---- CPU batch split --------------------------------------------------------------------------------------


@pytest.mark.parametrize("p2p", [True, False])
def test_cpu_batch_split_removes_the_gpu0_hot_link(tmp_path, p2p):
    topo = tiny_topology(gpus=2, nvlink=False, p2p=p2p)
    wl = write(tmp_path, tiny_workload(LAYERS, batch=8, input_bytes=1_000_000, step_s=STEP))
    base = simulate(make_scenario(topo, wl, "dp-gpu0", 16))
    split = simulate(make_scenario(topo, wl, "dp-gpu0", 16, optimizations={"cpu_batch_split": True}))
    shard = 8 * 1_000_000 * base.iterations  # GPU1's shard over the measured iterations
    labels = 8 * 8 * base.iterations  # ... and the int64 labels GPU0 gathers instead, for the loss
    # GPU0's link no longer carries GPU1's shard in, nor (scattered) out; only its labels come in
    assert link_bytes(base, "sw0->gpu0") - link_bytes(split, "sw0->gpu0") == pytest.approx(shard - labels)
    assert link_bytes(base, "gpu0->sw0") - link_bytes(split, "gpu0->sw0") == pytest.approx(shard)
    # GPU1 receives its shard either way
    assert link_bytes(split, "sw0->gpu1") == pytest.approx(link_bytes(base, "sw0->gpu1"))
    # without P2P the scatter detoured through host memory: the uplink carried GPU1's shard twice
    detour = 0 if p2p else shard - labels
    assert link_bytes(base, "cpu0->sw0") - link_bytes(split, "cpu0->sw0") == pytest.approx(detour)
    assert not ops(split, "scatter_input") and ops(split, "gather_targets")
    assert split.iteration_time_s < base.iteration_time_s


def test_cpu_batch_split_with_preload_copies_every_shard_ahead(tmp_path):
    topo = tiny_topology(gpus=2, nvlink=False)
    wl = write(tmp_path, tiny_workload(LAYERS, batch=8, input_bytes=1_000_000, step_s=STEP))
    split_only = {"cpu_batch_split": True}
    split = simulate(make_scenario(topo, wl, "dp-gpu0", 16, iterations=3, optimizations=split_only))
    opts = {"cpu_batch_split": True, "preload": 1}
    result = simulate(make_scenario(topo, wl, "dp-gpu0", 16, iterations=3, optimizations=opts))
    assert {op.resource for op in ops(result, "h2d_preload")} == {"gpu0", "gpu1"}
    # GPU1's next shard shares its H2D engine with the parameter broadcast, so a little stays exposed
    assert result.breakdown_s["exposed_transfer"] < split.breakdown_s["exposed_transfer"]
    assert result.iteration_time_s < split.iteration_time_s


@pytest.mark.parametrize("workers", [1, 2])
def test_cpu_batch_split_gives_each_gpu_a_loader_of_its_own(tmp_path, workers):
    # as trainsim execute runs it, each rank loads its own shard with its own worker pool: a loader-bound
    # run prepares half a batch per GPU with twice the workers in all (scenario-stated cost per sample)
    topo = tiny_topology(gpus=2, nvlink=False)
    wl = write(tmp_path, tiny_workload(LAYERS, batch=8, input_bytes=1_000, step_s=STEP))
    prep = 0.02  # a shard of 8 samples is 0.16 s of one core, above the 0.057 s iteration when fed
    host = {"prep_s_per_sample": prep, "data_workers": workers}
    runs = {
        split: simulate(make_scenario(topo, wl, "dp-gpu0", 16, iterations=4, warmup_iterations=3, host=host,
                                      optimizations={"cpu_batch_split": split}))
        for split in (False, True)
    }
    assert runs[False].iteration_time_s == pytest.approx(16 * prep / workers, rel=0.02)
    assert runs[True].iteration_time_s == pytest.approx(8 * prep / workers, rel=0.02)
    assert len(ops(runs[True], "data_prep")) == 2 * len(ops(runs[False], "data_prep"))


# ---- parameter compression -------------------------------------------------------------------------------


def allreduce_bytes(result):
    return sum(op.nbytes for op in ops(result, "allreduce"))


@pytest.mark.parametrize(
    "spec, ratio",
    [("fp16", 0.5), ("bf16", 0.5), ("int8", 0.25), ({"method": "topk", "ratio": 0.01}, 0.02)],
)
def test_compression_cuts_wire_bytes_by_its_ratio_and_adds_memory_bound_codec(tmp_path, spec, ratio):
    topo = tiny_topology(gpus=2)
    wl = write(tmp_path, tiny_workload(LAYERS, batch=8, step_s=STEP))
    base = simulate(make_scenario(topo, wl, "ddp", 16))
    comp = simulate(make_scenario(topo, wl, "ddp", 16, optimizations={"param_compression": spec}))
    assert allreduce_bytes(comp) == pytest.approx(ratio * allreduce_bytes(base))
    # encode reads the full gradients and writes the compressed ones; decode the reverse (per rank)
    full = allreduce_bytes(base) / 2  # each of the two ranks records the all-reduce
    for name in ("encode_grads", "decode_grads"):
        seconds = sum(op.duration for op in ops(comp, name) if op.resource == "gpu0")
        assert seconds == pytest.approx((1 + ratio) * full / A100_STREAMING, rel=1e-9)


def test_powersgd_sends_low_rank_factors_and_pays_matmul_flops(tmp_path):
    topo = tiny_topology(gpus=2)
    wl = write(tmp_path, tiny_workload(LAYERS, batch=8, step_s=STEP))
    rank, a100_fp32 = 4, 19.5e12
    spec = {"method": "powersgd", "rank": rank}
    base = simulate(make_scenario(topo, wl, "ddp", 16))
    comp = simulate(make_scenario(topo, wl, "ddp", 16, optimizations={"param_compression": spec}))
    # no recorded shape: each layer's 1e6 / 1e7 fp32 values as a square matrix of side 1000 / 3162, sent as
    # P (side x rank) and Q (side x rank)
    sides = [1000, 3162]
    wire = sum(2 * s * rank * 4 for s in sides) * comp.iterations * 2  # 2 ranks record each all-reduce
    assert allreduce_bytes(comp) == pytest.approx(wire)
    assert allreduce_bytes(comp) < 0.01 * allreduce_bytes(base)
    # P = M Q, Q = M^T P, M = P Q^T: 2 m n r FLOPs each; error feedback: read + write the bucket twice
    matmul = sum(2 * s * s * rank for s in sides) / a100_fp32 * comp.iterations
    feedback = 2 * allreduce_bytes(base) / 2 / A100_STREAMING  # each rank all-reduces each gradient byte once

    def seconds(name):
        return sum(op.duration for op in ops(comp, name) if op.resource == "gpu0")

    assert seconds("encode_grads") == pytest.approx(matmul + feedback, rel=1e-9)
    assert seconds("encode_q_grads") == pytest.approx(matmul, rel=1e-9)
    assert seconds("decode_grads") == pytest.approx(matmul + feedback, rel=1e-9)


BIAS = {"name": "bias", "fwd": 0.001, "bwd": 0.001, "params": 40}  # 10 values: 3 x 3 at rank 3 is no saving


def allreduce_chain(result, gpu="gpu0"):
    """The all-reduces of each (iteration, bucket) on ``gpu``, in start order: [(part, start, end)]."""
    chains: dict = {}
    for op in sorted(ops(result, "allreduce"), key=lambda op: op.start):
        if op.resource == gpu:
            bucket, part = op.layer.split(":")
            chains.setdefault((op.iteration, bucket), []).append((part, op.start, op.end))
    return chains


@pytest.mark.parametrize(
    "layers, parts",
    [
        (LAYERS, {"bucket0": ["P", "Q"], "bucket1": ["P", "Q"]}),  # every layer compressed
        ([BIAS, *LAYERS], {"bucket0": ["P", "Q"], "bucket1": ["uncompressed", "P", "Q"]}),  # bias joins a's
    ],
)
def test_powersgd_is_chained_allreduces_per_bucket(tmp_path, layers, parts):
    topo = tiny_topology(gpus=2)
    wl = write(tmp_path, tiny_workload(layers, batch=8, step_s=STEP))
    spec = {"method": "powersgd", "rank": 4}
    comp = simulate(make_scenario(topo, wl, "ddp", 16, optimizations={"param_compression": spec}))
    chains = allreduce_chain(comp)
    assert {bucket for _, bucket in chains} == set(parts)
    q_matmuls = [op for op in ops(comp, "encode_q_grads") if op.resource == "gpu0"]
    for (it, bucket), chain in chains.items():
        assert [part for part, _, _ in chain] == parts[bucket]
        # each all-reduce waits for the previous one; Q = M^T P runs between the P and Q all-reduces
        assert all(prev[2] <= nxt[1] for prev, nxt in pairwise(chain))
        (q_matmul,) = [op for op in q_matmuls if op.iteration == it and op.layer == bucket]
        assert chain[-2][2] <= q_matmul.start and q_matmul.end <= chain[-1][1]


def test_powersgd_pays_two_more_collective_latencies_per_bucket(tmp_path):
    from trainsim.sim.collectives.ops import collective_time

    topo = tiny_topology(gpus=2)
    small = [BIAS, {"name": "a", "fwd": 0.010, "bwd": 0.020, "params": 400_000}]  # 1e5 values: 316 x 316
    wl = write(tmp_path, tiny_workload(small, batch=8, step_s=STEP))
    spec = {"method": "powersgd", "rank": 4}

    def run(**extra):
        scenario = make_scenario(topo, wl, "ddp", 16, **extra)
        scenario["strategy"]["collectives"] = "analytic"  # alpha-beta; one bucket holds bias and a
        return simulate(scenario)

    base, comp = run(), run(optimizations={"param_compression": spec})
    t = lambda nbytes: collective_time(load_topology(topo), "allreduce", ["gpu0", "gpu1"], nbytes)  # noqa: E731
    side, grads = 316, 400_040
    matmul = 2 * side * side * 4 / 19.5e12
    feedback = 2 * grads / A100_STREAMING
    chain = t(40) + t(side * 4 * 4) + t(side * 4 * 4)  # uncompressed bias, P, Q
    expected = chain - t(grads) + 3 * matmul + 2 * feedback
    assert comp.iteration_time_s - base.iteration_time_s == pytest.approx(expected, rel=1e-6)
    # three small all-reduces (NCCL's LL protocol) instead of one of the whole gradient: two more latencies
    assert chain > 3 * t(0) and chain - t(grads) > 0


def test_dp_gpu0_compresses_parameter_broadcast_and_gradient_gather(tmp_path):
    topo = tiny_topology(gpus=2, nvlink=False)
    wl = write(tmp_path, tiny_workload(LAYERS, batch=8, step_s=STEP))
    base = simulate(make_scenario(topo, wl, "dp-gpu0", 16))
    comp = simulate(make_scenario(topo, wl, "dp-gpu0", 16, optimizations={"param_compression": "fp16"}))
    for name in ("broadcast_params", "reduce_grads"):
        assert sum(op.nbytes for op in ops(comp, name)) == pytest.approx(
            0.5 * sum(op.nbytes for op in ops(base, name))
        )
    assert ops(comp, "encode_params") and ops(comp, "decode_reduce_grads")


# ---- bad input -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "strategy, extra, words",
    [
        ("single", {"optimizations": {"cpu_batch_split": True}}, ["cpu_batch_split", "single"]),
        ("easgd", {"optimizations": {"preload": 1}}, ["preload", "easgd"]),
        ("ddp", {"optimizations": {"param_compression": "fp16"}, "precision": "fp16"},
         ["param_compression", "precision"]),
        ("parameter-server", {"optimizations": {"param_compression": "int8"}},
         ["param_compression", "parameter-server"]),
        ("ddp", {"optimizations": {"param_compression": {"method": "topk"}}}, ["topk", "ratio"]),
    ],
)
def test_incompatible_switches_are_one_line_naming_both(tmp_path, strategy, extra, words):
    topo = tiny_topology(gpus=1 if strategy == "single" else 2)
    wl = write(tmp_path, tiny_workload(LAYERS, batch=8))
    path = tmp_path / "bad.yaml"
    batch = 8 if strategy == "single" else 16
    path.write_text(yaml.safe_dump(make_scenario(topo, wl, strategy, batch, **extra)))
    result = CliRunner().invoke(app, ["simulate", str(path)])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and all(word in lines[0] for word in words), result.output


def test_a_measured_hook_cost_is_what_each_rank_spends_in_the_codec():
    from trainsim.api import RunMeasurements, simulation

    # a hook's cost is measured by validate on a calibrated box, so it travels with that box's bundle
    bundle = Path(__file__).parent / "data" / "bundle-cpu-2rank"
    measured = RunMeasurements(codec_s=0.003)
    result = simulation("validate-cpu", variant="ddp-2-powersgd", calibration=str(bundle),
                        measurements=measured).run()
    codec = ("encode_grads", "encode_q_grads", "decode_grads")
    for gpu in ("gpu0", "gpu1"):
        spent = sum(op.duration for op in result.machine.ops
                    if op.op in codec and op.resource == gpu and op.iteration == result.warmup_iterations)
        assert spent == pytest.approx(0.003)
