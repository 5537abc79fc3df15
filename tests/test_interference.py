"""Communication that slows compute: NCCL's CTAs hold SMs and its bytes take HBM while it overlaps compute."""

import pytest
from simtools import scenario, tiny_topology, tiny_workload

from trainsim.sim.collectives.footprint import footprint, hbm_bytes, nccl_ctas
from trainsim.sim.core.interference import (
    HBM_STREAM_FRACTION,
    MATRIX,
    STREAMING,
    Contention,
    Walk,
    factor,
    overlapped_seconds,
    settle,
    state_beside,
)
from trainsim.sim.core.machine import build_machine
from trainsim.topologies import load_topology

MS = 1e-3
A100_SMS = 108


def test_matrix_work_slows_by_the_sms_taken_memory_work_by_the_hbm_taken_launches_not_at_all():
    s = (A100_SMS - 12) / A100_SMS
    assert factor(MATRIX, (s, 0.3)) == pytest.approx(1 / s)
    assert factor(STREAMING, (s, 0.3)) == pytest.approx(1.3)
    assert factor((0.0, 0.0), (s, 0.3)) == 1.0  # launch-bound
    assert factor((0.5, 0.4), (s, 0.3)) == pytest.approx(0.5 / s + 0.5)  # its launch share unchanged
    assert factor((0.2, 0.5), (1.0, 0.4)) == 1.0  # HBM not oversubscribed: 0.5 + 0.4 < 1
    for load in (MATRIX, STREAMING, (0.3, 0.6)):
        assert factor(load, (1.0, 0.0)) == 1.0  # nothing in flight: nominal


def _overlapped_run(load, ctas: int, demand: float, *, interference: bool = True) -> tuple[float, list]:
    """10 ms of ``load`` on gpu0's compute stream, a collective holding ``ctas`` SMs and ``demand`` bytes/s
    of HBM from 2 ms to 6 ms, then 10 ms more that nothing overlaps."""
    machine = build_machine(load_topology(tiny_topology(gpus=2)))
    if interference:
        machine.enable_interference(["gpu0", "gpu1"])
    env = machine.env

    def compute():
        yield from machine.run("gpu0", "compute", 10 * MS, op="forward", iteration=0, load=load)
        yield from machine.run("gpu0", "compute", 10 * MS, op="backward", iteration=0, load=load)

    def collective():
        yield env.timeout(2 * MS)
        contention = machine.gpus["gpu0"].contention
        held = contention.hold(ctas, demand) if contention else None
        yield env.timeout(4 * MS)
        if contention:
            contention.release(held)

    env.process(compute())
    env.process(collective())
    env.run()
    return env.now, [(op.op, op.end - op.start) for op in machine.ops]


def test_a_kernel_overlapped_by_a_collective_takes_longer_by_the_modelled_share_and_not_otherwise():
    s = (A100_SMS - 12) / A100_SMS
    end, ops = _overlapped_run(MATRIX, 12, 0.0)
    # 2 ms alone, 4 ms at s of the rate, the rest alone: the first kernel ends at 6 + (10 - 2 - 4 s)
    assert dict(ops)["forward"] == pytest.approx((14 - 4 * s) * MS)
    assert dict(ops)["backward"] == pytest.approx(10 * MS)  # not overlapped: nominal
    assert end == pytest.approx((24 - 4 * s) * MS)
    off, ops_off = _overlapped_run(MATRIX, 12, 0.0, interference=False)
    assert off == pytest.approx(20 * MS) and dict(ops_off)["forward"] == pytest.approx(10 * MS)


def test_memory_bound_work_shares_hbm_with_the_collective_bytes():
    a100 = build_machine(load_topology(tiny_topology(gpus=2))).gpus["gpu0"].device
    demand = 0.5 * a100.memory_bandwidth * HBM_STREAM_FRACTION  # half the achievable bandwidth
    end, ops = _overlapped_run(STREAMING, 12, demand)
    # over the 4 ms both ask for 1.5 x what HBM gives: the kernel moves at 1 / 1.5
    assert dict(ops)["forward"] == pytest.approx((6 + 10 - 2 - 4 / 1.5) * MS)
    end_matrix, _ = _overlapped_run(MATRIX, 0, demand)
    assert end_matrix == pytest.approx(20 * MS)  # matrix work with no CTAs taken: HBM is not what bounds it


def test_contention_state_and_release_back_to_idle():
    import simpy

    c = Contention(simpy.Environment(), 100, 1e12)
    assert c.state == (1.0, 0.0) and not c.busy
    a = c.hold(8, 3e11)
    b = c.hold(8, 1e11)
    assert c.state == pytest.approx((0.84, 0.4))
    c.release(a)
    c.release(b)
    assert c.state == (1.0, 0.0) and c.demand == 0.0


def test_a_wait_for_the_host_is_not_slowed():
    # piece 0: 2 s; piece 1 ready at 5 s (the host dispatches it then), 2 s of matrix work
    walk = Walk(0.0, [2.0, 2.0], [MATRIX, MATRIX], ready=[0.0, 5.0], until=[0.0, 5.0])
    assert walk.end((0.5, 0.0)) == pytest.approx(4.0 + 4.0 - 4.0 + 5.0)  # 4 s, wait to 5 s, 4 s
    walk.advance(3.0, (0.5, 0.0))  # 3 s at half rate: 1.5 s of piece 0 done
    assert walk.end((1.0, 0.0)) == pytest.approx(7.0)  # 0.5 s more, the wait to 5 s, 2 s
    assert walk.finish((1.0, 0.0)) == [(0.0, 3.5), (5.0, 7.0)]


def test_nccl_ctas_follow_the_cost_model_and_ncc_ls_small_size_cut():
    # the real trace (kineto-a100-ddp2-rank0): a 53-element int64 broadcast ran on one CTA, 8-31 MB on all
    assert nccl_ctas(80, "broadcast", "ring", "ll", 2, 424, 240.0) == 1
    assert nccl_ctas(80, "allreduce", "ring", "ll", 2, 26e6, 160.0) == 8
    assert nccl_ctas(90, "allreduce", "nvls", "simple", 8, 1e9, 480.0) == 16  # NCCL_NVLS_NCHANNELS
    assert nccl_ctas(None, "allreduce", "ring", "simple", 2, 1e9, 10.0) == 0  # gloo: no SMs
    assert hbm_bytes("allreduce", "ring", 2, 100.0) == pytest.approx(250.0)  # 5 (n-1)/n S
    topo = load_topology("dgx-a100")
    fp = footprint(topo, "allreduce", topo.gpus, 256 * 2**20)
    assert 2 <= fp.ctas <= 32 and 0 < fp.demand < 1555e9 and fp.seconds > 0


def _ddp(tmp_path, gpus: int, interference: bool):
    import json

    from trainsim.resolve import resolve
    from trainsim.sim.simulation import Simulation

    # backward-heavy layers with large gradients: DDP's buckets all-reduce while backward still runs
    layers = [{"name": f"l{i}", "fwd": 2 * MS, "bwd": 4 * MS, "params": 40_000_000} for i in range(8)]
    path = tmp_path / "w.json"
    workload = tiny_workload(layers, batch=8)
    for layer in workload["layers"]:  # matrix work: 8 x 3e10 FLOPs a pass on an A100, compute-bound
        layer["flops_forward_per_sample"], layer["flops_backward_per_sample"] = 1.5e10, 3e10
    path.write_text(json.dumps(workload))
    sc = scenario(tiny_topology(gpus=gpus), str(path), "ddp", 8 * gpus, comm_interference=interference)
    return Simulation(resolve(sc)).run()


def test_ddp_overlap_slows_the_backward_it_overlaps(tmp_path):
    on, off = _ddp(tmp_path, 2, True), _ddp(tmp_path, 2, False)
    assert on.iteration_times_s[0] > off.iteration_times_s[0] * 1.001
    assert on.breakdown_s["compute"] > off.breakdown_s["compute"] * 1.001
    # the longer backward hides more of the all-reduces: exposed communication does not grow
    assert on.breakdown_s["exposed_communication"] <= off.breakdown_s["exposed_communication"] + 1e-9
    # the layers overlapped are recorded at their actual times: one compute stream, no overlap on it
    compute = sorted((op.start, op.end) for op in on.machine.ops if op.resource == "gpu0" and
                     op.stream == "compute")
    assert all(b[0] >= a[1] - 1e-12 for a, b in zip(compute, compute[1:], strict=False))


def test_one_gpu_does_not_move(tmp_path):
    on, off = _ddp(tmp_path, 1, True), _ddp(tmp_path, 1, False)
    assert on.iteration_times_s == off.iteration_times_s and on.breakdown_s == off.breakdown_s


def test_back_to_back_pieces_walk_as_pieces_with_host_times_that_never_hold_them():
    seconds, loads = [1.0, 2.0, 0.0, 3.0], [MATRIX, STREAMING, MATRIX, (0.4, 0.7)]
    never = [float("-inf")] * 4
    fast, slow = Walk(0.0, seconds, loads), Walk(0.0, seconds, loads, ready=never, until=never)
    for now, state in ((0.5, (1.0, 0.0)), (2.2, (0.8, 0.5)), (4.0, (0.5, 0.9))):
        fast.advance(now, state)
        slow.advance(now, state)
        assert fast.end((0.9, 0.1)) == pytest.approx(slow.end((0.9, 0.1)))
    flat = [[t for span in walk.finish((0.9, 0.1)) for t in span] for walk in (fast, slow)]
    assert flat[0] == pytest.approx(flat[1]) and all(type(t) is float for t in flat[0] + flat[1])


def test_the_closed_form_agrees_with_the_simulated_overlap():
    s = (A100_SMS - 12) / A100_SMS
    end, ops = _overlapped_run(MATRIX, 12, 0.0)
    # the first kernel from 2 ms on: 8 ms of work that starts with the 4 ms collective
    assert 2 * MS + overlapped_seconds(8 * MS, 4 * MS, factor(MATRIX, (s, 0.0))) == pytest.approx(
        dict(ops)["forward"])
    assert overlapped_seconds(8.0, 100.0, 2.0) == 16.0  # all of it beside the collective
    assert overlapped_seconds(8.0, 4.0, 1.0) == 8.0


def test_compute_slows_the_collective_in_turn_where_hbm_runs_out():
    machine = build_machine(load_topology(tiny_topology(gpus=2)))
    machine.enable_interference(["gpu0"])
    env, contention = machine.env, machine.gpus["gpu0"].contention
    achievable = contention.hbm_bandwidth
    ends = {}

    def collective(demand):
        yield env.timeout(2 * MS)
        held = contention.hold(0, demand)
        mark = contention.lost
        yield env.timeout(4 * MS)  # its bytes at full rate
        yield from settle(env, [contention], [mark])
        contention.release(held)
        ends["collective"] = env.now

    def compute(load):
        yield from machine.run("gpu0", "compute", 20 * MS, op="forward", iteration=0, load=load)
        ends["compute"] = env.now

    env.process(compute(STREAMING))
    env.process(collective(0.5 * achievable))
    env.run()
    # both ask for 1.5 x what HBM gives: the collective's 4 ms take 6, the compute loses 2 ms of its 6
    assert ends["collective"] == pytest.approx(8 * MS)
    assert ends["compute"] == pytest.approx(22 * MS)
    # beside matrix work (no HBM demand to speak of) the collective keeps its time
    machine = build_machine(load_topology(tiny_topology(gpus=2)))
    machine.enable_interference(["gpu0"])
    env, contention = machine.env, machine.gpus["gpu0"].contention
    env.process(compute(MATRIX))
    env.process(collective(0.5 * achievable))
    env.run()
    assert ends["collective"] == pytest.approx(6 * MS) and ends["compute"] == pytest.approx(20 * MS)


def test_a_closed_form_reads_the_same_state_as_the_simulation():
    topo = load_topology("dgx-a100")
    fp = footprint(topo, "allreduce", topo.gpus, 25 * 2**20)
    machine = build_machine(topo)
    machine.enable_interference(topo.gpus)
    contention, device = machine.gpus[topo.gpus[0]].contention, machine.gpus[topo.gpus[0]].device
    contention.hold(fp.ctas, fp.demand)
    assert state_beside(device.sm_count, device.memory_bandwidth, fp.ctas, fp.demand) == pytest.approx(
        contention.state)


def test_every_gpu_preset_has_the_sm_count_the_model_needs():
    from trainsim.sim.core.devices import DEVICES

    gpus = [d for d in DEVICES.values() if d.kind == "gpu"]
    assert gpus and all(d.sm_count and d.sm_count > 0 for d in gpus), [d.name for d in gpus if not d.sm_count]


def test_hbm_is_counted_in_the_bandwidth_the_roofline_streams_at():
    from trainsim.sim.compute.roofline import DEFAULT_EFFICIENCY

    assert HBM_STREAM_FRACTION == DEFAULT_EFFICIENCY.memory
