"""Time estimates for layers on devices that were never measured, and retargeting of measured ones.

Two compute models (``compute_model``, a scenario's top-level field):

- ``roofline``: a layer pass takes ``max(FLOPs / (peak x eff.compute), bytes / (bandwidth x eff.memory))``
  plus a fixed launch overhead per kernel. Bytes are the layer's per-sample traffic times the batch plus its
  parameters once per batch (read in forward; read for the input grad and written as the weight grad in
  backward).
- ``kernels``: a GPU layer pass is the kernels it launches (`kernels.layers.layer_kernels`), each timed by
  the kernel model fitted on measured kernels (`kernels.model.kernel_time`), summed, plus the same launch
  overhead per kernel. A CPU device, and a layer whose kernels cannot be told from its record, keep the
  roofline.

:func:`layer_times` is what the simulator calls: measured times where the workload was measured on the
target device in the same precision (unchanged by either model), measured times scaled by the ratio of the
model's estimates of that layer (target / measured device, each in the precision it runs there) where it
was measured elsewhere, and the plain model for analytic workloads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainsim.errors import TrainsimError, unknown_name
from trainsim.formats.scenario_options import DEFAULT_COMPUTE_MODEL
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

#: how a layer's time is estimated where it was not measured on the device (module doc)
COMPUTE_MODELS = ("roofline", "kernels")

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


def check_compute_model(model: str) -> str:
    if model not in COMPUTE_MODELS:
        raise unknown_name("compute_model", model, COMPUTE_MODELS, field="compute_model")
    return model


def tf32_flags(workload: Workload | None) -> dict:
    """Whether the workload's run let cuDNN's convolutions and cuBLAS's matmuls use TF32 (a calibration
    records ``torch.backends``' switches; PyTorch's defaults where it did not: convolutions on, matmuls
    off)."""
    extra = (workload.provenance.model_extra or {}) if workload is not None else {}
    return {"tf32_conv": bool(extra.get("tf32_cudnn", True)),
            "tf32_matmul": bool(extra.get("tf32_matmul", False))}


def kernel_estimates(layer: Layer, device: DeviceSpec | str, batch: int, precision: str = "fp32", *,
                     dtype: str = "float32", config: dict | None = None, flags: dict | None = None,
                     autocast: bool = False):
    """The kernel model's (forward, backward) `kernels.layers.LayerEstimate` of ``layer`` on ``device``; None
    where it does not apply (a CPU, or a layer whose kernels cannot be told from its record)."""
    from .kernels.layers import LayerUnknown, layer_estimate, layer_kernels

    device = get_device(device)
    if device.kind != "gpu":
        return None
    _storage_scale(dtype, precision)
    try:
        forward, backward = layer_kernels(layer, batch, precision, dtype, config=config, autocast=autocast)
    except LayerUnknown:
        return None
    flags = flags or {}
    return layer_estimate(forward, device, **flags), layer_estimate(backward, device, **flags)


def layer_time(layer: Layer, device: DeviceSpec | str, batch: int, precision: str = "fp32",
               efficiency: Efficiency = DEFAULT_EFFICIENCY, *, dtype: str = "float32",
               model: str = "roofline", config: dict | None = None,
               flags: dict | None = None, autocast: bool = False) -> tuple[float, float]:
    """Estimated (forward, backward) seconds of ``layer`` at ``batch`` on ``device`` by ``model``.

    ``dtype`` is the dtype the layer's byte counts were recorded at (the workload's); a 16-bit
    ``precision`` halves fp32 traffic. ``config``: the workload's model config (its attention's heads);
    ``flags``: its run's TF32 switches (`tf32_flags`); ``autocast``: a 16-bit precision under
    torch.autocast (the kernel model keeps the ops autocast runs in fp32 in fp32).
    """
    device = get_device(device)
    if batch < 1:
        raise TrainsimError(f"batch must be >= 1, got {batch}", field="batch")
    if check_compute_model(model) == "kernels":
        estimates = kernel_estimates(layer, device, batch, precision, dtype=dtype, config=config, flags=flags,
                                     autocast=autocast)
        if estimates is not None:
            return tuple(e.seconds + e.kernels * efficiency.launch_overhead_s for e in estimates)
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


def _ratio(layer, source, target, src_precision, precision, efficiency, dtype, index, model="roofline",
           config=None, flags=None, autocast=False):
    """``ratio(batch)``: the model's time of ``layer``'s pass ``index`` on ``target`` over its time on
    ``source`` (the kernel model's where it applies to both, else the roofline's)."""
    def ratio(batch: int) -> float:
        for use in ((model, "roofline") if model == "kernels" else (model,)):
            if use == "kernels" and (source.kind != "gpu" or target.kind != "gpu"):
                continue  # CPU devices keep the roofline
            kw = {"dtype": dtype, "model": use, "config": config, "flags": flags, "autocast": autocast}
            if use == "kernels" and kernel_estimates(layer, source, batch, src_precision, dtype=dtype,
                                                     config=config, flags=flags, autocast=autocast) is None:
                continue
            before = layer_time(layer, source, batch, src_precision, efficiency, **kw)[index]
            after = layer_time(layer, target, batch, precision, efficiency, **kw)[index]
            return after / before if before > 0 else 1.0
        return 1.0
    return ratio


def layer_times(workload: Workload, device: DeviceSpec | str, batch: int, precision: str = "fp32",
                efficiency: Efficiency = DEFAULT_EFFICIENCY, *,
                measured_on: DeviceSpec | str | None = None,
                model: str = DEFAULT_COMPUTE_MODEL, autocast: bool = False) -> list[tuple[float, float]]:
    """(forward, backward) seconds per layer at ``batch`` on ``device``: measured, retargeted or estimated by
    ``model`` (`COMPUTE_MODELS`).

    ``measured_on`` is the device a measured workload ran on when it is not a built-in spec (e.g. the CPU
    spec stored in a calibration bundle); by default ``workload.provenance.device_spec``. ``autocast``: a
    16-bit ``precision`` under torch.autocast (`layer_time`).
    """
    target = get_device(device)
    check_compute_model(model)
    src_precision = _measured_precision(workload)
    source = None
    if any(layer.forward or layer.backward for layer in workload.layers):
        # measured on the target itself (a calibration bundle's CPU or GPU spec, not a built-in one): its own
        # source, as `costs.measured_here` has it
        spec = (workload.provenance.device_spec or "").lower()
        here = measured_on is None and spec in {target.name.lower(), *(a.lower() for a in target.aliases)}
        source = target if here else _measured_on(workload, measured_on)
    same = source is not None and source.name == target.name and src_precision == precision
    config, flags = workload.provenance.config, tf32_flags(workload)
    result = []
    for i, layer in enumerate(workload.layers):
        times = []
        for index, measured in enumerate((layer.forward, layer.backward)):
            if measured is None:  # the model only where nothing was measured
                estimate = layer_time(layer, target, batch, precision, efficiency, dtype=workload.dtype,
                                      model=model, config=config, flags=flags, autocast=autocast)
                times.append(estimate[index])
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
                               workload.dtype, index, model, config, flags, autocast)
                times.append(at * ratio(batch))
        result.append((times[0], times[1]))
    return result


def compute_time(workload: Workload, device: DeviceSpec | str, batch: int, precision: str = "fp32",
                 efficiency: Efficiency = DEFAULT_EFFICIENCY, **kwargs) -> tuple[float, float]:
    # kwargs: measured_on, model (`layer_times`)
    """Total (forward, backward) seconds of one batch on one device, layers back to back."""
    times = layer_times(workload, device, batch, precision, efficiency, **kwargs)
    return sum(t[0] for t in times), sum(t[1] for t in times)


def retarget(workload: Workload, to_device: DeviceSpec | str, precision: str = "fp32",
             efficiency: Efficiency = DEFAULT_EFFICIENCY, *,
             measured_on: DeviceSpec | str | None = None, model: str = DEFAULT_COMPUTE_MODEL) -> Workload:
    """A measured workload rescaled to ``to_device``: each layer's times x model(to) / model(from).

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
                               index, check_compute_model(model), workload.provenance.config,
                               tf32_flags(workload))
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
                 efficiency: Efficiency = DEFAULT_EFFICIENCY, *, model: str = DEFAULT_COMPUTE_MODEL) -> dict:
    """Per-layer forward/backward seconds as the simulator uses them, with their source (measured,
    retargeted, or the model: roofline or kernels) and, per pass, what the time is made of: the kernel class
    of its longest kernel, what bounds it (compute, memory, launch), the rate it achieves (FLOP/s of a
    compute-bound pass, bytes/s of another) and a ``low``/``high`` range (the kernel model's held-out error
    for the classes that make it up, scaled to the time; a time measured on this device in this precision
    is its own range)."""
    target = get_device(device)
    check_compute_model(model)
    times = layer_times(workload, target, batch, precision, efficiency, model=model)
    same = workload.provenance.device_spec is not None and (
        get_device(workload.provenance.device_spec).name == target.name) and (
        _measured_precision(workload) == precision)
    config, flags = workload.provenance.config, tf32_flags(workload)
    scale = _storage_scale(workload.dtype, precision)
    layers, low, high = [], [0.0, 0.0], [0.0, 0.0]
    for layer, pair in zip(workload.layers, times, strict=True):
        measured = layer.forward is not None
        source = ("measured" if same else "retargeted") if measured else model
        estimates = kernel_estimates(layer, target, batch, precision, dtype=workload.dtype, config=config,
                                     flags=flags) if model == "kernels" else None
        record = {"name": layer.name, "kind": layer.kind, "forward_s": pair[0], "backward_s": pair[1],
                  "source": source}
        for index, phase in enumerate(("forward", "backward")):
            seconds = pair[index]
            detail = _pass_detail(layer, target, batch, precision, scale, index, seconds, estimates,
                                  efficiency, exact=measured and same)
            record[phase] = detail
            low[index] += detail["low_s"]
            high[index] += detail["high_s"]
        layers.append(record)
    return {"workload": workload.name, "device": target.name, "batch": batch, "precision": precision,
            "compute_model": model, "forward_s": sum(t[0] for t in times),
            "backward_s": sum(t[1] for t in times), "forward_low_s": low[0], "forward_high_s": high[0],
            "backward_low_s": low[1], "backward_high_s": high[1], "layers": layers}


def _pass_detail(layer, device, batch, precision, scale, index, seconds, estimates, efficiency, *,
                 exact: bool) -> dict:
    """One pass's class, bound, achieved rate and range (see `times_report`)."""
    flops = (layer.flops_forward_per_sample, layer.flops_backward_per_sample)[index] * batch
    traffic = ((layer.memory_bytes_forward_per_sample, layer.memory_bytes_backward_per_sample)[index] * batch
               * scale)
    if seconds <= 0:
        return {"s": 0.0, "low_s": 0.0, "high_s": 0.0, "kernel_class": "none", "bound": "none",
                "achieved": 0.0, "achieved_unit": "", "kernels": 0}
    if estimates is not None:
        estimate = estimates[index]
        launch = estimate.kernels * efficiency.launch_overhead_s
        cls, bound, kernels = estimate.kernel_class, estimate.bound, estimate.kernels
        if launch > estimate.seconds:
            bound = "launch"
        share = (estimate.low / estimate.seconds, estimate.high / estimate.seconds) if estimate.seconds > 0 \
            else (1.0, 1.0)
    else:  # the roofline's view: which of its terms is the longest
        cls = "matmul" if flops > 0 else "memory"
        kernels = KERNELS.get(layer.kind, (1, 1))[index]
        compute = flops / (device.peak(precision) * efficiency.compute) if flops else 0.0
        memory = streaming_seconds(device, traffic, efficiency)
        launch = kernels * efficiency.launch_overhead_s
        bound = max((compute, "compute"), (memory, "memory"), (launch, "launch"))[1]
        share = (1.0, 1.0)
    if exact:
        share = (1.0, 1.0)
    achieved = (flops if bound == "compute" else traffic) / seconds
    return {"s": seconds, "low_s": seconds * share[0], "high_s": seconds * share[1], "kernel_class": cls,
            "bound": bound, "achieved": achieved, "achieved_unit": "FLOP/s" if bound == "compute" else "B/s",
            "kernels": kernels}
