"""`pipeline`: GPipe / 1F1B / message-driven schedules, optimizer-state offload, jitter, bad input."""

import pytest
from typer.testing import CliRunner

from trainsim.api import simulation
from trainsim.cli import app
from trainsim.errors import TrainsimError
from trainsim.formats.scenario_loader import load_scenario
from trainsim.formats.workload import InputSpec, Layer, Provenance, TimeModel, Workload, save_workload
from trainsim.sim.compute.costs import STATE_BYTES
from trainsim.sim.compute.workspaces import training_workspace_bytes
from trainsim.sim.core.devices import get_device
from trainsim.sim.hosts.call_latency import GlooCallLatency
from trainsim.sim.strategies.pipeline import balance, schedule_order

F, B = 1e-3, 2e-3  # seconds per sample, per layer
SAVED = 1000  # saved-activation bytes per sample, per layer
WORKSPACES = training_workspace_bytes(get_device("v100"))  # each stage's cuBLAS workspaces


def _workload(layers=8, *, params=0, out=0, f=F, b=B) -> Workload:
    """Uniform layers, measured (times exact at any batch) on the topology's V100s; no input, free step."""
    return Workload(
        name="uniform",
        input=InputSpec(shape=[1], dtype="uint8", bytes_per_sample=0),
        layers=[
            Layer(
                name=f"l{i}",
                kind="linear",
                param_bytes=params,
                saved_activation_bytes_per_sample=SAVED,
                output_bytes_per_sample=out,
                flops_forward_per_sample=1,
                flops_backward_per_sample=2,
                memory_bytes_forward_per_sample=0,
                memory_bytes_backward_per_sample=0,
                forward=TimeModel(fit={"model": "affine", "a": 0.0, "b": f}),
                backward=TimeModel(fit={"model": "affine", "a": 0.0, "b": b}),
            )
            for i in range(layers)
        ],
        optimizer_step=TimeModel(fit={"model": "affine", "a": 0.0, "b": 0.0}),
        provenance=Provenance(device="test", device_spec="v100-16gb"),
    )


def _topology(gpus=4, gbps=100.0, latency_us=0.0) -> dict:
    """GPUs on one PCIe switch, links without latency (free for the zero-byte messages of most cases)."""
    nodes = [
        {"name": "cpu0", "kind": "cpu", "cores": 8, "dram_bandwidth_gbps": 1e6},
        {"name": "sw0", "kind": "pcie_switch"},
    ]
    links = [{"a": "cpu0", "b": "sw0", "kind": "pcie", "bandwidth_gbps": gbps, "latency_us": latency_us}]
    for i in range(gpus):
        nodes.append({"name": f"gpu{i}", "kind": "gpu", "spec": "v100", "memory_gib": 16})
        links.append(
            {"a": "sw0", "b": f"gpu{i}", "kind": "pcie", "bandwidth_gbps": gbps, "latency_us": latency_us}
        )
    return {"schema": "trainsim.topology/1", "name": "one-switch", "nodes": nodes, "links": links}


@pytest.fixture
def workload_file(tmp_path):
    def make(**kwargs) -> str:
        path = tmp_path / f"w{len(list(tmp_path.iterdir()))}.json"
        save_workload(_workload(**kwargs), path)
        return str(path)

    return make


def _scenario(
    workload, *, stages=4, micro=8, schedule="1f1b", gpus=4, batch=None, topology=None, jitter=None, **top
):
    """A pipeline scenario; ``top``: other top-level fields (precision, optimizer, optimizations)."""
    strategy = {
        "name": "pipeline",
        "pipeline": {"stages": stages, "micro_batches": micro, "schedule": schedule},
    }
    if jitter is not None:
        strategy["jitter"] = jitter
    return load_scenario(
        {
            "topology": topology or _topology(gpus),
            "workload": workload,
            "strategy": strategy,
            "batch_size": batch or micro * (gpus // stages),
            "iterations": 2,
            "warmup_iterations": 1,
            **top,
        }
    )


def _run(*args, **kwargs):
    return simulation(_scenario(*args, **kwargs)).run()


# ---- schedules on the hand-computable case --------------------------------------------------------------


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "message-driven"])
def test_uniform_stages_on_free_links_take_m_plus_s_minus_1_slots(workload_file, schedule):
    S, M, layers = 4, 8, 8
    result = _run(workload_file(layers=layers), stages=S, micro=M, schedule=schedule)
    f_stage, b_stage = (layers // S) * F, (layers // S) * B  # micro-batch of one sample
    assert result.iteration_time_s == pytest.approx((M + S - 1) * (f_stage + b_stage), rel=1e-12)
    bubble = (S - 1) / (M + S - 1)
    for gpu in result.gpus:  # every stage computes M (f + b) of the (M + S - 1) (f + b)
        assert gpu.utilisation == pytest.approx(1 - bubble, rel=1e-9)
    assert result.extra["pipeline"]["ideal_bubble_fraction"] == pytest.approx(bubble, abs=1e-6)


def test_1f1b_keeps_fewer_micro_batches_in_flight_than_gpipe(workload_file):
    S, M = 4, 8
    path = workload_file()
    gpipe = _run(path, stages=S, micro=M, schedule="gpipe")
    one_f_one_b = _run(path, stages=S, micro=M, schedule="1f1b")
    assert one_f_one_b.iteration_time_s == pytest.approx(gpipe.iteration_time_s, rel=1e-12)
    per_micro_batch = 2 * SAVED  # two layers per stage, one sample per micro-batch
    for s in range(S):
        assert gpipe.gpus[s].memory_peak_bytes == M * per_micro_batch + WORKSPACES
        assert one_f_one_b.gpus[s].memory_peak_bytes == (S - s) * per_micro_batch + WORKSPACES


def test_gradients_live_from_a_stages_first_backward_to_its_step(workload_file):
    # GPipe, 4 stages of 2 layers, 8 micro-batches of one sample: every forward of an iteration runs before
    # any backward, so a stage holds no gradient while its forwards run; its first backward writes them (the
    # later ones accumulate) and zero_grad(set_to_none=True) frees them after the step
    S, M, P = 4, 8, 4000
    result = _run(workload_file(params=P), stages=S, micro=M, schedule="gpipe")
    f_stage, b_stage = 2 * F, 2 * B
    for s in range(S):
        events = [e for e in result.machine.gpus[f"gpu{s}"].memory.timeline if e.category == "grads"]
        assert [e.delta for e in events] == [2 * P, -2 * P] * 3  # a warm-up and two measured iterations
        first_backward_ends = (M + S - 1) * f_stage + (S - 1 - s) * b_stage + b_stage
        assert events[0].time == pytest.approx(first_backward_ends, rel=1e-12)
        # the peak: the weights, every micro-batch's activations and the gradients the first backward wrote
        assert result.gpus[s].memory_peak_bytes == pytest.approx(2 * P + M * 2 * SAVED + 2 * P + WORKSPACES,
                                                                 rel=1e-12)


def test_1f1b_order_bounds_micro_batches_in_flight():
    for s in range(4):
        order = schedule_order("1f1b", s, 4, 8)
        assert sorted(order) == sorted([("F", m) for m in range(8)] + [("B", m) for m in range(8)])
        in_flight = peak = 0
        for kind, _m in order:
            in_flight += 1 if kind == "F" else -1
            peak = max(peak, in_flight)
        assert peak == 4 - s


def test_message_driven_equals_1f1b_without_jitter_and_beats_it_with(workload_file):
    path = workload_file(layers=4)
    base = {"stages": 4, "micro": 4}
    assert _run(path, schedule="message-driven", **base).iteration_time_s == pytest.approx(
        _run(path, schedule="1f1b", **base).iteration_time_s, rel=1e-12
    )
    for seed in range(3):
        jitter = {"sigma": 0.3, "seed": seed}
        fixed = _run(path, schedule="1f1b", jitter=jitter, **base).iteration_time_s
        driven = _run(path, schedule="message-driven", jitter=jitter, **base).iteration_time_s
        assert driven < fixed


def test_jitter_is_reproducible_and_mean_preserving_in_kind(workload_file):
    path = workload_file()
    a = _run(path, jitter={"sigma": 0.2, "seed": 7}).iteration_time_s
    b = _run(path, jitter={"sigma": 0.2, "seed": 7}).iteration_time_s
    c = _run(path, jitter={"sigma": 0.2, "seed": 8}).iteration_time_s
    assert a == b and a != c


def test_non_blocking_sends_hide_transfers_that_blocking_ones_expose(workload_file):
    # 1 MB activations over 10 GB/s links: 0.1 ms per message, next to 2 ms / 4 ms of compute per stage
    path = workload_file(layers=4, out=1_000_000)
    topo = _topology(gbps=10)
    fixed = _run(path, stages=4, micro=8, schedule="1f1b", topology=topo).iteration_time_s
    driven = _run(path, stages=4, micro=8, schedule="message-driven", topology=topo).iteration_time_s
    free = (8 + 4 - 1) * (F + B)
    assert free < driven < fixed


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_a_fixed_schedule_that_does_not_wait_for_its_sends_hides_them(workload_file, schedule):
    path = workload_file(layers=4, out=1_000_000)
    topo = _topology(gbps=10)
    waiting = _run(path, stages=4, micro=8, schedule=schedule, topology=topo)
    sc = _scenario(path, stages=4, micro=8, schedule=schedule, topology=topo)
    sc.strategy.pipeline.blocking_sends = False
    going_on = simulation(sc).run()
    free = (8 + 4 - 1) * (F + B)
    assert free < going_on.iteration_time_s < waiting.iteration_time_s
    # the first stage's forwards follow each other with no gap: its sends run beside them
    forwards = sorted((op for op in going_on.machine.ops if op.resource == "gpu0" and op.op == "forward"
                       and op.iteration == 1), key=lambda op: op.start)
    if schedule == "gpipe":
        pairs = zip(forwards, forwards[1:], strict=False)
        assert all(b.start == pytest.approx(a.end, abs=1e-12) for a, b in pairs)


def test_activations_cross_the_links_between_stages(workload_file):
    out = 1000
    result = _run(workload_file(layers=4, out=out), stages=4, micro=8)
    moved = {link.name: link.bytes for link in result.links}
    its = result.iterations  # measured iterations
    # gpu1 sends micro-batch activations to gpu2 and gradients back to gpu0: 8 each per iteration
    assert moved["gpu1->sw0"] == pytest.approx(its * 2 * 8 * out)
    assert moved["gpu0->sw0"] == pytest.approx(its * 8 * out)  # the first stage sends no dL/dx


def test_data_parallel_replicas_all_reduce_each_stage(workload_file):
    params = 4000  # bytes per layer
    result = _run(workload_file(layers=4, params=params), stages=2, micro=4, gpus=4)
    allreduces = [op for op in result.machine.ops if op.op == "allreduce" and op.iteration == 1]
    groups = {tuple(sorted({o.resource for o in allreduces if o.layer == f"stage{s}"})) for s in range(2)}
    assert groups == {("gpu0", "gpu2"), ("gpu1", "gpu3")}
    assert {op.nbytes for op in allreduces} == {2 * params}


def test_offload_optimizer_state_moves_state_off_the_gpu(workload_file):
    params = 4 * 2**20  # fp32 bytes per layer: 1 Mi parameters
    path = workload_file(layers=4, params=params)
    common = dict(stages=2, micro=4, precision="fp16", optimizer={"name": "adam"})
    plain = _run(path, **common)
    chunk_mb = 2.0
    off = _run(path, **common, optimizations={"offload_optimizer_state": True, "offload_chunk_mb": chunk_mb})
    num_params = 2 * params / 4  # per stage
    state = num_params * (STATE_BYTES["adam"] + 4)  # m, v and the fp32 master copy: 12 bytes/param
    buffers = 2 * chunk_mb * 2**20
    for before, after in zip(plain.gpus, off.gpus, strict=True):
        assert before.memory_peak_bytes - after.memory_peak_bytes == pytest.approx(state - buffers)
        assert "optimizer_state" not in after.memory_at_peak
        model_state = after.memory_at_peak["params"] + after.memory_at_peak["grads"]
        assert model_state / num_params == pytest.approx(4)  # fp16 weights + fp16 gradients
        assert (
            before.memory_at_peak["params"]
            + before.memory_at_peak["grads"]
            + before.memory_at_peak["optimizer_state"]
        ) / num_params == pytest.approx(16)
    ops = [op for op in off.machine.ops if op.iteration == 1 and op.resource == "gpu0"]
    assert sum(op.nbytes for op in ops if op.op == "h2d_optimizer_state") == pytest.approx(state)
    assert sum(op.nbytes for op in ops if op.op == "d2h_optimizer_state") == pytest.approx(state)


def test_recompute_keeps_stage_inputs_and_reruns_the_forward(workload_file):
    S, M, layers, out = 4, 8, 8, 500
    path = workload_file(layers=layers, out=out)
    plain = simulation(_scenario(path, stages=S, micro=M)).run()
    sc = _scenario(path, stages=S, micro=M)
    sc.strategy.pipeline.recompute = True
    checkpointed = simulation(sc).run()
    f_stage, b_stage = (layers // S) * F, (layers // S) * B
    # backward reruns the stage's forward first: every slot is f + (f + b) (the 500-byte sends: ~5 ns each)
    assert checkpointed.iteration_time_s == pytest.approx((M + S - 1) * (2 * f_stage + b_stage), abs=1e-6)
    assert plain.iteration_time_s == pytest.approx((M + S - 1) * (f_stage + b_stage), abs=1e-6)
    stage_saved = (layers // S) * SAVED
    for s in range(S):
        kept = out if s > 0 else 0  # what the previous stage sent (the first stage's input is empty here)
        # 1F1B keeps S - s micro-batches in flight; only one micro-batch's activations live at a time
        assert checkpointed.gpus[s].memory_peak_bytes == (S - s) * kept + stage_saved + WORKSPACES
        assert plain.gpus[s].memory_peak_bytes == (S - s) * stage_saved + WORKSPACES
    assert checkpointed.extra["pipeline"]["recompute"] is True


def test_balance_splits_by_compute_time():
    assert balance([1, 1, 1, 1, 4], 2) == [4, 1]
    assert balance([1.0] * 8, 4) == [2, 2, 2, 2]
    assert balance([5, 1, 1, 1, 1, 1], 2) == [1, 5]
    with pytest.raises(ValueError):
        balance([1.0, 1.0], 3)


# ---- bad input ------------------------------------------------------------------------------------------


def test_stages_must_divide_the_gpus(workload_file):
    with pytest.raises(
        TrainsimError, match=r"strategy.pipeline.stages \(3\) does not divide the 4 GPUs.*gpus"
    ):
        _run(workload_file(), stages=3, micro=4, batch=4)


def test_more_stages_than_layers_is_rejected(workload_file):
    with pytest.raises(TrainsimError, match=r"stages \(4\) is more than the 2 layers.*workload"):
        _run(workload_file(layers=2), stages=4, micro=4)


def test_batch_must_split_into_micro_batches(workload_file):
    with pytest.raises(
        TrainsimError,
        match="does not divide over 2 data-parallel replicas x "
        r"strategy.pipeline.micro_batches \(4\)",
    ):
        _run(workload_file(), stages=2, micro=4, batch=12)


def test_options_of_another_strategy_are_rejected():
    base = {"topology": "pcie-4gpu-gen3", "workload": "tiny-cnn", "batch_size": 8}
    with pytest.raises(
        TrainsimError, match="strategy.pipeline applies to strategy pipeline, not strategy.name ddp"
    ):
        load_scenario({**base, "strategy": {"name": "ddp", "pipeline": {"stages": 2}}})
    with pytest.raises(TrainsimError, match="offload_optimizer_state is modelled for strategy.name single"):
        load_scenario(
            {**base, "strategy": {"name": "spatial"}, "optimizations": {"offload_optimizer_state": True}}
        )


def test_cli_rejects_a_bad_pipeline_in_one_line():
    result = CliRunner().invoke(
        app,
        [
            "simulate",
            "ddp-resnet50-pcie-4gpu-gen3",
            "--set",
            "strategy.name=pipeline",
            "--set",
            "strategy.pipeline.stages=3",
        ],
    )
    assert result.exit_code == 2
    assert "strategy.pipeline.stages (3) does not divide the 4 GPUs" in result.output
    assert "Traceback" not in result.output


def test_cli_simulates_a_pipeline_and_reports_it():
    result = CliRunner().invoke(
        app,
        [
            "simulate",
            "ddp-resnet50-pcie-4gpu-gen3",
            "--json",
            "--set",
            "strategy.name=pipeline",
            "--set",
            "strategy.pipeline.stages=2",
            "--set",
            "workload={name: tiny-cnn}",
            "--set",
            "batch_size=32",
        ],
    )
    assert result.exit_code == 0, result.output
    assert '"stages": 2' in result.output and '"data_parallel": 2' in result.output


def test_stage_messages_pay_the_measured_message_latency(workload_file):
    # 2 stages, 1 micro-batch: the activation and the gradient message are both on the critical path, each
    # paying the measured per-message latency (gloo send/recv on a calibrated CPU box) once
    sc = _scenario(workload_file(layers=4, out=1000), stages=2, micro=1, gpus=2, schedule="gpipe")
    plain, gloo = simulation(sc), simulation(sc)
    gloo.machine.latency = GlooCallLatency({"p2p": 0.25})
    results = [s.run() for s in (plain, gloo)]
    assert results[1].iteration_time_s - results[0].iteration_time_s == pytest.approx(2 * 0.25, rel=1e-9)
    sends = [[op.duration for op in r.machine.ops if op.op.startswith("send_") and op.iteration == 1]
             for r in results]
    assert len(sends[0]) == 2 and [b - a for a, b in zip(*sends, strict=True)] == pytest.approx([0.25, 0.25])
