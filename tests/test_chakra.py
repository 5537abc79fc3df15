"""Chakra execution traces (ET) in and out: the vendored schema and its framing, the exact round trip
trainsim -> ET -> trainsim (same graph, same times), ETs from elsewhere, simulate --chakra, a PyTorch
execution trace linked to its Kineto trace (recorded with torch on the CPU here), and bad input."""

import gzip
import json

import pytest
from typer.testing import CliRunner

from trainsim.cli import app
from trainsim.errors import TrainsimError
from trainsim.formats import chakra, pytorch_et
from trainsim.sim.replay import chakra_graph
from trainsim.sim.replay.kineto_builder import TraceBuilder
from trainsim.sim.replay.whatif import WhatIf
from trainsim.traces import replay_traces

MAIN, WORKER = 1, 2
A100 = "NVIDIA A100-SXM4-40GB"
NCCL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
runner = CliRunner()


def two_rank_job(tmp_path) -> list:
    """Two ranks: GEMMs on stream 7 from two threads, a copy, and an all-reduce on stream 9 after an event
    wait; rank 1 is 300 us late."""
    paths = []
    for rank in (0, 1):
        b = TraceBuilder(rank=rank, world_size=2, device_name=A100)
        for step in (1, 2):
            t = 10_000 * (step - 1)
            late = 300 * rank
            b.step(step, MAIN, t, 6000 + late)
            b.cpu_op(MAIN, "aten::mm", t + 5, 30, **{"Input Dims": [[1024, 1024], [1024, 1024]],
                                                     "Input type": ["float", "float"]})
            b.launch(MAIN, t + 10, 5, stream=7, gpu_ts=t + 20, gpu_dur=1000 + late,
                     name="ampere_sgemm_128x64_nn")
            b.launch(WORKER, t + 30, 5, stream=7, gpu_ts=t + 1021 + late, gpu_dur=800,
                     name="ampere_sgemm_64x64_nn")
            b.launch(MAIN, t + 40, 5, stream=20, gpu_ts=t + 50, gpu_dur=200,
                     name="Memcpy HtoD (Pinned -> Device)", kind="gpu_memcpy", bytes=2**22)
            b.runtime(MAIN, "cudaEventRecord", t + 50, 2)
            b.runtime(MAIN, "cudaStreamWaitEvent", t + 53, 2)
            b.launch(MAIN, t + 60, 5, stream=9, gpu_ts=t + 1830 + late, gpu_dur=3000 - late, name=NCCL,
                     **{"Collective name": "allreduce", "In msg nelems": 2**22, "dtype": "Float",
                        "Group size": 2, "Process Group Name": "0", "Process Group Ranks": "[0, 1]"})
            b.runtime(MAIN, "cudaDeviceSynchronize", t + 70, 4770)
        paths.append(b.write(tmp_path / f"rank{rank}.json"))
    return paths


def same_graph(a, b) -> None:
    """The same nodes, edges and parameters (times as the replay gave them, to the float's rounding)."""
    assert set(a.to_networkx().edges) == set(b.to_networkx().edges)

    def ops(g):
        return [(o.kind, o.name, o.stream_key, o.launch, o.stream_prev, o.deps, o.step, o.collective)
                for o in g.ops]

    def points(g):
        return [(p.thread, p.label, p.name, [o for o, _ in p.gpu_waits], [q for q, _ in p.cpu_waits])
                for p in g.points]

    def numbers(g):
        return ([x for o in g.ops for x in (o.event.dur, o.launch_latency, o.queue_gap)]
                + [x for p in g.points
                   for x in (p.own, *(s for _, s in p.gpu_waits), *(s for _, s in p.cpu_waits))])

    assert ops(a) == ops(b) and points(a) == points(b)
    assert numbers(b) == pytest.approx(numbers(a), abs=1e-12)
    assert [(s.number, s.start, s.end) for s in a.steps] == [(s.number, s.start, s.end) for s in b.steps]


# ---------------------------------------------------------------- the schema

def test_vendored_schema_builds_and_frames_messages_as_chakra(tmp_path):
    s = chakra.schema()
    assert s.node_types["COMM_COLL_NODE"] == 7 and s.comm_types["ALL_REDUCE"] == 0
    node = s.Node(id=3, name="k", type=s.node_types["COMP_NODE"], duration_micros=12)
    node.data_deps.extend([1, 2])
    chakra.add_attr(node, "is_cpu_op", False)
    chakra.add_attr(node, "tensor_size", 2**40, "uint64_val")
    data = chakra.encode_et(s.GlobalMetadata(version="0.0.4"), [node])
    meta_len = len(s.GlobalMetadata(version="0.0.4").SerializeToString())
    assert data[0] == meta_len and data[1 + meta_len] == len(node.SerializeToString())   # varint lengths
    (tmp_path / "x.0.et").write_bytes(data)
    (tmp_path / "x.1.et.gz").write_bytes(gzip.compress(data))
    for name in ("x.0.et", "x.1.et.gz"):
        f = chakra.read_et(tmp_path / name)
        assert f.version == "0.0.4" and list(f.nodes[0].data_deps) == [1, 2]
        assert chakra.attrs(f.nodes[0]) == {"is_cpu_op": False, "tensor_size": 2**40}


# ---------------------------------------------------------------- round trip

def test_round_trip_gives_the_same_graph_and_times(tmp_path):
    report = replay_traces(two_rank_job(tmp_path), checks=False)
    chakra_graph.write_replay_et(report, tmp_path / "et")
    assert sorted(p.name for p in (tmp_path / "et").iterdir()) == ["trainsim.0.et", "trainsim.1.et"]
    back = replay_traces([tmp_path / "et"], checks=False)
    for a, b in zip(report.replay.ranks, back.replay.ranks, strict=True):
        same_graph(a.graph, b.graph)
        assert b.op_start == a.op_start and b.op_end == a.op_end and b.point_time == a.point_time
    assert [s.replayed_s for s in back.replay.steps] == [s.replayed_s for s in report.replay.steps]
    # the ranks still join their all-reduce: a faster GPU moves both as before
    again = replay_traces([tmp_path / "et"], whatif=WhatIf(gpu="h100-sxm"), checks=False)
    first = replay_traces(two_rank_job(tmp_path), whatif=WhatIf(gpu="h100-sxm"), checks=False)
    assert [s.replayed_s for s in again.whatif.steps] == pytest.approx(
        [s.replayed_s for s in first.whatif.steps])


def test_a_whatif_exported_reads_back_as_that_whatif(tmp_path):
    report = replay_traces(two_rank_job(tmp_path), whatif=WhatIf(compression="fp16"), checks=False)
    chakra_graph.write_replay_et(report, tmp_path / "et")
    back = replay_traces([tmp_path / "et"], checks=False)
    assert [s.replayed_s for s in back.replay.steps] == pytest.approx(
        [s.replayed_s for s in report.whatif.steps], abs=1e-12)
    f = chakra.read_et(tmp_path / "et" / "trainsim.0.et")
    colls = [n for n in f.nodes if n.type == chakra.schema().node_types["COMM_COLL_NODE"]]
    assert {chakra.attrs(n)["comm_size"] for n in colls} == {2**24 // 2}     # the compressed messages


def test_chakra_fields_describe_the_run(tmp_path):
    report = replay_traces(two_rank_job(tmp_path), checks=False)
    meta, nodes = chakra_graph.rank_et(report.replay.ranks[0], world_size=2)
    ids = {n.id for n in nodes}
    assert all(d in ids for n in nodes for d in n.data_deps)
    colls = [n for n in nodes if n.type == 7]
    assert len(colls) == 2 and all(chakra.attrs(n)["comm_type"] == 0 and chakra.attrs(n)["comm_size"] == 2**24
                                   and chakra.attrs(n)["pg_name"] == "0" for n in colls)
    gemm = next(n for n in nodes if n.name == "ampere_sgemm_128x64_nn")
    assert chakra.attrs(gemm)["is_cpu_op"] is False and chakra.attrs(gemm)["num_ops"] == 2 * 1024**3
    assert gemm.duration_micros == 1000
    assert chakra.attrs(meta)["world_size"] == 2


# ---------------------------------------------------------------- ETs from elsewhere

def foreign_et(path, rank: int, *, dur_us: int = 3000, size: int = 2**26) -> None:
    """An ET as Chakra's examples write one: a compute node then an all-reduce, no times, no trainsim."""
    s = chakra.schema()
    comp = s.Node(id=1, name="gemm", type=s.node_types["COMP_NODE"], duration_micros=1000)
    chakra.add_attr(comp, "is_cpu_op", False)
    chakra.add_attr(comp, "num_ops", 10**9)
    coll = s.Node(id=2, name="allreduce", type=s.node_types["COMM_COLL_NODE"], duration_micros=dur_us)
    coll.data_deps.append(1)
    coll.inputs.types = "['Tensor(float)']"
    chakra.add_attr(coll, "is_cpu_op", False)
    chakra.add_attr(coll, "comm_type", s.comm_types["ALL_REDUCE"])
    chakra.add_attr(coll, "comm_size", size)
    path.write_bytes(chakra.encode_et(s.GlobalMetadata(version="0.0.4"), [comp, coll]))


def test_an_et_from_elsewhere_replays_and_answers_whatifs(tmp_path):
    for rank in (0, 1):
        foreign_et(tmp_path / f"job.{rank}.et", rank)
    report = replay_traces([tmp_path / "job.0.et", tmp_path / "job.1.et"],
                           whatif=WhatIf(compression="fp16", ran_on="dgx-a100"), checks=False)
    assert [s.measured_s for s in report.replay.steps] == pytest.approx([4000e-6, 4000e-6])
    assert [s.replayed_s for s in report.replay.steps] == pytest.approx([4000e-6, 4000e-6])
    cut = [s.replayed_s for s in report.whatif.steps]
    assert all(2400e-6 < c < 2700e-6 for c in cut)                # half the all-reduce's transfer, casts


def test_our_et_without_its_trainsim_attributes_still_replays_as_measured(tmp_path):
    report = replay_traces(two_rank_job(tmp_path), checks=False)
    chakra_graph.write_replay_et(report, tmp_path / "et")
    for rank in (0, 1):
        f = chakra.read_et(tmp_path / "et" / f"trainsim.{rank}.et")
        for m in [f.metadata, *f.nodes]:
            keep = [a for a in m.attr if a.name != "trainsim"]
            del m.attr[:]
            m.attr.extend(keep)
        (tmp_path / f"plain.{rank}.et").write_bytes(chakra.encode_et(f.metadata, f.nodes))
    back = replay_traces([tmp_path / "plain.0.et", tmp_path / "plain.1.et"], checks=False)
    assert [s.step for s in back.replay.steps] == [1, 2, 1, 2]
    for a, b in zip(report.replay.steps, back.replay.steps, strict=True):
        assert b.replayed_s == pytest.approx(a.replayed_s, abs=2e-6)    # whole microseconds


def test_simulate_writes_chakra_that_replays_the_simulated_steps(tmp_path):
    from trainsim import api

    out = tmp_path / "et"
    result = runner.invoke(app, ["simulate", "ddp-resnet50-dgx-a100", "--set", "workload=tiny-cnn",
                                 "--set", "batch_size=64", "--set", "iterations=3", "--chakra", str(out)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == [f"trainsim.{r}.et" for r in range(8)]
    sim = api.simulate("ddp-resnet50-dgx-a100",
                       overrides=["workload=tiny-cnn", "batch_size=64", "iterations=3"])
    back = replay_traces([out / "trainsim.0.et"], checks=False)
    # to the Kineto trace's resolution: a GPU event inside one microsecond moves by under half of one
    assert [s.replayed_s for s in back.replay.steps] == pytest.approx(sim.iteration_times_s, abs=5e-7)


@pytest.mark.slow
def test_real_trace_round_trip(tmp_path, shared_file):
    trace = shared_file("traces", "kineto-a100-ddp2-rank0.json.gz")
    report = replay_traces([trace], checks=False)
    chakra_graph.write_replay_et(report, tmp_path / "et")
    back = replay_traces([tmp_path / "et"], checks=False)
    same_graph(report.replay.ranks[0].graph, back.replay.ranks[0].graph)
    assert back.replay.ranks[0].op_end == report.replay.ranks[0].op_end


# ---------------------------------------------------------------- PyTorch execution trace + Kineto

@pytest.mark.slow
def test_a_real_execution_trace_links_to_its_kineto_trace(tmp_path):
    """Two training steps of a tiny MLP on the CPU, recorded by torch.profiler with an ExecutionTraceObserver:
    every top-level operator links to its Kineto operator by record-function id; the steps replay as measured
    and go out as Chakra and back."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, schedule

    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 32), torch.randint(0, 8, (16,))
    et = ExecutionTraceObserver().register_callback(str(tmp_path / "host_et.json"))
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=2),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(tmp_path / "kineto.json")),
                 execution_trace_observer=et, record_shapes=True) as prof:
        for _ in range(3):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
    et.unregister_callback()
    assert pytorch_et.is_pytorch_et(tmp_path / "host_et.json")
    linked = pytorch_et.link(tmp_path / "host_et.json", tmp_path / "kineto.json")
    assert linked.unlinked == 0 and linked.linked >= 10
    assert any(n.deps for n in linked.nodes if n.cpu)             # data dependencies through tensors
    kineto = json.loads((tmp_path / "kineto.json").read_text())
    steps = sorted(e["dur"] * 1e-6 for e in kineto["traceEvents"]
                   if e.get("name", "").startswith("ProfilerStep#"))
    report = replay_traces([tmp_path / "host_et.json", tmp_path / "kineto.json"], checks=False)
    assert sorted(s.measured_s for s in report.replay.steps) == pytest.approx(steps)
    assert [s.replayed_s for s in report.replay.steps] == pytest.approx(
        [s.measured_s for s in report.replay.steps])
    chakra_graph.write_replay_et(report, tmp_path / "et")
    back = replay_traces([tmp_path / "et"], checks=False)
    same_graph(report.replay.ranks[0].graph, back.replay.ranks[0].graph)


# ---------------------------------------------------------------- bad input

def small_et_pair(tmp_path, *, kineto_names=("aten::mm", "aten::add"), pid=42):
    nodes = [{"id": 1, "name": "[pytorch|profiler|execution_trace|process]", "ctrl_deps": 1, "attrs": []},
             {"id": 2, "name": "[pytorch|profiler|execution_trace|thread]", "ctrl_deps": 1, "attrs": []},
             {"id": 3, "name": "aten::mm", "ctrl_deps": 2, "attrs": [{"name": "rf_id", "value": 10}]},
             {"id": 4, "name": "aten::add", "ctrl_deps": 2, "attrs": [{"name": "rf_id", "value": 11}]}]
    doc = {"schema": "1.1.1-chakra.0.0.4", "pid": 42, "nodes": nodes}
    (tmp_path / "host_et.json").write_text(json.dumps(doc))
    events = [{"ph": "X", "cat": "cpu_op", "name": name, "pid": pid, "tid": pid, "ts": 100.0 + 50 * i,
               "dur": 40.0, "args": {"Record function id": 10 + i}} for i, name in enumerate(kineto_names)]
    (tmp_path / "kineto.json").write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return tmp_path / "host_et.json", tmp_path / "kineto.json"


def run_refused(args, tmp_path, expected: str):
    outs = [tmp_path / "out-et", tmp_path / "out-trace"]
    result = runner.invoke(app, ["replay", *map(str, args), "--chakra", str(outs[0]),
                                 "--trace", str(outs[1])])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and expected in lines[0], result.output
    assert not any(p.exists() for p in outs)                       # nothing written
    return lines[0]


def test_a_small_pair_links(tmp_path):
    et, kineto = small_et_pair(tmp_path)
    linked = pytorch_et.link(et, kineto)
    assert [n.name for n in linked.nodes] == ["aten::mm", "aten::add"]
    assert [x for n in linked.nodes for x in (n.start, n.dur)] == pytest.approx([0.0, 40e-6, 50e-6, 40e-6])


def test_chakra_file_of_another_schema_version(tmp_path):
    s = chakra.schema()
    node = s.Node(id=1, name="x", type=4, duration_micros=1)
    (tmp_path / "old.0.et").write_bytes(chakra.encode_et(s.GlobalMetadata(version="0.0.3"), [node]))
    line = run_refused([tmp_path / "old.0.et"], tmp_path, "old.0.et")
    assert "another schema" in line and "0.0.3" in line


@pytest.mark.parametrize("content", [b"\x05\x01\x02", b'{"traceEvents": []}', b"\xff" * 11, b"\x02\xff\xff"],
                         ids=["truncated", "json", "varint", "garbage"])
def test_protobuf_that_does_not_parse(tmp_path, content):
    (tmp_path / "bad.0.et").write_bytes(content)
    line = run_refused([tmp_path / "bad.0.et"], tmp_path, "bad.0.et")
    assert "not a Chakra execution trace" in line or "another schema" in line


def test_execution_trace_without_its_kineto_partner(tmp_path):
    et, _ = small_et_pair(tmp_path)
    line = run_refused([et], tmp_path, "host_et.json")
    assert "give its Kineto trace" in line


@pytest.mark.parametrize("how", ["names", "pid"])
def test_execution_and_kineto_traces_of_different_runs(tmp_path, how):
    kw = {"kineto_names": ("aten::relu", "aten::add")} if how == "names" else {"pid": 7}
    et, kineto = small_et_pair(tmp_path, **kw)
    line = run_refused([et, kineto], tmp_path, "host_et.json")
    assert "different runs" in line


def test_chakra_output_folder_with_other_files_is_refused_before_work(tmp_path):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    paths = two_rank_job(tmp_path)
    result = runner.invoke(app, ["replay", *map(str, paths), "--chakra", str(tmp_path / "busy")])
    assert result.exit_code == 2 and "not Chakra traces" in result.output
    with pytest.raises(TrainsimError, match="no such file"):
        chakra.read_et(tmp_path / "missing.0.et")


def test_protoc_generated_classes_read_our_files_byte_for_byte(tmp_path):
    """Where grpcio-tools is installed: classes protoc generates from the vendored et_def.proto, as Chakra's
    own tools use them, decode our files and encode them again to the same bytes."""
    grpc_tools = pytest.importorskip("grpc_tools")
    import importlib.util
    from importlib import resources

    from grpc_tools import protoc

    proto = resources.files("trainsim.third_party.chakra") / "et_def.proto"
    args = ["protoc", f"-I{proto.parent}", f"--python_out={tmp_path}", str(proto)]
    assert protoc.main(args) == 0, grpc_tools
    spec = importlib.util.spec_from_file_location("et_def_pb2", tmp_path / "et_def_pb2.py")
    pb = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pb)
    report = replay_traces(two_rank_job(tmp_path), checks=False)
    meta, nodes = chakra_graph.rank_et(report.replay.ranks[0], world_size=2)
    data = chakra.encode_et(meta, nodes)
    theirs = [pb.GlobalMetadata.FromString(meta.SerializeToString())]
    theirs += [pb.Node.FromString(n.SerializeToString()) for n in nodes]
    assert theirs[0].version == "0.0.4" and sum(n.type == pb.COMM_COLL_NODE for n in theirs[1:]) == 2
    assert chakra.encode_et(theirs[0], theirs[1:]) == data
