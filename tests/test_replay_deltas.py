"""Replay what-ifs as deltas on the measurement: CUDA graphs and the launch queue in the graph, NCCL kernels
split into wait, latency and transfer, sizes inferred, several ranks of one run, bad input.

Expected values are built from the measured numbers of each small trace and the models' public functions.
"""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainsim.cli import app
from trainsim.formats.kineto import load_trace, load_traces
from trainsim.sim.collectives.ops import choose, collective_time
from trainsim.sim.core.devices import get_device
from trainsim.sim.replay import trace_graph
from trainsim.sim.replay.engine import replay
from trainsim.sim.replay.kineto_builder import TraceBuilder
from trainsim.sim.replay.nccl_split import NcclSplit, kernel_algo_proto
from trainsim.sim.replay.trace_graph import build_graph
from trainsim.sim.replay.whatif import WhatIf
from trainsim.topologies import load_topology
from trainsim.traces import whatif_model

MAIN, WORKER, US = 1, 2, 1e-6
A100, V100 = "NVIDIA A100-SXM4-40GB", "Tesla V100-SXM2-16GB"
LL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
SIMPLE = "ncclKernel_AllReduce_RING_SIMPLE_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
runner = CliRunner()


def graph_of(b: TraceBuilder, path: Path):
    return build_graph(load_trace(b.write(path), single_file=False))


def sized(nelems: int) -> dict:
    return {"Collective name": "allreduce", "In msg nelems": nelems, "Out msg nelems": nelems,
            "dtype": "Float", "Group size": 2}


def scale(factor: float, names=None):
    def op_time(env, rank, op):
        return op.event.dur * factor if names is None or op.name in names else None
    return op_time


def by_name(g, name):
    return next(o for o in g.ops if o.name == name)


# ---------------------------------------------------------------- CUDA graphs, streams, launch queue

def test_cuda_graph_launch_links_every_kernel(tmp_path):
    """Three kernels carry one cudaGraphLaunch's correlation: all are launched by it, and a faster GPU
    moves the sync that waits for the last one."""
    b = TraceBuilder()
    b.step(1, MAIN, 0, 400)
    b.graph_launch(MAIN, 10, 20, stream=7, kernels=[(40, 100, "k0"), (141, 100, "k1"), (242, 100, "k2")])
    b.runtime(MAIN, "cudaDeviceSynchronize", 35, 310)                # returns 3 us after k2 ends at 342
    g = graph_of(b, tmp_path / "t.json")
    launch = by_name(g, "k0").launch
    assert launch is not None and all(by_name(g, k).launch == launch for k in ("k1", "k2"))
    assert g.stats["graph_launches"] == 1
    rr = replay([g]).ranks[0]
    assert rr.steps[0].replayed_s == pytest.approx(400 * US)
    half = replay([g], op_time=scale(0.5)).ranks[0]
    # k0 40..90, k1 91..141, k2 142..192; the sync returns 3 us later; 55 us of CPU to the step end
    assert half.steps[0].replayed_s == pytest.approx(250 * US)


def test_graph_branches_run_side_by_side_on_one_stream(tmp_path):
    """A graph's kernels on parallel branches are reported on one stream and overlap: the second follows
    what ran before both, the third the longer branch."""
    b = TraceBuilder()
    b.graph_launch(MAIN, 10, 5, stream=7, kernels=[(20, 100, "a"), (30, 50, "b"), (121, 10, "c")])
    g = graph_of(b, tmp_path / "t.json")
    assert by_name(g, "b").stream_prev is None
    assert by_name(g, "c").stream_prev == by_name(g, "a").index
    rr = replay([g]).ranks[0]
    assert [rr.op_start[o.index] for o in g.ops] == pytest.approx([o.event.ts for o in g.ops])


def test_stream_wait_without_a_visible_record_waits_for_the_op_that_released_it(tmp_path):
    """NCCL records its events outside the profiler's view: the consumer started the moment the
    all-reduce on the other stream ended, so it waits for it."""
    b = TraceBuilder()
    b.launch(MAIN, 10, 5, stream=8, gpu_ts=20, gpu_dur=480, name="nccl")
    b.runtime(MAIN, "cudaStreamWaitEvent", 20, 2)
    b.launch(MAIN, 25, 5, stream=7, gpu_ts=501, gpu_dur=30, name="consumer")
    g = graph_of(b, tmp_path / "t.json")
    assert by_name(g, "consumer").deps == [by_name(g, "nccl").index]
    assert g.stats["event_waits_timed"] == 1
    rr = replay([g], op_time=scale(0.5, {"nccl"})).ranks[0]          # times from the first event, at 10
    assert rr.op_start[by_name(g, "consumer").index] == pytest.approx(251 * US)


def test_launch_blocked_on_a_full_queue_waits_for_the_gpu(tmp_path, monkeypatch):
    """With room for 4 pending launches the 5th launch call blocked until k0 finished (120 us) and
    returned 5 us later: its wait is on the GPU, not CPU time, so a faster GPU shortens it."""
    monkeypatch.setattr(trace_graph, "LAUNCH_QUEUE", 4)
    b = TraceBuilder()
    b.step(1, MAIN, 0, 600)
    for k in range(4):
        b.launch(MAIN, 10 + 2 * k, 1, stream=7, gpu_ts=20 + 101 * k, gpu_dur=100, name=f"k{k}")
    b.launch(MAIN, 18, 107, stream=7, gpu_ts=424, gpu_dur=100, name="k4")
    b.runtime(MAIN, "cudaStreamSynchronize", 126, 400)                # returns at 526, 2 us after k4
    g = graph_of(b, tmp_path / "t.json")
    assert g.stats["launches_blocked_on_full_queue"] == 1
    returned = next(p.index for p in g.points if p.label == "return" and p.name == "cudaLaunchKernel")
    assert replay([g], launch_queue=4).ranks[0].point_time[returned] == pytest.approx(125 * US)
    half = replay([g], op_time=scale(0.5), launch_queue=4).ranks[0]
    assert half.point_time[returned] == pytest.approx(75 * US)         # k0 ends at 70
    assert half.steps[0].replayed_s < 400 * US


def test_thread_inside_backward_resumes_when_the_autograd_thread_hands_over(tmp_path):
    """Main idles in backward while the worker works on past main's resumption: main resumes when the
    worker reaches its last boundary before that, so a slower kernel the worker waits for delays main."""
    b = TraceBuilder()
    b.step(1, MAIN, 0, 5000)
    b.cpu_op(MAIN, "forward", 0, 1000)
    b.cpu_op(WORKER, "backward part 1", 1100, 2900)
    b.launch(WORKER, 1200, 5, stream=7, gpu_ts=1210, gpu_dur=50, name="k")
    b.runtime(WORKER, "cudaStreamSynchronize", 1210, 55)              # k ends 1260, returns 1265
    b.cpu_op(WORKER, "backward part 2", 4000, 800)
    b.cpu_op(MAIN, "evaluate_function", 4010, 100)                    # main resumes while worker works
    b.cpu_op(MAIN, "optimizer", 4900, 50)
    g = graph_of(b, tmp_path / "t.json")
    assert g.stats["thread_handoffs_in_progress"] == 1
    assert replay([g]).ranks[0].steps[0].replayed_s == pytest.approx(5000 * US)
    assert replay([g], op_time=scale(3.0, {"k"})).ranks[0].steps[0].replayed_s == pytest.approx(5100 * US)


# ---------------------------------------------------------------- NCCL kernels in parts

def ll_latency() -> float:
    topo = load_topology("dgx-a100")
    return collective_time(topo, "allreduce", ["gpu0", "gpu1"], 0, algo="ring", proto="ll")


def test_kernel_names_give_algorithm_and_threads_the_protocol():
    """NCCL names every kernel of a collective and algorithm ..._LL whatever protocol runs in it; the
    threads per block tell: LL 512 (halved for small messages), LL128 640, Simple one sync warp more."""
    assert kernel_algo_proto(LL) == ("ring", "auto")
    assert kernel_algo_proto(LL, 512) == kernel_algo_proto(LL, 128) == ("ring", "ll")
    assert kernel_algo_proto(LL, 640) == kernel_algo_proto(LL, 320) == ("ring", "ll128")
    assert kernel_algo_proto(LL, 544) == kernel_algo_proto(LL, 160) == ("ring", "simple")
    assert kernel_algo_proto(LL, 96) == ("ring", "auto")          # three warps: the floor of either
    assert kernel_algo_proto("ncclKernel_AllReduce_TREE_LL_Sum_float", 544) == ("tree", "auto")
    # From NCCL 2.19 RING_LL runs every algorithm but tree: only the ring's Simple warp is unambiguous.
    new = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage)"
    assert kernel_algo_proto(new, 544) == ("ring", "simple")
    assert kernel_algo_proto(new, 640) == kernel_algo_proto(new, 512) == ("auto", "auto")
    assert kernel_algo_proto("ncclDevKernel_AllReduce_Sum_f32_TREE_LL128(ncclDevKernelArgsStorage)") == (
        "tree", "ll128")
    assert kernel_algo_proto("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", 640) == ("ring", "simple")
    assert kernel_algo_proto("ncclKernel_Broadcast") == ("auto", "auto")


def test_shared_a100_trace_ran_simple_and_its_rate_is_not_dgx_a100s(shared_file):
    """The shared A100 trace's all-reduces launch 544 threads (Simple) and move 13 GB/s at best: the check
    says the model of dgx-a100 moves far more, so the trace's GPUs were not linked as that machine's."""
    trace = shared_file("traces", "kineto-a100-ddp2-rank0.json.gz")
    g = build_graph(load_trace(trace))
    split = NcclSplit([g], load_topology("dgx-a100"))
    allreduces = [m for m in split.members.values() if m.op == "allreduce"]
    assert allreduces and {(m.algo, m.proto) for m in allreduces} == {("ring", "simple")}
    result = runner.invoke(app, ["replay", str(trace), "--json"])
    assert result.exit_code == 0, result.output
    rates = json.loads(result.stdout)["checks"]["collectives"]["summary"]["rates"]
    allreduce = next(r for r in rates if r["collective"] == "allreduce")
    assert allreduce["measured_gbps"] == pytest.approx(13.1, abs=0.1)
    assert allreduce["mismatch"] and allreduce["model_gbps"] > 10 * allreduce["measured_gbps"]


def test_split_fits_the_fastest_rate_and_calls_the_rest_waiting(tmp_path):
    """Two all-reduces of 16 MiB (1000 and 1600 us) and one of 32 MiB (1700 us): the fastest effective
    rate is the 32 MiB one's; the slow 16 MiB kernel waited for its peer."""
    b = TraceBuilder(world_size=2, device_name=A100)
    for ts, nelems, dur in ((0, 4 * 2**20, 1000), (2000, 4 * 2**20, 1600), (4000, 8 * 2**20, 1700)):
        b.launch(MAIN, ts, 5, stream=9, gpu_ts=ts + 10, gpu_dur=dur, name=LL, **sized(nelems))
    g = graph_of(b, tmp_path / "t.json")
    split = NcclSplit([g], load_topology("dgx-a100"))
    lat = ll_latency()
    rate = max(16 * 2**20 / (1000 * US - lat), 32 * 2**20 / (1700 * US - lat))
    parts = [split.split(0, o) for o in sorted(g.ops, key=lambda o: o.event.ts)]
    assert [p.latency_s for p in parts] == pytest.approx([lat] * 3)
    assert parts[2].wait_s == pytest.approx(0.0, abs=1e-12)
    assert parts[1].transfer_s == pytest.approx(16 * 2**20 / rate)
    assert parts[1].wait_s == pytest.approx(1600 * US - lat - 16 * 2**20 / rate)
    assert parts[0].size_source == "trace" and parts[0].nbytes == 16 * 2**20


def test_size_missing_from_one_kernel_comes_from_the_trace_fit(tmp_path):
    b = TraceBuilder(world_size=2, device_name=A100)
    b.launch(MAIN, 0, 5, stream=9, gpu_ts=10, gpu_dur=1000, name=LL, **sized(4 * 2**20))
    b.launch(MAIN, 2000, 5, stream=9, gpu_ts=2010, gpu_dur=500, name=LL, **{"Group size": 2})
    g = graph_of(b, tmp_path / "t.json")
    split = NcclSplit([g], load_topology("dgx-a100"))
    unsized = split.split(0, max(g.ops, key=lambda o: o.event.ts))
    rate = 16 * 2**20 / (1000 * US - ll_latency())
    assert unsized.size_source == "inferred from the trace's rates"
    assert unsized.nbytes == pytest.approx((500 * US - ll_latency()) * rate)


def test_ll_kernel_without_size_moved_a_small_message_whatever_it_lasted(tmp_path):
    """NCCL runs LL only for small messages: a 10 ms LL all-reduce is mostly waiting."""
    b = TraceBuilder(world_size=2, device_name=V100)
    b.launch(MAIN, 0, 5, stream=9, gpu_ts=10, gpu_dur=10_000, name=LL, block=[512, 1, 1])
    g = graph_of(b, tmp_path / "t.json")
    topo = load_topology("dgx1-v100")
    part = NcclSplit([g], topo).split(0, g.ops[0])
    assert choose(topo, "allreduce", ["gpu0", "gpu1"], part.nbytes, algo="ring")[1] == "ll"
    assert choose(topo, "allreduce", ["gpu0", "gpu1"], 2 * part.nbytes, algo="ring")[1] != "ll"
    assert part.wait_s > 9_000 * US and part.size_source == "inferred from the model of dgx1-v100"


def test_compression_on_a_trace_without_sizes_says_they_were_inferred(tmp_path):
    b = TraceBuilder(world_size=2, device_name=V100)
    b.step(1, MAIN, 0, 2100)
    b.launch(MAIN, 10, 5, stream=9, gpu_ts=20, gpu_dur=2000, name=SIMPLE)
    b.runtime(MAIN, "cudaStreamSynchronize", 16, 2009)                # returns 5 us after the all-reduce
    path = b.write(tmp_path / "t.json")
    result = runner.invoke(app, ["replay", str(path), "--set", "compression=fp16", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert any("inferred from the model of dgx1-v100" in n for n in doc["whatif"]["notes"])
    assert doc["whatif"]["steps"][0]["predicted_s"] < 0.8 * doc["steps"][0]["measured_s"]


def test_compressed_trace_shows_the_halved_messages(tmp_path):
    b = TraceBuilder(world_size=2, device_name=A100)
    b.step(1, MAIN, 0, 2000)
    b.launch(MAIN, 10, 5, stream=9, gpu_ts=20, gpu_dur=1000, name=LL, **sized(4 * 2**20))
    out = tmp_path / "out.json"
    result = runner.invoke(app, ["replay", str(b.write(tmp_path / "t.json")), "--set", "compression=fp16",
                                 "--trace", str(out)])
    assert result.exit_code == 0, result.output
    [kernel] = [e for e in json.loads(out.read_text())["traceEvents"] if e.get("cat") == "collective"]
    assert kernel["args"]["message_bytes"] == 8 * 2**20


def test_topology_whatif_retimes_only_latency_and_transfer(tmp_path):
    """A kernel that waited 1000 us for its peer: --topology scales its 1000 us of latency + transfer
    by new model / old model and keeps the wait."""
    b = TraceBuilder(world_size=2, device_name=V100)
    b.launch(MAIN, 0, 5, stream=9, gpu_ts=10, gpu_dur=1000, name=SIMPLE, **sized(4 * 2**20))
    b.launch(MAIN, 2000, 5, stream=9, gpu_ts=2010, gpu_dur=2000, name=SIMPLE, **sized(4 * 2**20))
    g = graph_of(b, tmp_path / "t.json")
    model = whatif_model([g], WhatIf(topology="dgx-a100", collectives="analytic"))
    rr = replay([g], op_time=model).ranks[0]
    old, new = (collective_time(load_topology(t), "allreduce", ["gpu0", "gpu1"], 16 * 2**20)
                for t in ("dgx1-v100", "dgx-a100"))
    late = max(g.ops, key=lambda o: o.event.ts)
    assert rr.op_end[late.index] - rr.op_start[late.index] == pytest.approx(1000 * US + 1000 * US * new / old)


def test_a_shorter_allreduce_before_does_not_bring_the_peer_sooner(tmp_path):
    """Two 16 MiB all-reduces back to back; the second waited 500 us for its peer. Compressed, the first
    ends sooner, but the peer (held up by its own work, not by that all-reduce) arrives when it did: the
    second ends the new latency + transfer (and casts) after the measured moment the peer arrived."""
    b = TraceBuilder(world_size=2, device_name=A100)
    b.step(1, MAIN, 0, 3000)
    b.launch(MAIN, 10, 1, stream=9, gpu_ts=20, gpu_dur=1000, name=LL, **sized(4 * 2**20))
    b.launch(MAIN, 12, 1, stream=9, gpu_ts=1021, gpu_dur=1500, name=LL, **sized(4 * 2**20))
    g = graph_of(b, tmp_path / "t.json")
    rr = replay([g], op_time=whatif_model([g], WhatIf(compression="fp16"))).ranks[0]
    lat = ll_latency()
    casts = 2 * 4 * 2**20 * 6 / get_device("a100-40gb").memory_bandwidth
    first, second = sorted(g.ops, key=lambda o: o.event.ts)
    assert rr.op_end[first.index] - rr.op_start[first.index] == pytest.approx(
        lat + (1000 * US - lat) / 2 + casts)
    assert rr.op_end[second.index] == pytest.approx(1521 * US + casts + lat + (1000 * US - lat) / 2)


# ---------------------------------------------------------------- several ranks, bad input

def test_ranks_are_put_on_one_clock(tmp_path):
    paths = []
    for rank, base in ((0, 1_700_000_000_000_000_000), (1, 1_700_000_000_000_100_000)):    # 100 us later
        b = TraceBuilder(rank=rank, world_size=2, base_time_ns=base, device_name=A100)
        b.launch(MAIN, 10, 5, stream=7, gpu_ts=20, gpu_dur=100)
        paths.append(b.write(tmp_path / f"r{rank}.json"))
    r0, r1 = load_traces(paths)
    assert r1.gpu_events[0].ts - r0.gpu_events[0].ts == pytest.approx(100 * US)


def test_traces_of_different_gpus_are_refused(tmp_path):
    paths = []
    for rank, name in ((0, A100), (1, V100)):
        b = TraceBuilder(rank=rank, world_size=2, device_name=name)
        b.launch(MAIN, 10, 5, stream=7, gpu_ts=20, gpu_dur=100)
        paths.append(str(b.write(tmp_path / f"r{rank}.json")))
    result = runner.invoke(app, ["replay", *paths])
    assert result.exit_code == 2 and "different runs mixed together: GPUs" in result.output
    assert len(result.stderr.strip().splitlines()) == 1


def no_sizes_unknown_gpu(tmp_path):
    b = TraceBuilder(world_size=2)                      # "Synthetic GPU": no machine to infer sizes on
    b.step(1, MAIN, 0, 3000)
    b.launch(MAIN, 10, 5, stream=9, gpu_ts=20, gpu_dur=2000, name=LL)
    return b


@pytest.mark.parametrize("make, args, message", [
    (no_sizes_unknown_gpu, ["--set", "compression=fp16"], "message sizes"),
    (no_sizes_unknown_gpu, ["--topology", "dgx-a100"], "--set ran_on=TOPOLOGY"),
    (no_sizes_unknown_gpu, ["--gpu", "h100-sxm"], "not a known device spec"),
])
def test_whatif_the_trace_cannot_support_is_one_line(tmp_path, make, args, message):
    out = tmp_path / "out.json.gz"
    path = make(tmp_path).write(tmp_path / "t.json")
    result = runner.invoke(app, ["replay", str(path), *args, "--trace", str(out)])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_a_trace_without_steps_is_one_window(tmp_path):
    """No ProfilerStep spans: the replay and its what-if cover the whole trace, from the first launch call
    (10 us) to the end of the last kernel (320 us), shown as step 'all' (null in JSON)."""
    b = TraceBuilder(device_name=A100)
    b.launch(MAIN, 10, 5, stream=7, gpu_ts=20, gpu_dur=100, name="vectorized_elementwise_kernel<add>")
    b.launch(MAIN, 15, 5, stream=7, gpu_ts=120, gpu_dur=200, name="vectorized_elementwise_kernel<mul>")
    path = b.write(tmp_path / "t.json")
    result = runner.invoke(app, ["replay", str(path), "--gpu", "h100-sxm", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    [step] = doc["steps"]
    assert step["step"] is None and step["measured_s"] == pytest.approx(310e-6)
    assert step["replayed_s"] == pytest.approx(310e-6)
    ratio = get_device("a100-40gb").memory_bandwidth / get_device("h100-sxm").memory_bandwidth
    [whatif] = doc["whatif"]["steps"]
    assert whatif["predicted_s"] == pytest.approx(10e-6 + 300e-6 * ratio)
    text = runner.invoke(app, ["replay", str(path)]).output
    assert "   0   all " in text and "the whole trace is one window" in text


@pytest.mark.slow
def test_gpu_bound_cuda_graph_step_shortens_on_a_faster_gpu(shared_file):
    """The V100 CUDA-graph trace's 166 ms steps are GPU-bound: on an H100 they save over half the compute
    saved; the identity what-if gives every step back."""
    g = build_graph(load_trace(shared_file("traces", "v100-ddp2-rank1-cudagraph.json.gz")))
    same = replay([g], op_time=whatif_model([g], WhatIf(topology="dgx1-v100", gpu="v100-16gb"))).ranks[0]
    assert all(abs(s.error_pct) < 0.5 for s in same.steps)
    base = replay([g]).ranks[0]
    h100 = replay([g], op_time=whatif_model([g], WhatIf(gpu="h100-sxm"))).ranks[0]
    for m, w in zip(base.steps, h100.steps, strict=True):
        if m.step in (1011, 1014):
            saved = m.measured_breakdown["compute_s"] - w.replayed_breakdown["compute_s"]
            assert m.measured_s - w.replayed_s > 0.5 * saved
