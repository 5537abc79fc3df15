"""`trainsim calibrate profiler`: what torch.profiler costs the host per recorded event."""

import json

import pytest

torch = pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from trainsim.calibrate.measure.profiler_cost import measure_profiler_cost  # noqa: E402
from trainsim.cli import app  # noqa: E402
from trainsim.errors import TrainsimError  # noqa: E402

runner = CliRunner()


def test_the_cost_is_the_step_difference_over_the_events_recorded():
    cost = measure_profiler_cost("tiny-cnn", "cpu", batch=2, repeats=3, warmup=1)
    # every step records at least its ops: each layer's forward op, the loss, backward's nodes, the step
    assert cost.events_per_step > 20
    assert cost.untraced_host_s > 0 and cost.traced_host_s > 0
    difference = cost.traced_host_s - cost.untraced_host_s
    assert cost.per_event_s == pytest.approx(difference / cost.events_per_step)
    assert cost.to_dict()["model"] == "tiny-cnn" and cost.device == "cpu"


def test_the_events_counted_are_the_steps_host_events():
    small = measure_profiler_cost("tiny-cnn", "cpu", batch=2, repeats=3, warmup=1)
    large = measure_profiler_cost("tiny-cnn", "cpu", batch=8, repeats=3, warmup=1)
    assert small.events_per_step == pytest.approx(large.events_per_step, rel=0.05)   # ops, not samples


@pytest.mark.parametrize("kwargs, message", [
    ({"repeats": 2}, "repeats must be >= 3"),
    ({"batch": 0}, "batch must be >= 1"),
    ({"precision": "fp8"}, "unknown precision"),
    ({"warmup": -1}, "warmup must be >= 0"),
])
def test_bad_settings_are_named(kwargs, message):
    with pytest.raises(TrainsimError, match=message):
        measure_profiler_cost("tiny-cnn", "cpu", **kwargs)


def test_cli_prints_the_figure_replay_takes():
    result = runner.invoke(app, ["calibrate", "profiler", "tiny-cnn", "--device", "cpu", "--batch-size", "2",
                                 "--repeats", "3", "--warmup", "1"])
    assert result.exit_code == 0, result.output
    assert "cost per recorded event" in result.output
    assert "--set untraced=true --set profiler_event_us=" in result.output
    result = runner.invoke(app, ["calibrate", "profiler", "tiny-cnn", "--device", "cpu", "--batch-size", "2",
                                 "--repeats", "3", "--warmup", "1", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout[result.stdout.index("{"):])
    assert doc["events_per_step"] > 20 and "per_event_s" in doc


def test_cli_bad_model_one_line_exit_2():
    result = runner.invoke(app, ["calibrate", "profiler", "nosuch", "--device", "cpu"])
    assert result.exit_code == 2
    assert "unknown model 'nosuch'" in result.output and "Traceback" not in result.output


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_profiling_costs_the_host_per_event():
    cost = measure_profiler_cost("resnet18", "cuda", batch=8, repeats=10, warmup=3)
    # CUPTI's callback on every runtime call and the op records: dispatch is slower under the profiler
    assert cost.per_event_s > 0
    assert cost.events_per_step > 200          # ops and their runtime calls
