"""The replay graph: launches, stream order, event waits, synchronisations, thread hand-offs, steps."""


import pytest

from trainsim.formats.kineto import load_trace
from trainsim.sim.replay.kineto_builder import PID, TraceBuilder
from trainsim.sim.replay.trace_graph import build_graph

MAIN, WORKER = 1, 2


def graph_of(builder: TraceBuilder, tmp_path, **kw):
    return build_graph(load_trace(builder.write(tmp_path / "t.json")), **kw)


def op_named(g, name):
    return next(o for o in g.ops if o.name == name)


def test_launches_streams_and_launch_latency(tmp_path):
    b = TraceBuilder()
    b.step(1, MAIN, 0, 200)
    b.launch(MAIN, 10, 5, stream=7, gpu_ts=20, gpu_dur=100, name="k1")     # launch-bound: 10 us latency
    b.launch(MAIN, 30, 5, stream=7, gpu_ts=121, gpu_dur=10, name="k2")     # queued behind k1: 1 us gap
    g = graph_of(b, tmp_path)
    k1, k2 = op_named(g, "k1"), op_named(g, "k2")
    assert g.points[k1.launch].name == "cudaLaunchKernel" and g.points[k1.launch].t == pytest.approx(10e-6)
    assert g.streams[(0, 7)] == [k1.index, k2.index] and k2.stream_prev == k1.index
    assert k1.launch_latency == pytest.approx(10e-6)
    assert k2.queue_gap == pytest.approx(1e-6)
    assert k2.launch_latency == pytest.approx(10e-6)      # the typical latency, not its 91 us of queueing


def test_launch_found_through_ac2g_flow_without_correlation_args(tmp_path):
    b = TraceBuilder(correlation_args=False)
    b.launch(MAIN, 10, 5, stream=7, gpu_ts=20, gpu_dur=100, name="k1")
    g = graph_of(b, tmp_path)
    assert g.ops[0].launch is not None and g.stats["gpu_ops_launched"] == 1


def test_stream_wait_event_is_inferred(tmp_path):
    b = TraceBuilder()
    b.launch(MAIN, 10, 5, stream=7, gpu_ts=20, gpu_dur=100, name="producer")
    b.runtime(MAIN, "cudaEventRecord", 16, 2)
    b.runtime(MAIN, "cudaStreamWaitEvent", 20, 2)
    b.launch(MAIN, 25, 5, stream=8, gpu_ts=121, gpu_dur=30, name="consumer")
    g = graph_of(b, tmp_path)
    assert op_named(g, "consumer").deps == [op_named(g, "producer").index]
    assert g.stats["event_waits_inferred"] == 1


def test_stream_wait_event_from_cuda_sync_events(tmp_path):
    """Traces with enable_cuda_sync_events say which stream waits for which record: no guessing."""
    b = TraceBuilder()
    b.launch(MAIN, 10, 5, stream=7, gpu_ts=20, gpu_dur=100, name="producer")
    b.launch(MAIN, 12, 2, stream=9, gpu_ts=20, gpu_dur=5, name="other stream, launched later")
    record = b.runtime(MAIN, "cudaEventRecord", 16, 2)
    wait = b.runtime(MAIN, "cudaStreamWaitEvent", 20, 2)
    b.events.append({"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0, "tid": 8, "ts": 21,
                     "dur": 0, "args": {"cuda_sync_kind": "Stream Wait Event", "stream": 8, "device": 0,
                                        "correlation": wait, "wait_on_stream": 7,
                                        "wait_on_cuda_event_record_corr_id": record}})
    b.launch(MAIN, 25, 5, stream=8, gpu_ts=121, gpu_dur=30, name="consumer")
    g = graph_of(b, tmp_path)
    assert op_named(g, "consumer").deps == [op_named(g, "producer").index]
    assert g.stats["event_waits_exact"] == 1


def test_inferred_wait_contradicting_the_measurement_is_dropped(tmp_path):
    b = TraceBuilder()
    b.launch(MAIN, 10, 5, stream=7, gpu_ts=20, gpu_dur=100, name="long")
    b.runtime(MAIN, "cudaEventRecord", 16, 2)
    b.runtime(MAIN, "cudaStreamWaitEvent", 20, 2)
    b.launch(MAIN, 25, 5, stream=8, gpu_ts=40, gpu_dur=30, name="ran while long was running")
    g = graph_of(b, tmp_path)
    assert all(not o.deps for o in g.ops)
    assert g.stats["event_waits_dropped_inconsistent"] == 1


def test_device_synchronize_waits_for_every_stream(tmp_path):
    b = TraceBuilder()
    b.launch(MAIN, 10, 5, stream=7, gpu_ts=20, gpu_dur=100, name="a")
    b.launch(MAIN, 20, 5, stream=8, gpu_ts=30, gpu_dur=50, name="b")
    b.runtime(MAIN, "cudaDeviceSynchronize", 30, 95)                     # returns 5 us after a ends
    g = graph_of(b, tmp_path)
    (ret,) = [p for p in g.points if p.label == "return"]
    assert sorted(o for o, _ in ret.gpu_waits) == sorted([op_named(g, "a").index, op_named(g, "b").index])
    assert dict(ret.gpu_waits)[op_named(g, "a").index] == pytest.approx(5e-6)
    assert g.stats["syncs_binding"] == 1


def test_stream_synchronize_waits_for_the_op_that_released_it(tmp_path):
    b = TraceBuilder()
    b.launch(MAIN, 10, 5, stream=7, gpu_ts=20, gpu_dur=100, name="a")
    b.launch(MAIN, 20, 5, stream=8, gpu_ts=30, gpu_dur=20, name="b")
    b.runtime(MAIN, "cudaStreamSynchronize", 30, 93)                     # released by a at 120
    g = graph_of(b, tmp_path)
    (ret,) = [p for p in g.points if p.label == "return"]
    assert [o for o, _ in ret.gpu_waits] == [op_named(g, "a").index]


def test_thread_handoffs(tmp_path):
    """A worker thread that starts when main goes idle and main resumes when it is done: fork and join."""
    b = TraceBuilder()
    b.step(1, MAIN, 0, 5000)
    b.cpu_op(MAIN, "forward", 0, 1000)
    b.annotation(MAIN, "backward", 1000, 3950)                   # main waits inside it
    b.cpu_op(WORKER, "backward work", 1100, 3800)                # ends at 4900
    b.cpu_op(MAIN, "optimizer", 4950, 40)
    b.launch(MAIN, 10, 5, stream=7, gpu_ts=20, gpu_dur=10)
    g = graph_of(b, tmp_path)
    resumes = sorted((g.points[i] for i in range(len(g.points)) if g.points[i].label == "resume"),
                     key=lambda p: p.t)
    assert [round(p.t * 1e6) for p in resumes] == [1100, 4950]
    fork, join = resumes
    assert g.thread_name(fork.thread).endswith(str(WORKER)) and g.thread_name(join.thread).endswith(str(MAIN))
    (src, slack), = join.cpu_waits
    assert g.points[src].t == pytest.approx(4900e-6) and slack == pytest.approx(50e-6)
    assert g.stats["thread_handoffs"] == 2


def test_steps_and_layers(tmp_path):
    b = TraceBuilder()
    b.step(1, MAIN, 0, 100)
    b.step(2, MAIN, 100, 100)
    b.cpu_op(MAIN, "aten::linear", 5, 20)
    b.events.append({"ph": "X", "cat": "python_function", "name": "nn.Module: Linear_0", "pid": PID,
                     "tid": MAIN, "ts": 4, "dur": 30, "args": {}})
    b.launch(MAIN, 10, 5, stream=7, gpu_ts=20, gpu_dur=10, name="in module")
    b.cpu_op(MAIN, "aten::relu", 150, 20)
    b.launch(MAIN, 155, 5, stream=7, gpu_ts=170, gpu_dur=10, name="op only")
    g = graph_of(b, tmp_path)
    assert (op_named(g, "in module").layer, op_named(g, "in module").step) == ("nn.Module: Linear_0", 1)
    assert (op_named(g, "op only").layer, op_named(g, "op only").step) == ("aten::relu", 2)
    assert [(s.number, round(s.measured_s * 1e6)) for s in g.steps] == [(1, 100), (2, 100)]


def test_no_cycles_in_a_synthetic_graph(tmp_path):
    b = TraceBuilder()
    b.launch(MAIN, 10, 5, stream=7, gpu_ts=20, gpu_dur=100)
    b.runtime(MAIN, "cudaEventRecord", 16, 2)
    b.runtime(MAIN, "cudaStreamWaitEvent", 20, 2)
    b.launch(MAIN, 25, 5, stream=8, gpu_ts=121, gpu_dur=30)
    b.runtime(MAIN, "cudaDeviceSynchronize", 30, 125)
    assert not graph_of(b, tmp_path).has_cycle()


def test_shared_trace_graph(shared_file):
    trace = shared_file("traces", "kineto-a100-ddp2-rank0.json.gz")
    g = build_graph(load_trace(trace))
    assert not g.has_cycle()
    kernels = [o for o in g.ops if o.kind in ("kernel", "collective")]
    assert len(kernels) == 2700
    assert all(o.stream_key in g.streams and o.step in (4, 5, 6) for o in kernels)
    assert all(o.launch is not None for o in g.ops)
    # DDP: every all-reduce/broadcast waits for the compute stream (the gradient bucket is ready).
    assert all(o.deps for o in g.ops if o.kind == "collective")
    # backward runs on the autograd thread: main hands over and takes back once per step
    assert g.stats["thread_handoffs"] == 6
