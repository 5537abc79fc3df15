"""Roofline time estimates for layers on devices that were never measured, and retargeting of measured ones.

A layer pass takes ``max(FLOPs / (peak x eff.compute), bytes / (bandwidth x eff.memory))`` plus a fixed
launch overhead per kernel. Bytes are the layer's per-sample traffic times the batch plus its parameters once
per batch (read in forward; read for the input grad and written as the weight grad in backward).

:func:`layer_times` is what the simulator calls: measured times where the workload was measured on the
target device, measured times scaled by the ratio of roofline estimates (target / measured device) where it
was measured elsewhere, and the plain roofline for analytic workloads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainsim.errors import TrainsimError
from trainsim.formats.workload import DTYPE_BYTES, Layer, TimeModel, Workload, fit_time
from trainsim.sim.core.devices import DeviceSpec, get_device

#: bytes per element of activations and parameters at each compute precision (tf32 stores fp32)
PRECISION_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2}
#: the precision a workload recorded at ``dtype`` was measured in
DTYPE_PRECISION = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}

#: kernels launched per (forward, backward) pass, by layer kind; unknown kinds launch one each way
KERNELS = {
    "conv2d": (1, 2),  # backward: data grad + weight grad (bias grad is folded in by cuDNN)
    "linear": (1, 3),  # GEMM; backward: two GEMMs + the bias reduction
    "batchnorm": (1, 1), "relu": (1, 1), "gelu": (1, 1), "avgpool": (1, 1), "dropout": (1, 1),
    "maxpool": (1, 2),  # backward zero-fills grad_in, then scatters
    "embedding": (1, 2), "layernorm": (1, 2),
    "attention": (7, 11),  # math path: q/k/v copies, 2 bmm, scale, mask, softmax, output copy
}

#: batches at which a fit-only time model is sampled when retargeted
_SAMPLE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass(frozen=True)
class Efficiency:
    """Fractions of peak a real kernel reaches, and the fixed cost of launching one.

    Defaults: cuDNN convolutions and cuBLAS GEMMs at training sizes typically sustain 60-80 % of fp32 peak
    (e.g. ResNet-50 on V100 fp32 ~ 360 img/s x 24.6 GFLOP/img ~ 8.9 TFLOP/s ~ 57 % of 15.7 overall, higher for
    the big convs) -> 0.7; streaming elementwise kernels reach 75-90 % of HBM bandwidth (STREAM-like copy
    kernels) -> 0.8; eager PyTorch pays ~5 us of host-side dispatch + launch per kernel, which is what bounds
    tiny layers. :func:`fit_efficiency` replaces all three from measured layers.
    """

    compute: float = 0.7
    memory: float = 0.8
    launch_overhead_s: float = 5e-6

    def __post_init__(self):
        for name in ("compute", "memory"):
            value = getattr(self, name)
            if not (0 < value <= 1):
                raise TrainsimError(f"must be in (0, 1], got {value}", field=f"efficiency.{name}")
        if not (self.launch_overhead_s >= 0 and math.isfinite(self.launch_overhead_s)):
            raise TrainsimError(f"must be >= 0, got {self.launch_overhead_s}",
                                field="efficiency.launch_overhead_s")


DEFAULT_EFFICIENCY = Efficiency()


def streaming_seconds(device: DeviceSpec, nbytes: float,
                      efficiency: Efficiency = DEFAULT_EFFICIENCY) -> float:
    """Seconds for a memory-bound kernel (a cast, an elementwise update, a device-to-device copy) that reads
    and writes ``nbytes`` in all on ``device``. A GPU's ``memory_bandwidth`` is its datasheet peak, of which
    streaming kernels reach ``efficiency.memory`` (as the roofline's elementwise layers); a CPU's is already
    what copies reach (calibrated, or a published STREAM figure), so it is used as it is."""
    share = efficiency.memory if device.kind == "gpu" else 1.0
    return nbytes / (device.memory_bandwidth * share)


def kernel_seconds(device: DeviceSpec, flops: float, nbytes: float, precision: str = "fp32",
                   efficiency: Efficiency = DEFAULT_EFFICIENCY) -> float:
    """Roofline seconds of one kernel on ``device``: ``flops`` at ``precision``'s peak or ``nbytes`` of
    memory traffic, whichever takes longer (its time on the GPU: no launch overhead)."""
    return max(flops / (device.peak(precision) * efficiency.compute),
               nbytes / (device.memory_bandwidth * efficiency.memory))


def _storage_scale(workload_dtype: str, precision: str) -> float:
    if precision not in PRECISION_BYTES:
        raise TrainsimError(f"unknown precision {precision!r}; valid choices: {', '.join(PRECISION_BYTES)}",
                            field="precision")
    return PRECISION_BYTES[precision] / DTYPE_BYTES[workload_dtype]


def layer_time(layer: Layer, device: DeviceSpec | str, batch: int, precision: str = "fp32",
               efficiency: Efficiency = DEFAULT_EFFICIENCY, *, dtype: str = "float32") -> tuple[float, float]:
    """Roofline (forward, backward) seconds of ``layer`` at ``batch`` on ``device``.

    ``dtype`` is the dtype the layer's byte counts were recorded at (the workload's); a 16-bit
    ``precision`` halves fp32 traffic.
    """
    device = get_device(device)
    if batch < 1:
        raise TrainsimError(f"batch must be >= 1, got {batch}", field="batch")
    scale = _storage_scale(dtype, precision)
    params = (layer.param_bytes + layer.shared_param_bytes) * scale
    kernels = KERNELS.get(layer.kind, (1, 1))
    times = []
    for flops_per_sample, bytes_per_sample, param_passes, n_kernels in (
            (layer.flops_forward_per_sample, layer.memory_bytes_forward_per_sample, 1, kernels[0]),
            (layer.flops_backward_per_sample, layer.memory_bytes_backward_per_sample, 2, kernels[1])):
        flops = flops_per_sample * batch
        traffic = bytes_per_sample * batch * scale + params * param_passes
        if flops == 0 and traffic == 0:
            times.append(0.0)  # an identity (dropout p=0, position embedding with no weights): no kernel
            continue
        times.append(kernel_seconds(device, flops, traffic, precision, efficiency)
                     + n_kernels * efficiency.launch_overhead_s)
    return times[0], times[1]


def _measured_precision(workload: Workload) -> str:
    return str(getattr(workload.provenance, "precision", None) or DTYPE_PRECISION[workload.dtype])


def _measured_on(workload: Workload, measured_on: DeviceSpec | str | None) -> DeviceSpec:
    if measured_on is not None:
        return get_device(measured_on)
    spec = workload.provenance.device_spec
    if spec is None:
        raise TrainsimError(f"workload {workload.name!r} was measured on {workload.provenance.device!r} "
                            "with no device spec to scale from; pass the device it was measured on",
                            field="provenance.device_spec")
    try:
        return get_device(spec)
    except TrainsimError as exc:
        raise TrainsimError(str(exc).removeprefix("device: "), field="provenance.device_spec") from None


def measured_device(workload: Workload, measured_on: DeviceSpec | str | None = None) -> DeviceSpec | None:
    """The device a workload's measured times come from (``measured_on``, else its provenance's spec);
    None when its provenance names no device trainsim knows."""
    try:
        return _measured_on(workload, measured_on)
    except TrainsimError:
        return None


def _scaled(time_model: TimeModel, ratio) -> TimeModel:
    """``time_model`` with every time multiplied by ``ratio(batch)``, refitted."""
    if time_model.points:
        points = [(b, t * ratio(b), s * ratio(b)) for b, t, s in time_model.points]
        model = time_model.fit["model"] if time_model.fit else "affine"
        return TimeModel(points=points, fit=fit_time(points, model))
    sampled = [(b, time_model.fitted(b) * ratio(b), 0.0) for b in _SAMPLE_BATCHES]
    sampled = [p for p in sampled if p[1] > 0]
    return TimeModel(fit=fit_time(sampled, time_model.fit["model"]))


def _ratio(layer, source, target, src_precision, precision, efficiency, dtype, index):
    def ratio(batch: int) -> float:
        before = layer_time(layer, source, batch, src_precision, efficiency, dtype=dtype)[index]
        after = layer_time(layer, target, batch, precision, efficiency, dtype=dtype)[index]
        return after / before if before > 0 else 1.0
    return ratio


def layer_times(workload: Workload, device: DeviceSpec | str, batch: int, precision: str = "fp32",
                efficiency: Efficiency = DEFAULT_EFFICIENCY, *,
                measured_on: DeviceSpec | str | None = None) -> list[tuple[float, float]]:
    """(forward, backward) seconds per layer at ``batch`` on ``device``: measured, retargeted or roofline.

    ``measured_on`` is the device a measured workload ran on when it is not a built-in spec (e.g. the CPU
    spec stored in a calibration bundle); by default ``workload.provenance.device_spec``.
    """
    target = get_device(device)
    src_precision = _measured_precision(workload)
    source = None
    if any(layer.forward or layer.backward for layer in workload.layers):
        source = _measured_on(workload, measured_on)
    same = source is not None and source.name == target.name and src_precision == precision
    result = []
    for i, layer in enumerate(workload.layers):
        times = []
        for index, measured in enumerate((layer.forward, layer.backward)):
            if measured is None:  # the roofline only where nothing was measured
                roof = layer_time(layer, target, batch, precision, efficiency, dtype=workload.dtype)
                times.append(roof[index])
                continue
            try:
                at = measured.at(batch)
            except TrainsimError as exc:  # name the file and the layer, as the workload's reader does
                raise TrainsimError(exc.reason, file=workload.source,
                                    field=f"layers.{i}({layer.name}).{('forward', 'backward')[index]}."
                                          f"{exc.field}") from None
            if same:
                times.append(at)
            else:
                ratio = _ratio(layer, source, target, src_precision, precision, efficiency,
                               workload.dtype, index)
                times.append(at * ratio(batch))
        result.append((times[0], times[1]))
    return result


def compute_time(workload: Workload, device: DeviceSpec | str, batch: int, precision: str = "fp32",
                 efficiency: Efficiency = DEFAULT_EFFICIENCY, **kwargs) -> tuple[float, float]:
    """Total (forward, backward) seconds of one batch on one device, layers back to back."""
    times = layer_times(workload, device, batch, precision, efficiency, **kwargs)
    return sum(t[0] for t in times), sum(t[1] for t in times)


def retarget(workload: Workload, to_device: DeviceSpec | str, precision: str = "fp32",
             efficiency: Efficiency = DEFAULT_EFFICIENCY, *,
             measured_on: DeviceSpec | str | None = None) -> Workload:
    """A measured workload rescaled to ``to_device``: each layer's times x roofline(to) / roofline(from).

    The optimizer step (elementwise over the parameters: memory-bound) scales by the bandwidth ratio.
    """
    target = get_device(to_device)
    source = _measured_on(workload, measured_on)
    src_precision = _measured_precision(workload)
    layers = []
    for layer in workload.layers:
        update = {}
        for index, key in enumerate(("forward", "backward")):
            measured = getattr(layer, key)
            if measured is not None:
                ratio = _ratio(layer, source, target, src_precision, precision, efficiency, workload.dtype,
                               index)
                update[key] = _scaled(measured, ratio)
        layers.append(layer.model_copy(update=update))
    optimizer = workload.optimizer_step
    if optimizer is not None:
        bandwidth_ratio = source.memory_bandwidth / target.memory_bandwidth
        optimizer = _scaled(optimizer, lambda _batch: bandwidth_ratio)
    provenance = workload.provenance.model_dump()
    provenance.update(device=f"{workload.provenance.device} (retargeted to {target.name})",
                      device_spec=target.name, retargeted_from=source.name, precision=precision)
    return Workload.model_validate({
        **workload.model_dump(by_alias=True),
        "layers": [layer.model_dump() for layer in layers],
        "optimizer_step": optimizer.model_dump() if optimizer else None,
        "provenance": provenance,
    })


def fit_efficiency(workload_measured: Workload, device: DeviceSpec | str | None = None,
                   precision: str | None = None) -> Efficiency:
    """The :class:`Efficiency` that best explains measured layer times (least squares on relative error).

    ``device`` is the device the workload was measured on (default: its ``provenance.device_spec``).
    """
    import numpy as np
    from scipy.optimize import least_squares

    source = _measured_on(workload_measured, device)
    precision = precision or _measured_precision(workload_measured)
    samples = []  # (layer, batch, index, seconds)
    for layer in workload_measured.layers:
        for index, measured in enumerate((layer.forward, layer.backward)):
            if measured is not None:
                samples.extend((layer, batch, index, seconds) for batch, seconds, _ in measured.points)
    if not samples:
        raise TrainsimError(f"workload {workload_measured.name!r} has no measured layer times to fit",
                            field="layers")
    measured = np.array([s[3] for s in samples])
    dtype = workload_measured.dtype

    def residuals(x):
        eff = Efficiency(compute=x[0], memory=x[1], launch_overhead_s=x[2] * 1e-6)
        model = np.array([layer_time(layer, source, batch, precision, eff, dtype=dtype)[index]
                          for layer, batch, index, _ in samples])
        return (model - measured) / measured

    start = DEFAULT_EFFICIENCY
    # the launch overhead is fitted in microseconds so that all three unknowns are of order one
    solution = least_squares(residuals, [start.compute, start.memory, start.launch_overhead_s * 1e6],
                             bounds=([1e-3, 1e-3, 0.0], [1.0, 1.0, 1000.0]), x_scale=[0.1, 0.1, 1.0])
    return Efficiency(compute=float(solution.x[0]), memory=float(solution.x[1]),
                      launch_overhead_s=float(solution.x[2]) * 1e-6)


def times_report(workload: Workload, device: DeviceSpec | str, batch: int, precision: str = "fp32",
                 efficiency: Efficiency = DEFAULT_EFFICIENCY) -> dict:
    """Per-layer forward/backward seconds and their source (measured, retargeted, roofline), as a record."""
    target = get_device(device)
    times = layer_times(workload, target, batch, precision, efficiency)
    same = workload.provenance.device_spec is not None and (
        get_device(workload.provenance.device_spec).name == target.name)
    layers = []
    for layer, (fwd, bwd) in zip(workload.layers, times, strict=True):
        source = "roofline" if layer.forward is None else ("measured" if same else "retargeted")
        layers.append({"name": layer.name, "kind": layer.kind, "forward_s": fwd, "backward_s": bwd,
                       "source": source})
    return {"workload": workload.name, "device": target.name, "batch": batch, "precision": precision,
            "forward_s": sum(t[0] for t in times), "backward_s": sum(t[1] for t in times), "layers": layers}
