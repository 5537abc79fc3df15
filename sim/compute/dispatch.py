"""The host's side of a GPU rank's layers: how long its CPU thread takes to dispatch each layer's work.

A GPU runs a layer's kernels only once the host has enqueued them: the training loop's Python thread in
forward, autograd's thread in backward. Where a layer's dispatch takes longer than its kernels, the GPU waits
on the host, and a faster GPU does not shorten the step (`gpu_spans` times a pass with both).

The figures come from a CUDA calibration's ``provenance.layer_host_s`` (`calibrate layers`: ``perf_counter``
at each layer's hooks, the marks' own cost left out). A layer launches the same kernels at every batch size,
so its dispatch does not grow with the batch; but a host that has filled the launch queue waits for the GPU
inside the layer, which only adds. So a layer's dispatch is its least over the calibrated batch sizes. It
stays as measured on a what-if GPU, since the host is the same CPU.
"""

from __future__ import annotations

from trainsim.formats.workload import Workload
from trainsim.sim.core.devices import DeviceSpec


def dispatch_seconds(
    workload: Workload, device: DeviceSpec, measured_on: DeviceSpec | None
) -> tuple[list[float], list[float]] | None:
    """Each layer's forward and backward dispatch seconds for a rank on ``device``. None where the workload
    has no host record for every layer, was measured on a CPU (there the host does the work, and its times
    are the layers' own), or the rank is a CPU."""
    record = workload.provenance.layer_host_s
    if record is None or device.kind == "cpu" or measured_on is None or measured_on.kind == "cpu":
        return None
    phases = []
    for phase in ("forward", "backward"):
        per_layer = record.get(phase, {})
        points = [per_layer.get(layer.name) for layer in workload.layers]
        if not all(points):
            return None
        phases.append([min(median for _, median, _ in layer_points) for layer_points in points])
    return phases[0], phases[1]


def gpu_spans(
    gpu_free: float, host_free: float, gpu_s: list[float], host_s: list[float]
) -> tuple[list[tuple[float, float]], float]:
    """When each layer of a pass runs on the GPU, given its dispatch: the GPU is free from ``gpu_free``, the
    host from ``host_free``; layer i takes ``gpu_s[i]`` on the GPU and ``host_s[i]`` to dispatch. A layer
    starts once the GPU is done with the one before and its own dispatch has begun (its first kernel is
    enqueued), and ends no earlier than its dispatch (its last kernel is enqueued then). Its span is its GPU
    time, ending then; the gap before it is the GPU waiting on the host. Returns the spans and when the host
    is done dispatching the pass."""
    spans = []
    gpu, host = gpu_free, host_free
    for work, dispatch in zip(gpu_s, host_s, strict=True):
        start = max(gpu, host)
        host += dispatch
        gpu = max(start + work, host)
        spans.append((gpu - work, gpu))
    return spans, host
