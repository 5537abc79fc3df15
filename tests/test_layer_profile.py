"""Per-layer timing on the CPU (CUDA when present), memory limits, bad input, the `calibrate layers` CLI."""

import json

import pytest

torch = pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from trainsim.calibrate.measure import layer_profile  # noqa: E402
from trainsim.calibrate.measure.layer_profile import profile_layers, resolve_device, training_bytes  # noqa: E402
from trainsim.cli import app  # noqa: E402
from trainsim.errors import TrainsimError  # noqa: E402
from trainsim.formats.workload import load_workload, save_workload  # noqa: E402

FAST = dict(repeats=3, warmup=1, threads=1, prep_samples=8)


@pytest.fixture(scope="module")
def tiny():
    return profile_layers("tiny-cnn", "cpu", [2, 4], **FAST)


def test_every_layer_timed_at_every_batch(tiny):
    names = ["conv1", "relu1", "pool1", "conv2", "relu2", "pool2", "fc"]
    assert [layer.name for layer in tiny.layers] == names
    for layer in tiny.layers:
        for model in (layer.forward, layer.backward):
            assert [p[0] for p in model.points] == [2, 4]
            assert all(t > 0 and spread >= 0 for _, t, spread in model.points)
            assert model.fit["model"] == "affine"
    # the first conv's backward (weight gradient only) is measured, not lost to a full-backward-hook pitfall
    conv1 = tiny.layer("conv1")
    assert min(t for _, t, _ in conv1.backward.points) > layer_profile.MIN_TIME_S
    assert [p[0] for p in tiny.optimizer_step.points] == [2, 4]
    assert tiny.measured


def test_iteration_is_accounted_for(tiny):
    it = tiny.provenance.iteration
    for p, layer_sum, opt_step, rest_of in zip(it.plain, it.layers_sum, it.optimizer, it.unattributed,
                                              strict=True):
        b, plain, layers, opt, rest = p.batch, p.s, layer_sum.s, opt_step.s, rest_of.s
        assert layers + opt + rest == pytest.approx(plain, rel=1e-9, abs=1e-12)
        assert layers > 0 and opt > 0
        summed = sum(layer.forward.at(b) + layer.backward.at(b) for layer in tiny.layers)
        assert summed == pytest.approx(layers, rel=1e-6)


def test_the_host_side_is_recorded_and_on_the_cpu_is_the_same_clock(tiny):
    it = tiny.provenance.iteration
    assert [p.batch for p in it.plain_host] == [p.batch for p in it.layers_host_sum] == [2, 4]
    # on the CPU ops run as they are dispatched: the host's perf_counter spans the same work as the clock,
    # less the marks' own cost
    for host, plain in zip(it.plain_host, it.plain, strict=True):
        assert 0 < host.s <= plain.s
        assert host.s == pytest.approx(plain.s, rel=0.05)
    for host, layers in zip(it.layers_host_sum, it.layers_sum, strict=True):
        assert 0 < host.s <= layers.s
    per_layer = tiny.provenance.layer_host_s
    assert sorted(per_layer) == ["backward", "forward"]
    for layer in tiny.layers:
        for phase, model in (("forward", layer.forward), ("backward", layer.backward)):
            points = per_layer[phase][layer.name]
            assert [p[0] for p in points] == [2, 4]
            for (_, host, spread), (_, clock, _) in zip(points, model.points, strict=True):
                assert 0 < host <= clock and spread >= 0
    assert sum(host for phase in per_layer.values() for points in phase.values()
               for b, host, _ in points if b == 4) == pytest.approx(it.layers_host_sum[1].s, rel=1e-9)


def test_provenance_and_input(tiny):
    prov = tiny.provenance.model_extra
    assert tiny.provenance.device_spec == "cpu"
    assert prov["threads"] == 1 and prov["cores_available"] >= 1
    assert prov["batch_sizes_measured"] == [2, 4] and prov["largest_batch_that_fits"] == 4
    assert prov["optimizer"]["name"] == "sgd"
    assert tiny.input.prep_s_per_sample > 0 and tiny.input.bytes_per_sample == 3 * 32 * 32 * 4  # float32


def test_static_fields_are_describes(tiny):
    from trainsim.calibrate.measure.describe import describe

    analytic = describe("tiny-cnn")
    for measured, static in zip(tiny.layers, analytic.layers, strict=True):
        assert measured.model_copy(update={"forward": None, "backward": None}) == static


def test_round_trip(tiny, tmp_path):
    path = save_workload(tiny, tmp_path / "w.json")
    assert load_workload(str(path)) == tiny


def test_threads_restored():
    before = torch.get_num_threads()
    profile_layers("tiny-cnn", "cpu", [1], repeats=1, warmup=0, threads=1, prep_samples=0)
    assert torch.get_num_threads() == before


def test_batch_that_does_not_fit_is_skipped(monkeypatch):
    static = layer_profile.describe_layers("tiny-cnn")
    # memory for batch 2 but not for batch 64
    budget = (training_bytes(static, 2) + training_bytes(static, 64)) / 2 / layer_profile.CPU_MEMORY_FRACTION
    monkeypatch.setattr(layer_profile, "memory_available_bytes", lambda: budget)
    wl = profile_layers("tiny-cnn", "cpu", [2, 64, 128], repeats=1, warmup=0, threads=1, prep_samples=0)
    prov = wl.provenance.model_extra
    assert prov["batch_sizes_measured"] == [2] and prov["largest_batch_that_fits"] == 2
    assert [s.batch for s in wl.provenance.skipped] == [64, 128]
    assert "GiB" in wl.provenance.skipped[0].reason
    monkeypatch.setattr(layer_profile, "memory_available_bytes", lambda: 1000)
    with pytest.raises(TrainsimError, match="no batch size fits"):
        profile_layers("tiny-cnn", "cpu", [2], repeats=1, warmup=0, prep_samples=0)


def test_out_of_memory_during_a_run_is_skipped(monkeypatch):
    real = layer_profile._measure_batch

    def flaky(model, optimizer, name, batch, *args, **kwargs):
        if batch > 2:
            raise MemoryError("simulated")
        return real(model, optimizer, name, batch, *args, **kwargs)

    monkeypatch.setattr(layer_profile, "_measure_batch", flaky)
    wl = profile_layers("tiny-cnn", "cpu", [2, 3, 4], repeats=1, warmup=0, threads=1, prep_samples=0)
    skipped = wl.provenance.skipped
    assert [s.batch for s in skipped] == [3, 4] and "out of memory" in skipped[0].reason


def test_is_oom():
    assert layer_profile._is_oom(MemoryError())
    assert layer_profile._is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert layer_profile._is_oom(RuntimeError("DefaultCPUAllocator: can't allocate memory"))
    assert not layer_profile._is_oom(RuntimeError("shape mismatch"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_gpu_is_an_error():
    with pytest.raises(TrainsimError, match="no CUDA GPU") as exc:
        resolve_device("cuda")
    assert exc.value.field == "device"
    assert resolve_device("auto").type == "cpu"


@pytest.mark.parametrize("kwargs, field", [
    ({"device": "tpu"}, "device"),
    ({"batch_sizes": []}, "batch_sizes"),
    ({"batch_sizes": [0]}, "batch_sizes"),
    ({"repeats": 0}, "repeats"),
    ({"optimizer": "lion"}, "optimizer"),
    ({"threads": 0}, "threads"),
])
def test_bad_input_names_the_field(kwargs, field):
    args = {"device": "cpu", "batch_sizes": [2], **kwargs}
    with pytest.raises(TrainsimError) as exc:
        profile_layers("tiny-cnn", **args)
    assert exc.value.field == field


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_profile_with_events():
    wl = profile_layers("tiny-cnn", "cuda", [8, 32], repeats=5, warmup=2, prep_samples=8)
    prov = wl.provenance.model_extra
    assert prov["torch_device"].startswith("cuda") and "CUDA events" in prov["timing"]
    assert all(peak > 0 for _, peak in prov["peak_memory_bytes"])
    assert all(t > 0 for layer in wl.layers for _, t, _ in layer.forward.points)
    # the host's dispatch is recorded beside the GPU's time, and the workspace configuration the run had
    it = wl.provenance.iteration
    assert [p.batch for p in it.plain_host] == [8, 32] and all(p.s > 0 for p in it.plain_host)
    assert all(p.s > 0 for p in it.layers_host_sum)
    assert "cublas_workspace_config" in prov


def test_kernel_timing_reads_each_layer_from_its_profiler_ranges():
    wl = profile_layers("tiny-cnn", "cpu", [2], repeats=2, warmup=1, threads=1, prep_samples=0,
                        timing="kernels")
    assert "torch.profiler" in wl.provenance.model_extra["timing"]
    # forward on the calling thread and backward in the autograd engine: every layer has both, and the
    # convolutions' and the linear layer's weight gradients are work of their own
    for layer in wl.layers:
        assert layer.forward.at(2) > layer_profile.MIN_TIME_S, layer.name
        if layer.kind in ("conv2d", "linear"):
            assert layer.backward.at(2) > layer_profile.MIN_TIME_S, layer.name
    assert wl.optimizer_step.at(2) > layer_profile.MIN_TIME_S
    it = wl.provenance.iteration
    # the accounting identity holds whatever the timing: layers + optimizer + unattributed = plain
    total = it.layers_sum[0].s + it.optimizer[0].s + it.unattributed[0].s
    assert total == pytest.approx(it.plain[0].s, rel=1e-9)


class _Event:
    def __init__(self, name, cpu_us, device_us):
        self.name, self.cpu_time_total, self.device_time_total = name, cpu_us, device_us


def test_range_totals_sum_a_layers_ranges_and_ignore_other_events():
    events = [_Event("trainsim::forward::blocks.0.attn", 30.0, 12.0),
              _Event("trainsim::backward::blocks.0.attn", 50.0, 20.0),
              _Event("trainsim::backward::blocks.0.attn", 10.0, 4.0),  # a second autograd node
              _Event("aten::mm", 25.0, 10.0), _Event("trainsim::optimizer::step", 7.0, 3.0)]
    on_gpu = layer_profile.range_totals(events, "cuda")
    assert on_gpu == pytest.approx({("forward", "blocks.0.attn"): 12e-6, ("backward", "blocks.0.attn"): 24e-6,
                                    ("optimizer", "step"): 3e-6})
    assert layer_profile.range_totals(events, "cpu")[("backward", "blocks.0.attn")] == pytest.approx(60e-6)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_kernel_timing_leaves_launch_gaps_unattributed():
    # batch 1: a host-bound step, where CUDA events between hooks would count the GPU's idle time
    wl = profile_layers("tiny-cnn", "cuda", [1], repeats=5, warmup=2, prep_samples=0, timing="kernels")
    assert "CUDA kernel time" in wl.provenance.model_extra["timing"]
    it = wl.provenance.iteration
    assert all(layer.forward.at(1) > layer_profile.MIN_TIME_S for layer in wl.layers)
    assert it.layers_sum[0].s <= it.hooked[0].s and it.unattributed[0].s > 0


runner = CliRunner()


def test_cli_layers_refuses_an_unknown_timing_or_precision():
    for option, value in (("--layer-timing", "events"), ("--precision", "fp8")):
        result = runner.invoke(app, ["calibrate", "layers", "tiny-cnn", "--device", "cpu", option, value])
        assert result.exit_code == 2
        assert result.output.strip().splitlines()[-1].startswith(f"error: {option}: unknown")


def test_cli_layers_json(tmp_path):
    out = tmp_path / "tiny.json"
    result = runner.invoke(app, ["calibrate", "layers", "tiny-cnn", "--device", "cpu", "--batch-sizes", "2",
                                 "--repeats", "2", "--warmup", "0", "--threads", "1", "--out", str(out),
                                 "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output[result.output.index("{"):])
    assert summary["measured"] is True and summary["file"] == str(out)
    assert "2" in summary["iteration_s"] and "2" in summary["host_dispatch_s"]
    assert load_workload(str(out)).measured


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cli_layers_cuda_without_gpu_is_one_line():
    result = runner.invoke(app, ["calibrate", "layers", "tiny-cnn", "--device", "cuda"])
    assert result.exit_code == 2
    assert "no CUDA GPU" in result.output and "Traceback" not in result.output
