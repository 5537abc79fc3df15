"""The analytic workload of a zoo model, read off torch itself: shapes, bytes and FLOPs, no timing.

Training steps (forward, loss, backward) run on the ``meta`` device, so nothing is computed or allocated
and even GPT-2 at full size takes seconds. While one runs, ``LayerHooks`` says which layer is active, and:

- parameter bytes: the layer's own parameters; a tied weight belongs to its first user, later users carry
  it as ``shared_param_bytes``;
- saved-activation bytes: every tensor autograd packs for backward (``saved_tensors_hooks``), de-duplicated
  by storage across the whole model (a storage counts whole, once, for the first layer that saved it),
  parameters excluded. Buffers autograd keeps (batch norm's running statistics, beside its save_mean and
  save_invstd) count, as fixed bytes, as the analytic generator counts them. The loss's saved tensors
  count with the last layer (its backward comes right after the loss's);
- packed bytes: every tensor autograd packs, each time it is packed, parameters included: what
  ``torch.autograd.graph.save_on_cpu`` copies (a ReLU's output that the next convolution saves again is
  copied twice);
- output bytes: the layer's output tensors;
- FLOPs: ``torch.utils.flop_counter``'s formulas (a multiply-add = 2 FLOPs; conv/linear/matmul only), forward
  attributed by the forward hooks and backward by the autograd-node hooks: a layer whose input needs no
  gradient (the first conv) has backward FLOPs equal to its forward FLOPs, the others twice;
- memory traffic (for the roofline, excluding parameters): the compulsory bytes each op reads and writes,
  by the same per-kind rules as :mod:`trainsim.sim.compute.analytic_models` (so a described and a built-in
  workload
  are timed alike), fed with the measured tensor sizes.

The step runs at two batch sizes (2 and 4: batch norm refuses one sample on a 1x1 map): the difference gives
the per-sample figures, and what does not grow with the batch (batch-norm statistics, position indices,
the causal mask) is ``saved_activation_bytes_fixed``.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from trainsim.calibrate import zoo
from trainsim.calibrate.measure.cuda_autocast import CudaFloat32Ops
from trainsim.calibrate.measure.layer_hooks import LayerHooks
from trainsim.errors import TrainsimError, unknown_name
from trainsim.formats.workload import AutocastBytes, InputSpec, Layer, Provenance, SpatialShape, Workload
from trainsim.provenance import provenance

_KINDS = {
    nn.Conv2d: "conv2d", nn.Linear: "linear", nn.BatchNorm2d: "batchnorm", nn.ReLU: "relu",
    nn.MaxPool2d: "maxpool", nn.AdaptiveAvgPool2d: "avgpool", nn.Dropout: "dropout",
    nn.Embedding: "embedding", nn.LayerNorm: "layernorm", zoo.CausalAttentionCore: "attention",
    nn.GELU: "gelu",
    # the zoo Llama's layers as the simulator's transformer workload names their kinds
    nn.RMSNorm: "rmsnorm", zoo.Rotary: "rope", zoo.SdpaCore: "flash_attention", zoo.SwiGLU: "swiglu",
}
UNATTRIBUTED = "(unattributed)"


def layer_kind(module: nn.Module) -> str:
    for cls, kind in _KINDS.items():
        if isinstance(module, cls):
            return kind
    return type(module).__name__.lower()


def _storage_key(t: torch.Tensor) -> int:
    # The StorageImpl's address: stable while the storage lives, and defined on the meta device too.
    return t.untyped_storage()._cdata


@dataclass
class StepFacts:
    """What one layer did in one described step at one batch size (whole batch, not per sample)."""

    name: str
    kind: str
    param_bytes: int = 0
    shared_param_bytes: int = 0
    saved_bytes: int = 0
    packed_bytes: int = 0  # every tensor packed, each time, parameters too (what torch's save_on_cpu copies)
    weight_copy_bytes: int = 0  # autocast's 16-bit copies of parameters that the backward keeps
    output_bytes: int = 0
    flops_forward: int = 0
    flops_backward: int = 0
    traffic_forward: float = 0.0
    traffic_backward: float = 0.0
    spatial: dict | None = None


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _traffic(kind: str, module: nn.Module, x: torch.Tensor | None,
             out: list[torch.Tensor]) -> tuple[float, float]:
    """Compulsory forward/backward bytes of one layer call, as analytic_models counts them."""
    xb = x.numel() * x.element_size() if x is not None else 0
    ob = _nbytes(out)
    x_grad = x is not None and x.requires_grad
    if kind in ("conv2d", "linear"):
        return xb + ob, (2 * ob + 2 * xb) if x_grad else (ob + xb)
    if kind == "batchnorm":
        return 2 * xb + ob, 2 * ob + 3 * xb
    if kind in ("relu", "gelu"):
        return 2 * xb, 3 * xb
    if kind == "maxpool":
        idx = sum(t.numel() for t in out) * 8
        return xb + ob + idx, ob + idx + 2 * xb
    if kind == "avgpool":
        return xb + ob, ob + xb
    if kind == "dropout":
        if not module.training or module.p == 0:
            return 0.0, 0.0
        mask = x.numel()
        return xb + ob + mask, ob + mask + xb
    if kind == "embedding":
        return xb + 2 * ob, xb + 3 * ob
    if kind == "layernorm":
        stats = 2 * (x.numel() // x.shape[-1]) * 4
        return 2 * xb + stats, 3 * xb + stats
    if kind == "attention":
        b, t, c3 = x.shape
        c, s = c3 // 3, x.element_size()
        scores = module.n_head * t * t
        return b * (12 * t * c + 8 * scores) * s, b * (16 * t * c + 11 * scores) * s
    return xb + ob, 2 * (xb + ob)


def _spatial(module: nn.Module, x: torch.Tensor, out: torch.Tensor) -> dict | None:
    if not isinstance(module, nn.Conv2d) or x.dim() != 4:
        return None
    pad = module.padding
    if isinstance(pad, str) or any(len(set(v)) > 1 for v in (module.stride, pad, module.dilation)):
        return None  # the workload format records square geometry only
    return {"in_h": x.shape[2], "in_w": x.shape[3], "in_c": x.shape[1], "out_c": out.shape[1],
            "kernel_h": module.kernel_size[0], "kernel_w": module.kernel_size[1], "stride": module.stride[0],
            "padding": pad[0], "dilation": module.dilation[0], "groups": module.groups,
            "out_h": out.shape[2], "out_w": out.shape[3]}


class _Recorder:
    """Observer + saved-tensor hooks + flop attribution for one described step."""

    def __init__(self, model: nn.Module, hooks: LayerHooks):
        self.hooks = hooks
        self.phase = "forward"
        self.facts: dict[str, StepFacts] = {}
        self.unattributed_saved = 0
        self.unattributed_packed = 0
        self._seen_storages: set[int] = set()
        self._param_storages = {_storage_key(p) for p in model.parameters()}
        self._param_ids = {id(p) for p in model.parameters()}
        self._param_owner: dict[int, str] = {}

    # LayerObserver
    def start(self, phase: str, layer: str) -> None:
        self.phase = phase
        if layer in self.facts:
            return
        module = self.hooks.modules[layer]
        facts = self.facts[layer] = StepFacts(layer, layer_kind(module))
        for p in module.parameters(recurse=False):
            nbytes = p.numel() * p.element_size()
            if id(p) in self._param_owner:
                facts.shared_param_bytes += nbytes
            else:
                self._param_owner[id(p)] = layer
                facts.param_bytes += nbytes

    def end(self, phase: str, layer: str) -> None:
        pass

    def output(self, layer: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> None:
        f = self.facts[layer]
        module = self.hooks.modules[layer]
        x = inputs[0] if inputs else None
        f.output_bytes += _nbytes(outputs)
        fwd, bwd = _traffic(f.kind, module, x, outputs)
        f.traffic_forward += fwd
        f.traffic_backward += bwd
        if f.spatial is None and x is not None and outputs:
            f.spatial = _spatial(module, x, outputs[0])

    # saved_tensors_hooks
    def pack(self, t: torch.Tensor) -> torch.Tensor:
        layer = self.hooks.current
        if layer is None:
            self.unattributed_packed += t.numel() * t.element_size()
        else:
            self.facts[layer].packed_bytes += t.numel() * t.element_size()
        key = _storage_key(t)
        if self._casts_parameter(t):  # weights, not activations: counted apart
            if key not in self._seen_storages and layer is not None:
                self._seen_storages.add(key)
                self.facts[layer].weight_copy_bytes += t.untyped_storage().nbytes()
            return t
        if key not in self._param_storages and key not in self._seen_storages:
            self._seen_storages.add(key)
            nbytes = t.untyped_storage().nbytes()
            layer = self.hooks.current
            if layer is None:
                self.unattributed_saved += nbytes
            else:
                self.facts[layer].saved_bytes += nbytes
        return t

    def _casts_parameter(self, t: torch.Tensor) -> bool:
        """Whether ``t`` (or the tensor it views) is autocast's 16-bit copy of a parameter: made by a copy
        whose autograd input is the parameter itself."""
        base = t._base if t._base is not None else t
        fn = base.grad_fn
        if fn is None or fn.name() != "ToCopyBackward0" or not fn.next_functions:
            return False
        source = fn.next_functions[0][0]
        return source is not None and id(getattr(source, "variable", None)) in self._param_ids

    # flop counting
    def add_flops(self, flops: int) -> None:
        layer = self.hooks.current
        if layer is None:
            return
        if self.phase == "forward":
            self.facts[layer].flops_forward += flops
        else:
            self.facts[layer].flops_backward += flops


class _LayerFlopCounter(FlopCounterMode):
    """torch's flop counter, attributing each op to the running layer instead of to module parents."""

    def __init__(self, recorder: _Recorder):
        super().__init__(display=False)
        self.recorder = recorder

    def _count_flops(self, func_packet, out, args, kwargs):
        if func_packet in self.flop_registry:
            self.recorder.add_flops(int(self.flop_registry[func_packet](*args, **kwargs, out_val=out)))
        return out


def step_facts(model: nn.Module, name: str, batch: int, device: str | torch.device = "meta",
               autocast: torch.dtype | None = None, **cfg) -> tuple[list[StepFacts], int, int]:
    """Run one training step of zoo model ``name`` at ``batch`` and return its layers' facts in forward
    order, and the bytes saved and packed outside any layer (by the loss). ``autocast``: the forward runs
    under autocast to that dtype and the loss on its output cast to fp32, as the executor trains."""
    inputs, targets = zoo.example_batch(name, batch, device, **cfg)
    device_type = torch.device(device).type
    with LayerHooks(model, []) as hooks:
        rec = _Recorder(model, hooks)
        hooks.observers.append(rec)
        with _LayerFlopCounter(rec), torch.autograd.graph.saved_tensors_hooks(rec.pack, lambda t: t):
            with torch.autocast(device_type, dtype=autocast) if autocast else contextlib.nullcontext():
                output = model(inputs)
            loss = zoo.loss_fn(name, output.float(), targets)
            rec.phase = "backward"
            loss.backward()
    model.zero_grad(set_to_none=True)
    return [rec.facts[layer] for layer in hooks.order], rec.unattributed_saved, rec.unattributed_packed


DESCRIBE_BATCHES = (2, 4)


def _per_sample(small: float, large: float) -> float:
    b1, b2 = DESCRIBE_BATCHES
    return (large - small) / (b2 - b1)


def _as_int(x: float) -> int:
    return int(round(x))


def _two_steps(name: str, device: str | torch.device, merged: dict, autocast: torch.dtype | None = None
               ) -> tuple[list[StepFacts], list[StepFacts]]:
    """The facts of a step at each of DESCRIBE_BATCHES, the loss's saved and packed bytes in the last layer's
    (the loss saves its input's softmax, GPT-2: batch x tokens x vocabulary, for its backward, which runs
    just before the last layer's)."""
    with torch.device(device):
        model = zoo.build_model(name, **merged)
    steps = []
    for batch in DESCRIBE_BATCHES:
        try:
            facts, loss_saved, loss_packed = step_facts(model, name, batch, device, autocast, **merged)
        except (RuntimeError, ValueError) as exc:  # shapes torch refuses, e.g. an image too small for it
            options = ", ".join(f"{k}={v}" for k, v in merged.items())
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise TrainsimError(f"{name} does not run with {options}: {first}",
                                field="model options") from None
        facts[-1].saved_bytes += loss_saved
        facts[-1].packed_bytes += loss_packed
        steps.append(facts)
    return steps[0], steps[1]


def describe_layers(name: str, device: str = "meta", **cfg) -> list[Layer]:
    """Per-layer analytic records (no timing) of zoo model ``name`` with options ``cfg``."""
    name = zoo.canonical_name(name)
    merged = zoo.model_config(name, **cfg)
    small, large = _two_steps(name, device, merged)
    layers = []
    for s, g in zip(small, large, strict=True):
        saved = _per_sample(s.saved_bytes, g.saved_bytes)
        packed = _per_sample(s.packed_bytes, g.packed_bytes)
        layers.append(Layer(
            name=s.name, kind=s.kind, param_bytes=s.param_bytes, shared_param_bytes=s.shared_param_bytes,
            saved_activation_bytes_per_sample=_as_int(saved),
            saved_activation_bytes_fixed=_as_int(s.saved_bytes - DESCRIBE_BATCHES[0] * saved),
            saved_packed_bytes_per_sample=_as_int(packed),
            saved_packed_bytes_fixed=_as_int(s.packed_bytes - DESCRIBE_BATCHES[0] * packed),
            output_bytes_per_sample=_as_int(_per_sample(s.output_bytes, g.output_bytes)),
            flops_forward_per_sample=_per_sample(s.flops_forward, g.flops_forward),
            flops_backward_per_sample=_per_sample(s.flops_backward, g.flops_backward),
            memory_bytes_forward_per_sample=_per_sample(s.traffic_forward, g.traffic_forward),
            memory_bytes_backward_per_sample=_per_sample(s.traffic_backward, g.traffic_backward),
            spatial=SpatialShape(**s.spatial) if s.spatial else None,
        ))
    return layers


#: the dtype of each 16-bit precision autocast runs
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_bytes(name: str, device: str | torch.device, precision: str, *, cuda_policy: bool = False,
                   **cfg) -> list[AutocastBytes]:
    """Each layer's activation bytes of zoo model ``name`` (in forward order, as `describe_layers`) with the
    forward under autocast to ``precision``, from real training steps on ``device`` at DESCRIBE_BATCHES:
    autocast's op lists are the device type's own, and the meta device has none. ``cuda_policy``: on a CPU,
    run CUDA autocast's fp32 ops in fp32 (`cuda_autocast.CudaFloat32Ops`), as a CUDA run keeps them."""
    if precision not in AUTOCAST_DTYPES:
        raise unknown_name("precision", precision, AUTOCAST_DTYPES, field="precision")
    if torch.device(device).type == "meta":
        raise TrainsimError("autocast bytes need a real device (cpu or cuda), not meta", field="device")
    name = zoo.canonical_name(name)
    merged = zoo.model_config(name, **cfg)
    emulate = cuda_policy and torch.device(device).type != "cuda"
    with CudaFloat32Ops() if emulate else contextlib.nullcontext():
        small, large = _two_steps(name, device, merged, AUTOCAST_DTYPES[precision])
    out = []
    for s, g in zip(small, large, strict=True):
        saved = _per_sample(s.saved_bytes, g.saved_bytes)
        packed = _per_sample(s.packed_bytes, g.packed_bytes)
        out.append(AutocastBytes(
            saved_per_sample=_as_int(saved),
            saved_fixed=max(0, _as_int(s.saved_bytes - DESCRIBE_BATCHES[0] * saved)),
            packed_per_sample=_as_int(packed),
            packed_fixed=max(0, _as_int(s.packed_bytes - DESCRIBE_BATCHES[0] * packed)),
            output_per_sample=_as_int(_per_sample(s.output_bytes, g.output_bytes)),
            weight_copies=s.weight_copy_bytes,
        ))
    return out


def input_spec(name: str, prep_s_per_sample: float | None = None, **cfg) -> InputSpec:
    """The host-side input of one sample as the executor's data pipeline hands it to the device
    (`calibrate.execute.data_prep`): a normalised float32 CHW image, or int64 tokens."""
    shape = zoo.input_shape(name, **cfg)
    tokens = zoo.model_spec(name).kind == "tokens"
    itemsize = 8 if tokens else 4
    return InputSpec(shape=shape, dtype="int64" if tokens else "float32",
                     bytes_per_sample=math.prod(shape) * itemsize, prep_s_per_sample=prep_s_per_sample)


def describe(name: str, **cfg) -> Workload:
    """The analytic workload (shapes, bytes, FLOPs; no timing) of zoo model ``name``, measured by torch on
    the meta device. ``cfg`` overrides the model's defaults (image_size, num_classes; GPT sizes)."""
    canonical = zoo.canonical_name(name)
    merged = zoo.model_config(canonical, **cfg)
    return Workload(
        name=canonical, dtype="float32", input=input_spec(canonical, **merged),
        layers=describe_layers(canonical, **merged),
        provenance=Provenance(**provenance(timestamp=False, device="analytic", device_spec=None,
                                           generator="trainsim.calibrate.measure.describe", config=merged)),
    )


def parse_overrides(pairs: list[str] | None) -> dict:
    """``["image_size=32", "dropout=0.1"]`` -> ``{"image_size": 32, "dropout": 0.1}``."""
    out = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise TrainsimError(f"expected KEY=VALUE, got {pair!r}", field="--set")
        try:
            number = float(value)
        except ValueError:
            raise TrainsimError(f"value of {key.strip()!r} must be a number, got {value!r}",
                                field="--set") from None
        out[key.strip()] = int(number) if number.is_integer() and "." not in value else number
    return out


def layer_rows(workload: Workload) -> list[dict]:
    """One flat row per layer (for tables and --json); measured layers add their times at each batch."""
    rows = []
    for layer in workload.layers:
        row = {"name": layer.name, "kind": layer.kind, "params": layer.param_bytes // workload.itemsize,
               "saved_kib_per_sample": layer.saved_activation_bytes_per_sample / 1024,
               "output_kib_per_sample": layer.output_bytes_per_sample / 1024,
               "gflops_forward_per_sample": layer.flops_forward_per_sample / 1e9,
               "gflops_backward_per_sample": layer.flops_backward_per_sample / 1e9}
        for phase in ("forward", "backward"):
            model = getattr(layer, phase)
            if model is not None:
                row[f"{phase}_s"] = {b: t for b, t, _ in model.points}
        rows.append(row)
    return rows
