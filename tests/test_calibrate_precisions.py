"""Layers measured in each precision a scenario runs: the profiler under autocast, a workload file per
precision in the bundle, and the simulator taking the one measured in the scenario's precision."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

torch = pytest.importorskip("torch")

from trainsim import api  # noqa: E402
from trainsim.calibrate.measure.layer_profile import profile_layers  # noqa: E402
from trainsim.calibrate.validate.quickstart import calibration_precisions  # noqa: E402
from trainsim.errors import TrainsimError  # noqa: E402
from trainsim.formats.bundle import workload_file  # noqa: E402

PINNED = Path(__file__).parent / "data" / "bundle-cpu-2rank"


def test_the_profiler_measures_under_autocast_and_says_so():
    workload = profile_layers("tiny-cnn", "cpu", [2], repeats=1, warmup=0, prep_samples=0, precision="bf16")
    assert workload.provenance.precision == "bf16" and workload.dtype == "float32"
    assert all(layer.forward is not None for layer in workload.layers)
    # and its activation bytes as autocast keeps them: the first conv saves its 16-bit input copy
    conv1 = workload.layers[0]
    assert conv1.autocast.saved_per_sample == conv1.saved_activation_bytes_per_sample // 2
    fp32 = profile_layers("tiny-cnn", "cpu", [2], repeats=1, warmup=0, prep_samples=0)
    assert all(layer.autocast is None for layer in fp32.layers)
    with pytest.raises(TrainsimError, match="unknown precision 'int4'"):
        profile_layers("tiny-cnn", "cpu", [2], precision="int4")


def test_a_cpu_calibration_keeps_the_bytes_cuda_autocast_keeps():
    # a 16-bit what-if is a GPU's: the CPU profiler runs softmax in fp32 as CUDA's autocast does, so its bytes
    # equal the built-in generator's, which follow CUDA's op lists
    from trainsim.sim.compute.analytic_models import build_analytic

    small = dict(n_layer=1, n_head=2, n_embd=16, vocab_size=50, block_size=8)
    measured = profile_layers("gpt2-small", "cpu", [2], repeats=1, warmup=0, prep_samples=0, precision="bf16",
                              **small)
    analytic = build_analytic("gpt2-small", **small)
    assert [layer.autocast for layer in measured.layers] == [layer.autocast for layer in analytic.layers]


def test_a_scenario_calibrates_the_precisions_its_variants_run():
    assert calibration_precisions("validate-cpu") == ("fp32",)
    assert calibration_precisions("validate-gpu") == ("fp32", "bf16")


def _scenario(tmp_path: Path, precision: str) -> str:
    doc = yaml.safe_load((Path(__file__).parents[1] / "scenarios" / "validate-cpu.yaml").read_text())
    doc.pop("variants")
    doc["precision"] = precision
    path = tmp_path / f"{precision}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_the_simulator_takes_the_workload_measured_in_the_scenarios_precision(tmp_path):
    bundle = tmp_path / "bundle"
    shutil.copytree(PINNED, bundle)
    fp32 = json.loads((bundle / workload_file("tiny-cnn")).read_text())
    half = json.loads(json.dumps(fp32))
    half["provenance"]["precision"] = "bf16"
    for layer in half["layers"]:  # every measured time halved: what the bf16 run would have measured
        for phase in ("forward", "backward"):
            model = layer.get(phase)
            if model:
                model["points"] = [[b, t / 2, s / 2] for b, t, s in model["points"]]
                model["fit"] = None
    (bundle / workload_file("tiny-cnn", "bf16")).write_text(json.dumps(half))

    def compute(precision):
        result = api.simulation(_scenario(tmp_path, precision), calibration=str(bundle)).run()
        return result.breakdown_s["compute"], result

    full, _ = compute("fp32")
    halved, result = compute("bf16")
    assert halved < 0.75 * full  # the layers are half; the optimizer step is the same
    # without the bf16 file the CPU spec (fp32 only) cannot rescale fp32 times to bf16: a clear error
    (bundle / workload_file("tiny-cnn", "bf16")).unlink()
    with pytest.raises(TrainsimError, match="precision"):
        compute("bf16")
