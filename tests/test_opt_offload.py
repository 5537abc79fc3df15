"""Activation offload (vDNN / Kim et al.) on hand-computable cases: memory saved, hidden vs stalled transfers,
the prefetch distance, contention-aware staggering and the combinations it rejects."""

import json

import pytest
import yaml
from simtools import scenario as make_scenario
from simtools import tiny_topology, tiny_workload
from typer.testing import CliRunner

from trainsim.api import simulate
from trainsim.cli import app
from trainsim.errors import TrainsimError
from trainsim.sim.optimizations.offload import offload_stall_s
from trainsim.topologies import load_topology

BATCH = 8
# layer a is offloaded; c saves more than a, and the gradients backward writes are smaller than c's saved
# tensors, so the peak without a sits at the turn (input + b + c)
LAYERS = [
    {"name": "a", "fwd": 0.010, "bwd": 0.020, "params": 40_000, "saved": 100_000},
    {"name": "b", "fwd": 0.005, "bwd": 0.007, "params": 400_000, "saved": 50_000},
    {"name": "c", "fwd": 0.001, "bwd": 0.003, "params": 0, "saved": 200_000},
]
A_BYTES = BATCH * 100_000


def write(tmp_path, data, name="wl.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def copy_time(topo_dict, nbytes, direction):
    topo = load_topology(topo_dict)
    host = topo.host_memory("gpu0")
    route = topo.route("gpu0", host) if direction == "d2h" else topo.route(host, "gpu0")
    return nbytes / topo.bottleneck(route) + topo.route_latency(route)


def run(tmp_path, topo, layers=LAYERS, strategy="single", batch=BATCH, **opts):
    wl = write(tmp_path, tiny_workload(layers, batch=BATCH, input_bytes=1000, step_s=0.002))
    return simulate(make_scenario(topo, wl, strategy, batch, optimizations=opts))


def test_offload_lowers_peak_by_offloaded_bytes_and_costs_nothing_when_hidden(tmp_path):
    topo = tiny_topology(gpus=1, nvlink=False, pcie_gbps=10)  # 0.8 MB: 80 us each way, hidden
    base = run(tmp_path, topo)
    off = run(tmp_path, topo, offload_activations=["a"])
    assert off.gpus[0].memory_peak_bytes == pytest.approx(base.gpus[0].memory_peak_bytes - A_BYTES)
    assert off.iteration_time_s == pytest.approx(base.iteration_time_s, rel=1e-12)
    assert offload_stall_s(off) == 0.0
    moved = [op for op in off.machine.ops if op.op in ("offload_activations", "prefetch_activations")]
    assert {op.layer for op in moved} == {"a"} and all(op.nbytes == A_BYTES for op in moved)
    # the memory timeline shows the copy-out freeing a's activations
    timeline = off.machine.gpus["gpu0"].memory.timeline
    frees = [e for e in timeline if e.category == "activations" and e.delta < 0]
    assert any(e.delta == pytest.approx(-A_BYTES) for e in frees)


def test_a_slow_link_stalls_forward_and_backward_by_the_uncovered_copy(tmp_path):
    topo = tiny_topology(gpus=1, nvlink=False, pcie_gbps=0.04)  # 0.8 MB: 20 ms each way
    base = run(tmp_path, topo)
    off = run(tmp_path, topo, offload_activations=["a"], prefetch_distance=1)
    d2h, h2d = copy_time(topo, A_BYTES, "d2h"), copy_time(topo, A_BYTES, "h2d")
    forward_wait = d2h - LAYERS[0]["fwd"]  # b waits for a's copy-out, which overlapped a's forward
    backward_stall = h2d - LAYERS[1]["bwd"]  # prefetched as b's backward starts, needed after it
    expected = base.iteration_time_s + forward_wait + backward_stall
    assert off.iteration_time_s == pytest.approx(expected, rel=1e-9)
    assert offload_stall_s(off) == pytest.approx(backward_stall, rel=1e-9)
    assert off.breakdown_s["exposed_transfer"] > base.breakdown_s["exposed_transfer"] + backward_stall * 0.99


@pytest.mark.parametrize("distance, hidden_under", [(0, 0.0), (1, 0.007), (2, 0.010)])
def test_prefetch_distance_k_hides_the_copy_under_k_layers_of_backward(tmp_path, distance, hidden_under):
    topo = tiny_topology(gpus=1, nvlink=False, pcie_gbps=0.04)
    off = run(tmp_path, topo, offload_activations=["a"], prefetch_distance=distance)
    h2d = copy_time(topo, A_BYTES, "h2d")
    assert offload_stall_s(off) == pytest.approx(h2d - hidden_under, rel=1e-9)


def test_auto_distance_is_the_smallest_that_hides_the_prefetch(tmp_path):
    topo = tiny_topology(gpus=1, nvlink=False, pcie_gbps=0.1)  # 8 ms: more than b's 7 ms, less than b + c
    assert offload_stall_s(run(tmp_path, topo, offload_activations=["a"], prefetch_distance=1)) > 0
    auto = run(tmp_path, topo, offload_activations=["a"], prefetch_distance="auto")
    assert auto.extra["offload"]["prefetch_distance"] == 2
    assert offload_stall_s(auto) == 0.0


CONTENDED = [
    {"name": "a", "fwd": 0.010, "bwd": 0.020, "params": 4_000_000, "saved": 1_000_000},
    {"name": "b", "fwd": 0.005, "bwd": 0.007, "params": 40_000_000, "saved": 500_000},
    {"name": "c", "fwd": 0.004, "bwd": 0.006, "params": 0, "saved": 2_000_000},
    {"name": "d", "fwd": 0.003, "bwd": 0.005, "params": 1000, "saved": 800_000},
]


@pytest.mark.parametrize("gbps", [0.5, 2, 10])
def test_contention_aware_staggering_is_never_slower(tmp_path, gbps):
    # two GPUs behind one switch whose uplink carries one GPU's link: their copies contend
    topo = tiny_topology(gpus=2, pcie_gbps=gbps, uplink_gbps=gbps)
    faster = 0
    for distance in (0, 1, 3):
        opts = {"offload_activations": "all", "prefetch_distance": distance}
        plain = run(tmp_path, topo, CONTENDED, "ddp", 2 * BATCH, **opts)
        staggered = run(tmp_path, topo, CONTENDED, "ddp", 2 * BATCH, contention_aware=True, **opts)
        # serialised copies pay their route latency (0.1 us on the DRAM edge) one after the other
        assert staggered.iteration_time_s <= plain.iteration_time_s + 1e-6
        assert offload_stall_s(staggered) <= offload_stall_s(plain) * (1 + 1e-12)
        faster += staggered.iteration_time_s < plain.iteration_time_s * (1 - 1e-6)
    assert faster >= 1  # the switch does something


def test_contention_aware_leaves_a_gpu_alone_on_its_link_unchanged(tmp_path):
    topo = tiny_topology(gpus=2, pcie_gbps=2, uplink_gbps=100)  # the uplink carries both at full speed
    opts = {"offload_activations": "all", "prefetch_distance": 1}
    plain = run(tmp_path, topo, CONTENDED, "ddp", 2 * BATCH, **opts)
    staggered = run(tmp_path, topo, CONTENDED, "ddp", 2 * BATCH, contention_aware=True, **opts)
    assert staggered.iteration_time_s == pytest.approx(plain.iteration_time_s, rel=1e-12)


def test_conv_policy_offloads_convolutions_and_their_inputs():
    from trainsim.formats.workload import load_workload
    from trainsim.sim.optimizations.offload import offloaded_layers

    wl = load_workload("vgg16")
    chosen = offloaded_layers(wl, "conv")
    convs = [i for i, layer in enumerate(wl.layers) if layer.kind.startswith("conv")]
    saves = [i for i, layer in enumerate(wl.layers) if layer.saved_activation_bytes_per_sample > 0]
    # every convolution that saves something, and the layer before it whose saved output is its input
    expected = {i for i in convs if i in saves} | {i - 1 for i in convs if i - 1 in saves}
    assert set(chosen) == expected and any(i not in convs for i in chosen)
    assert len(offloaded_layers(wl, "all")) > len(chosen)


# ---- bad input -----------------------------------------------------------------------------------------


def test_offload_beyond_host_memory_is_rejected_naming_both(tmp_path):
    topo = tiny_topology(gpus=1, nvlink=False)
    wl = write(tmp_path, tiny_workload(LAYERS, batch=BATCH))
    sc = make_scenario(topo, wl, "single", BATCH, optimizations={"offload_activations": "all"},
                       host={"memory_gib": 1e-4})
    with pytest.raises(TrainsimError, match=r"offload_activations.*host\.memory_gib"):
        simulate(sc)


@pytest.mark.parametrize(
    "strategy, extra, words",
    [
        ("ddp", {"optimizations": {"contention_aware": True}}, ["contention_aware", "offload_activations"]),
        ("ddp", {"optimizations": {"prefetch_distance": 3}}, ["prefetch_distance", "offload_activations"]),
        ("ddp", {"optimizations": {"offload_activations": "all"}, "host": {"memory_gib": 0}},
         ["offload_activations", "host.memory_gib"]),
        ("spatial", {"optimizations": {"offload_activations": "all"}}, ["offload_activations", "spatial"]),
        ("ddp", {"optimizations": {"offload_activations": ["nope"]}}, ["nope", "offload_activations"]),
        ("ddp", {"optimizations": {"offload_activations": "all"}, "host": {"memory_gib": 1e-6}},
         ["offload_activations", "host.memory_gib"]),
    ],
)
def test_bad_offload_input_is_one_line(tmp_path, strategy, extra, words):
    topo = tiny_topology(gpus=2)
    wl = write(tmp_path, tiny_workload(LAYERS, batch=BATCH))
    path = tmp_path / "bad.yaml"
    data = make_scenario(topo, wl, strategy, 2 * BATCH, **extra)
    if strategy == "spatial":
        data["strategy"]["grid"] = [1, 2, 1]
    path.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(app, ["simulate", str(path)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and all(word in lines[0] for word in words), result.output


def test_blocking_copies_add_the_whole_copy_to_each_pass(tmp_path):
    # torch save_on_cpu: the copy out follows the layer in the stream's order, the copy back comes when
    # backward reaches the layer; nothing overlaps, even where a copy engine would have hidden it
    topo = tiny_topology(gpus=1, nvlink=False, pcie_gbps=10)
    base = run(tmp_path, topo)
    overlapped = run(tmp_path, topo, offload_activations=["a"], prefetch_distance=0)
    blocking = run(tmp_path, topo, offload_activations="all", offload_copies="blocking", prefetch_distance=0)
    d2h, h2d = copy_time(topo, A_BYTES, "d2h"), copy_time(topo, A_BYTES, "h2d")
    assert overlapped.iteration_time_s == pytest.approx(base.iteration_time_s + h2d, rel=1e-9)
    # save_on_cpu offloads every layer that saves something: a, b and c
    moved = sum(op.duration for op in blocking.machine.ops
                if op.iteration == 1 and op.op in ("offload_activations", "prefetch_activations"))
    assert moved > d2h + h2d
    assert blocking.iteration_time_s == pytest.approx(base.iteration_time_s + moved, rel=1e-9)
    assert blocking.extra["offload"]["copies"] == "blocking"


def test_blocking_copies_refuse_a_prefetch_distance(tmp_path):
    topo = tiny_topology(gpus=1, nvlink=False, pcie_gbps=10)
    with pytest.raises(TrainsimError, match="blocking offload copies"):
        run(tmp_path, topo, offload_activations="all", offload_copies="blocking", prefetch_distance=2)
