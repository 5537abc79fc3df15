"""Reading Kineto traces: formats, streaming, ranks, event details, and bad input."""

import gzip
import json
from pathlib import Path

import pytest

from trainsim.errors import TrainsimError
from trainsim.formats import kineto
from trainsim.formats.kineto import Collective, load_trace, load_traces
from trainsim.sim.replay.kineto_builder import TraceBuilder


def small_trace(**kw) -> TraceBuilder:
    b = TraceBuilder(**kw)
    b.step(1, 1, 0.0, 100.0)
    b.launch(1, 10.0, 5.0, stream=7, gpu_ts=20.0, gpu_dur=30.0, name="gemm")
    b.launch(1, 20.0, 5.0, stream=7, gpu_ts=50.0, gpu_dur=4.0, name="Memcpy HtoD (Pageable -> Device)",
             kind="gpu_memcpy", bytes=4096)
    b.launch(1, 30.0, 5.0, stream=7, gpu_ts=60.0, gpu_dur=4.0, name="Memcpy DtoH (Device -> Pinned)",
             kind="gpu_memcpy", bytes=2048)
    b.launch(1, 40.0, 5.0, stream=9, gpu_ts=70.0, gpu_dur=20.0,
             name="ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
             **{"Collective name": "allreduce", "In msg nelems": 1000, "dtype": "Float", "Group size": 2,
                "Process Group Name": "0", "Process Group Ranks": "[0, 1]"})
    return b


def test_plain_and_gzip_read_the_same(tmp_path):
    b = small_trace()
    plain = load_trace(b.write(tmp_path / "t.json"))
    packed = load_trace(b.write(tmp_path / "t.json.gz"))
    def rows(t):
        return [(g.name, g.ts, g.dur) for g in t.gpu_events]
    assert rows(plain) == rows(packed)
    assert len(plain.cpu_events) == len(packed.cpu_events) == 5        # the step and four runtime calls


def test_times_are_seconds_from_the_earliest_event(tmp_path):
    t = load_trace(small_trace().write(tmp_path / "t.json"))
    assert t.origin_us == 0.0
    gemm = next(g for g in t.gpu_events if g.name == "gemm")
    assert gemm.ts == pytest.approx(20e-6) and gemm.dur == pytest.approx(30e-6)
    assert t.steps[0].number == 1 and t.steps[0].dur == pytest.approx(100e-6)


def test_streaming_across_tiny_chunks(tmp_path, monkeypatch):
    """Events and numbers split across buffer boundaries decode the same as in one piece."""
    path = small_trace().write(tmp_path / "t.json")
    whole = load_trace(path)
    monkeypatch.setattr(kineto, "_CHUNK_CHARS", 7)
    chunked = load_trace(path)
    assert [(g.name, g.ts) for g in chunked.gpu_events] == [(g.name, g.ts) for g in whole.gpu_events]
    assert chunked.base_time_ns == whole.base_time_ns


def test_memcpy_direction_pinned_and_bytes(tmp_path):
    t = load_trace(small_trace().write(tmp_path / "t.json"))
    h2d, d2h = [g for g in t.gpu_events if g.kind == "memcpy"]
    assert (h2d.copy_kind, h2d.pinned, h2d.nbytes) == ("H2D", False, 4096)
    assert (d2h.copy_kind, d2h.pinned, d2h.nbytes) == ("D2H", True, 2048)


def test_collective_type_size_dtype_group(tmp_path):
    t = load_trace(small_trace().write(tmp_path / "t.json"))
    (nccl,) = [g for g in t.gpu_events if g.kind == "collective"]
    assert nccl.collective == Collective("allreduce", 1000, "Float", 2, "0", (0, 1))
    assert nccl.collective.nbytes == nccl.collective.array_bytes == 4000


def test_collective_without_sizes_keeps_type_only(tmp_path):
    b = TraceBuilder()
    b.launch(1, 0.0, 5.0, stream=9, gpu_ts=10.0, gpu_dur=20.0, name="ncclKernel_AllGather_RING_LL_Sum_int8_t")
    (nccl,) = load_trace(b.write(tmp_path / "t.json")).gpu_events
    assert nccl.kind == "collective" and nccl.collective.op == "allgather" and nccl.collective.nbytes is None


def test_rank_from_distributed_info_then_file_name(tmp_path):
    t = load_trace(small_trace(rank=3, world_size=4).write(tmp_path / "a.json"))
    assert (t.rank, t.rank_source) == (3, "distributedInfo")
    t = load_trace(small_trace(distributed_info=False).write(tmp_path / "host_rank5.json"))
    assert (t.rank, t.rank_source) == (5, "file name")


def test_several_files_without_rank_are_an_error(tmp_path):
    a = small_trace(distributed_info=False).write(tmp_path / "a.json")
    b = small_trace(distributed_info=False).write(tmp_path / "b.json")
    with pytest.raises(TrainsimError, match="cannot tell which rank"):
        load_traces([a, b])


def test_ranks_are_sorted(tmp_path):
    a = small_trace(rank=1, world_size=2).write(tmp_path / "a.json")
    b = small_trace(rank=0, world_size=2).write(tmp_path / "b.json")
    assert [t.rank for t in load_traces([a, b])] == [0, 1]


@pytest.mark.parametrize("content, message", [
    (b"hello, not json", "not a Kineto trace"),
    (b'{"foo": 1}', "no 'traceEvents'"),
    (b"[1, 2, 3]", "not a Kineto trace"),
    (b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 0, "dur": 1}]}',
     "no GPU events"),
    (b'{"traceEvents": [{"ph": "X"', "truncated"),
    (b"\x00\x01\x02binary\xff\xfe", "not"),
])
def test_bad_input_is_one_clear_error(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(TrainsimError, match=message):
        load_trace(path)


def _damaged(tmp_path, name: str, **change) -> Path:
    """The small trace with the first event called ``name`` changed (a value None: the key removed)."""
    doc = small_trace().to_dict()
    index, event = next((i, e) for i, e in enumerate(doc["traceEvents"]) if e.get("name") == name)
    for key, value in change.items():
        target = event["args"] if key == "bytes" else event
        if value is None:
            target.pop(key)
        else:
            target[key] = value
    path = tmp_path / f"damaged-{index}.json"
    path.write_text(json.dumps(doc))  # json writes nan and inf as NaN and Infinity, as a damaged file might
    return path


@pytest.mark.parametrize("name, change, message", [
    ("gemm", {"dur": -5}, "dur -5 is negative"),
    ("gemm", {"dur": None}, "dur is missing"),
    ("gemm", {"dur": float("nan")}, "dur nan is not a finite number"),
    ("gemm", {"ts": "20"}, "ts '20' is not a finite number"),
    ("gemm", {"ts": True}, "ts True is not a finite number"),
    ("Memcpy HtoD (Pageable -> Device)", {"bytes": -4096}, "args.bytes -4096 is not a whole number"),
    ("Memcpy HtoD (Pageable -> Device)", {"bytes": "4k"}, "args.bytes '4k' is not a whole number"),
    ("ProfilerStep#1", {"dur": float("inf")}, "dur inf is not a finite number"),
])
def test_a_damaged_event_is_an_error_naming_it(tmp_path, name, change, message):
    path = _damaged(tmp_path, name, **change)
    with pytest.raises(TrainsimError, match=message) as caught:
        load_trace(path)
    index = path.stem.split("-")[1]
    assert caught.value.file == str(path) and caught.value.field == f"traceEvents[{index}]"
    assert name[:20] in str(caught.value)


def test_events_of_kinds_the_replay_does_not_use_are_not_checked(tmp_path):
    doc = small_trace().to_dict()
    doc["traceEvents"].append({"ph": "X", "cat": "some_new_category", "name": "x", "pid": 1, "tid": 1,
                               "ts": "later", "dur": -1})
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    assert len(load_trace(path).gpu_events) == 4


def test_truncated_gzip(tmp_path):
    data = gzip.compress(json.dumps(small_trace().to_dict()).encode())
    path = tmp_path / "cut.json.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(TrainsimError, match="truncated or corrupt gzip"):
        load_trace(path)


def test_missing_file(tmp_path):
    with pytest.raises(TrainsimError, match="no such file"):
        load_trace(tmp_path / "nope.json")


def test_mixed_runs_are_rejected(tmp_path):
    a = small_trace(rank=0, world_size=2).write(tmp_path / "a.json")
    same_rank = small_trace(rank=0, world_size=2).write(tmp_path / "b.json")
    with pytest.raises(TrainsimError, match="rank 0 appears twice"):
        load_traces([a, same_rank])
    other_size = small_trace(rank=1, world_size=4).write(tmp_path / "c.json")
    with pytest.raises(TrainsimError, match="world sizes"):
        load_traces([a, other_size])
    a_day_later = small_trace(rank=1, world_size=2, base_time_ns=1_700_000_000_000_000_000 + 86_400 * 10**9)
    with pytest.raises(TrainsimError, match="do not overlap in time"):
        load_traces([a, a_day_later.write(tmp_path / "d.json")])


def _with_meta(builder: TraceBuilder, path: Path, **meta) -> Path:
    doc = builder.to_dict() | meta
    path.write_text(json.dumps(doc))
    return path


def test_traces_trainsim_wrote_in_different_runs_are_rejected(tmp_path):
    def ours(rank, scenario):
        return _with_meta(small_trace(rank=rank, world_size=2), tmp_path / f"{scenario}-{rank}.json",
                          trainsim={"schema": "trainsim.trace/1", "scenario": scenario})

    assert [t.rank for t in load_traces([ours(0, "x"), ours(1, "x")])] == [0, 1]
    with pytest.raises(TrainsimError, match="written by different trainsim runs"):
        load_traces([ours(0, "x"), ours(1, "y")])
    profiled = small_trace(rank=1, world_size=2).write(tmp_path / "profiled.json")
    with pytest.raises(TrainsimError, match="some were written by trainsim and some by a profiler"):
        load_traces([ours(0, "x"), profiled])


def test_traces_with_no_step_in_common_are_rejected(tmp_path):
    a = small_trace(rank=0, world_size=2).write(tmp_path / "a.json")
    later = TraceBuilder(rank=1, world_size=2)
    later.step(551, 1, 0.0, 100.0)
    later.launch(1, 10.0, 5.0, stream=7, gpu_ts=20.0, gpu_dur=30.0, name="gemm")
    with pytest.raises(TrainsimError, match=r"no ProfilerStep number is in every file \(rank 0: 1-1, rank 1: "
                                            r"551-551\)"):
        load_traces([a, later.write(tmp_path / "b.json")])


@pytest.mark.parametrize("info, message", [
    ({"rank": 3, "world_size": 2}, "distributedInfo.rank: rank 3 is outside world size 2"),
    ({"rank": -1, "world_size": 2}, r"distributedInfo.rank: should be a whole number >= 0, got -1"),
    ({"rank": "x"}, "distributedInfo.rank: should be a whole number >= 0, got 'x'"),
    ({"rank": 0, "world_size": 0}, "distributedInfo.world_size: should be a whole number >= 1, got 0"),
])
def test_a_lone_trace_with_an_impossible_rank_is_an_error(tmp_path, info, message):
    path = _with_meta(small_trace(), tmp_path / "a.json", distributedInfo=info)
    with pytest.raises(TrainsimError, match=message):
        load_trace(path)


def test_a_folder_stands_for_its_trace_files(tmp_path):
    small_trace(rank=1, world_size=2).write(tmp_path / "rank-1.json.gz")
    small_trace(rank=0, world_size=2).write(tmp_path / "rank-0.json")
    (tmp_path / "notes.txt").write_text("not a trace")
    assert [Path(t.path).name for t in load_traces([tmp_path])] == ["rank-0.json", "rank-1.json.gz"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(TrainsimError, match="the folder has no trace files"):
        load_traces([tmp_path / "empty"])


def test_shared_a100_trace(shared_file):
    trace = shared_file("traces", "kineto-a100-ddp2-rank0.json.gz")
    t = load_trace(trace)
    assert (t.rank, t.world_size, t.rank_source) == (0, 2, "distributedInfo")
    assert [s.number for s in t.steps] == [4, 5, 6]
    assert all(0.2 < s.dur < 0.24 for s in t.steps)              # "three ProfilerSteps of about 220 ms"
    kinds = {g.kind for g in t.gpu_events}
    assert kinds == {"kernel", "collective", "memcpy", "memset"}
    colls = [g.collective for g in t.gpu_events if g.kind == "collective"]
    assert {c.op for c in colls} == {"allreduce", "broadcast"}
    assert all(c.nbytes and c.group_size == 2 for c in colls)
    assert all(g.copy_kind == "D2D" and g.nbytes is not None for g in t.gpu_events if g.kind == "memcpy")
