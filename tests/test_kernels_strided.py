"""The unvectorised ``strided`` kernel on the kernels it rests on: the GPT-2 step traced on an H200 (fp32)."""

from pathlib import Path

import numpy as np

from trainsim.formats.kineto import load_traces
from trainsim.formats.workload import load_workload
from trainsim.sim.compute.kernels.layers import layer_kernels
from trainsim.sim.compute.kernels.memory_bound import streaming_time
from trainsim.sim.compute.kernels.params import load_params
from trainsim.sim.compute.kernels.specs import Streaming
from trainsim.sim.core.devices import get_device

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "tests" / "data" / "traces-h200" / "gpt2-small-fp32-step.json.gz"
WORKLOAD = ROOT / "benchmarks/data/h200-run3/gpt2-small/calibration-0/workload-gpt2-small.json"


def _kernels(name: str) -> list[float]:
    return [g.dur for g in load_traces([TRACE])[0].gpu_events if name in g.name]


def test_the_causal_masks_of_the_traced_step_stream_at_the_shipped_fp32_share():
    masks = _kernels("masked_fill")  # nanoGPT's mask over 8 x 12 score matrices of 512 x 512, both passes
    assert len(masks) == 24
    mask = streaming_time(Streaming("strided", 8 * 12 * 512 * 512, dtype="fp32"), get_device("h200"),
                          load_params())
    errors = np.array([mask.seconds / t - 1 for t in masks])
    assert np.median(abs(errors)) < 0.05
    vectorised = streaming_time(Streaming("elementwise", 8 * 12 * 512 * 512, dtype="fp32"),
                                get_device("h200"), load_params())
    assert vectorised.seconds < 0.75 * min(masks)  # what the model had: a third too fast


def test_the_head_copies_not_fitted_on_come_closer_as_strided_kernels():
    # the written-out attention copies q, k, v and the output out of transposed views (direct_copy kernels)
    workload, h200, params = load_workload(WORKLOAD), get_device("h200"), load_params()
    copies = []
    for layer in workload.layers:
        if layer.kind == "attention":
            forward, backward = layer_kernels(layer, 8, "fp32", workload.dtype,
                                              config=workload.provenance.config)
            copies += [k for k in forward + backward if isinstance(k, Streaming) and k.kind == "strided"
                       and k.elements != 8 * 12 * 512 * 512]
    modelled = sum(streaming_time(k, h200, params).seconds for k in copies)
    measured = sum(_kernels("direct_copy"))
    assert abs(modelled / measured - 1) < 0.25
