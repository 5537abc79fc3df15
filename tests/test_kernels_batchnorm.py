"""cuDNN's NCHW batch norm on the kernels it was fitted on: the ResNet-50 step traced on an H200."""

import re
from pathlib import Path

import numpy as np

from trainsim.formats.kineto import load_traces
from trainsim.formats.workload import load_workload
from trainsim.sim.compute.kernels.layers import layer_kernels
from trainsim.sim.compute.kernels.memory_bound import streaming_time
from trainsim.sim.compute.kernels.params import load_params
from trainsim.sim.core.devices import get_device

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "tests" / "data" / "traces-h200" / "resnet50-fp32-step.json.gz"
WORKLOAD = ROOT / "benchmarks/data/h200-run3/resnet50" / "calibration-0" / "workload-resnet50.json"


def _errors() -> dict[str, np.ndarray]:
    trace, workload = load_traces([TRACE])[0], load_workload(WORKLOAD)
    layers = [layer for layer in workload.layers if layer.kind == "batchnorm"]
    kernels = {"batchnorm": sorted((g for g in trace.gpu_events if "bn_fw" in g.name), key=lambda g: g.ts),
               "batchnorm_backward": sorted((g for g in trace.gpu_events if re.search("bn_bw", g.name)),
                                            key=lambda g: -g.ts)}
    h200, params = get_device("h200"), load_params()
    out = {}
    for index, (kind, measured) in enumerate(kernels.items()):
        assert len(measured) == len(layers) == 53
        specs = [layer_kernels(layer, 64, "fp32", workload.dtype)[index][0] for layer in layers]
        assert {spec.kind for spec in specs} == {kind}
        out[kind] = np.array([streaming_time(spec, h200, params).seconds / kernel.dur - 1
                              for spec, kernel in zip(specs, measured, strict=True)])
    return out


def test_the_shipped_figures_reproduce_the_batch_norm_kernels_of_the_traced_step():
    for kind, errors in _errors().items():
        assert np.median(abs(errors)) < 0.12, kind
        assert abs(np.median(errors)) < 0.1, kind  # neither side: the rows bound the few-channel layers


def test_few_channels_are_bound_by_their_rows_on_the_h200_but_not_on_a_v100():
    layer = next(layer for layer in load_workload(WORKLOAD).layers if layer.name == "layer1.0.bn1")  # 64 ch
    forward, _ = layer_kernels(layer, 64, "fp32", "float32")
    params = load_params()
    assert streaming_time(forward[0], get_device("h200"), params).detail.get("rows_bound")
    assert not streaming_time(forward[0], get_device("v100-32gb"), params).detail.get("rows_bound")
