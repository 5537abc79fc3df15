"""The Kineto-shaped Chrome/Perfetto trace of a simulated run."""

import gzip
import json

from trainsim.api import simulate
from trainsim.sim.output.chrome_trace import chrome_trace, write_chrome_trace

SCENARIO = {
    "schema": "trainsim.scenario/1",
    "name": "trace-test",
    "topology": "pcie-4gpu-gen3",
    "workload": "tiny-cnn",
    "strategy": {"name": "ddp"},
    "batch_size": 64,
    "gpus": 2,
    "iterations": 1,
    "warmup_iterations": 1,
}


def test_trace_shape_follows_kineto():
    result = simulate(SCENARIO)
    trace = chrome_trace(result, provenance={"tool": "trainsim"})
    assert trace["distributedInfo"]["rank"] == 0 and trace["distributedInfo"]["world_size"] == 2
    assert [d["id"] for d in trace["deviceProperties"]] == [0, 1]
    events = trace["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    kernels = [e for e in slices if e["cat"] == "kernel"]
    assert any(e["name"].startswith("forward conv2d: conv1") and e["pid"] == 0 and e["tid"] == 7
               for e in kernels)
    nccl = [e for e in kernels if e["name"].startswith("nccl")]
    assert nccl and all(
        e["args"]["Collective name"] == "allreduce" and e["args"]["message_bytes"] > 0 for e in nccl
    )
    memcpy = [e for e in slices if e["cat"] == "gpu_memcpy"]
    assert any(e["name"] == "Memcpy HtoD (Pinned -> Device)" for e in memcpy)
    steps = [e for e in slices if e["cat"] == "user_annotation"]
    assert [e["name"] for e in steps] == ["ProfilerStep#0", "ProfilerStep#1"]
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert {"GPU memory", "bandwidth"} <= counters
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert {"GPU 0 (gpu0, v100-pcie)", "host cpu0"} <= names
    assert any(n.startswith("link ") for n in names)
    # µs, and no two slices overlap on one track
    by_track = {}
    for e in slices:
        by_track.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_track.values():
        spans.sort()
        assert all(a[1] <= b[0] + 1e-3 for a, b in zip(spans, spans[1:], strict=False))


def test_trace_file_is_byte_identical_for_the_same_inputs(tmp_path):
    a, b = tmp_path / "a.json.gz", tmp_path / "b.json.gz"
    write_chrome_trace(simulate(SCENARIO), a, provenance={"x": 1})
    write_chrome_trace(simulate(SCENARIO), b, provenance={"x": 1})
    assert a.read_bytes() == b.read_bytes()
    assert json.loads(gzip.decompress(a.read_bytes()))["traceEvents"]
