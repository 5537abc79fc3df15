"""What one rank's share of an iteration costs: layer times, optimizer step time and the bytes involved.

Times come from `roofline.layer_times` (measured where the workload was measured on this device spec, a
roofline estimate elsewhere); the host's time to dispatch each layer from `dispatch` where a GPU
calibration recorded it. Bytes follow the precision:

- fp32/tf32: weights 4 B/param, gradients 4 B/param, optimizer state: momentum 4, Adam 8 (m and v);
- fp16/bf16 (mixed precision, docs/hardware-figures.md, "Memory accounting"), ``mixed_precision="master"``
  (Megatron, DeepSpeed): weights 2, gradients 2, and the optimizer keeps an fp32 master copy (4) plus its
  moments, so Adam totals 2 + 2 + 12 = 16 B/param. ``"autocast"`` (torch.autocast, what `validate` executes):
  weights 4 and gradients 4 (the weights are the master), the moments, and autocast's 16-bit copies of the
  weights held from each layer's forward to its backward (measured, `AutocastBytes.weight_copies`, or 2 B per
  parameter of the convolutions and linear layers): Adam 4 + 4 + 8 + 2 = 18 B/param at the peak.
- Activations under ``autocast`` are the workload's bytes under autocast where it has them (`Layer.autocast`,
  measured by a calibration or, for the built-in workloads, from CUDA autocast's op lists: autocast keeps
  layer norms, softmax, the loss and the residual stream in fp32). Under ``master`` (the model itself held in
  16 bit) and where a workload lacks them, they are the workload's bytes scaled by the element size. The
  loss reads the last output cast to fp32 (``output.float()``, as the executor and Megatron compute cross
  entropy), so its backward's gradients take 4 B per output element at every precision. The input batch
  crosses PCIe as the workload's input says.

The optimizer step is memory-bound. Measured on another device, it scales by the ratio of memory bandwidths;
never measured, it reads the gradients, reads and writes the (master) weights and the state, and writes the
16-bit weights back under mixed precision, at the share of the memory bandwidth streaming kernels reach
(`roofline.Efficiency.memory`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainsim.errors import TrainsimError, unknown_name
from trainsim.formats.workload import Workload
from trainsim.sim.core.devices import DeviceSpec

from .dispatch import dispatch_seconds
from .workspaces import training_workspace_bytes

WEIGHT_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2}
#: optimizer moments per parameter (bytes, fp32)
STATE_BYTES = {"sgd": 0, "momentum": 4, "adam": 8}
MASTER_BYTES = 4  # fp32 master weights under mixed precision
#: how 16-bit training keeps its weights (the scenario's ``mixed_precision``)
MIXED_MODES = ("master", "autocast")
#: the layer kinds torch.autocast runs in 16 bit, so that it copies their weights
AUTOCAST_KINDS = ("conv2d", "linear")


def mixed(precision: str) -> bool:
    return WEIGHT_BYTES[precision] < 4


def weight_bytes(precision: str, mode: str = "master") -> int:
    """Bytes per parameter of the weights kept between steps, and of their gradients."""
    return MASTER_BYTES if mode == "autocast" and mixed(precision) else WEIGHT_BYTES[precision]


@dataclass(frozen=True)
class RankCosts:
    """One rank's work for one iteration at its per-device batch."""

    batch: int
    layer_names: list[str]
    forward_s: list[float]
    backward_s: list[float]
    step_s: float
    param_bytes: float  # weights as the GPU holds them
    grad_bytes_per_layer: list[float]  # gradient bytes each layer's backward produces
    state_bytes: float  # optimizer state incl. fp32 master weights under mixed precision
    saved_bytes_per_layer: list[float]  # saved for backward, at this batch
    input_bytes: float  # the input batch as it crosses PCIe
    output_bytes: float  # the last layer's output at this batch (what DataParallel gathers)
    # each layer's output at this batch: in backward, the gradient flowing into the layer has its size
    output_bytes_per_layer: list[float] = field(default_factory=list)
    # what autograd packs for backward, each time, parameters too (torch's save_on_cpu copies this)
    packed_bytes_per_layer: list[float] = field(default_factory=list)
    # the loss's input: the last output cast to fp32 (``output.float()``), whatever the precision; the loss's
    # backward makes gradients of this size (0: the size of the last output)
    loss_input_bytes: float = 0.0
    # cuBLAS workspaces the training process's matmul threads hold on the device (`workspaces`)
    workspace_bytes: float = 0.0
    # each layer's kind (conv2d, linear, ...: `Layer.kind`), which names its kernels in a trace
    layer_kinds: list[str] = field(default_factory=list)
    # seconds the host takes to dispatch each layer's forward and backward (`dispatch`); empty: not modelled
    forward_host_s: list[float] = field(default_factory=list)
    backward_host_s: list[float] = field(default_factory=list)
    # each layer pass's (sm, hbm) make-up (`bounds`): how it shares the GPU with overlapping communication;
    # empty: taken as matrix work
    forward_loads: list[tuple[float, float]] = field(default_factory=list)
    backward_loads: list[tuple[float, float]] = field(default_factory=list)

    @property
    def grad_bytes(self) -> float:
        return sum(self.grad_bytes_per_layer)

    @property
    def saved_bytes(self) -> float:
        return sum(self.saved_bytes_per_layer)

    @property
    def compute_s(self) -> float:
        return sum(self.forward_s) + sum(self.backward_s)


def optimizer_traffic(num_params: float, precision: str, optimizer: str, mode: str = "master") -> float:
    """Bytes an optimizer step moves through memory (see the module docstring): under autocast no 16-bit
    copy is written (the forward makes its own)."""
    grad = weight_bytes(precision, mode)
    master = MASTER_BYTES if mixed(precision) else WEIGHT_BYTES[precision]
    state = STATE_BYTES[optimizer]
    low_precision_copy = WEIGHT_BYTES[precision] if mixed(precision) and mode == "master" else 0
    return num_params * (grad + 2 * master + 2 * state + low_precision_copy)


def state_bytes(num_params: float, precision: str, optimizer: str, mode: str = "master") -> float:
    master = MASTER_BYTES if mixed(precision) and mode == "master" else 0
    return num_params * (STATE_BYTES[optimizer] + master)


def rank_costs(
    workload: Workload,
    device: DeviceSpec,
    batch: int,
    precision: str,
    optimizer: str,
    *,
    measured_on: DeviceSpec | None = None,
    scale: float = 1.0,
    mixed_precision: str = "master",
    workspace_config: str | None = None,
    compute_model: str | None = None,
) -> RankCosts:
    """The costs of one rank running ``batch`` samples of ``workload`` on ``device`` (``measured_on``: the
    device a measured workload ran on when the built-in library lacks it, e.g. a calibrated CPU).
    ``scale``: the factor on times measured on this device (a host plug-in's, e.g. ranks sharing cores).
    ``mixed_precision``: how a 16-bit ``precision`` keeps its weights (`MIXED_MODES`, module docstring).
    ``workspace_config``: the process's ``CUBLAS_WORKSPACE_CONFIG`` (None: PyTorch's default,
    `workspaces`). ``compute_model``: how times not measured on ``device`` are estimated
    (`roofline.COMPUTE_MODELS`; None: `roofline.DEFAULT_COMPUTE_MODEL`)."""
    from . import roofline  # the roofline module owns "measured or estimated"

    compute_model = compute_model or roofline.DEFAULT_COMPUTE_MODEL

    if batch < 1:
        raise TrainsimError(f"per-GPU batch must be >= 1, got {batch}", field="batch_size")
    if mixed_precision not in MIXED_MODES:
        raise unknown_name("mixed_precision", mixed_precision, MIXED_MODES, field="mixed_precision")
    if device.kind == "gpu":
        device.peak(precision)  # a precision the GPU has not got (TF32 on a V100) names the ones it has
    times = roofline.layer_times(workload, device, batch, precision, measured_on=measured_on,
                                 model=compute_model,
                                 autocast=mixed(precision) and mixed_precision == "autocast")
    if len(times) != len(workload.layers):
        raise TrainsimError(
            f"got {len(times)} layer times for {len(workload.layers)} layers", field="workload.layers"
        )
    itemsize = workload.itemsize
    weight = weight_bytes(precision, mixed_precision)
    act_scale = WEIGHT_BYTES[precision] / itemsize  # saved tensors follow the compute precision
    params_per_layer = [layer.param_bytes / itemsize for layer in workload.layers]
    num_params = sum(params_per_layer)
    here = measured_here(workload, device)
    elsewhere = not here and workload.optimizer_step is not None
    source = roofline.measured_device(workload, measured_on) if elsewhere else None
    if workload.optimizer_step is not None and (here or source is not None):
        try:
            step = workload.optimizer_step.at(batch)
        except TrainsimError as exc:
            raise TrainsimError(exc.reason, file=workload.source,
                                field=f"optimizer_step.{exc.field}") from None
        if source is not None:  # memory-bound: the measured step at the ratio of bandwidths, as retarget does
            step *= source.memory_bandwidth / device.memory_bandwidth
    else:
        step = roofline.streaming_seconds(device, optimizer_traffic(num_params, precision, optimizer,
                                                                    mixed_precision))
    last = workload.layers[-1]
    autocast = mixed(precision) and mixed_precision == "autocast"
    host = dispatch_seconds(workload, device, roofline.measured_device(workload, measured_on)) or ([], [])
    from .bounds import workload_loads  # the roofline's split, as ``roofline`` above

    loads = workload_loads(workload, device, batch, precision)
    forward = [float(f) for f, _ in times]
    backward = [float(b) for _, b in times]
    if here:
        # the measured iteration's glue outside every layer (loss, zero_grad, the autograd engine): real work
        # on the rank, charged where the loss is computed, after the last layer's forward
        forward[-1] += unattributed_s(workload, batch)
        forward, backward, step = [f * scale for f in forward], [b * scale for b in backward], step * scale
    return RankCosts(
        batch=batch,
        layer_names=[layer.name for layer in workload.layers],
        layer_kinds=[layer.kind for layer in workload.layers],
        forward_s=forward,
        backward_s=backward,
        step_s=float(step),
        param_bytes=num_params * weight,
        grad_bytes_per_layer=[p * weight for p in params_per_layer],
        state_bytes=state_bytes(num_params, precision, optimizer, mixed_precision),
        saved_bytes_per_layer=[float(_saved(layer, batch, act_scale, autocast)
                                     + (_weight_copies(layer, itemsize) if autocast else 0.0))
                               for layer in workload.layers],
        input_bytes=float(batch * workload.input.bytes_per_sample),
        output_bytes=float(_output(last, batch, act_scale, autocast)),
        output_bytes_per_layer=[float(_output(layer, batch, act_scale, autocast))
                                for layer in workload.layers],
        packed_bytes_per_layer=[float(_packed(layer, batch, act_scale, autocast))
                                for layer in workload.layers],
        loss_input_bytes=float(batch * last.output_bytes_per_sample * WEIGHT_BYTES["fp32"] / itemsize),
        workspace_bytes=float(training_workspace_bytes(device, workspace_config)),
        forward_host_s=host[0],
        backward_host_s=host[1],
        forward_loads=loads[0],
        backward_loads=loads[1],
    )


def _saved(layer, batch: int, scale: float, autocast: bool) -> float:
    """Bytes autograd keeps for ``layer``'s backward at ``batch`` (its bytes under autocast where known)."""
    if autocast and layer.autocast is not None:
        return batch * layer.autocast.saved_per_sample + layer.autocast.saved_fixed
    return (batch * layer.saved_activation_bytes_per_sample + layer.saved_activation_bytes_fixed) * scale


def _packed(layer, batch: int, scale: float, autocast: bool) -> float:
    """Bytes autograd packs for ``layer`` at ``batch`` (its distinct saved bytes where not described)."""
    if autocast and layer.autocast is not None:
        return batch * layer.autocast.packed_per_sample + layer.autocast.packed_fixed
    if layer.saved_packed_bytes_per_sample is None:
        return (batch * layer.saved_activation_bytes_per_sample + layer.saved_activation_bytes_fixed) * scale
    return (batch * layer.saved_packed_bytes_per_sample + (layer.saved_packed_bytes_fixed or 0)) * scale


def _weight_copies(layer, itemsize: int) -> float:
    """Bytes of autocast's 16-bit copies of ``layer``'s weights (measured, else its conv/linear params)."""
    if layer.autocast is not None:
        return float(layer.autocast.weight_copies)
    if layer.kind not in AUTOCAST_KINDS:
        return 0.0
    return 2.0 * (layer.param_bytes + layer.shared_param_bytes) / itemsize


def _output(layer, batch: int, scale: float, autocast: bool) -> float:
    """Bytes of ``layer``'s output at ``batch`` (and of its gradient in backward)."""
    if autocast and layer.autocast is not None:
        return batch * layer.autocast.output_per_sample
    return batch * layer.output_bytes_per_sample * scale


def unattributed_s(workload: Workload, batch: int) -> float:
    """Seconds of a calibrated iteration outside every layer and the optimizer step at ``batch`` (the
    calibration's ``provenance.iteration.unattributed``): linear between its batch sizes, proportional to
    the batch beyond them, 0 without it; never negative (a negative figure is the hooks' own cost)."""
    iteration = workload.provenance.iteration
    points = sorted((float(p.batch), p.s) for p in (iteration.unattributed if iteration else []))
    if not points:
        return 0.0
    if batch <= points[0][0]:
        value = points[0][1] * batch / points[0][0]
    elif batch >= points[-1][0]:
        value = points[-1][1] * batch / points[-1][0]
    else:
        value = next(t0 + (t1 - t0) * (batch - b0) / (b1 - b0)
                     for (b0, t0), (b1, t1) in zip(points, points[1:], strict=False) if b0 <= batch <= b1)
    return max(0.0, value)


def measured_here(workload: Workload, device: DeviceSpec) -> bool:
    spec = workload.provenance.device_spec
    return spec is not None and spec.lower() in {device.name.lower(), *(a.lower() for a in device.aliases)}
