"""Per-rank Kineto traces (HTA's shape) from simulate and replay: their shape, our own reader reading them
back exactly, the folder written whole or not at all, and `--trace DIR` versus `--trace FILE.json.gz`."""

import gzip
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainsim import api
from trainsim.cli import app
from trainsim.errors import TrainsimError
from trainsim.formats.kineto import load_traces
from trainsim.formats.kineto_writer import check_trace_output, is_single_file, write_rank_folder
from trainsim.sim.output.kineto_ranks import GPU_STREAM, write_rank_traces
from trainsim.sim.replay import kineto_ranks as replay_ranks
from trainsim.sim.replay.kineto_builder import TraceBuilder
from trainsim.traces import replay_traces

HTA_RANK_RE = re.compile(r'"rank":\s+(\d+)')      # how HTA finds a file's rank (hta/common/trace_file.py)
SMALL_DDP = ["workload=tiny-cnn", "batch_size=64", "iterations=3"]
runner = CliRunner()


@pytest.fixture(scope="module")
def simulated():
    return api.simulate("ddp-resnet50-dgx-a100", overrides=SMALL_DDP)


@pytest.fixture(scope="module")
def sim_folder(simulated, tmp_path_factory):
    folder = tmp_path_factory.mktemp("sim") / "trace"
    write_rank_traces(simulated, folder)
    return folder


def _doc(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


def _hta_rank(path: Path) -> int | None:
    """The rank HTA reads: the first line that matches its pattern."""
    for line in gzip.decompress(path.read_bytes()).decode().splitlines():
        match = HTA_RANK_RE.search(line)
        if match:
            return int(match.group(1))
    return None


def two_ranks(tmp_path) -> list[Path]:
    paths = []
    for rank in (0, 1):
        b = TraceBuilder(rank=rank, world_size=2)
        b.step(1, 1, 0, 300)
        b.launch(1, 10, 5, stream=7, gpu_ts=20, gpu_dur=100, name="gemm")
        b.launch(1, 20, 5, stream=13, gpu_ts=130, gpu_dur=50 + 20 * rank,
                 name="ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
                 grid=[2, 1, 1], block=[544, 1, 1],
                 **{"Collective name": "allreduce", "In msg nelems": 1024, "Group size": 2, "dtype": "Float"})
        b.launch(1, 30, 5, stream=7, gpu_ts=200, gpu_dur=10, kind="gpu_memcpy",
                 name="Memcpy DtoH (Device -> Pinned)", bytes=4096)
        b.runtime(1, "cudaDeviceSynchronize", 40, 250)
        b.step(2, 1, 300, 300)
        b.launch(1, 310, 5, stream=7, gpu_ts=320, gpu_dur=100, name="gemm")
        paths.append(b.write(tmp_path / f"in_rank{rank}.json"))
    return paths


# ---------------------------------------------------------------- simulate

def test_one_file_per_rank_that_hta_reads_as_that_rank(simulated, sim_folder):
    files = sorted(sim_folder.iterdir())
    assert [f.name for f in files] == [f"rank-{i}.json.gz" for i in range(8)]
    for i, f in enumerate(files):
        assert _hta_rank(f) == i
        doc = _doc(f)
        assert doc["distributedInfo"]["rank"] == i and doc["distributedInfo"]["world_size"] == 8
        assert doc["distributedInfo"]["backend"] == "nccl"
        assert [d["id"] for d in doc["deviceProperties"]] == [i]


def test_kineto_categories_and_links(sim_folder):
    doc = _doc(sim_folder / "rank-3.json.gz")
    events = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    cats = {e["cat"] for e in events}
    assert {"kernel", "gpu_memcpy", "cuda_runtime", "user_annotation"} <= cats
    steps = [e["name"] for e in events if e["cat"] == "user_annotation"]
    assert steps == ["ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"]   # warm-up step 0 not recorded
    launches = {e["args"]["correlation"]: e for e in events
                if e["cat"] == "cuda_runtime" and e["name"] in ("cudaLaunchKernel", "cudaMemcpyAsync")}
    gpu = [e for e in events if e["cat"] in ("kernel", "gpu_memcpy")]
    assert len(launches) == len(gpu)
    # the loop synchronises once per step: after its last launch, until the step's end
    step_spans = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["cat"] == "user_annotation"]
    syncs = [e for e in events if e["name"] == "cudaDeviceSynchronize"]
    assert len(syncs) == len(step_spans)
    for sync, (start, end) in zip(syncs, step_spans, strict=True):
        inside = [c["ts"] for c in launches.values() if start <= c["ts"] < end - 0.0005]  # 1 ns resolution
        assert inside and max(inside) < sync["ts"]
        assert sync["ts"] + sync["dur"] == pytest.approx(end, abs=0.01)
    for e in gpu:
        assert e["pid"] == e["args"]["device"] == 3 and e["tid"] == e["args"]["stream"]
        call = launches[e["args"]["correlation"]]
        assert call["ts"] <= e["ts"] and call["args"]["External id"] == e["args"]["External id"]
        assert call["name"] == ("cudaLaunchKernel" if e["cat"] == "kernel" else "cudaMemcpyAsync")
    nccl = [e for e in gpu if e["name"].startswith("nccl")]
    assert nccl and all(e["tid"] == GPU_STREAM["comm"] and e["args"]["Collective name"] == "allreduce"
                        and e["args"]["In msg nelems"] * 4 == e["args"]["message_bytes"] for e in nccl)
    # the streams' dependencies as DDP makes them: each wait names the stream and the record it waits for
    records = {e["args"]["correlation"] for e in events if e["name"] == "cudaEventRecord"}
    waits = {e["args"]["correlation"] for e in events if e["name"] == "cudaStreamWaitEvent"}
    stream_waits = [e["args"] for e in events if e["cat"] == "cuda_sync"]
    assert waits and {a["correlation"] for a in stream_waits} == waits
    assert all(a["wait_on_cuda_event_record_corr_id"] in records and a["wait_on_stream"] != a["stream"]
               for a in stream_waits)
    assert any(a["stream"] == GPU_STREAM["comm"] and a["wait_on_stream"] == GPU_STREAM["compute"]
               for a in stream_waits)  # an all-reduce waits for its bucket's backward
    starts = {e["id"] for e in doc["traceEvents"] if e["ph"] == "s" and e["cat"] == "ac2g"}
    ends = {e["id"] for e in doc["traceEvents"] if e["ph"] == "f" and e["cat"] == "ac2g"}
    assert starts == ends == set(launches)


def test_our_reader_reads_it_back_and_replays_the_simulated_iterations(simulated, sim_folder):
    traces = load_traces(sorted(sim_folder.iterdir()))
    assert [t.rank for t in traces] == list(range(8))
    assert all(t.rank_source == "distributedInfo" and t.world_size == 8 for t in traces)
    measured_ops = [op for op in simulated.machine.ops
                    if op.resource == "gpu0" and op.iteration >= 1 and op.stream in GPU_STREAM]
    assert len(traces[0].gpu_events) == len(measured_ops)
    report = replay_traces(sorted(sim_folder.iterdir())[:2], checks=False)
    steps = report.replay.steps
    assert [s.step for s in steps[:3]] == [1, 2, 3]
    # the simulated iteration times come back to the trace's resolution: its start and end are each written
    # to the nearest ns (Kineto's us with three decimals), except a GPU event lying inside one microsecond,
    # which moves by under half a microsecond so that HTA reads it (kineto_writer.hta_safe)
    for s in steps:
        assert s.replayed_s == pytest.approx(simulated.iteration_times_s[s.step - 1], rel=1e-6, abs=5e-7)


def test_a_what_if_gpu_retimes_our_own_trace(tmp_path):
    # The loop launches ahead and synchronises once per step, and the streams' dependencies are event waits:
    # a replay sees the GPU's critical path, so a faster GPU shortens the GPU-bound steps and a slower one
    # lengthens them (before, each launch sat at its kernel's start and pinned every step as measured).
    from trainsim.sim.replay.whatif import WhatIf

    result = api.simulate("ddp-resnet50-pcie-4gpu-gen3", overrides=["batch_size=128", "iterations=2"],
                          record=True)
    write_rank_traces(result, tmp_path / "trace")
    rank0 = [tmp_path / "trace" / "rank-0.json.gz"]

    def steps(gpu):
        report = replay_traces(rank0, whatif=WhatIf(gpu=gpu), checks=False)
        assert all(s.replayed_s == pytest.approx(s.measured_s, rel=1e-6) for s in report.replay.steps)
        return [(s.measured_s, w.replayed_s) for s, w in zip(report.replay.steps, report.whatif.steps,
                                                               strict=True)]

    faster, slower = steps("h100-sxm"), steps("k80")
    assert all(whatif < 0.7 * measured for measured, whatif in faster)  # a V100 step on an H100
    assert all(whatif > 2 * measured for measured, whatif in slower)    # ... and on a K80


def test_writing_twice_is_byte_identical(simulated, sim_folder, tmp_path):
    write_rank_traces(simulated, tmp_path / "again")
    for f in sim_folder.iterdir():
        assert (tmp_path / "again" / f.name).read_bytes() == f.read_bytes()


# ---------------------------------------------------------------- replay

def test_replayed_folder_reads_back_as_the_replay(tmp_path):
    report = replay_traces(two_ranks(tmp_path), checks=False)
    replay_ranks.write_rank_traces(report, tmp_path / "out")
    written = sorted((tmp_path / "out").iterdir())
    assert [f.name for f in written] == ["rank-0.json.gz", "rank-1.json.gz"]
    assert [_hta_rank(f) for f in written] == [0, 1]
    replay_ranks.write_rank_traces(report, tmp_path / "twice")
    twice = sorted((tmp_path / "twice").iterdir())
    assert [f.read_bytes() for f in written] == [f.read_bytes() for f in twice]   # byte-identical
    again = replay_traces(written, checks=False)
    for a, b in zip(report.replay.steps, again.replay.steps, strict=True):
        assert (a.rank, a.step) == (b.rank, b.step) and b.replayed_s == pytest.approx(a.replayed_s, abs=1e-9)
    [t0, t1] = load_traces(written)
    coll = next(g for g in t1.gpu_events if g.kind == "collective")
    assert coll.collective.nbytes == 4096 and coll.collective.group_size == 2
    assert (coll.collective.channels, coll.collective.threads) == (2, 544)     # the launch shape: Simple
    assert coll.dur == pytest.approx(70e-6)
    copy = next(g for g in t0.gpu_events if g.kind == "memcpy")
    assert copy.nbytes == 4096 and copy.copy_kind == "D2H" and copy.pinned


def test_external_id_ties_a_launch_to_its_operator(tmp_path):
    b = TraceBuilder()
    b.step(1, 1, 0, 200)
    b.cpu_op(1, "aten::mm", 5, 30)
    b.launch(1, 10, 5, stream=7, gpu_ts=20, gpu_dur=100, name="gemm")
    report = replay_traces([b.write(tmp_path / "t.json")], checks=False)
    replay_ranks.write_rank_traces(report, tmp_path / "out")
    events = [e for e in _doc(tmp_path / "out" / "rank-0.json.gz")["traceEvents"] if e["ph"] == "X"]
    op = next(e for e in events if e["name"] == "aten::mm")
    call = next(e for e in events if e["cat"] == "cuda_runtime")
    kernel = next(e for e in events if e["cat"] == "kernel")
    assert op["args"]["External id"] == call["args"]["External id"] == kernel["args"]["External id"]
    assert call["args"]["correlation"] == kernel["args"]["correlation"]


def test_the_replayed_a100_trace_keeps_every_event(tmp_path, shared_file):
    trace = shared_file("traces", "kineto-a100-ddp2-rank0.json.gz")
    report = replay_traces([trace], checks=False)
    replay_ranks.write_rank_traces(report, tmp_path / "out")
    [measured] = load_traces([trace])
    [written] = load_traces([tmp_path / "out" / "rank-0.json.gz"])
    assert (written.base_time_ns, written.origin_us) == (measured.base_time_ns, measured.origin_us)
    assert len(written.cpu_events) == len(measured.cpu_events)
    key = lambda g: (g.correlation, g.stream, g.kind)  # noqa: E731
    for a, b in zip(sorted(measured.gpu_events, key=key), sorted(written.gpu_events, key=key), strict=True):
        assert key(a) == key(b) and abs(a.ts - b.ts) < 2e-9 and abs(a.dur - b.dur) < 2e-9


# ---------------------------------------------------------------- the folder and the CLI

def test_file_or_folder_by_the_name():
    assert is_single_file("t.json") and is_single_file("t.json.gz") and is_single_file("t.gz")
    assert not is_single_file("traces") and not is_single_file("run.d/hta")


def test_folder_is_replaced_whole(tmp_path):
    folder = tmp_path / "t"
    write_rank_folder(folder, {0: b"a", 1: b"b", 2: b"c"})
    write_rank_folder(folder, {0: b"x"})        # a smaller run leaves no stale ranks behind
    assert sorted(p.name for p in folder.iterdir()) == ["rank-0.json.gz"]
    assert [p.name for p in tmp_path.iterdir()] == ["t"]


def test_folder_with_other_files_or_a_file_in_the_way_is_refused(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(TrainsimError, match="not rank traces"):
        check_trace_output(tmp_path / "mine")
    (tmp_path / "taken").write_text("a file")
    with pytest.raises(TrainsimError, match="is a file"):
        check_trace_output(tmp_path / "taken")
    (tmp_path / "dir.json.gz").mkdir()
    with pytest.raises(TrainsimError, match="is a folder"):
        check_trace_output(tmp_path / "dir.json.gz")


def test_cli_simulate_and_replay_write_folders(tmp_path):
    sets = [a for s in SMALL_DDP for a in ("--set", s)]
    sim = runner.invoke(app, ["simulate", "ddp-resnet50-pcie-4gpu-gen3", *sets,
                              "--trace", str(tmp_path / "sim")])
    assert sim.exit_code == 0, sim.output
    assert sorted(p.name for p in (tmp_path / "sim").iterdir()) == [f"rank-{i}.json.gz" for i in range(4)]
    rep = runner.invoke(app, ["replay", *map(str, two_ranks(tmp_path)), "--trace", str(tmp_path / "rep")])
    assert rep.exit_code == 0, rep.output
    assert sorted(p.name for p in (tmp_path / "rep").iterdir()) == ["rank-0.json.gz", "rank-1.json.gz"]
    one = tmp_path / "one.json"
    single = runner.invoke(app, ["replay", *map(str, two_ranks(tmp_path)), "--trace", str(one)])
    assert single.exit_code == 0 and "traceEvents" in json.loads(one.read_text())


def test_cli_refuses_a_trace_folder_holding_other_files_before_the_run(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    mine = str(tmp_path / "mine")
    result = runner.invoke(app, ["simulate", "ddp-resnet50-pcie-4gpu-gen3", "--trace", mine])
    assert result.exit_code == 2 and "Traceback" not in result.output
    [line] = result.stderr.strip().splitlines()
    assert "--trace" in line and "not rank traces" in line
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]


def test_help_says_file_or_folder():
    for command in ("simulate", "replay"):
        text = " ".join(runner.invoke(app, [command, "--help"]).stdout.split())
        assert "folder of rank-N.json.gz" in text and ".json.gz" in text


def test_kernels_are_named_by_what_their_layer_computes_and_the_precision():
    """A profiler's kernel names say convolution or matrix multiply and the precision; ours do too, so a
    replay what-if rescales a linear layer by peak FLOP/s (its name says gemm) at the run's precision."""
    from trainsim.sim.core.devices import get_device
    from trainsim.sim.output.chrome_trace import compute_kernel_name
    from trainsim.sim.replay.whatif import compute_ratio

    result = api.simulate("single-gpu-resnet50", overrides=["batch_size=8", "iterations=1"], record=True)
    names = {compute_kernel_name(op, result.precision) for op in result.machine.ops if op.stream == "compute"}
    assert {"forward conv2d tf32: conv1", "backward gemm tf32: fc", "forward batchnorm: bn1",
            "forward relu: relu"} <= names

    class Kernel:
        kind, name, work = "kernel", "backward gemm tf32: fc", None

    a100, h100 = get_device("a100-40gb"), get_device("h100-sxm")
    assert compute_ratio(Kernel, a100, h100) == pytest.approx(a100.peak("tf32") / h100.peak("tf32"))
