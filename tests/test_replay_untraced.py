"""Replaying a trace as the step runs untraced: the profiler's stalls and per-event cost taken out of the
CPU threads (known answers on hand-written traces, the H200 traces, the what-if's bad input)."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainsim.cli import app
from trainsim.errors import TrainsimError
from trainsim.formats.kineto import load_trace
from trainsim.sim.replay.engine import replay
from trainsim.sim.replay.kineto_builder import TraceBuilder
from trainsim.sim.replay.trace_graph import build_graph
from trainsim.sim.replay.whatif import WhatIf

H200 = Path(__file__).parent / "data" / "traces-h200"
MAIN, AUTOGRAD, PIN = 1, 2, 3
US = 1e-6
runner = CliRunner()


def graph(builder, tmp_path):
    return build_graph(load_trace(builder.write(tmp_path / "t.json")))


def step_s(g, event_s=None):
    return replay([g], untraced_event_s=event_s).ranks[0].steps[0].replayed_s


def stalled_in_fill(*, idle_thread: bool = True, blocked_main: bool = False) -> TraceBuilder:
    """The autograd thread's first op waits 2 ms inside CUPTI's buffer request before it launches, while
    the main thread waits for backward (silent, or inside a long op with ``blocked_main``) and then
    synchronises on that kernel; a pin thread sits idle between two events meanwhile."""
    b = TraceBuilder()
    b.step(1, MAIN, 0, 2230)
    b.launch(MAIN, 10, 5, stream=7, gpu_ts=20, gpu_dur=50)
    if blocked_main:
        b.cpu_op(MAIN, "autograd::backward", 80, 2120)
    b.cpu_op(AUTOGRAD, "aten::fill_", 100, 2100)
    b.launch(AUTOGRAD, 2150, 5, stream=7, gpu_ts=2160, gpu_dur=60)
    b.runtime(MAIN, "cudaDeviceSynchronize", 2205, 20)
    if idle_thread:
        b.runtime(PIN, "cudaEventQuery", 0, 5)
        b.runtime(PIN, "cudaEventQuery", 3000, 5)
    b.profiler_overhead(120, 2000)
    return b


def test_overhead_events_are_read_in_seconds_from_the_origin(tmp_path):
    b = stalled_in_fill()
    trace = load_trace(b.write(tmp_path / "t.json"))
    assert trace.profiler_overheads == [(pytest.approx(120 * US), pytest.approx(2000 * US))]
    trace.shift(1.0)
    assert trace.profiler_overheads[0][0] == pytest.approx(1.0 + 120 * US)


def test_a_buffer_request_a_thread_waited_on_is_taken_out_of_that_thread(tmp_path):
    g = graph(stalled_in_fill(), tmp_path)
    stalls = {g.threads[p.thread][1]: 0.0 for p in g.points}
    for p in g.points:
        stalls[g.threads[p.thread][1]] += p.profiler_stall
    # charged to the autograd thread, inside its fill_, not to the pin thread idle between its events
    assert stalls == {MAIN: 0.0, AUTOGRAD: pytest.approx(2000 * US), PIN: 0.0}
    assert g.stats["profiler_stalls"] == 1
    measured = step_s(g)
    assert measured == pytest.approx(2230 * US)
    # the launch comes 2 ms earlier, so do its kernel, the main thread's hand-off and its synchronise
    assert step_s(g, 0.0) == pytest.approx(measured - 2000 * US, abs=1 * US)


def test_the_innermost_waiting_event_takes_the_stall(tmp_path):
    g = graph(stalled_in_fill(blocked_main=True), tmp_path)
    by_thread = {}
    for p in g.points:
        by_thread[g.threads[p.thread][1]] = by_thread.get(g.threads[p.thread][1], 0.0) + p.profiler_stall
    # the main thread is silent inside a longer op (blocked in backward): the autograd thread's fill_ is it
    assert by_thread[AUTOGRAD] == pytest.approx(2000 * US)
    assert by_thread[MAIN] == 0.0


def test_a_request_no_thread_waited_on_is_charged_to_none(tmp_path):
    b = TraceBuilder()
    b.step(1, MAIN, 0, 500)
    for k in range(40):                     # the main thread works through the request: ops 10 us apart
        b.launch(MAIN, 10 + 10 * k, 5, stream=7, gpu_ts=20 + 10 * k, gpu_dur=5)
    b.profiler_overhead(100, 200)
    g = graph(b, tmp_path)
    assert sum(p.profiler_stall for p in g.points) == 0.0
    assert "profiler_stalls" not in g.stats
    assert step_s(g, 0.0) == pytest.approx(step_s(g))


def launches(n: int, gap_us: float, kernel_us: float) -> TraceBuilder:
    """``n`` ops of the main thread, each a cpu_op around its launch (two recorded events), ``gap_us``
    apart, each launching a kernel of ``kernel_us``; then a synchronise for the last."""
    b = TraceBuilder()
    t_gpu = 0.0
    for k in range(n):
        t = 10 + gap_us * k
        b.cpu_op(MAIN, "aten::add", t, 4)
        b.launch(MAIN, t + 1, 2, stream=7, gpu_ts=max(t + 5, t_gpu), gpu_dur=kernel_us)
        t_gpu = max(t + 5, t_gpu) + kernel_us
    t = 10 + gap_us * n
    b.runtime(MAIN, "cudaDeviceSynchronize", t, max(t_gpu + 1 - t, 1))
    b.step(1, MAIN, 0, max(t, t_gpu + 1) + 2)
    return b


def test_the_per_event_cost_shortens_a_host_bound_step_by_events_times_cost(tmp_path):
    g = graph(launches(20, gap_us=10, kernel_us=1), tmp_path)
    # each launch's gap holds two recorded events (the op and its runtime call): 2 x 2 us less per launch,
    # and the synchronise's call one more
    assert step_s(g) - step_s(g, 2 * US) == pytest.approx((20 * 4 + 2) * US, abs=0.5 * US)


def test_the_per_event_cost_barely_moves_a_gpu_bound_step(tmp_path):
    g = graph(launches(20, gap_us=10, kernel_us=50), tmp_path)
    # the GPU's queue absorbs the host's gain but for the first launch's (the first kernel starts earlier)
    assert step_s(g) - step_s(g, 2 * US) == pytest.approx(4 * US, abs=0.5 * US)


@pytest.mark.parametrize("sets, message", [
    (["profiler_event_us=-1"], "must be a number of microseconds >= 0"),
    (["profiler_event_us=fast"], "must be a number of microseconds"),
    (["untraced=true", "profiler_event_us=nan"], "must be a number of microseconds >= 0"),
    (["profiler_event_us=2"], "needs untraced=true"),
    (["untraced=maybe"], "untraced must be true or false"),
])
def test_bad_untraced_settings_name_the_field(sets, message):
    with pytest.raises(TrainsimError, match=message):
        WhatIf.from_options(sets=sets)


def test_untraced_is_a_what_if():
    assert WhatIf.from_options(sets=["untraced=true"]).untraced_event_s == 0.0
    assert WhatIf.from_options(sets=["untraced=true", "profiler_event_us=3.5"]).untraced_event_s == 3.5 * US
    assert WhatIf().untraced_event_s is None and not WhatIf().active


@pytest.mark.parametrize("name, threads", [("resnet50", 2), ("gpt2-small", 2)])
def test_h200_traces_stall_the_step_start_and_the_first_backward_op(name, threads):
    g = build_graph(load_trace(H200 / f"{name}-fp32-step.json.gz"))
    assert len(g.trace.profiler_overheads) == 3
    assert g.stats["profiler_stalls"] == 3 if name == "resnet50" else 2    # ResNet-50's two overlap
    stalled = {p.thread for p in g.points if p.profiler_stall > 0}
    assert len(stalled) == threads
    stall = sum(p.profiler_stall for p in g.points)
    traced, untraced = step_s(g), step_s(g, 0.0)
    if name == "resnet50":      # bound by the host: the step is shorter by the stalls
        assert stall == pytest.approx(5.35e-3, abs=0.05e-3)
        assert traced - untraced == pytest.approx(stall, rel=0.02)
    else:                       # bound by the GPU: the queue absorbs part of them
        assert 0 < traced - untraced < stall


def test_cli_untraced_replay_says_what_it_took_out():
    result = runner.invoke(app, ["replay", str(H200 / "resnet50-fp32-step.json.gz"), "--set", "untraced=true",
                                 "--set", "profiler_event_us=3"])
    assert result.exit_code == 0, result.output
    assert "untraced=True" in result.output and "profiler_event_us=3.0" in result.output
    assert "5.36 ms of profiler stalls" in result.output and "3 us per recorded host event" in result.output


def test_two_stalls_of_one_thread_are_each_charged_to_their_own_point(tmp_path):
    b = TraceBuilder()
    b.step(1, MAIN, 0, 3000)
    b.cpu_op(MAIN, "aten::fill_", 10, 1010)                     # waits 1 ms, then launches
    b.launch(MAIN, 1015, 5, stream=7, gpu_ts=1025, gpu_dur=10)
    b.cpu_op(MAIN, "aten::fill_", 1100, 610)                    # waits 0.5 ms, then launches
    b.launch(MAIN, 1705, 5, stream=7, gpu_ts=1715, gpu_dur=10)
    b.runtime(MAIN, "cudaDeviceSynchronize", 1720, 10)
    b.profiler_overhead(12, 1000)
    b.profiler_overhead(1102, 500)
    g = graph(b, tmp_path)
    launches = [p for p in g.points if p.name == "cudaLaunchKernel"]
    assert [p.profiler_stall for p in launches] == [pytest.approx(1000 * US), pytest.approx(500 * US)]
    assert step_s(g) - step_s(g, 0.0) == pytest.approx(1500 * US, abs=1 * US)
