"""The SimPy replay: exact with measured durations, known answers when durations change, the CLI."""

import gzip
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainsim.cli import app
from trainsim.formats.kineto import load_trace
from trainsim.sim.replay.engine import breakdown, replay, write_chrome_trace
from trainsim.sim.replay.kineto_builder import TraceBuilder
from trainsim.sim.replay.trace_graph import build_graph

MAIN, WORKER = 1, 2
US = 1e-6
runner = CliRunner()


def run(builder, tmp_path, op_time=None):
    g = build_graph(load_trace(builder.write(tmp_path / "t.json")))
    return g, replay([g], op_time=op_time).ranks[0]


def scale(factor, names=None):
    """An op_time hook scaling the measured duration of the named ops (all ops when names is None)."""
    def op_time(env, rank, op):
        return op.event.dur * factor if names is None or op.name in names else None
    return op_time


def start_of(g, rr, name):
    return next(rr.op_start[o.index] for o in g.ops if o.name == name)


def two_streams() -> TraceBuilder:
    b = TraceBuilder()
    b.step(1, MAIN, 0, 140)
    b.launch(MAIN, 10, 5, stream=7, gpu_ts=20, gpu_dur=100, name="k1")
    b.launch(MAIN, 20, 5, stream=8, gpu_ts=30, gpu_dur=100, name="k2")
    b.runtime(MAIN, "cudaDeviceSynchronize", 30, 105)              # returns 5 us after k2 ends
    return b


def test_measured_durations_reproduce_the_measurement(tmp_path):
    g, rr = run(two_streams(), tmp_path)
    assert rr.steps[0].replayed_s == pytest.approx(140 * US)
    assert [rr.op_start[o.index] for o in g.ops] == pytest.approx([o.event.ts for o in g.ops])


def test_two_streams_overlap(tmp_path):
    """Halving both kernels: they still run side by side, the sync returns 5 us after the later one."""
    _, rr = run(two_streams(), tmp_path, scale(0.5))
    # k1 20..70 and k2 30..80 overlap; sync returns at 85; 5 us of CPU to the step end. Serialised: 130.
    assert rr.steps[0].replayed_s == pytest.approx(90 * US)


def test_stream_synchronize_serialises(tmp_path):
    b = TraceBuilder()
    b.step(1, MAIN, 0, 200)
    b.launch(MAIN, 10, 5, stream=7, gpu_ts=20, gpu_dur=100, name="k1")
    b.runtime(MAIN, "cudaStreamSynchronize", 16, 109)              # k1 ends at 120, returns at 125
    b.launch(MAIN, 130, 5, stream=8, gpu_ts=140, gpu_dur=50, name="k2")
    g, rr = run(b, tmp_path, scale(2.0, {"k1"}))
    # k1 20..220, the sync returns at 225, k2 is launched 5 us later and starts 10 us after that.
    assert start_of(g, rr, "k2") == pytest.approx(240 * US)
    assert rr.steps[0].replayed_s == pytest.approx(300 * US)


def test_stream_wait_event_orders_streams(tmp_path):
    b = TraceBuilder()
    b.step(1, MAIN, 0, 200)
    b.launch(MAIN, 10, 5, stream=7, gpu_ts=20, gpu_dur=100, name="producer")
    b.runtime(MAIN, "cudaEventRecord", 16, 2)
    b.runtime(MAIN, "cudaStreamWaitEvent", 20, 2)
    b.launch(MAIN, 25, 5, stream=8, gpu_ts=121, gpu_dur=30, name="consumer")
    g, rr = run(b, tmp_path)
    assert start_of(g, rr, "consumer") == pytest.approx(121 * US)
    g, rr = run(b, tmp_path, scale(0.5, {"producer"}))
    # producer ends at 70; the consumer follows 1 us later (its measured queue gap)
    assert start_of(g, rr, "consumer") == pytest.approx(71 * US)


def test_join_waits_for_the_other_thread(tmp_path):
    """Main waits inside `backward` for a worker that waits for a kernel: a longer kernel delays main."""
    b = TraceBuilder()
    b.step(1, MAIN, 0, 5000)
    b.cpu_op(MAIN, "forward", 0, 1000)
    b.annotation(MAIN, "backward", 1000, 3950)
    b.cpu_op(WORKER, "backward work", 1100, 3800)
    b.launch(WORKER, 1200, 5, stream=7, gpu_ts=1210, gpu_dur=50, name="k")
    b.runtime(WORKER, "cudaStreamSynchronize", 1210, 55)           # k ends at 1260, returns at 1265
    b.cpu_op(MAIN, "optimizer", 4950, 40)
    _, rr = run(b, tmp_path)
    assert rr.steps[0].replayed_s == pytest.approx(5000 * US)
    _, rr = run(b, tmp_path, scale(2.0, {"k"}))
    assert rr.steps[0].replayed_s == pytest.approx(5050 * US)


def test_full_launch_queue_blocks_the_cpu(tmp_path):
    """With room for 2 pending launches, the third launch waits until the first kernel has finished."""
    b = TraceBuilder()
    b.step(1, MAIN, 0, 400)
    for k in range(3):
        b.launch(MAIN, 10 + 10 * k, 5, stream=7, gpu_ts=20 + 101 * k, gpu_dur=100, name=f"k{k}")
    g = build_graph(load_trace(b.write(tmp_path / "t.json")))
    third = next(o for o in g.ops if o.name == "k2").launch
    free = replay([g]).ranks[0]
    assert free.point_time[third] == pytest.approx(30 * US)
    blocked = replay([g], launch_queue=2).ranks[0]
    assert blocked.point_time[third] == pytest.approx(120 * US)          # k0 ends at 120
    assert blocked.steps[0].replayed_s == pytest.approx(490 * US)        # the 90 us wait moves the step end


def test_op_time_may_return_a_simpy_event(tmp_path):
    def op_time(env, rank, op):
        return env.timeout(op.event.dur / 2)
    _, halved = run(two_streams(), tmp_path, op_time)
    assert halved.steps[0].replayed_s == pytest.approx(90 * US)


def test_breakdown_of_overlap():
    from trainsim.formats.kineto import GpuEvent
    from trainsim.sim.replay.trace_graph import GpuOp

    ops = [GpuOp(0, GpuEvent("kernel", "c", 0, 7, 0, 0)), GpuOp(1, GpuEvent("collective", "n", 0, 9, 0, 0)),
           GpuOp(2, GpuEvent("memcpy", "m", 0, 7, 0, 0))]
    b = breakdown(ops, [0.0, 5.0, 12.0], [10.0, 15.0, 13.0], (0.0, 20.0))
    assert b == {"compute_s": 10.0, "communication_s": 10.0, "communication_exposed_s": 5.0, "copies_s": 1.0,
                 "copies_exposed_s": 0.0, "gpu_idle_s": 5.0}


def test_replay_trace_is_deterministic(tmp_path):
    g = build_graph(load_trace(two_streams().write(tmp_path / "t.json")))
    a, b = tmp_path / "a.json.gz", tmp_path / "b.json.gz"
    write_chrome_trace(replay([g]), a)
    write_chrome_trace(replay([g]), b)
    assert a.read_bytes() == b.read_bytes()
    doc = json.loads(gzip.decompress(a.read_bytes()))
    assert {e["name"] for e in doc["traceEvents"] if e.get("cat") == "kernel"} == {"k1", "k2"}


def test_shared_trace_replay_matches_measured_steps(shared_file):
    trace = shared_file("traces", "kineto-a100-ddp2-rank0.json.gz")
    g = build_graph(load_trace(trace))
    result = replay([g])
    assert [s.step for s in result.steps] == [4, 5, 6]
    for s in result.steps:
        assert abs(s.error_pct) < 3.0
    # The run is CPU-bound (GPU busy ~25 % of a step): infinitely fast GPU work barely helps.
    fast = replay([g], op_time=lambda env, rank, op: 0.0)
    for measured, instant in zip(result.steps, fast.steps, strict=True):
        assert 0.85 * measured.replayed_s < instant.replayed_s <= measured.replayed_s * 1.0001


# ---------------------------------------------------------------- CLI

def test_cli_replay_json_and_trace(tmp_path):
    out = tmp_path / "replay.json.gz"
    result = runner.invoke(app, ["replay", str(two_streams().write(tmp_path / "t.json")), "--json",
                                 "--trace", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == "trainsim.replay/1"
    assert doc["steps"][0]["replayed_s"] == pytest.approx(140 * US) and doc["steps"][0]["error_pct"] == 0
    assert out.exists()


def test_cli_replay_text(tmp_path):
    result = runner.invoke(app, ["replay", str(two_streams().write(tmp_path / "t.json"))])
    assert result.exit_code == 0
    assert "measured ms" in result.stdout and "error %" in result.stdout


def test_cli_replay_shared_trace(shared_file):
    trace = shared_file("traces", "kineto-a100-ddp2-rank0.json.gz")
    result = runner.invoke(app, ["replay", str(trace), "--json"])
    assert result.exit_code == 0
    steps = json.loads(result.stdout)["steps"]
    assert len(steps) == 3 and all(abs(s["error_pct"]) < 3 for s in steps)


def _no_gpu(tmp_path):
    p = tmp_path / "cpu_only.json"
    p.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1,
                                              "ts": 0, "dur": 1}]}))
    return [p]


def _truncated(tmp_path):
    data = gzip.compress(json.dumps(two_streams().to_dict()).encode())
    p = tmp_path / "cut.json.gz"
    p.write_bytes(data[:-20])
    return [p]


def _not_a_trace(tmp_path):
    p = tmp_path / "config.json"
    p.write_text('{"model": "resnet50", "batch_size": 32}')
    return [p]


def _mixed(tmp_path):
    a = TraceBuilder(rank=0, world_size=2)
    a.launch(MAIN, 10, 5, stream=7, gpu_ts=20, gpu_dur=100)
    b = TraceBuilder(rank=1, world_size=2, base_time_ns=1_600_000_000_000_000_000)      # months earlier
    b.launch(MAIN, 10, 5, stream=7, gpu_ts=20, gpu_dur=100)
    return [a.write(tmp_path / "r0.json"), b.write(tmp_path / "r1.json")]


@pytest.mark.parametrize("make, message", [
    (_not_a_trace, "no 'traceEvents'"), (_truncated, "truncated or corrupt gzip"),
    (_no_gpu, "no GPU events"), (_mixed, "different runs mixed together"),
])
def test_cli_bad_input_one_line_exit_2_nothing_written(tmp_path, make, message):
    out = tmp_path / "out.json.gz"
    result = runner.invoke(app, ["replay", *map(str, make(tmp_path)), "--trace", str(out)])
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1
    assert not out.exists() and not list(tmp_path.glob(".out.json.gz*"))


H200 = Path(__file__).parent / "data" / "traces-h200"  # executor steps traced on an H200 (see its README)


@pytest.mark.parametrize("name", ["gpt2-small-fp32-step", "resnet50-fp32-step"])
def test_executor_traces_from_an_h200_replay_their_step(name):
    result = runner.invoke(app, ["replay", str(H200 / f"{name}.json.gz"), "--json"])
    assert result.exit_code == 0, result.stdout
    [step] = json.loads(result.stdout)["steps"]  # the ProfilerStep#N span the executor marks
    assert step["measured_s"] > 0 and abs(step["error_pct"]) < 0.5


def test_a_gpu_bound_step_slows_down_on_a_slower_gpu():
    # GPT-2 small in fp32 (no TF32): 87 ms of kernels in a 94 ms step; an A100's fp32 peak is 19.5 TFLOP/s
    # against the H200's 67, so the step's compute grows about 3.4x, and the step with it
    result = runner.invoke(app, ["replay", str(H200 / "gpt2-small-fp32-step.json.gz"), "--gpu", "a100-80gb",
                                 "--json"])
    assert result.exit_code == 0, result.stdout
    [step] = json.loads(result.stdout)["whatif"]["steps"]
    assert 2.5 < step["predicted_s"] / step["measured_s"] < 3.6
