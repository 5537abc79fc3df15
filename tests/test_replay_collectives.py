"""A collective as its launching call says: kind, size, element type and group from ``record_param_comms``,
``c10d::`` ops and ``nccl:`` annotations, the kernel's name only as a fallback; inferred sizes as bounded
ranges; re-timed collectives held between what the wires and the measured rate allow; the GPU-side step.

Expected values come from the small traces' own numbers and the models' public functions.
"""

import json

import pytest
from typer.testing import CliRunner

from trainsim.cli import app
from trainsim.formats.collectives import call_collective, collective_from_args, merge
from trainsim.formats.kineto import load_trace, load_traces
from trainsim.sim.collectives.ops import bus_factor
from trainsim.sim.replay.engine import replay
from trainsim.sim.replay.kineto_builder import TraceBuilder
from trainsim.sim.replay.nccl_split import NcclSplit
from trainsim.sim.replay.trace_graph import build_graph
from trainsim.sim.replay.whatif import WhatIf
from trainsim.topologies import load_topology
from trainsim.traces import replay_traces, whatif_model

MAIN, US = 1, 1e-6
A100 = "NVIDIA A100-SXM4-40GB"
SENDRECV = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"
ALLREDUCE = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
runner = CliRunner()


def allreduce_call(b: TraceBuilder, ts: float, gpu_ts: float, gpu_dur: float, nelems: int, *,
                   kernel: str = SENDRECV, rank_args: bool = False) -> None:
    """An all-reduce as PyTorch records it without kernel args: c10d::allreduce_ > record_param_comms >
    nccl:all_reduce (with the flattened bucket's shape) > cudaLaunchKernel of an NCCL kernel."""
    b.cpu_op(MAIN, "c10d::allreduce_", ts, 40, **{"Input Dims": [[], [], [], []],
                                                  "Input type": ["TensorList", "", "", "Scalar"]})
    b.cpu_op(MAIN, "record_param_comms", ts + 2, 36, **{"Input Dims": [[], [], []],
                                                        "Input type": ["TensorList", "Scalar", ""]})
    b.annotation(MAIN, "nccl:all_reduce", ts + 4, 30, **{"Input Dims": [[nelems]], "Input type": ["float"]})
    b.launch(MAIN, ts + 10, 5, stream=9, gpu_ts=gpu_ts, gpu_dur=gpu_dur, name=kernel, block=[640, 1, 1])


def one_graph(b: TraceBuilder, path):
    return build_graph(load_trace(b.write(path), single_file=False))


# ---------------------------------------------------------------- reading the call

def test_calls_say_kind_size_and_group():
    ar = call_collective("nccl:all_reduce", {"Input Dims": [[19618307]], "Input type": ["float"]})
    assert (ar.op, ar.nelems, ar.nbytes, ar.kind_from, ar.size_from) == (
        "allreduce", 19618307, 4 * 19618307, "call", "call")
    gather = call_collective("c10d::_allgather_base_", {"Input Dims": [[1073741824], [16777216], []],
                                                        "Input type": ["signed char", "signed char", ""]})
    assert (gather.op, gather.nelems, gather.out_nelems, gather.group_size) == (
        "allgatherbase", 16777216, 1073741824, 64)            # the output gathers 64 inputs
    assert gather.array_bytes == 1073741824
    a2a = call_collective("nccl:all_to_all", {"Input Dims": [[2, 1024, 34820]], "Input type": ["float"]})
    assert a2a.op == "alltoall" and a2a.nelems == 2 * 1024 * 34820
    assert call_collective("c10d::allreduce_", {"Input Dims": [[], []], "Input type": ["TensorList", ""]}
                           ).nelems is None                  # a tensor list has no recorded shape
    assert call_collective("c10d::wait", {}) is None          # not a collective
    assert call_collective("aten::add", {}) is None


def test_merge_prefers_kernel_args_then_the_innermost_call_then_the_name():
    kernel = collective_from_args({"grid": [16, 1, 1], "block": [640, 1, 1]}, SENDRECV)
    assert (kernel.op, kernel.kind_from, kernel.kernel_op) == ("sendrecv", "kernel name", "sendrecv")
    inner = call_collective("nccl:all_reduce", {"Input Dims": [[100]], "Input type": ["float"]})
    outer = call_collective("c10d::allreduce_", {})
    merged = merge(kernel, (inner, outer))
    assert (merged.op, merged.nelems, merged.dtype, merged.threads, merged.kind_from, merged.kernel_op) == (
        "allreduce", 100, "float", 640, "call", "sendrecv")
    args = collective_from_args({"Collective name": "broadcast", "In msg nelems": 7, "dtype": "Float"},
                                SENDRECV)
    assert merge(args, (inner,)).op == "broadcast" and merge(args, (inner,)).nelems == 7


def test_sendrecv_kernel_launched_by_an_allreduce_is_one(tmp_path):
    """NCCL ran the all-reduce in a kernel named SendRecv: its call says all-reduce, 32 MiB of floats; the
    algorithm and protocol in the kernel's name are not the all-reduce's."""
    b = TraceBuilder(world_size=2, device_name=A100)
    allreduce_call(b, 0, 60, 3000, 8 * 2**20)
    g = one_graph(b, tmp_path / "t.json")
    (op,) = [o for o in g.ops if o.kind == "collective"]
    assert (op.collective.op, op.collective.nbytes, op.collective.kernel_op) == ("allreduce", 32 * 2**20,
                                                                                 "sendrecv")
    m = NcclSplit([g], load_topology("dgx-a100")).member(0, op)
    assert (m.op, m.ranks, m.algo, m.proto) == ("allreduce", (0, 1), "auto", "auto")


def test_compression_cuts_an_allreduce_in_a_sendrecv_kernel_and_says_why(tmp_path):
    b = TraceBuilder(world_size=2, device_name=A100)
    b.step(1, MAIN, 0, 4000)
    allreduce_call(b, 10, 60, 3000, 8 * 2**20)
    b.runtime(MAIN, "cudaStreamSynchronize", 70, 2995)            # returns 5 us after the kernel
    out = runner.invoke(app, ["replay", str(b.write(tmp_path / "t.json")), "--set", "compression=fp16",
                              "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    step = doc["whatif"]["steps"][0]
    assert step["predicted_s"] < 0.65 * step["measured_s"]
    notes = " ".join(doc["whatif"]["notes"])
    assert "named sendrecv ran allreduce" in notes
    assert doc["whatif"]["nccl"]["guessed"] == []                 # kind, size and group (world of 2) given


def test_kernel_without_a_call_is_named_in_a_note(tmp_path):
    b = TraceBuilder(world_size=2, device_name=A100)
    b.step(1, MAIN, 0, 4000)
    b.launch(MAIN, 10, 5, stream=9, gpu_ts=20, gpu_dur=3000, name=ALLREDUCE)
    report = replay_traces([b.write(tmp_path / "t.json")], whatif=WhatIf(compression="fp16"), checks=False)
    (row,) = report.nccl["guessed"]
    assert (row["kind_from"], row["collective"]) == ("kernel name", "allreduce")
    assert row["size"].startswith("inferred from the model of dgx-a100")
    assert row["bytes_low"] <= row["bytes_high"]
    assert any("read from the kernel name only" in n and "rank 0 step 1" in n for n in report.notes)


# ---------------------------------------------------------------- sizes as bounded ranges

def test_inferred_size_is_bounded_by_the_traces_measured_rate(tmp_path):
    """An all-reduce without a size beside a sized all-gather moving 2 GB/s of bus bandwidth: the inferred
    size is at most what its time moves at that rate, far below what dgx-a100's model would allow."""
    b = TraceBuilder(world_size=2, device_name=A100)
    b.launch(MAIN, 0, 5, stream=9, gpu_ts=10, gpu_dur=4000,
             name="ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
             **{"Collective name": "allgather", "In msg nelems": 2_000_000, "Out msg nelems": 4_000_000,
                "dtype": "Float", "Group size": 2})
    b.launch(MAIN, 5000, 5, stream=9, gpu_ts=5010, gpu_dur=3000, name=ALLREDUCE, block=[544, 1, 1])
    g = one_graph(b, tmp_path / "t.json")
    split = NcclSplit([g], load_topology("dgx-a100"))
    gather, unsized = sorted((o for o in g.ops if o.kind == "collective"), key=lambda o: o.event.ts)
    busbw = split.rates[split.member(0, gather).key] * bus_factor("allgather", 2)
    part = split.split(0, unsized)
    assert part.size_source == "inferred from the trace's rates"
    high = (3000 * US - part.latency_s) * busbw / bus_factor("allreduce", 2)
    assert part.nbytes == pytest.approx(high) and part.size_range[1] == pytest.approx(high)
    assert 0 <= part.size_range[0] <= high


def test_whatif_answer_carries_the_range_of_inferred_sizes(tmp_path):
    b = TraceBuilder(world_size=2, device_name=A100)
    b.step(1, MAIN, 0, 3100)
    b.launch(MAIN, 10, 5, stream=9, gpu_ts=20, gpu_dur=3000, name=ALLREDUCE, block=[544, 1, 1])
    b.runtime(MAIN, "cudaStreamSynchronize", 16, 3009)
    out = runner.invoke(app, ["replay", str(b.write(tmp_path / "t.json")), "--set", "compression=fp16",
                              "--json"])
    assert out.exit_code == 0, out.output
    step = json.loads(out.stdout)["whatif"]["steps"][0]
    assert step["predicted_low_s"] <= step["predicted_s"] <= step["predicted_high_s"]
    assert step["predicted_low_s"] < step["predicted_high_s"] <= step["measured_s"]
    text = runner.invoke(app, ["replay", str(tmp_path / "t.json"), "--set", "compression=fp16"]).output
    assert "range ms" in text


def test_retimed_collectives_stay_between_the_wires_and_their_measured_rate(tmp_path):
    """A 64 MiB all-reduce measured in 100 us beat dgx-a100's wires (so the machine's were that much faster
    than its description); re-timed on a PCIe machine by the models' ratio it would beat that machine's wires
    even so: it is held to their floor. One measured slow stays under its own rate, slowed only as much as
    the PCIe wires are slower."""
    nelems = 16 * 2**20
    b = TraceBuilder(world_size=2, device_name=A100)
    b.launch(MAIN, 0, 5, stream=9, gpu_ts=10, gpu_dur=100, name=ALLREDUCE,
             **{"Collective name": "allreduce", "In msg nelems": nelems, "dtype": "Float", "Group size": 2})
    b.launch(MAIN, 1000, 5, stream=9, gpu_ts=1010, gpu_dur=90_000, name=ALLREDUCE,
             **{"Collective name": "allreduce", "In msg nelems": nelems, "dtype": "Float", "Group size": 2})
    g = one_graph(b, tmp_path / "t.json")
    model = whatif_model([g], WhatIf(topology="pcie-4gpu-gen3", ran_on="dgx-a100"))
    replay([g], op_time=model)
    fast, slow = (model.retimed[(0, o.index)] for o in sorted(g.ops, key=lambda o: o.event.ts))
    m = model.nccl.member(0, g.ops[0])
    wires, home = model.wire_busbw(model.topology, m), model.wire_busbw(model.home, m)
    beat = 64 * 2**20 * bus_factor("allreduce", 2) / model.nccl.split(0, g.ops[0]).transfer_s / home
    assert beat > 1                  # the measurement beat dgx-a100's wires: theirs count that much faster
    floor = 64 * 2**20 * bus_factor("allreduce", 2) / wires / beat
    assert fast["held"] and fast["new_s"] == pytest.approx(floor)
    for row in (fast, slow):
        assert row["floor_s"] <= row["new_s"] * (1 + 1e-9) and row["new_s"] <= row["ceiling_s"] * (1 + 1e-9)


# ---------------------------------------------------------------- ranks that do not line up; the GPU step

def test_ranks_whose_collectives_do_not_line_up_are_not_joined(tmp_path):
    """Sampled traces: rank 0 runs all-reduce then all-to-all, rank 1 the other way round on the same
    stream. Joining them by kind would deadlock; each keeps its peers as measured instead."""
    paths = []
    for rank, order in ((0, ("all_reduce", "all_to_all")), (1, ("all_to_all", "all_reduce"))):
        b = TraceBuilder(rank=rank, world_size=2, device_name=A100)
        b.step(1, MAIN, 0, 5000)
        for k, name in enumerate(order):
            ts = 100 + 2000 * k
            b.annotation(MAIN, f"nccl:{name}", ts, 30, **{"Input Dims": [[2**20]], "Input type": ["float"]})
            b.launch(MAIN, ts + 5, 5, stream=9, gpu_ts=ts + 20, gpu_dur=1500, name=SENDRECV)
        paths.append(b.write(tmp_path / f"rank{rank}.json"))
    graphs = [build_graph(t) for t in load_traces(paths)]
    model = whatif_model(graphs, WhatIf(compression="fp16"))
    result = replay(graphs, op_time=model)
    assert len(result.steps) == 2 and model.unjoined
    assert any("do not line up" in n for n in model.notes())


def test_gpu_step_beside_the_cpu_step(tmp_path):
    """The step's GPU work runs from 20 us to 4020 us, past the CPU-side ProfilerStep's end at 1000 us."""
    b = TraceBuilder(device_name=A100)
    b.step(1, MAIN, 0, 1000)
    b.launch(MAIN, 10, 5, stream=7, gpu_ts=20, gpu_dur=2000, name="k1")
    b.launch(MAIN, 20, 5, stream=7, gpu_ts=2020, gpu_dur=2000, name="k2")
    path = b.write(tmp_path / "t.json")
    out = runner.invoke(app, ["replay", str(path), "--gpu", "h100-sxm", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["steps"][0]["measured_s"] == pytest.approx(1000 * US)
    assert doc["steps"][0]["gpu_measured_s"] == pytest.approx(4000 * US)
    assert doc["whatif"]["steps"][0]["gpu_predicted_s"] < 4000 * US
    assert "GPU step ms" in runner.invoke(app, ["replay", str(path)]).output


# ---------------------------------------------------------------- the real 128-rank trace

def test_real_sendrecv_allreduces_compress_by_their_call(shared_file):
    """Ranks 0 and 1 of a 128-rank A100 job run every collective in SendRecv kernels; the all-reduces' calls
    give their sizes (23 to 108 MB of floats): fp16 compression cuts their own time 35-65 %."""
    paths = [shared_file("traces", f"a100-128rank-sampled-rank{r}.json.gz") for r in (0, 1)]
    graphs = [build_graph(t) for t in load_traces(paths)]
    model = whatif_model(graphs, WhatIf(compression="fp16", ran_on="dgx-a100"))
    replay(graphs, op_time=model)
    cuts = []
    for (rank, index), row in model.retimed.items():
        op = model.graphs_by_rank[rank].ops[index]
        m, split = model.nccl.member(rank, op), model.nccl.split(rank, op)
        if m.op == "allreduce" and split.nbytes >= 16e6:
            assert op.name.startswith("ncclKernel_SendRecv")
            cuts.append((row["new_s"] + row["casts_s"]) / split.core_s - 1)
    assert len(cuts) == 8 and all(-0.65 <= c <= -0.35 for c in cuts)
