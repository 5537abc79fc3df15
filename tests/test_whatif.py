"""What-if replays: collectives and host copies on a topology, another GPU, compression, and the checks.

Expected values come from the models themselves (the topology's links, the device specs, a collective
simulated alone), so these tests pin down how the replay composes them, not particular numbers.
"""


import pytest
from typer.testing import CliRunner

from trainsim.cli import app
from trainsim.errors import TrainsimError
from trainsim.formats.kineto import load_trace
from trainsim.sim.collectives.ops import collective_time, simulate_collective
from trainsim.sim.compute.roofline import DEFAULT_EFFICIENCY
from trainsim.sim.core.devices import get_device
from trainsim.sim.core.machine import PAGEABLE_COPY_RATE
from trainsim.sim.replay.engine import replay
from trainsim.sim.replay.kineto_builder import TraceBuilder
from trainsim.sim.replay.trace_graph import build_graph
from trainsim.sim.replay.whatif import WhatIf, collective_check, compute_ratio, memcpy_check
from trainsim.topologies import load_topology
from trainsim.traces import replay_traces, whatif_model

A100 = "NVIDIA A100-SXM4-40GB"
V100 = "Tesla V100-SXM2-16GB"
MAIN, US = 1, 1e-6
NCCL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
runner = CliRunner()


def allreduce_args(nelems: int, dtype: str = "Float") -> dict:
    return {"Collective name": "allreduce", "In msg nelems": nelems, "Out msg nelems": nelems, "dtype": dtype,
            "Group size": 2, "Process Group Name": "0", "Process Group Ranks": "[0, 1]"}


def graph(b: TraceBuilder, path):
    return build_graph(load_trace(b.write(path), single_file=False))


def whatif_replay(graphs, **options):
    model = whatif_model(graphs, WhatIf(**options))
    return replay(graphs, op_time=model)


def duration(rr, name):
    return next(rr.op_end[o.index] - rr.op_start[o.index] for o in rr.graph.ops if o.name == name)


def copy_alone(topology: str, nbytes: int, pinned: bool) -> float:
    """A host-to-device copy alone on the first GPU's host link."""
    topo = load_topology(topology)
    route = topo.route(topo.host_memory("gpu0"), "gpu0")
    rate = topo.bottleneck(route)
    return topo.route_latency(route) + nbytes / (rate if pinned else min(rate, PAGEABLE_COPY_RATE))


@pytest.mark.parametrize("pinned", [True, False])
def test_host_copy_scales_by_its_link_model(tmp_path, pinned):
    """The measured copy times new link model / old link model; on its own machine it is unchanged."""
    nbytes = 64 * 2**20
    kind = "Pinned" if pinned else "Pageable"
    name = f"Memcpy HtoD ({kind} -> Device)"
    b = TraceBuilder(device_name=V100)
    b.step(1, MAIN, 0, 6000)
    b.launch(MAIN, 10, 5, stream=7, gpu_ts=20, gpu_dur=5000, name=name, kind="gpu_memcpy", bytes=nbytes)
    g = graph(b, tmp_path / "t.json")
    moved = whatif_replay([g], topology="dgx-a100").ranks[0]
    ratio = copy_alone("dgx-a100", nbytes, pinned) / copy_alone("dgx1-v100", nbytes, pinned)
    assert duration(moved, name) == pytest.approx(5000 * US * ratio)
    home = whatif_replay([g], topology="dgx1-v100").ranks[0]
    assert duration(home, name) == pytest.approx(5000 * US)
    if not pinned:                     # pinned=true lifts the pageable staging cap on the same machine
        lifted = whatif_replay([g], pinned=True).ranks[0]
        expected = copy_alone("dgx1-v100", nbytes, True) / copy_alone("dgx1-v100", nbytes, False)
        assert duration(lifted, name) == pytest.approx(5000 * US * expected)


def test_shared_network_makes_concurrent_copies_contend(tmp_path):
    """Two equal pinned H2D copies at once: on the shared new link each gets half the rate."""
    nbytes = 64 * 2**20
    b = TraceBuilder(device_name=V100)
    for stream, name in ((7, "Memcpy HtoD (Pinned -> Device) a"), (8, "Memcpy HtoD (Pinned -> Device) b")):
        b.launch(MAIN, 10, 1, stream=stream, gpu_ts=20, gpu_dur=5000, name=name, kind="gpu_memcpy",
                 bytes=nbytes)
    g = graph(b, tmp_path / "t.json")
    old = copy_alone("dgx1-v100", nbytes, True)
    alone = whatif_replay([g], topology="dgx-a100").ranks[0]
    shared = whatif_replay([g], topology="dgx-a100", network="shared").ranks[0]
    assert duration(alone, "Memcpy HtoD (Pinned -> Device) a") == pytest.approx(
        5000 * US * copy_alone("dgx-a100", nbytes, True) / old)
    # each flow carries its bytes times measured / modelled-on-the-old-machine, at half the new link
    topo = load_topology("dgx-a100")
    route = topo.route(topo.host_memory("gpu0"), "gpu0")
    both = topo.route_latency(route) + nbytes * (5000 * US / old) / (0.5 * topo.bottleneck(route))
    for name in ("Memcpy HtoD (Pinned -> Device) a", "Memcpy HtoD (Pinned -> Device) b"):
        assert duration(shared, name) == pytest.approx(both)


def straggler_job(tmp_path, gemm_us: dict[int, float]) -> list:
    """Two ranks: a GEMM, then the all-reduce on the same stream; the ranks' all-reduces end together."""
    nelems, end = 4 * 2**20, 20 + max(gemm_us.values()) + 1 + 3000
    graphs = []
    for rank, gemm in gemm_us.items():
        b = TraceBuilder(rank=rank, world_size=2, device_name=A100)
        b.step(1, MAIN, 0, 5000)
        b.launch(MAIN, 10, 5, stream=9, gpu_ts=20, gpu_dur=gemm, name="cutlass_80_simt_sgemm_128x64")
        start = 20 + gemm + 1
        b.launch(MAIN, 16, 2, stream=9, gpu_ts=start, gpu_dur=end - start, name=NCCL,
                 **allreduce_args(nelems))
        graphs.append(graph(b, tmp_path / f"r{rank}.json"))
    return graphs


@pytest.mark.parametrize("network", ["isolated", "shared"])
def test_ranks_join_their_collective(tmp_path, network):
    """Rank 1's GEMM makes it 300 us late. A faster GPU shortens both GEMMs: rank 0's all-reduce still
    waits for rank 1, so both end when rank 1's transfer after its shorter GEMM ends."""
    graphs = straggler_job(tmp_path, {0: 100, 1: 400})
    same = whatif_replay(graphs, topology="dgx-a100", network=network)
    assert [rr.op_end[rr.graph.ops[-1].index] for rr in same.ranks] == pytest.approx([3421 * US] * 2)
    faster = whatif_replay(graphs, gpu="h100-sxm", network=network)
    r = get_device("a100-40gb").peak("fp32") / get_device("h100-sxm").peak("fp32")
    ends = [rr.op_end[rr.graph.ops[-1].index] for rr in faster.ranks]
    assert ends == pytest.approx([(3421 - 400 * (1 - r)) * US] * 2)
    alone = whatif_replay(graphs[:1], gpu="h100-sxm").ranks[0]        # rank 0 without its peer
    assert alone.op_end[alone.graph.ops[-1].index] == pytest.approx((3421 - 100 * (1 - r)) * US)


def test_collective_of_unknown_size_keeps_its_measured_duration(tmp_path):
    b = TraceBuilder(device_name=A100)
    b.launch(MAIN, 10, 5, stream=9, gpu_ts=20, gpu_dur=3000, name=NCCL)
    rr = whatif_replay([graph(b, tmp_path / "t.json")], topology="dgx-a100").ranks[0]
    assert duration(rr, NCCL) == pytest.approx(3000 * US)


def test_compression_halves_the_payload_and_pays_for_the_casts(tmp_path):
    """One all-reduce that waited for nobody: its transfer halves at its own rate, latency stays."""
    nelems = 8 * 2**20
    b = TraceBuilder(device_name=A100)
    b.launch(MAIN, 10, 5, stream=9, gpu_ts=20, gpu_dur=3000, name=NCCL, **allreduce_args(nelems))
    rr = whatif_replay([graph(b, tmp_path / "t.json")], compression="fp16").ranks[0]
    latency = collective_time(load_topology("dgx-a100"), "allreduce", ["gpu0", "gpu1"], 0, algo="ring",
                              proto="ll")
    casts = 2 * nelems * 6 / get_device("a100-40gb").memory_bandwidth
    assert duration(rr, NCCL) == pytest.approx(latency + (3000 * US - latency) / 2 + casts)


def test_another_gpu_rescales_by_kernel_kind(tmp_path):
    b = TraceBuilder(device_name=A100)
    b.launch(MAIN, 10, 5, stream=7, gpu_ts=20, gpu_dur=100, name="cutlass_80_tensorop_s1688gemm_256x64_nn")
    b.launch(MAIN, 20, 5, stream=7, gpu_ts=130, gpu_dur=100, name="vectorized_elementwise_kernel<add>")
    rr = whatif_replay([graph(b, tmp_path / "t.json")], gpu="h100-sxm").ranks[0]
    a100, h100 = get_device("a100-40gb"), get_device("h100-sxm")
    assert duration(rr, "cutlass_80_tensorop_s1688gemm_256x64_nn") == pytest.approx(
        100 * US * a100.peak("tf32") / h100.peak("tf32"))
    assert duration(rr, "vectorized_elementwise_kernel<add>") == pytest.approx(
        100 * US * a100.memory_bandwidth / h100.memory_bandwidth)


def test_matrix_kernels_by_their_ops_shapes(tmp_path):
    """A GEMM kernel under a matmul recorded with its shapes scales by the roofline of that matmul: a
    matrix-vector product by memory bandwidth, a large square one by peak FLOP/s. Kernel kinds are read
    from the function name, not its template arguments (fbgemm_gpu types do not make a GEMM), and Hopper's
    cuBLAS kernels (nvjet) are GEMMs."""
    gemv_like, square = "ampere_sgemm_128x64_nn", "ampere_sgemm_128x128_nn"
    embedding = "void split_embedding_codegen_forward_kernel<c10::Half, fbgemm_gpu::Vec4T<float>>(int)"
    nvjet = "nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNT"
    b = TraceBuilder(device_name=A100)
    b.cpu_op(MAIN, "aten::mm", 9, 8, **{"Input Dims": [[1, 8192], [8192, 8192]],
                                        "Input type": ["float", "float"]})
    b.launch(MAIN, 10, 5, stream=7, gpu_ts=20, gpu_dur=100, name=gemv_like)
    b.cpu_op(MAIN, "aten::mm", 19, 8, **{"Input Dims": [[8192, 8192], [8192, 8192]],
                                         "Input type": ["float", "float"]})
    b.launch(MAIN, 20, 5, stream=7, gpu_ts=130, gpu_dur=100, name=square)
    b.launch(MAIN, 30, 5, stream=7, gpu_ts=240, gpu_dur=100, name=embedding)
    b.launch(MAIN, 40, 5, stream=7, gpu_ts=350, gpu_dur=100, name=nvjet)
    graphs = [graph(b, tmp_path / "t.json")]
    model = whatif_model(graphs, WhatIf(gpu="h100-sxm"))
    rr = replay(graphs, op_time=model).ranks[0]
    a100, h100 = get_device("a100-40gb"), get_device("h100-sxm")
    bandwidth, fp32 = a100.memory_bandwidth / h100.memory_bandwidth, a100.peak("fp32") / h100.peak("fp32")
    assert duration(rr, gemv_like) == pytest.approx(100 * US * bandwidth)
    assert duration(rr, square) == pytest.approx(100 * US * fp32)
    assert duration(rr, embedding) == pytest.approx(100 * US * bandwidth)
    assert duration(rr, nvjet) == pytest.approx(100 * US * fp32)
    notes = model.notes()
    assert "2 matrix kernels rescaled by the roofline of their ops' recorded shapes (1 of them memory-bound" \
        in notes[0]
    assert notes[1].startswith("1 matrix kernels rescaled by peak FLOP/s")


def test_op_held_by_another_streams_kernel_moves_with_it(tmp_path):
    """A kernel that sat idle after its launch, its stream free, and started as a kernel on another stream
    ended (an event wait the trace does not show, or the SMs that kernel held) waits for that kernel: on a
    faster GPU it starts when that kernel's shorter run ends, not after its measured delay."""
    b = TraceBuilder(device_name=A100)
    b.launch(MAIN, 10, 5, stream=7, gpu_ts=20, gpu_dur=1000, name="elementwise_kernel_a")
    b.launch(MAIN, 16, 5, stream=8, gpu_ts=1021, gpu_dur=10, name="reduce_kernel_b")
    graphs = [graph(b, tmp_path / "t.json")]
    held = next(o for o in graphs[0].ops if o.name == "reduce_kernel_b")
    assert [graphs[0].ops[d].name for d in held.deps] == ["elementwise_kernel_a"]
    assert graphs[0].stats["ops_held_by_other_streams"] == 1
    first = next(o.index for o in graphs[0].ops if o.name == "elementwise_kernel_a")
    measured = replay(graphs).ranks[0]
    assert measured.op_start[held.index] - measured.op_start[first] == pytest.approx(1001 * US)
    rr = whatif_replay(graphs, gpu="h100-sxm").ranks[0]
    assert rr.op_end[first] - rr.op_start[first] < 500 * US
    assert rr.op_start[held.index] == pytest.approx(rr.op_end[first] + 1 * US)


def test_ops_launched_before_the_trace_move_with_their_stream(tmp_path):
    """Kernels whose launch calls precede the trace (queued while the GPU ran behind the CPU) run back to
    back on their stream; on a faster GPU they still do, so each starts earlier. The first one, with nothing
    before it in the trace, keeps its measured start."""
    b = TraceBuilder(device_name=A100)
    b.cpu_op(MAIN, "aten::add", 0, 2)
    for k, ts in enumerate((5, 506, 1007)):
        b.events.append({"ph": "X", "cat": "kernel", "name": f"elementwise_kernel_{k}", "pid": 0, "tid": 7,
                         "ts": ts, "dur": 500, "args": {"device": 0, "stream": 7, "correlation": 7 + k}})
    graphs = [graph(b, tmp_path / "t.json")]
    measured = replay(graphs).ranks[0]
    assert [measured.op_start[o.index] / US for o in graphs[0].ops] == pytest.approx([5, 506, 1007])  # from 0
    rr = whatif_replay(graphs, gpu="h100-sxm").ranks[0]
    a100, h100 = get_device("a100-40gb"), get_device("h100-sxm")
    run = 500 * a100.memory_bandwidth / h100.memory_bandwidth
    starts = [rr.op_start[o.index] / US for o in graphs[0].ops]
    assert starts == pytest.approx([5, 5 + run + 1, 5 + 2 * run + 2])


def test_compute_ratio_precision_from_the_name():
    from trainsim.formats.kineto import GpuEvent
    from trainsim.sim.replay.trace_graph import GpuOp

    a100, v100 = get_device("a100-40gb"), get_device("v100-16gb")
    fp16 = GpuOp(0, GpuEvent("kernel", "volta_h884gemm_128x64", 0, 7, 0, 1))
    fp32 = GpuOp(1, GpuEvent("kernel", "ampere_sgemm_128x64_nn", 0, 7, 0, 1))
    assert compute_ratio(fp16, a100, v100) == pytest.approx(a100.peak("fp16") / v100.peak("fp16"))
    assert compute_ratio(fp32, a100, v100) == pytest.approx(a100.peak("fp32") / v100.peak("fp32"))


def test_unknown_trace_gpu_cannot_be_rescaled(tmp_path):
    b = TraceBuilder()                                  # "Synthetic GPU"
    b.launch(MAIN, 10, 5, stream=7, gpu_ts=20, gpu_dur=100)
    with pytest.raises(TrainsimError, match="not a known device spec"):
        whatif_model([graph(b, tmp_path / "t.json")], WhatIf(gpu="h100-sxm"))


@pytest.mark.parametrize("sets, message", [
    (["nope=1"], "unknown --set key"), (["compression=int3"], "unknown compression"),
    (["pinned=maybe"], "pinned must be true or false"), (["compression"], "expected key=value"),
    (["algo=butterfly"], "unknown algorithm"), (["network=mesh"], "unknown network"),
])
def test_bad_switches(sets, message):
    with pytest.raises(TrainsimError, match=message):
        WhatIf.from_options(sets=sets)


def test_checks_on_a_synthetic_trace(tmp_path):
    nelems = 2**20
    b = TraceBuilder(device_name=A100)
    b.launch(MAIN, 10, 5, stream=9, gpu_ts=20, gpu_dur=1000, name=NCCL, block=[512, 1, 1],
             **allreduce_args(nelems))
    b.launch(MAIN, 20, 5, stream=7, gpu_ts=1100, gpu_dur=20, name="Memcpy DtoD (Device -> Device)",
             kind="gpu_memcpy", bytes=8 * 2**20)
    g = graph(b, tmp_path / "t.json")
    coll = collective_check([g], load_topology("dgx-a100"))
    # as the kernel ran (its name says ring, its 512 threads LL); one kernel waited for nobody, so all of it
    # is compared
    alone = simulate_collective(load_topology("dgx-a100"), "allreduce", ["gpu0", "gpu1"], nelems * 4,
                                algo="ring", proto="ll")["time_s"]
    assert coll.summary["count"] == 1
    assert coll.rows[0]["error_pct"] == pytest.approx(100 * (alone - 1000 * US) / (1000 * US))
    copies = memcpy_check([g], load_topology("dgx-a100"))
    expected = 2 * 8 * 2**20 / (get_device("a100-40gb").memory_bandwidth * DEFAULT_EFFICIENCY.memory)
    assert copies.rows[0]["simulated_s"] == pytest.approx(expected)
    assert copies.summary["by_copy"]["D2D"]["count"] == 1


def test_shared_trace_whatif_on_its_own_machine_is_the_measurement(shared_file):
    trace = shared_file("traces", "kineto-a100-ddp2-rank0.json.gz")
    report = replay_traces([trace], whatif=WhatIf(topology="dgx-a100", gpu="a100-40gb"))
    assert report.checks["collectives"].summary["count"] == 21
    assert report.checks["memcpys"].summary["count"] == 960
    for m, w in zip(report.replay.steps, report.whatif.steps, strict=True):
        assert w.replayed_s == pytest.approx(m.measured_s, rel=0.005)
        assert w.replayed_breakdown["communication_s"] == pytest.approx(
            m.measured_breakdown["communication_s"], rel=0.005)


def test_cli_whatif_and_bad_names(tmp_path):
    b = TraceBuilder(device_name=A100)
    b.step(1, MAIN, 0, 200)
    b.launch(MAIN, 10, 5, stream=7, gpu_ts=20, gpu_dur=100, name="cutlass_gemm")
    path = str(b.write(tmp_path / "t.json"))
    ok = runner.invoke(app, ["replay", path, "--gpu", "h100-sxm", "--topology", "dgx-a100", "--json"])
    assert ok.exit_code == 0, ok.output
    assert "whatif" in ok.stdout
    for args, message in ((["--topology", "no-such-box"], "no-such-box"),
                          (["--gpu", "z80"], "--gpu: unknown device 'z80'"),
                          (["--set", "pinned=maybe"], "pinned")):
        bad = runner.invoke(app, ["replay", path, *args])
        assert bad.exit_code == 2 and message in bad.output and "Traceback" not in bad.output
