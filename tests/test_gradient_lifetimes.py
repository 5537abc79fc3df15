"""Parameter gradients live as the training loops keep them: from each layer's backward until the loop
lets them go with ``zero_grad(set_to_none=True)``, in dp-gpu0 (DataParallel), the parameter server and
EASGD too."""

import json

import pytest
from simtools import scenario as make_scenario
from simtools import tiny_topology, tiny_workload

from trainsim.api import simulate

LAYERS = [{"name": "a", "fwd": 0.01, "bwd": 0.02, "params": 4_000, "saved": 100_000},
          {"name": "b", "fwd": 0.01, "bwd": 0.02, "params": 8_000, "saved": 50_000}]
GRAD_BYTES = 4_000 + 8_000  # the layers' fp32 parameter bytes


def _grads(result, gpu: str):
    return [e for e in result.machine.gpus[gpu].memory.timeline if e.category == "grads"]


def _run(tmp_path, strategy: str, iterations: int = 2):
    wl = tmp_path / "wl.json"
    wl.write_text(json.dumps(tiny_workload(LAYERS, batch=8)))
    sc = make_scenario(tiny_topology(gpus=2), str(wl), strategy, 8)
    sc["iterations"], sc["warmup_iterations"] = iterations, 0
    return simulate(sc)


def _held(events, t: float) -> float:
    return sum(e.delta for e in events if e.time <= t)


@pytest.mark.parametrize("strategy", ["dp-gpu0", "parameter-server", "easgd"])
def test_no_gradient_outlives_its_iteration(tmp_path, strategy):
    result = _run(tmp_path, strategy)
    for gpu in ("gpu0", "gpu1"):
        events = _grads(result, gpu)
        allocs = [e for e in events if e.delta > 0]
        assert allocs and min(e.time for e in allocs) > 0  # none before the first backward
        assert sum(e.delta for e in allocs) == pytest.approx(2 * GRAD_BYTES)  # per layer, every iteration
        assert sum(e.delta for e in events) == pytest.approx(0.0)  # all freed by the end
        # never more than one iteration's gradients at once
        assert max(_held(events, e.time) for e in events) == pytest.approx(GRAD_BYTES)


def test_dataparallel_replicas_drop_their_gradients_once_summed_on_gpu0(tmp_path):
    result = _run(tmp_path, "dp-gpu0", iterations=1)
    replica_freed = max(e.time for e in _grads(result, "gpu1") if e.delta < 0)
    root_freed = max(e.time for e in _grads(result, "gpu0") if e.delta < 0)
    steps = [r for r in result.machine.ops if r.op == "optimizer" and r.resource == "gpu0"]
    assert len(steps) == 1
    # the replica's go at the reduce, before GPU0 steps; GPU0's at the step's zero_grad
    assert replica_freed <= steps[0].start < root_freed
    assert root_freed == pytest.approx(steps[0].end)


def test_parameter_server_ranks_drop_their_gradients_once_pushed(tmp_path):
    result = _run(tmp_path, "parameter-server", iterations=1)
    for gpu in ("gpu0", "gpu1"):
        freed = max(e.time for e in _grads(result, gpu) if e.delta < 0)
        push = [r for r in result.machine.ops if r.op == "push_grads" and r.resource == gpu]
        pull = [r for r in result.machine.ops if r.op == "pull_params" and r.resource == gpu]
        assert len(push) == len(pull) == 1
        assert freed == pytest.approx(push[0].end) and freed < pull[0].start


def test_easgd_backward_runs_layer_by_layer_with_its_activation_gradients(tmp_path):
    result = _run(tmp_path, "easgd", iterations=1)
    backward = [r for r in result.machine.ops if r.op == "backward" and r.resource == "gpu0"]
    assert [r.layer for r in backward] == ["b", "a"]
    memory = result.machine.gpus["gpu0"].memory.timeline
    assert any(e.category == "activation_grads" and e.delta > 0 for e in memory)
    # each layer's saved activations go when its own backward ends, not all at once after the pass
    freed = sorted(e.time for e in memory if e.category == "activations" and e.delta < 0)
    assert freed == pytest.approx(sorted(r.end for r in backward))
