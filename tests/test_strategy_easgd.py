"""`easgd`: the five variants, the co-design switches, staleness, bad input."""

import pytest

from trainsim.api import simulation
from trainsim.errors import TrainsimError
from trainsim.formats.scenario_loader import load_scenario
from trainsim.formats.workload import InputSpec, Layer, Provenance, TimeModel, Workload, save_workload
from trainsim.sim.compute.roofline import DEFAULT_EFFICIENCY
from trainsim.sim.strategies.easgd import sync_bytes_per_round, tree_order

LAYER_BYTES = 2_000_000  # fp32 weights per layer
LAYERS = 3
W = LAYERS * LAYER_BYTES
GBPS = 10.0
STREAMING = 900e9 * DEFAULT_EFFICIENCY.memory  # bytes/s an elementwise kernel reaches on a V100


def _workload(seconds: float) -> Workload:
    """LAYERS layers with weights, measured on V100 (``seconds`` forward and backward per sample each);
    no input bytes and a free local optimizer step, so only EASGD's own work remains."""
    return Workload(
        name="weights",
        input=InputSpec(shape=[1], dtype="uint8", bytes_per_sample=0),
        layers=[
            Layer(
                name=f"l{i}",
                kind="linear",
                param_bytes=LAYER_BYTES,
                saved_activation_bytes_per_sample=0,
                output_bytes_per_sample=0,
                flops_forward_per_sample=1,
                flops_backward_per_sample=2,
                memory_bytes_forward_per_sample=0,
                memory_bytes_backward_per_sample=0,
                forward=TimeModel(fit={"model": "affine", "a": seconds, "b": 0.0}),
                backward=TimeModel(fit={"model": "affine", "a": seconds, "b": 0.0}),
            )
            for i in range(LAYERS)
        ],
        optimizer_step=TimeModel(fit={"model": "affine", "a": 0.0, "b": 0.0}),
        provenance=Provenance(device="test", device_spec="v100-16gb"),
    )


def _topology(gpus: int = 4) -> dict:
    nodes = [
        {"name": "cpu0", "kind": "cpu", "cores": 8, "dram_bandwidth_gbps": 100},
        {"name": "sw0", "kind": "pcie_switch"},
    ]
    links = [{"a": "cpu0", "b": "sw0", "kind": "pcie", "bandwidth_gbps": GBPS, "latency_us": 0}]
    for i in range(gpus):
        nodes.append({"name": f"gpu{i}", "kind": "gpu", "spec": "v100", "memory_gib": 16})
        links.append({"a": "sw0", "b": f"gpu{i}", "kind": "pcie", "bandwidth_gbps": GBPS, "latency_us": 0})
    return {"schema": "trainsim.topology/1", "name": "one-switch", "nodes": nodes, "links": links}


@pytest.fixture
def run(tmp_path):
    def simulate(seconds: float = 0.0, gpus: int = 4, iterations: int = 2, **easgd):
        path = tmp_path / "w.json"
        save_workload(_workload(seconds), path)
        data = {
            "topology": _topology(gpus),
            "workload": str(path),
            "batch_size": gpus,
            "strategy": {"name": "easgd", "easgd": easgd},
            "iterations": iterations,
            "warmup_iterations": 1,
        }
        return simulation(load_scenario(data)).run()

    return simulate


def _sent_by_gpus(result) -> float:
    return sum(link.bytes for link in result.links if link.src.startswith("gpu"))


# ---- sync: volume and time by the formula ---------------------------------------------------------------


@pytest.mark.parametrize("tree", [True, False])
def test_sync_communication_volume_per_iteration_matches_the_formula(run, tree):
    result = run(variant="sync", centre="gpu", tree_reduce=tree, iterations=3)
    per_round = sync_bytes_per_round(4, W, centre_on_gpu=True)
    assert per_round == 2 * 3 * W  # W~ to 3 workers, 3 (partial) sums back
    assert _sent_by_gpus(result) == pytest.approx(result.iterations * per_round)


def test_tau_divides_the_volume(run):
    every = run(variant="sync", centre="gpu", iterations=4)
    fourth = run(variant="sync", centre="gpu", tau=4, iterations=3)  # 4 iterations in all: one exchange
    assert _sent_by_gpus(every) == pytest.approx(4 * sync_bytes_per_round(4, W, True))
    assert _sent_by_gpus(fourth) == pytest.approx(sync_bytes_per_round(4, W, True))


def test_tree_reduce_takes_log_p_rounds_linear_p_minus_1(run):
    beta = W / (GBPS * 1e9)  # one whole-model message on a free link
    add = 3 * W / STREAMING  # a memory-bound a = a + c (b - a) on the GPU
    tree = run(variant="sync", centre="gpu", tree_reduce=True).iteration_time_s
    linear = run(variant="sync", centre="gpu", tree_reduce=False).iteration_time_s
    # broadcast + reduce; the elastic update; a reduce-add per tree round (linear: per message); centre update
    assert tree == pytest.approx(2 * 2 * beta + add + 2 * add + add, rel=1e-9)
    assert linear == pytest.approx(2 * 3 * beta + add + 3 * add + add, rel=1e-9)


def test_flat_buffer_sends_one_message_instead_of_one_per_layer(run):
    flat = run(variant="sync", centre="gpu", flat_buffer=True)
    layered = run(variant="sync", centre="gpu", flat_buffer=False)
    assert _sent_by_gpus(flat) == pytest.approx(_sent_by_gpus(layered))
    assert layered.stats["flows"] - flat.stats["flows"] == (LAYERS - 1) * (flat.stats["flows"])
    assert layered.extra["easgd"]["messages_per_exchange"] == LAYERS


def test_weights_off_the_gpu_cross_pcie_every_iteration(run):
    on = run(variant="sync", centre="gpu", weights_on_gpu=True)
    off = run(variant="sync", centre="host", weights_on_gpu=False, tree_reduce=False)
    for result, expected in ((on, 0.0), (off, W)):
        ops = [op for op in result.machine.ops if op.iteration == 1]
        for name in ("h2d_weights", "d2h_weights"):
            per_gpu = {op.resource: op.nbytes for op in ops if op.op == name}
            assert sum(per_gpu.values()) == pytest.approx(4 * expected)


def test_overlap_hides_the_exchange_under_compute(run):
    plain = run(seconds=0.01, variant="sync", centre="gpu")
    hidden = run(seconds=0.01, variant="sync", centre="gpu", overlap=True)
    compute = 2 * LAYERS * 0.01
    assert hidden.iteration_time_s < plain.iteration_time_s
    assert hidden.iteration_time_s == pytest.approx(compute, rel=0.05)  # elastic updates still take the GPU


# ---- staleness ------------------------------------------------------------------------------------------


def test_sync_updates_are_never_stale(run):
    staleness = run(variant="sync", centre="gpu").extra["staleness"]
    assert staleness["max"] == 0 and staleness["updates"] == 4 * 3  # 4 workers x 3 exchanges


@pytest.mark.parametrize("variant", ["async", "async-momentum", "hogwild"])
def test_asynchronous_updates_are_stale_with_more_than_one_worker(run, variant):
    staleness = run(seconds=0.001, variant=variant, centre="host").extra["staleness"]
    assert staleness["updates"] == 4 * 3
    assert staleness["max"] > 0 and staleness["mean"] > 0
    single = run(seconds=0.001, gpus=1, variant=variant, centre="host").extra["staleness"]
    assert single["max"] == 0


def test_original_serves_round_robin_so_each_update_is_p_minus_1_stale(run):
    staleness = run(seconds=0.001, variant="original", centre="host", iterations=4).extra["staleness"]
    # the first round reads the initial centre: worker i sees i updates; then every update sees P - 1
    assert staleness["histogram"] == {"0": 1, "1": 1, "2": 1, "3": 1 + 4 * 4}


def _max_concurrent(result, op_name: str) -> int:
    points = sorted(
        (t, d) for op in result.machine.ops if op.op == op_name for t, d in ((op.start, 1), (op.end, -1))
    )
    level = peak = 0
    for _t, delta in sorted(points, key=lambda p: (p[0], p[1])):  # an end before a start at the same instant
        level += delta
        peak = max(peak, level)
    return peak


@pytest.mark.parametrize("variant, concurrent", [("original", 1), ("async", 1), ("hogwild", 4)])
def test_only_hogwild_updates_the_centre_concurrently(run, variant, concurrent):
    result = run(seconds=0.001, variant=variant, centre="host")
    assert _max_concurrent(result, "easgd_centre_update") == concurrent


# ---- bad input ------------------------------------------------------------------------------------------


def test_tree_reduce_belongs_to_sync():
    with pytest.raises(TrainsimError, match="tree_reduce applies to variant sync.*not variant async"):
        load_scenario(
            {
                "topology": "pcie-4gpu-gen3",
                "workload": "tiny-cnn",
                "batch_size": 8,
                "strategy": {"name": "easgd", "easgd": {"variant": "async", "tree_reduce": True}},
            }
        )


def test_sync_with_a_linear_reduce_is_fine(run):
    assert run(variant="sync", tree_reduce=False, centre="host").iteration_time_s > 0


def test_centre_gpu_must_be_one_of_the_ranks(run):
    with pytest.raises(TrainsimError, match="centre_gpu is 7 but the scenario has 4 GPUs"):
        run(variant="sync", centre="gpu", centre_gpu=7)


def test_easgd_options_with_another_strategy_are_rejected():
    with pytest.raises(
        TrainsimError, match="strategy.easgd applies to strategy easgd, not strategy.name ddp"
    ):
        load_scenario(
            {
                "topology": "pcie-4gpu-gen3",
                "workload": "tiny-cnn",
                "batch_size": 8,
                "strategy": {"name": "ddp", "easgd": {"variant": "sync"}},
            }
        )


def test_tree_order_spans_the_halves_first():
    assert tree_order(list(range(8))) == [0, 4, 2, 6, 1, 5, 3, 7]
    for n in range(1, 12):
        assert sorted(tree_order(list(range(n)))) == list(range(n))  # a permutation, root first
        assert tree_order(list(range(n)))[0] == 0


def test_sync_with_a_replicated_centre_is_one_all_reduce_and_two_local_updates(run):
    result = run(variant="sync", centre="replicated", iterations=2)
    ops = [op for op in result.machine.ops if op.iteration == 1]
    assert not [op for op in ops if op.op in ("easgd_broadcast", "easgd_reduce")]
    for gpu in ("gpu0", "gpu1", "gpu2", "gpu3"):
        mine = [op.op for op in ops if op.resource == gpu]
        assert mine.count("easgd_elastic_update") == 1 and mine.count("easgd_centre_update") == 1
        update = next(op for op in ops if op.resource == gpu and op.op == "easgd_centre_update")
        assert update.duration == pytest.approx(3 * W / STREAMING, rel=1e-9)  # read W~ and S, write W~
    assert result.extra["easgd"]["centre"] == "replicated"
    assert result.extra["staleness"]["max"] == 0
    reduces = [op for op in ops if op.op == "allreduce"]
    assert sorted(op.resource for op in reduces) == ["gpu0", "gpu1", "gpu2", "gpu3"]
    assert {op.nbytes for op in reduces} == {W}


def test_a_replicated_centre_is_for_sync_only(run):
    with pytest.raises(TrainsimError, match="centre replicated applies to variant sync"):
        run(variant="original", centre="replicated")
