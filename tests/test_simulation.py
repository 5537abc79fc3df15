"""The simulator on hand-computable cases: tiny machines and workloads with known times and bytes."""

import json
import statistics
from pathlib import Path

import pytest
import simpy
from simtools import scenario as make_scenario
from simtools import stalls_per_call, tiny_topology, tiny_workload

from trainsim.api import load_bundle, simulate, simulation
from trainsim.errors import TrainsimError
from trainsim.formats.bundle import RunMeasurements
from trainsim.resolve import bundle_call_latencies, bundle_timer_tick
from trainsim.sim.collectives.ops import run_collective
from trainsim.sim.compute.workspaces import training_workspace_bytes
from trainsim.sim.core.devices import get_device
from trainsim.sim.core.flows import FlowNetwork
from trainsim.sim.core.latency import CallSite
from trainsim.sim.core.machine import PAGEABLE_COPY_RATE
from trainsim.sim.simulation import build_machine
from trainsim.topologies import load_topology

#: the cuBLAS workspaces every training A100 holds (two matmul threads; sim/compute/workspaces.py)
WORKSPACES = training_workspace_bytes(get_device("a100"))

MB = 1e6


def write(tmp_path, data, name="wl.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def h2d_time(topo_dict, nbytes, flows_sharing=1):
    """Bytes over the PCIe path from cpu0's memory to gpu0; ``flows_sharing`` copies share the bottleneck."""
    topo = load_topology(topo_dict)
    route = topo.route(topo.host_memory("gpu0"), "gpu0")
    return flows_sharing * nbytes / topo.bottleneck(route) + topo.route_latency(route)


def allreduce_alone(topo_dict, nbytes, gpus=("gpu0", "gpu1")):
    """The time of one flow-level all-reduce on an idle machine."""
    env = simpy.Environment()
    topo = load_topology(topo_dict)
    net = FlowNetwork.from_topology(env, topo)
    env.process(run_collective(env, net, topo, "allreduce", list(gpus), nbytes))
    env.run()
    return env.now


LAYERS = [
    {"name": "a", "fwd": 0.010, "bwd": 0.020, "params": 4_000_000, "saved": 100_000},
    {"name": "b", "fwd": 0.005, "bwd": 0.007, "params": 40_000_000, "saved": 50_000},
    {"name": "c", "fwd": 0.001, "bwd": 0.003, "params": 0, "saved": 10_000},
]


def test_single_device_is_sum_of_layers_plus_input_plus_step(tmp_path):
    topo = tiny_topology(gpus=1, nvlink=False)
    wl = write(tmp_path, tiny_workload(LAYERS, batch=8, input_bytes=1_000_000, step_s=0.002))
    result = simulate(make_scenario(topo, wl, "single", 8))
    layers = sum(layer["fwd"] + layer["bwd"] for layer in LAYERS)
    expected = layers + h2d_time(topo, 8 * 1_000_000) + 0.002
    assert result.iteration_time_s == pytest.approx(expected, rel=1e-9)
    assert result.samples_per_s == pytest.approx(8 / expected, rel=1e-9)
    assert result.breakdown_s["compute"] == pytest.approx(layers + 0.002, rel=1e-9)
    assert result.breakdown_s["exposed_transfer"] == pytest.approx(h2d_time(topo, 8e6), rel=1e-9)


def test_memory_peak_is_params_grads_state_and_what_the_first_layer_backward_holds(tmp_path):
    topo = tiny_topology(gpus=1, nvlink=False)
    wl = write(tmp_path, tiny_workload(LAYERS, batch=8))
    result = simulate(make_scenario(topo, wl, "single", 8, optimizer={"name": "momentum"}))
    params = sum(layer["params"] for layer in LAYERS)
    # gradients exist from their layer's backward to the step's zero_grad(set_to_none=True); b's 40 MB of them
    # outweigh every activation, so the peak is at the first layer's backward: all gradients, a's saved
    # tensors, the input batch and the output the training loop still holds, and the gradient of a's output
    out = [8 * layer.get("output", 1000) for layer in LAYERS]  # the tiny workload's default output
    alive = 8 * LAYERS[0]["saved"] + 8 * 1_000_000 + out[-1]
    # fp32: weights 4 B, gradients 4 B, momentum 4 B per parameter -> 3 x the parameter bytes
    assert result.gpus[0].memory_peak_bytes == pytest.approx(3 * params + alive + out[0] + WORKSPACES,
                                                             rel=1e-12)
    at_peak = result.gpus[0].memory_at_peak
    assert at_peak["workspaces"] == WORKSPACES
    assert at_peak["activations"] + at_peak["input"] + at_peak["output"] == pytest.approx(alive)
    assert at_peak["activation_grads"] == pytest.approx(out[0])
    assert at_peak["params"] == at_peak["grads"] == at_peak["optimizer_state"] == pytest.approx(params)
    # after the step's zero_grad no gradient is held
    grads = [e for e in result.machine.gpus["gpu0"].memory.timeline if e.category == "grads"]
    assert sum(e.delta for e in grads) == pytest.approx(0.0)
    assert not result.oom


def test_the_loss_backward_makes_fp32_gradients_of_a_16_bit_output(tmp_path):
    # a head with a large output and no parameters: the peak is at the turn, as the loss's backward makes
    # two gradients of its input, the output cast to fp32 (``output.float()``), whatever the precision
    layers = [{"name": "a", "fwd": 0.01, "bwd": 0.02, "saved": 100_000},
              {"name": "head", "fwd": 0.01, "bwd": 0.02, "output": 1_000_000}]
    topo = tiny_topology(gpus=1, nvlink=False)
    wl = write(tmp_path, tiny_workload(layers, batch=8))
    result = simulate(make_scenario(topo, wl, "single", 8, precision="bf16"))
    saved, output_bf16, loss_input_fp32 = 8 * 100_000 / 2, 8 * 1_000_000 / 2, 8 * 1_000_000
    assert result.gpus[0].memory_peak_bytes == pytest.approx(8 * 1_000_000 + saved + output_bf16
                                                             + 2 * loss_input_fp32 + WORKSPACES, rel=1e-12)
    at_peak = result.gpus[0].memory_at_peak
    assert at_peak["activation_grads"] == pytest.approx(2 * loss_input_fp32)
    assert at_peak["output"] == pytest.approx(output_bf16)


def test_out_of_memory_is_a_result(tmp_path):
    topo = tiny_topology(gpus=1, nvlink=False, memory_gib=0.1)
    wl = write(
        tmp_path,
        tiny_workload(
            [{"name": "big", "fwd": 0.01, "bwd": 0.01, "params": 50_000_000, "saved": 1_000_000}], batch=64
        ),
    )
    result = simulate(make_scenario(topo, wl, "single", 64, optimizer={"name": "adam"}))
    assert result.gpus[0].oom
    [line] = result.oom
    # weights, grads, Adam's m and v; activations; the input; the cuBLAS workspaces
    needs = (50e6 * 4 + 64e6 + 64e6 + WORKSPACES) / 2**30
    assert line == f"gpu0 needs {needs:.2f} GiB, has 0.10 GiB"
    assert result.to_dict()["oom"] == [line]


def _ddp_layers(first_params, second_params, bwd_first):
    return [
        {"name": "first", "fwd": 0.004, "bwd": bwd_first, "params": first_params, "saved": 0},
        {"name": "last", "fwd": 0.003, "bwd": 0.005, "params": second_params, "saved": 0},
    ]


@pytest.mark.parametrize("bwd_first", [0.050, 0.0001])
def test_ddp_allreduce_overlapping_backward_gives_max_not_sum(tmp_path, bwd_first):
    # the last layer's gradients form the only bucket: their all-reduce overlaps the first layer's backward
    topo = tiny_topology(gpus=2)
    grads = 80_000_000
    wl = write(tmp_path, tiny_workload(_ddp_layers(0, grads, bwd_first), batch=4, input_bytes=250_000))
    result = simulate(make_scenario(topo, wl, "ddp", 8))
    allreduce = allreduce_alone(topo, grads)
    assert 0.0005 < allreduce < 0.05  # the two cases below really are on both sides of it
    head = h2d_time(topo, 4 * 250_000, flows_sharing=2) + 0.004 + 0.003 + 0.005
    expected = head + max(bwd_first, allreduce) + 0.002
    assert result.iteration_time_s == pytest.approx(expected, rel=1e-6)
    exposed = max(0.0, allreduce - bwd_first)
    assert result.breakdown_s["exposed_communication"] == pytest.approx(exposed, rel=1e-6, abs=1e-12)


def test_ddp_allreduce_after_backward_gives_the_serial_sum(tmp_path):
    # only the first layer has parameters: its bucket is ready when backward is over
    topo = tiny_topology(gpus=2)
    grads = 8_000_000
    wl = write(tmp_path, tiny_workload(_ddp_layers(grads, 0, 0.010), batch=4, input_bytes=250_000))
    result = simulate(make_scenario(topo, wl, "ddp", 8))
    compute = 0.004 + 0.003 + 0.005 + 0.010
    expected = h2d_time(topo, 1e6, flows_sharing=2) + compute + allreduce_alone(topo, grads) + 0.002
    assert result.iteration_time_s == pytest.approx(expected, rel=1e-6)


def _link_bytes(result, name):
    found = {link.name: link.bytes for link in result.links}
    return found.get(name, 0.0) / result.iterations


def test_dp_gpu0_moves_the_whole_batch_over_gpu0s_link_and_ddp_does_not(tmp_path):
    topo = tiny_topology(gpus=2)  # gpu0-gpu1 NVLink: peer copies and all-reduce go there, not over PCIe
    per_gpu_input = 4 * 250_000
    wl = write(tmp_path, tiny_workload(_ddp_layers(1_000_000, 1_000_000, 0.01), batch=4, input_bytes=250_000))
    dp = simulate(make_scenario(topo, wl, "dp-gpu0", 8))
    ddp = simulate(make_scenario(topo, wl, "ddp", 8))
    assert _link_bytes(dp, "sw0->gpu0") == pytest.approx(2 * per_gpu_input)
    assert _link_bytes(dp, "sw0->gpu1") == 0
    assert _link_bytes(ddp, "sw0->gpu0") == pytest.approx(per_gpu_input)
    assert _link_bytes(ddp, "sw0->gpu1") == pytest.approx(per_gpu_input)
    # and dp-gpu0 sends gpu1 its shard and the parameters over NVLink every iteration
    assert _link_bytes(dp, "gpu0->gpu1") >= per_gpu_input + 2_000_000


def test_parameter_server_pushes_gradients_to_host_memory(tmp_path):
    topo = tiny_topology(gpus=2, nvlink=False)
    grads = 4_000_000
    wl = write(tmp_path, tiny_workload(_ddp_layers(grads, 0, 0.01), batch=4, input_bytes=1000))
    result = simulate(make_scenario(topo, wl, "parameter-server", 8))
    # both ranks' gradients come up through the uplink into DRAM; the parameters go back down
    assert _link_bytes(result, "sw0->cpu0") == pytest.approx(2 * grads)
    assert _link_bytes(result, "cpu0->sw0") == pytest.approx(2 * grads + 2 * 4 * 1000)
    ops = {op.op for op in result.machine.ops}
    assert {"push_grads", "pull_params", "ps_update"} <= ops
    # no optimizer step on the GPUs, and the iteration includes push, update and pull
    assert "optimizer" not in ops
    assert result.breakdown_s["exposed_communication"] > 2 * grads / 10e9


def test_data_preparation_bound_iteration(tmp_path):
    topo = tiny_topology(gpus=1, nvlink=False)
    prep = 0.01  # 8 samples x 10 ms on one worker: 80 ms per batch, slower than the GPU
    wl = write(tmp_path, tiny_workload(LAYERS, batch=8, prep_s=prep))
    result = simulate(make_scenario(topo, wl, "single", 8, host={"data_workers": 1}, iterations=3))
    assert result.iteration_time_s == pytest.approx(8 * prep, rel=1e-9)
    assert result.breakdown_s["data_preparation"] > 0.01


def test_breakdown_adds_up(tmp_path):
    topo = tiny_topology(gpus=2, nvlink=False)
    wl = write(tmp_path, tiny_workload(_ddp_layers(8_000_000, 8_000_000, 0.001), batch=4, prep_s=0.001))
    for strategy in ("ddp", "dp-gpu0", "parameter-server"):
        result = simulate(make_scenario(topo, wl, strategy, 8))
        assert sum(result.breakdown_s.values()) == pytest.approx(result.iteration_time_s, rel=1e-9)
        assert all(v >= 0 for v in result.breakdown_s.values())


def test_shipped_scenario_runs_and_is_deterministic():
    a = simulate("ddp-resnet50-pcie-4gpu-gen3").to_dict()
    b = simulate("ddp-resnet50-pcie-4gpu-gen3").to_dict()
    a["stats"].pop("wall_s")
    b["stats"].pop("wall_s")
    assert a == b
    assert a["num_gpus"] == 4 and a["samples_per_s"] > 0


def test_bad_inputs_are_one_line_errors(tmp_path):
    topo = tiny_topology(gpus=2)
    wl = write(tmp_path, tiny_workload(LAYERS, batch=4))
    with pytest.raises(TrainsimError, match="does not divide over 2 GPUs"):
        simulation(make_scenario(topo, wl, "ddp", 7))
    with pytest.raises(TrainsimError, match="asks for 4 GPUs but topology 'tiny' has 2"):
        simulation(make_scenario(topo, wl, "ddp", 8, gpus=4))
    with pytest.raises(TrainsimError, match="GPU index 5 is out of range"):
        simulation(make_scenario(topo, wl, "ddp", 8, gpus=[0, 5]))


def test_ddp_resnet50_on_dgx_a100_is_within_2x_of_published_throughput():
    # NVIDIA DeepLearningExamples, PyTorch ResNet50 v1.5 README, "Training performance: NVIDIA DGX A100
    # (8x A100 80GB)": TF32, batch 256 per GPU, 8 GPUs: 7248 img/s. The analytic workload's layer times
    # come from an uncalibrated roofline (datasheet peaks, default efficiency), not trustworthy closer than
    # about 2x; see benchmarks/sanity_resnet50_a100.py for the justification and the scaling check.
    published = 7248.0
    result = simulate("ddp-resnet50-dgx-a100", overrides=["iterations=1"])
    assert result.precision == "tf32" and result.batch_size == 8 * 256 and len(result.gpus) == 8
    assert published / 2 <= result.samples_per_s <= published * 2


def test_three_call_api_and_pageable_input(tmp_path):
    topo = tiny_topology(gpus=1, nvlink=False, pcie_gbps=25.0)
    wl = write(tmp_path, tiny_workload(LAYERS, batch=8, input_bytes=10_000_000))
    machine = build_machine(load_topology(topo))
    pinned = simulation(make_scenario(topo, wl, "single", 8), machine=machine).run()
    pageable = simulate(make_scenario(topo, wl, "single", 8, host={"pinned": False}))
    # 80 MB: at the link's 25 GB/s when pinned, at one core's copy rate when pageable
    latency = h2d_time(topo, 0)
    assert pinned.breakdown_s["exposed_transfer"] == pytest.approx(80e6 / 25e9 + latency, rel=1e-9)
    expected = 80e6 / PAGEABLE_COPY_RATE + latency
    assert pageable.breakdown_s["exposed_transfer"] == pytest.approx(expected, rel=1e-9)
    staging = [op for op in pageable.machine.ops if op.op == "h2d_input_staging"]
    assert staging and all(op.resource == "cpu0" for op in staging)


def test_no_data_workers_puts_preparation_in_the_loop(tmp_path):
    # data_workers 0 (PyTorch num_workers=0): each batch is prepared when the loop asks, nothing overlaps,
    # so the iteration is preparation + the one-GPU iteration; with a worker it hides under compute
    topo = tiny_topology(gpus=1, nvlink=False)
    prep = 0.0005  # 8 samples: 4 ms per batch, shorter than the layers
    wl = write(tmp_path, tiny_workload(LAYERS, batch=8, prep_s=prep))
    inline = simulate(make_scenario(topo, wl, "single", 8, host={"data_workers": 0}, iterations=3))
    worker = simulate(make_scenario(topo, wl, "single", 8, host={"data_workers": 1}, iterations=3))
    assert inline.iteration_time_s == pytest.approx(worker.iteration_time_s + 8 * prep, rel=1e-9)
    assert inline.breakdown_s["data_preparation"] == pytest.approx(8 * prep, rel=1e-9)
    assert worker.breakdown_s["data_preparation"] == 0


def _complete_collectives(doc: dict) -> dict:
    """A trainsim.collectives/1 document from the fields a test cares about (the rest filled in)."""
    doc = json.loads(json.dumps(doc))
    doc.setdefault("schema", "trainsim.collectives/1")
    doc.setdefault("provenance", {})
    doc.setdefault("device", "cpu")
    doc.setdefault("world_size", 2)
    for record in doc.get("results", []):
        record.setdefault("ranks", 2)
        record.setdefault("backend", doc["backend"])
        record.setdefault("bus_factor", 1.0)
        record["points"] = [{"time_s": 1e-3, "spread_s": 0.0, "algbw_gbps": 1.0, "busbw_gbps": 1.0, **point}
                            for point in record.get("points", [])]
        fit = record.get("fit")
        if fit is not None:
            for key, value in (("alpha_s", fit["latency_us"] * 1e-6), ("beta_bytes_per_s", 1e9),
                               ("rel_rms", 0.0), ("points", 0)):
                fit.setdefault(key, value)
    tick = doc.get("timer_tick")
    if tick is not None:
        tick.setdefault("stalled_calls", 0)
        tick.setdefault("calls", 0)
    return doc


def _cpu_bundle(tmp_path, collectives: dict | None) -> str:
    """A calibration bundle of a 2-rank CPU box: ranks of spec ``cpu`` (machine.json's measured device)."""
    root = tmp_path / "bundle"
    root.mkdir(parents=True)
    topo = tiny_topology(gpus=2, nvlink=False)
    for node in topo["nodes"]:
        if node["kind"] == "gpu":
            node["spec"] = "cpu"
    (root / "meta.json").write_text(json.dumps({
        "schema": "trainsim.calibration/1", "provenance": {}, "config": {"device": "cpu"},
        "status": "complete", "steps_planned": []}))
    (root / "topology.yaml").write_text(json.dumps(topo))  # JSON is YAML
    workload = tiny_workload(LAYERS, batch=4, input_bytes=1_000_000, step_s=0.002, device_spec="cpu")
    (root / "workload-tiny-cnn.json").write_text(json.dumps(workload))
    spec = {"schema": "trainsim.device/1", "name": "cpu", "kind": "cpu", "peak_tflops": {"fp32": 0.1},
            "memory_bandwidth_gbps": 10.0, "memory_bytes": 2**34}
    cpu = {"cores": 2, "threads_per_rank": 1, "gemm_flops_per_core": 5e10,
           "memory_bandwidth_bytes_per_s": 1e10}
    (root / "machine.json").write_text(json.dumps({
        "schema": "trainsim.machine/1", "provenance": {}, "device": "cpu", "ranks": 2, "host": {}, "cpu": cpu,
        "device_spec": spec}))
    if collectives is not None:
        (root / "collectives.json").write_text(json.dumps(_complete_collectives(collectives)))
    return str(root)


def _send_recv(latency_us: float, backend: str = "gloo") -> dict:
    fit = {"model": "alpha_beta", "latency_us": latency_us, "bandwidth_gbps": 1.0}
    return {"backend": backend, "results": [{"collective": "all_reduce", "fit": {**fit, "latency_us": 9e3}},
                                            {"collective": "send_recv", "fit": fit}]}


def test_cpu_ranks_have_no_input_copy_and_pay_the_bundles_send_recv_latency(tmp_path):
    bundle = _cpu_bundle(tmp_path, _send_recv(1500.0))
    assert bundle_call_latencies(load_bundle(bundle)).get("p2p") == pytest.approx(1.5e-3)
    scenario = make_scenario(tiny_topology(gpus=1), "tiny-cnn", "single", 4, gpus=1)
    sim = simulation(scenario, calibration=bundle)
    assert sim.machine.latency.calls["p2p"] == pytest.approx(1.5e-3)
    result = sim.run()
    # a CPU rank's batch is already in its memory: layers and the step, no host-to-device copy
    layers = sum(layer["fwd"] + layer["bwd"] for layer in LAYERS)
    assert result.iteration_time_s == pytest.approx(layers + 0.002, rel=1e-9)
    assert not any(op.op == "h2d_input" for op in sim.machine.ops)
    # nor on a pipeline's first stage
    pipeline = make_scenario(tiny_topology(gpus=2), "tiny-cnn", "pipeline", 4)
    pipeline["strategy"]["pipeline"] = {"stages": 2, "micro_batches": 2, "schedule": "gpipe"}
    staged = simulation(pipeline, calibration=bundle)
    staged.run()
    assert any(op.op.startswith("send_") for op in staged.machine.ops)
    assert not any(op.op == "h2d_input" for op in staged.machine.ops)


def test_bundle_p2p_latency_only_from_a_gloo_send_recv_fit(tmp_path):
    assert bundle_call_latencies(load_bundle(_cpu_bundle(tmp_path / "none", None))) == {}  # no collectives
    nccl = load_bundle(_cpu_bundle(tmp_path / "nccl", _send_recv(20.0, "nccl")))
    assert bundle_call_latencies(nccl).get("p2p") is None
    old = _send_recv(1500.0)
    old["results"] = old["results"][:1]  # a bundle from before send/recv was measured
    assert bundle_call_latencies(load_bundle(_cpu_bundle(tmp_path / "old", old))).get("p2p") is None
    bad = _cpu_bundle(tmp_path / "bad", None)
    (tmp_path / "bad" / "bundle" / "collectives.json").write_text("{")
    with pytest.raises(TrainsimError, match="collectives.json.*not valid JSON"):
        load_bundle(bad)


def _gloo_calls(**latency_us) -> dict:
    results = [{"collective": name, "fit": {"model": "alpha_beta", "latency_us": us, "bandwidth_gbps": 1.0}}
               for name, us in latency_us.items()]
    return {"backend": "gloo", "results": results}


def test_bundle_call_latencies_name_the_simulators_ops(tmp_path):
    bundle = _cpu_bundle(tmp_path, _gloo_calls(all_reduce=2000.0, reduce=1800.0, broadcast=700.0,
                                               gather=600.0, scatter=400.0, send_recv=500.0,
                                               exchange=900.0))
    expected = {"allreduce": 2e-3, "reduce": 1.8e-3, "broadcast": 7e-4, "gather": 6e-4, "scatter": 4e-4,
                "p2p": 5e-4, "halo_exchange": 9e-4}
    assert bundle_call_latencies(load_bundle(bundle)) == pytest.approx(expected)
    assert bundle_call_latencies(load_bundle(_cpu_bundle(tmp_path / "nccl", _send_recv(20.0, "nccl")))) == {}


def _ops_of(sim, name):
    return [op for op in sim.machine.ops if op.op == name]


def test_a_measured_gloo_call_costs_the_mean_of_its_samples(tmp_path):
    from trainsim.sim.hosts.call_latency import MeasuredLatency

    fast, slow = 2e-4, 5e-3  # fast 8 times in 10, a 5 ms stall otherwise
    measured = _gloo_calls(all_reduce=1000.0)
    measured["results"][0]["fit"]["beta_bytes_per_s"] = 1e12
    measured["results"][0]["points"] = [{"bytes": 4096, "samples_s": [fast] * 8 + [slow] * 2}]
    mean = _gloo_calls(all_reduce=(0.8 * fast + 0.2 * slow) * 1e6)  # an old bundle: only the fit's alpha
    latency = bundle_call_latencies(load_bundle(_cpu_bundle(tmp_path / "samples", measured)))["allreduce"]
    assert isinstance(latency, MeasuredLatency)
    assert latency.mean(4096) == pytest.approx(0.8 * fast + 0.2 * slow, rel=1e-4)

    def run(calls, name):
        sim = simulation(make_scenario(tiny_topology(gpus=2), "tiny-cnn", "ddp", 8, iterations=4),
                         calibration=_cpu_bundle(tmp_path / name, calls))
        return sim.run().iteration_times_s

    # every call pays the samples' mean: the same steps as an alpha of that mean
    assert run(measured, "a") == pytest.approx(run(mean, "b"), rel=1e-6)

def test_where_stalls_wait_for_the_timer_tick_a_stalled_call_ends_on_one(tmp_path):
    from trainsim.sim.hosts.call_latency import TimerTick

    fast, slow = 2e-4, 5e-3  # fast 8 times in 10
    calls = _gloo_calls(all_reduce=1000.0)
    calls["results"][0]["fit"]["beta_bytes_per_s"] = 1e12
    calls["results"][0]["points"] = [{"bytes": 4096, "samples_s": [fast] * 8 + [slow] * 2}]
    calls["timer_tick"] = {"period_s": 4e-3, "offset_s": 2.5e-4, "dead_time_s": 1.5e-3, "stalled_calls": 40,
                           "calls": 100}
    bundle = _cpu_bundle(tmp_path, calls)
    assert bundle_timer_tick(load_bundle(bundle)) == TimerTick(4e-3, 2.5e-4, 1.5e-3)
    sim = simulation(make_scenario(tiny_topology(gpus=2), "tiny-cnn", "ddp", 8, iterations=200),
                     calibration=bundle)
    charged, charge = [], sim.machine.latency._charge

    def recorded(latency, nbytes, now, skew_s=None, key=None):
        charged.append((now, charge(latency, nbytes, now, skew_s, key), latency.wire_s(nbytes)))
        return charged[-1][1]

    sim.machine.latency._charge = recorded
    sim.run()
    stalled = [(start, paid, wire) for start, paid, wire in charged if paid > 1e-3]
    assert len(charged) >= 200 and 0.1 < len(stalled) / len(charged) < 0.3  # one in five, drawn
    for start, paid, wire in stalled:  # it ends on a tick, the first at least the dead time after it began
        ticks = (start + paid + wire - 2.5e-4) / 4e-3
        assert ticks == pytest.approx(round(ticks), abs=1e-6) and 1.5e-3 <= paid + wire < 1.5e-3 + 4e-3
    assert all(paid == pytest.approx(fast, rel=1e-3) for _, paid, _ in charged if paid <= 1e-3)
    # the same bundle without its tick: every call its mean
    del calls["timer_tick"]
    plain = simulation(make_scenario(tiny_topology(gpus=2), "tiny-cnn", "ddp", 8, iterations=2),
                       calibration=_cpu_bundle(tmp_path / "plain", calls))
    assert plain.machine.latency.tick is None
    costs = {plain.machine.latency.cost(CallSite("allreduce"), 4096, now=0.0) for _ in range(20)}
    assert len(costs) == 1 and costs.pop() == pytest.approx(0.8 * fast + 0.2 * slow, rel=1e-4)


def test_an_all_reduce_stalls_as_often_as_the_probe_s_calls_met_the_same_way(tmp_path):
    calls = _gloo_calls(all_reduce=1000.0)
    calls["results"][0]["fit"]["beta_bytes_per_s"] = 1e12
    calls["results"][0]["points"] = [{"bytes": 4096, "samples_s": [2e-4] * 8 + [5e-3] * 2}]
    tick = {"period_s": 4e-3, "offset_s": 2.5e-4, "dead_time_s": 1.5e-3, "stalled_calls": 40, "calls": 100,
            "together_s": 5e-5, "probe_bytes": 4096}

    def stalled_share(name: str, together: float, apart: float, options: dict) -> float:
        calls["timer_tick"] = {**tick, "stall_together": together, "stall_apart": apart}
        scenario = make_scenario(tiny_topology(gpus=2), "tiny-cnn", name, 8, iterations=40)
        scenario["strategy"].update(options)
        sim = simulation(scenario, calibration=_cpu_bundle(tmp_path / f"{name}{together}{apart}", calls))
        paid = []

        def recorded(latency, nbytes, now, skew_s=None, key=None, charge=sim.machine.latency._charge):
            paid.append((skew_s, charge(latency, nbytes, now, skew_s, key)))
            return paid[-1][1]

        sim.machine.latency._charge = recorded
        sim.run()
        assert paid and all(skew == 0.0 for skew, _ in paid)  # no jitter here: the ranks arrive at once
        return sum(cost > 1e-3 for _, cost in paid) / len(paid)

    easgd = {"easgd": {"variant": "sync", "tau": 1, "centre": "replicated"}}
    for name, options in (("ddp", {}), ("easgd", easgd)):
        assert stalled_share(name, 1.0, 0.0, options) == 1.0  # together: as the probe's together calls
        assert stalled_share(name, 0.0, 1.0, options) == 0.0


def test_every_rank_s_part_of_one_gloo_call_stalls_or_not_with_the_others(tmp_path):
    calls = _gloo_calls(reduce=1000.0, broadcast=500.0)
    for record in calls["results"]:
        record["fit"]["beta_bytes_per_s"] = 1e12
        record["points"] = [{"bytes": 4096, "samples_s": [2e-4] * 5 + [5e-3] * 5}]  # half of them stall
    calls["timer_tick"] = {"period_s": 4e-3, "offset_s": 2.5e-4, "dead_time_s": 1.5e-3, "stalled_calls": 40,
                           "calls": 100}
    sim = simulation(make_scenario(tiny_topology(gpus=2), "tiny-cnn", "parameter-server", 8, iterations=40),
                     calibration=_cpu_bundle(tmp_path, calls))
    parts = stalls_per_call(sim.machine)
    sim.run()
    assert None not in parts and len(parts) == 2 * sim.ctx.total_iterations  # a push and a pull a step
    assert all(len(stalled) == 2 and len(set(stalled)) == 1 for stalled in parts.values())  # both or neither
    assert 0.25 < sum(stalled[0] for stalled in parts.values()) / len(parts) < 0.75


def test_every_gloo_call_pays_its_own_measured_latency_once(tmp_path):
    calls = {"all_reduce": 3000.0, "reduce": 2000.0, "broadcast": 1000.0, "gather": 700.0, "scatter": 500.0}
    bundle = _cpu_bundle(tmp_path, _gloo_calls(**calls))
    plain = _cpu_bundle(tmp_path / "plain", None)

    def run(strategy, bundle_dir, **extra):
        sim = simulation(make_scenario(tiny_topology(gpus=2), "tiny-cnn", strategy, 8, iterations=2, **extra),
                         calibration=bundle_dir)
        return sim, sim.run()

    # DDP: its one bucket's all-reduce per iteration takes the all-reduce's latency longer
    (gloo, with_calls), (links, without) = run("ddp", bundle), run("ddp", plain)
    assert with_calls.iteration_time_s - without.iteration_time_s == pytest.approx(3e-3)
    assert len(_ops_of(gloo, "allreduce")) == len(_ops_of(links, "allreduce")) > 0
    # dp-gpu0: broadcast, then scatter (one blocking call after the other), gather, scatter, reduce
    sim, _ = run("dp-gpu0", bundle)
    paid = {name: min(op.end - op.start for op in _ops_of(sim, name))
            for name in ("broadcast_params", "scatter_input", "gather_outputs", "scatter_output_grads",
                         "reduce_grads")}
    for name, call in [("broadcast_params", 1e-3), ("scatter_input", 5e-4), ("gather_outputs", 7e-4),
                       ("scatter_output_grads", 5e-4), ("reduce_grads", 2e-3)]:
        assert paid[name] >= call
    first = _ops_of(sim, "broadcast_params")[0]
    assert _ops_of(sim, "scatter_input")[0].start >= first.end
    # parameter server: the push is a gloo reduce, the pull a broadcast
    sim, _ = run("parameter-server", bundle)
    assert min(op.end - op.start for op in _ops_of(sim, "push_grads")) >= 2e-3
    assert min(op.end - op.start for op in _ops_of(sim, "pull_params")) >= 1e-3


def test_calibrated_cpu_ranks_scatter_as_measured_and_wait_for_the_slowest(tmp_path):
    from trainsim.formats.provenance import IterationRecord, RankStepRecord
    from trainsim.formats.workload import load_workload

    def bundle(name, rank_step):
        root = Path(_cpu_bundle(tmp_path / name, _gloo_calls(all_reduce=100.0)))
        path = root / "workload-tiny-cnn.json"
        workload = load_workload(path)
        extra = {"iteration": IterationRecord(plain=[[4, 0.01]]),
                 "rank_step": RankStepRecord.model_validate(rank_step)}
        path.write_text(workload.model_copy(update={"provenance": workload.provenance.model_copy(
            update=extra)}).model_dump_json())
        return str(root)

    # the same step alone and together (scale 1): only the measured spread differs
    noisy = bundle("noisy", {"ranks": 2, "points": [[4, 0.01, 0.01, 0.2]]})
    steady = bundle("steady", {"ranks": 2, "points": [[4, 0.01, 0.01, 0.0]]})

    def run(strategy, gpus, calibration):
        scenario = make_scenario(tiny_topology(gpus=2), "tiny-cnn", strategy, 4 * gpus, gpus=gpus,
                                 iterations=40)
        sim = simulation(scenario, calibration=calibration)
        return sim, sim.run()

    sim, jittered = run("ddp", 2, noisy)
    spec = sim.ctx.settings.jitter_spec
    assert spec.sigma == pytest.approx(0.2) and spec.centre == "median"
    spread = max(jittered.iteration_times_s) - min(jittered.iteration_times_s)
    assert spread > 0.01 * jittered.iteration_time_s  # every iteration draws its passes afresh
    _, nominal = run("ddp", 2, steady)
    assert max(nominal.iteration_times_s) - min(nominal.iteration_times_s) < 1e-9
    # each synchronised step waits for the slower of two draws: the median step is above the nominal one
    assert statistics.median(jittered.iteration_times_s) > nominal.iteration_time_s
    # the same spread, shared by the ranks (the host's speed): they move together and nobody waits
    shared = bundle("shared", {"ranks": 2, "points": [[4, 0.01, 0.01, 0.2, None, None, None, 0.0]]})
    sim, together = run("ddp", 2, shared)
    spec = sim.ctx.settings.jitter_spec
    assert (spec.sigma, spec.common_sigma) == pytest.approx((0.0, 0.2))
    steps = together.iteration_times_s
    assert max(steps) - min(steps) > 0.01 * together.iteration_time_s
    ends = {}
    for op in sim.machine.ops:
        if op.op == "backward":
            ends.setdefault((op.iteration, op.layer), []).append(op.end)
    assert all(len(e) == 2 and max(e) - min(e) < 1e-12 for e in ends.values())  # both ranks' layers at once
    one, alone = run("single", 1, noisy)
    assert one.ctx.settings.jitter_spec is None  # one rank has nobody to wait for
    # a batch of 4 takes 0.4 ms longer in the loop than back to back, and x1.5 beside the other rank
    slow_data = bundle("data", {"ranks": 2, "points": [[4, 0.01, 0.01, 0.0, 0.002, 0.003, 0.0016]]})
    two = simulation(make_scenario(tiny_topology(gpus=2), "tiny-cnn", "ddp", 8, gpus=2),
                     calibration=slow_data, measurements=RunMeasurements(prep_s_per_sample=1e-4))
    assert two.ctx.settings.prep_s_per_sample == pytest.approx((1e-4 + 1e-4) * 1.5)
    single = simulation(make_scenario(tiny_topology(gpus=2), "tiny-cnn", "single", 4, gpus=1),
                        calibration=slow_data, measurements=RunMeasurements(prep_s_per_sample=1e-4))
    assert single.ctx.settings.prep_s_per_sample == pytest.approx(2e-4)
    # no pipeline given: the default one, as the rank's loop prepared it (2 ms per batch of 4 alone)
    default = simulation(make_scenario(tiny_topology(gpus=2), "tiny-cnn", "ddp", 8, gpus=2),
                         calibration=slow_data)
    assert default.ctx.settings.prep_s_per_sample == pytest.approx(0.002 / 4 * 1.5)
    assert max(alone.iteration_times_s) - min(alone.iteration_times_s) < 1e-9


def test_a_loader_thread_in_the_ranks_process_slows_both_as_measured(tmp_path):
    bundle = _cpu_bundle(tmp_path, None)
    overlap = {"step": 1.25, "prep": 1.5}

    def sim(**opts):
        scenario = make_scenario(tiny_topology(gpus=1), "tiny-cnn", "single", 4, gpus=1,
                                 host={"data_workers": 1}, **opts)
        return simulation(scenario, calibration=bundle,
                          measurements=RunMeasurements(prep_s_per_sample=1e-4, loader_overlap=overlap))

    plain, preloading = sim(), sim(optimizations={"preload": 1})
    assert plain.ctx.settings.prep_s_per_sample == pytest.approx(1e-4)  # no loader thread beside the loop
    assert preloading.ctx.settings.prep_s_per_sample == pytest.approx(1.5e-4)
    gpu = preloading.ranks[0]
    slowed, nominal = preloading.ctx.costs[gpu], plain.ctx.costs[gpu]
    assert slowed.forward_s == pytest.approx([f * 1.25 for f in nominal.forward_s])
    assert slowed.step_s == pytest.approx(nominal.step_s * 1.25)
