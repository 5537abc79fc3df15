"""`spatial` / `hybrid`: halo bytes, halo/interior overlap, redistribution, reductions to single and ddp."""

import json
from fractions import Fraction

import pytest
from simtools import scenario as make_scenario
from simtools import stalls_per_call, tiny_topology
from typer.testing import CliRunner

from trainsim.api import simulate, simulation
from trainsim.cli import app
from trainsim.errors import TrainsimError
from trainsim.formats.workload import Workload
from trainsim.sim.hosts.call_latency import GlooCallLatency
from trainsim.sim.spatial.decomposition import boundary_fraction, halo_bytes, redistribution, trunk_end

F32 = 4


def conv(name, in_hw, c_in, c_out, k, params=0):
    """An analytic stride-1 'same' conv layer (no measured times: the roofline times it)."""
    flops = 2 * c_out * c_in * k * k * in_hw * in_hw
    return {
        "name": name,
        "kind": "conv2d",
        "param_bytes": params,
        "saved_activation_bytes_per_sample": c_in * in_hw * in_hw * F32,
        "output_bytes_per_sample": c_out * in_hw * in_hw * F32,
        "flops_forward_per_sample": flops,
        "flops_backward_per_sample": 2 * flops,
        "memory_bytes_forward_per_sample": (c_in + c_out) * in_hw * in_hw * F32,
        "memory_bytes_backward_per_sample": 2 * (c_in + c_out) * in_hw * in_hw * F32,
        "spatial": {
            "in_h": in_hw,
            "in_w": in_hw,
            "in_c": c_in,
            "out_c": c_out,
            "kernel_h": k,
            "kernel_w": k,
            "stride": 1,
            "padding": k // 2,
            "out_h": in_hw,
            "out_w": in_hw,
        },
    }


def workload(layers, tmp_path, name="convs"):
    data = {
        "schema": "trainsim.workload/1",
        "name": name,
        "dtype": "float32",
        "input": {"shape": [4, 8, 8], "dtype": "uint8", "bytes_per_sample": 256},
        "layers": layers,
        "provenance": {"device": "analytic"},
    }
    Workload.model_validate(data)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data))
    return str(path)


def spatial_scenario(topo, wl, strategy, batch, grid=None, **extra):
    sc = make_scenario(topo, wl, strategy, batch, **extra)
    if grid is not None:
        sc["strategy"]["grid"] = grid
    return sc


#: a link counts the bytes of its flows as rate x time over each stretch of fair sharing: the sum is exact
#: but for float rounding, which moves with the compute times that set where the stretches end
BYTES_REL = 1e-9


def link_bytes(result, name):
    return next((link.bytes for link in result.links if link.name == name), 0.0)


def test_halo_bytes_on_the_link_match_the_formula(tmp_path):
    # two convs, all trunk (no head: no redistribution), no parameters (no all-reduce): the NVLink between the
    # two GPUs carries only halos. Per direction and iteration, with N = 2 samples, a 2-way row split:
    # forward  N * C_in * (k//2) * edge * 4:  c1: 2*4*1*8*4 = 256,  c2: 2*8*2*8*4 = 1024
    # backward N * C_out * (k//2) * edge * 4: c2: 2*8*2*8*4 = 1024 (c1 is the first layer: no input gradient)
    wl = workload([conv("c1", 8, 4, 8, 3), conv("c2", 8, 8, 8, 5)], tmp_path)
    result = simulate(spatial_scenario(tiny_topology(gpus=2), wl, "spatial", 2, grid=[1, 2, 1], iterations=3))
    per_iteration = 256 + 1024 + 1024
    assert link_bytes(result, "gpu0->gpu1") == pytest.approx(3 * per_iteration, rel=BYTES_REL)
    assert link_bytes(result, "gpu1->gpu0") == pytest.approx(3 * per_iteration, rel=BYTES_REL)
    # 2*N*C*(k//2)*edge*bytes cross each boundary: both directions together
    c2 = Workload.model_validate(json.loads(open(wl).read())).layers[1]
    assert 2 * halo_bytes(c2, (1, 2, 1), 2, F32, "h", "forward") == 2 * 2 * 8 * 2 * 8 * F32
    assert result.extra["spatial"]["halo_bytes_per_iteration_rank0"] == per_iteration


def test_a_backward_sending_the_halo_rows_gradient_back_moves_the_forward_halos_bytes(tmp_path):
    # c2 widens 8 -> 16 channels: the output gradient's halo is twice the input's. Sent back the autograd way,
    # the backward halo is the received rows' gradient: N * C_in * (k//2) * edge * 4 = 2*8*2*8*4 = 1024
    wl = workload([conv("c1", 8, 4, 8, 3), conv("c2", 8, 8, 16, 5)], tmp_path)
    sc = spatial_scenario(tiny_topology(gpus=2), wl, "spatial", 2, grid=[1, 2, 1], iterations=3)
    output_gradient = 2 * 16 * 2 * 8 * F32
    assert simulate(sc).extra["spatial"]["halo_bytes_per_iteration_rank0"] == 256 + 1024 + output_gradient
    sc["strategy"]["backward_halo"] = "input-gradient"
    result = simulate(sc)
    assert result.extra["spatial"]["halo_bytes_per_iteration_rank0"] == 256 + 1024 + 1024
    assert link_bytes(result, "gpu0->gpu1") == pytest.approx(3 * (256 + 1024 + 1024), rel=BYTES_REL)


def test_the_halo_rows_gradient_goes_back_after_the_layer_and_the_layer_below_waits_for_it(tmp_path):
    # a slow switch: the returned gradient takes longer than anything else. c2's backward runs as soon as its
    # output gradient is there (nothing to wait for), then c1's backward waits for the neighbour's part
    wl = workload([conv("c1", 8, 4, 8, 3), conv("c2", 8, 8, 16, 5)], tmp_path)
    topo = tiny_topology(gpus=2, nvlink=False, pcie_gbps=0.001)
    sc = spatial_scenario(topo, wl, "spatial", 2, grid=[1, 2, 1])
    sc["strategy"].update(halo_overlap=False, backward_halo="input-gradient")
    gpu0 = [op for op in simulate(sc).machine.ops if op.resource == "gpu0" and op.iteration == 1]
    backward = {op.layer: op for op in gpu0 if op.op == "backward"}
    returned = 2 * 8 * 2 * 8 * F32 / (0.001 * 1e9)  # c2's input-gradient halo at the switch's rate
    assert backward["c1"].start - backward["c2"].end >= returned * (1 - 1e-9)
    forward_end = max(op.end for op in gpu0 if op.op == "forward")
    assert backward["c2"].start - forward_end < returned  # not held for a halo before it


def test_halo_along_width_and_on_a_2d_grid(tmp_path):
    data = json.loads(open(workload([conv("c1", 8, 4, 8, 3)], tmp_path)).read())
    layer = Workload.model_validate(data).layers[0]
    # a 2x2 grid: the slab is 4x4; a row halo spans the slab's width (4), a column halo its height (4)
    assert halo_bytes(layer, (1, 2, 2), 4, F32, "h", "forward") == 4 * 4 * 1 * 4 * F32
    assert halo_bytes(layer, (1, 2, 2), 4, F32, "w", "backward") == 4 * 8 * 1 * 4 * F32
    # a hybrid 2x2x1 grid: 2 local samples of a batch of 4
    assert halo_bytes(layer, (2, 2, 1), 4, F32, "h", "forward") == 2 * 4 * 1 * 8 * F32
    # boundary: 1 halo row of 4 local rows on a 2-way split; on a 2x2 grid, one row and one column of 4x4
    assert boundary_fraction(layer, (1, 2, 1), 2, 0) == pytest.approx(1 / 4)
    assert boundary_fraction(layer, (1, 2, 2), 4, 0) == pytest.approx(1 - 3 * 3 / 16)


def _forward_parts(result, gpu, layer, iteration):
    ops = [
        op
        for op in result.machine.ops
        if op.resource == gpu and op.op == "forward" and op.layer == layer and op.iteration == iteration
    ]
    return {op.args["part"]: op for op in ops}


@pytest.mark.parametrize("pcie_gbps", [0.001, 1000.0])
def test_halo_overlaps_the_interior_and_the_boundary_waits(tmp_path, pcie_gbps):
    # one conv, two GPUs joined only through a PCIe switch (no NVLink): a slow switch makes the halo the
    # longer branch, a fast one the interior; either way the layer takes max(interior, halo) + boundary
    wl = workload([conv("c1", 8, 4, 8, 3)], tmp_path)
    topo = tiny_topology(gpus=2, nvlink=False, pcie_gbps=pcie_gbps)
    result = simulate(spatial_scenario(topo, wl, "spatial", 2, grid=[1, 2, 1]))
    parts = _forward_parts(result, "gpu0", "c1", 1)
    interior, boundary = parts["interior"], parts["boundary"]
    halo = 2 * 4 * 1 * 8 * F32 / (pcie_gbps * 1e9)  # two PCIe hops through the switch, no latency
    whole = interior.duration + boundary.duration
    assert boundary.duration == pytest.approx(whole / 4, rel=1e-9)  # 1 of 4 local rows
    assert boundary.start - interior.start == pytest.approx(max(interior.duration, halo), rel=1e-9)
    assert (halo > interior.duration) == (pcie_gbps < 1)


def test_without_halo_overlap_the_whole_layer_waits_for_the_halo(tmp_path):
    # a slow switch: the halo takes longer than the interior; exchanged first, the layer runs after it whole
    wl = workload([conv("c1", 8, 4, 8, 3)], tmp_path)
    topo = tiny_topology(gpus=2, nvlink=False, pcie_gbps=0.001)
    sc = spatial_scenario(topo, wl, "spatial", 2, grid=[1, 2, 1])
    overlapped = simulate(sc)
    sc["strategy"]["halo_overlap"] = False
    blocking = simulate(sc)
    (whole,) = [op for op in blocking.machine.ops
                if op.resource == "gpu0" and op.op == "forward" and op.layer == "c1" and op.iteration == 1]
    halo = 2 * 4 * 1 * 8 * F32 / (0.001 * 1e9)
    before = [op for op in blocking.machine.ops if op.iteration == 1 and op.resource == "gpu0"]
    start = min(op.start for op in before)
    assert whole.start - start >= halo * (1 - 1e-9)
    interior = _forward_parts(overlapped, "gpu0", "c1", 1)["interior"]
    assert whole.duration == pytest.approx(interior.duration * 4 / 3, rel=1e-9)  # interior + boundary
    assert blocking.iteration_time_s > overlapped.iteration_time_s


def test_gathering_for_the_head_pays_the_measured_all_gather_latency(tmp_path):
    # tiny-cnn split by rows: the trunk's output is gathered for the classifier, an all-gather within the
    # group; where gloo calls have a measured cost, those messages pay the all-gather's, not a send's
    sc = spatial_scenario(tiny_topology(gpus=2, nvlink=False), "tiny-cnn", "spatial", 4, grid=[1, 2, 1])
    costs = []
    for allgather in (0.25, 0.5):
        sim = simulation(sc)
        sim.machine.latency = GlooCallLatency({"p2p": 0.01, "allgather": allgather})
        moves = [op for op in sim.run().machine.ops if op.op == "redistribute" and op.iteration == 1]
        assert moves
        costs.append(min(op.duration for op in moves))
    assert costs[0] >= 0.25 and costs[1] - costs[0] == pytest.approx(0.25, rel=1e-6)


def test_spatial_on_one_gpu_equals_single(tmp_path):
    topo = tiny_topology(gpus=1, nvlink=False)
    single = simulate(make_scenario(topo, "tiny-cnn", "single", 8, gpus=1))
    spatial = simulate(spatial_scenario(topo, "tiny-cnn", "spatial", 8, grid=[1, 1, 1], gpus=1))
    assert spatial.iteration_time_s == pytest.approx(single.iteration_time_s, rel=1e-12)
    assert spatial.gpus[0].memory_peak_bytes == pytest.approx(single.gpus[0].memory_peak_bytes, rel=1e-12)


def test_hybrid_samples_only_equals_ddp(tmp_path):
    # [2, 1, 1] is data parallelism: same slabs (whole samples), same buckets, same all-reduce, no halo
    topo = tiny_topology(gpus=2)
    ddp = simulate(make_scenario(topo, "tiny-cnn", "ddp", 8))
    hybrid = simulate(spatial_scenario(topo, "tiny-cnn", "hybrid", 8, grid=[2, 1, 1]))
    assert hybrid.iteration_time_s == pytest.approx(ddp.iteration_time_s, rel=1e-12)
    assert link_bytes(hybrid, "gpu0->gpu1") == pytest.approx(link_bytes(ddp, "gpu0->gpu1"), rel=1e-12)
    assert hybrid.extra["spatial"]["halo_bytes_per_iteration_rank0"] == 0


def most_held(result, category: str, gpu: str = "gpu0") -> float:
    """The most bytes of ``category`` held at once on ``gpu`` (the overall peak may fall elsewhere)."""
    held = most = 0.0
    for event in result.machine.gpus[gpu].memory.timeline:
        if event.category == category:
            held += event.delta
            most = max(most, held)
    return most


def test_spatial_split_halves_trunk_activations_and_gathers_the_head_input(tmp_path):
    topo = tiny_topology(gpus=2)
    spatial = simulate(spatial_scenario(topo, "tiny-cnn", "spatial", 2, grid=[1, 2, 1]))
    single = simulate(make_scenario(tiny_topology(gpus=1), "tiny-cnn", "single", 2, gpus=1))
    # tiny-cnn's saved bytes per sample: trunk conv1 3x32x32 + relu1 16x32x32 + pool1 indices 16x16x16 int64
    # + conv2 16x16x16 + relu2 32x16x16 + pool2 indices 32x8x8 int64; head fc 32x8x8 (fp32 unless int64)
    trunk = (3 * 32 * 32 + 16 * 32 * 32 + 16 * 16 * 16 * 2 + 16 * 16 * 16 + 32 * 16 * 16
             + 32 * 8 * 8 * 2) * F32
    # + the loss's log-softmax of 10 logits and int64 target per sample, and its fp32 total weight per batch
    head = 32 * 8 * 8 * F32 + 10 * F32 + 8
    assert most_held(single, "activations") == 2 * (trunk + head) + F32
    # each GPU holds half of each trunk activation of both samples; the head is replicated
    assert most_held(spatial, "activations") == 2 * (trunk / 2 + head) + F32
    # the head's input (pool2's output, 32x8x8 fp32 per sample, 2 samples) is gathered: each GPU receives
    # the half it lacks, going forward; the gradient going back is already where it is needed
    assert spatial.extra["spatial"]["redistribution_bytes_per_iteration"] == 2 * 32 * 8 * 8 * F32


def test_redistribution_by_hand():
    # rows split over 2 GPUs -> samples split over 2 GPUs: each GPU lacks a quarter of the tensor
    moves = redistribution((1, 2, 1), (2, 1, 1), 2)
    assert sorted(moves) == [(0, 1, Fraction(1, 4)), (1, 0, Fraction(1, 4))]
    # replicated (every GPU holds everything) -> split: nothing moves
    assert redistribution((1, 1, 1), (1, 2, 1), 2) == []
    # split -> replicated: an all-gather, each GPU receives the half it lacks
    assert sorted(redistribution((1, 2, 1), (1, 1, 1), 2)) == [(0, 1, Fraction(1, 2)), (1, 0, Fraction(1, 2))]
    # 2x2 grid -> 4-way samples on 4 GPUs: each GPU keeps its quarter of a quarter
    moves = redistribution((1, 2, 2), (4, 1, 1), 4)
    assert sum(share for _, _, share in moves) == Fraction(3, 4)


def test_trunk_ends_before_the_classifier():
    from trainsim.formats.workload import load_workload

    wl = load_workload("resnet50")
    assert wl.layers[trunk_end(wl)].name == "avgpool"
    tiny = load_workload("tiny-cnn")
    assert tiny.layers[trunk_end(tiny)].name == "fc"  # its last max-pool runs on the slabs too


@pytest.mark.parametrize(
    "strategy, grid, gpus, batch, message",
    [
        ("spatial", [1, 3, 1], 3, 3, "splits layer 'conv1' 3x1 but its output is 32x32"),
        ("hybrid", [2, 2, 1], 2, 4, "has 4 cells but the scenario runs on 2 GPUs"),
        ("hybrid", [2, 1, 1], 2, 3, "batch_size 3 does not divide into the 2 sample groups"),
        ("spatial", [2, 1, 1], 2, 2, "strategy spatial splits samples 1 way"),
        ("hybrid", None, 2, 2, "strategy hybrid needs strategy.grid"),
    ],
)
def test_bad_grids_are_one_line_naming_the_fields(strategy, grid, gpus, batch, message):
    topo = tiny_topology(gpus=3)
    sc = spatial_scenario(topo, "tiny-cnn", strategy, batch, grid=grid, gpus=gpus)
    with pytest.raises(TrainsimError, match="strategy.grid") as info:
        simulate(sc)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_a_head_layer_cannot_be_split_spatially():
    sc = spatial_scenario(tiny_topology(gpus=2), "tiny-cnn", "spatial", 2, grid=[1, 2, 1])
    sc["strategy"]["layer_grids"] = {"fc": [1, 2, 1]}
    with pytest.raises(TrainsimError, match="strategy.layer_grids.fc.*no spatial extent"):
        simulate(sc)


def test_cli_rejects_a_bad_split_in_one_line(tmp_path):
    import yaml

    sc = spatial_scenario(tiny_topology(gpus=3), "tiny-cnn", "spatial", 3, grid=[1, 3, 1], gpus=3)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(sc))
    result = CliRunner().invoke(app, ["simulate", str(path)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "conv1" in lines[0] and "strategy.grid" in lines[0] and "out_h" in lines[0]


def test_spatial_defaults_to_splitting_rows_over_all_gpus(tmp_path):
    topo = tiny_topology(gpus=2)
    default = simulate(spatial_scenario(topo, "tiny-cnn", "spatial", 2))
    rows = simulate(spatial_scenario(topo, "tiny-cnn", "spatial", 2, grid=[1, 2, 1]))
    assert default.iteration_time_s == rows.iteration_time_s
    assert default.extra["spatial"]["grids"][0]["grid"] == [1, 2, 1]


def test_symmetric_ranks_mirror_one_block_exactly():
    # two DGX-1 nodes; sample groups of 2 GPUs; with the all-reduce analytic, simulating node 0 alone and
    # mirroring it onto node 1 gives the same iteration as simulating all 16 GPUs
    cluster = {"generator": "cluster", "node": "dgx1-v100", "nodes": 2, "network": "ib", "generation": "edr"}
    results = []
    for symmetric in (False, True):
        sc = spatial_scenario(cluster, "tiny-cnn", "hybrid", 16, grid=[8, 1, 2])
        sc["strategy"].update(collectives="analytic", symmetric_ranks=symmetric)
        results.append(simulate(sc))
    full, mirrored = results
    assert mirrored.iteration_time_s == pytest.approx(full.iteration_time_s, rel=1e-12)
    assert (full.extra["spatial"]["simulated_ranks"], mirrored.extra["spatial"]["simulated_ranks"]) == (16, 8)


def test_symmetric_ranks_need_analytic_collectives():
    sc = spatial_scenario(tiny_topology(gpus=2), "tiny-cnn", "hybrid", 2, grid=[2, 1, 1])
    sc["strategy"]["symmetric_ranks"] = True
    with pytest.raises(TrainsimError, match="strategy.symmetric_ranks.*analytic"):
        simulate(sc)


@pytest.mark.parametrize("p2p", [True, False])
def test_a_halo_pays_the_measured_message_latency_once(tmp_path, p2p):
    # gloo on a calibrated CPU box: each halo message pays the send/recv latency instead of its route's links,
    # once per message, whether it goes peer to peer or is staged through host memory (two legs)
    wl = workload([conv("c1", 8, 4, 8, 3)], tmp_path)
    topo = tiny_topology(gpus=2, nvlink=False, pcie_gbps=1.0, p2p=p2p)
    sc = spatial_scenario(topo, wl, "spatial", 2, grid=[1, 2, 1])
    plain, gloo = simulation(sc), simulation(sc)
    gloo.machine.latency = GlooCallLatency({"p2p": 0.25})
    halos = [
        [op for op in s.run().machine.ops if op.stream == "p2p" and op.iteration == 1] for s in (plain, gloo)
    ]
    assert halos[0] and len(halos[0]) == len(halos[1])
    topology = plain.machine.topology
    for a, b in zip(halos[0], halos[1], strict=True):
        links = sum(topology.route_latency(leg) for leg in topology.gpu_copy_legs(a.resource, a.peer))
        assert b.duration - a.duration == pytest.approx(0.25 - links, rel=1e-9)


def test_a_halo_pays_the_measured_exchange_where_the_bundle_has_one(tmp_path):
    # both neighbours send and receive at once; gloo's measured swap is what each halo costs, the one-way
    # message's latency only where the bundle has no exchange (older bundles)
    wl = workload([conv("c1", 8, 4, 8, 3), conv("c2", 8, 8, 8, 3)], tmp_path)
    sc = spatial_scenario(tiny_topology(gpus=2, nvlink=False, pcie_gbps=1.0), wl, "spatial", 2,
                          grid=[1, 2, 1])
    costs = {}
    for name, calls in (("p2p", {"p2p": 0.25}), ("exchange", {"p2p": 0.25, "halo_exchange": 0.75})):
        sim = simulation(sc)
        sim.machine.latency = GlooCallLatency(calls)
        halos = [op for op in sim.run().machine.ops if op.op.startswith("halo_") and op.iteration == 1]
        assert {op.op for op in halos} == {"halo_forward", "halo_backward"}
        costs[name] = [op.duration for op in halos]
    assert len(costs["p2p"]) == len(costs["exchange"])
    for one_way, swap in zip(costs["p2p"], costs["exchange"], strict=True):
        assert swap - one_way == pytest.approx(0.5, rel=1e-9)


def test_both_neighbours_parts_of_one_halo_swap_stall_or_not_together(tmp_path):
    from trainsim.sim.hosts.call_latency import MeasuredLatency, TimerTick

    wl = workload([conv("c1", 8, 4, 8, 3), conv("c2", 8, 8, 8, 3)], tmp_path)
    sim = simulation(spatial_scenario(tiny_topology(gpus=2, nvlink=False, pcie_gbps=1.0), wl, "spatial", 2,
                                      grid=[1, 2, 1], iterations=30))
    # half of the measured swaps stalled; a stall waits for the 4 ms tick
    swap = MeasuredLatency((1e6,), ((1e-4,) * 5 + (5e-3,) * 5,))
    tick = TimerTick(4e-3, dead_time_s=1.5e-3)
    sim.machine.latency = GlooCallLatency({"halo_exchange": swap, "p2p": 1e-4}, tick)
    parts = stalls_per_call(sim.machine)
    sim.run()
    assert None not in parts and parts
    assert all(len(stalled) == 2 and len(set(stalled)) == 1 for stalled in parts.values())  # one call
    assert 0.2 < sum(stalled[0] for stalled in parts.values()) / len(parts) < 0.8
