"""Built-in workloads from layer-shape arithmetic alone: no torch, no measurement.

``build_analytic(name, **cfg)`` walks a model's layers the way PyTorch would execute them (one layer per leaf
``nn.Module`` call, forward order, qualified module names as in the calibration zoo) and records, per sample,
parameter bytes, saved-activation bytes, output bytes, FLOPs and memory traffic. Regenerate the shipped files
with ``python -m trainsim.sim.compute.analytic_models --out scenarios/workloads``.

FLOPs follow ``torch.utils.flop_counter``: only conv/linear/matmul count, a multiply-add is 2 FLOPs, bias adds
are free, and backward is 2x forward (input grad + weight grad) except where the input needs no gradient (the
first conv, whose input is the image): there only the weight grad runs, 1x forward.

Saved activations follow PyTorch's autograd as measured with ``saved_tensors_hooks``, de-duplicated by storage
across the whole model, parameters excluded (buffers are not parameters), each storage attributed to the
first layer that saves it. Checked against torch 2.13 on the CPU for every model here. The rules (fp32
unless the dtype says otherwise):

- conv2d, linear: the input (the normalised float image counts, saved by the first conv);
- batchnorm (training): the input, plus four fp32 per-channel vectors once per batch (``_fixed``):
  save_mean, save_invstd and the running_mean/running_var buffers (autograd's hooks see them too);
- relu (not inplace): the output; gelu: the input;
- maxpool: the input plus int64 indices of the output's size;
- adaptive avgpool: nothing to a 1x1 output (torch takes the ``mean`` path, which keeps only sizes), the
  input otherwise (``_adaptive_avg_pool2d`` keeps ``self``);
- dropout with p > 0: the mask, ``dropout_mask_bytes`` per element (1: CUDA's fused kernel keeps a bool mask;
  torch on the CPU keeps a float noise tensor: 4); p = 0 returns its input and saves nothing;
- layernorm: the input plus fp32 mean and rstd per token; embedding: its int64 indices (``wpe``'s position
  indices exist once per batch, so they are ``_fixed``);
- attention core (math form, nanoGPT's slow path: ``softmax(mask(q @ k^T * s)) @ v``): ``q``, ``k`` and ``v``
  are strided views of ``c_attn``'s output that ``bmm`` must copy to contiguous batches, so it keeps the three
  copies (3·T·C) and the softmax output (n_head·T·T); the second ``bmm`` reuses the softmax output's storage;
  ``masked_fill`` keeps the causal bool mask (T·T bytes, once per batch). Dropout is 0, so nothing else.

- the loss (cross entropy): the log-softmax of the last layer's output, the int64 targets and the NLL's
  total weight (one fp32 per batch), counted with the last layer.

A layer whose input is a storage already saved earlier (a conv after a relu, the branches of an inception
block reading the same concat) saves nothing new. Packed bytes (what torch's ``save_on_cpu`` copies) count
every tensor each time an op packs it, and the parameters backward needs: conv/linear weights (not biases),
batchnorm's weight, layer norm's weight and bias; the softmax output twice in the attention (softmax and the
second bmm), the log-probs twice in the loss (log-softmax and NLL).

An fp32 workload also carries each layer's bytes with the forward under CUDA's torch.autocast to 16 bit
(`autocast_bytes`: the same walk, with autocast's casts).

Functional ops between modules (residual add, flatten, concat) are not layers; their (small) traffic is not
counted.

Memory traffic per sample is the bytes each op must read and write once (compulsory traffic, no cache reuse
modelled), excluding parameters: the roofline adds ``param_bytes`` once per batch (read in forward, read and
grad-written in backward). Batchnorm reads its input twice (statistics, then normalise).

It stays one module: the saved-activation and FLOP rules above and the layer builder that applies them
are one table, checked together against torch; split, a rule would sit apart from the code that obeys it.
"""

from __future__ import annotations

import argparse
import itertools
import math
from dataclasses import dataclass, fields
from pathlib import Path

from pydantic import ValidationError

from trainsim.errors import TrainsimError, pydantic_message, unknown_name
from trainsim.formats.workload import (
    DTYPE_BYTES,
    AutocastBytes,
    InputSpec,
    Layer,
    Provenance,
    SpatialShape,
    Workload,
    dumps_workload,
)

from .transformers import transformer_models

INT64 = 8
#: the most layers an analytic model may have: options beyond it (n_layer: 100000000) are a typo that would
#: build for hours, refused as the model is built
MAX_LAYERS = 100_000
FP32 = 4
LOW = 2  # bytes per value of autocast's 16-bit types (bf16, fp16)


@dataclass
class _Tensor:
    """A per-sample activation: its shape without the batch dim, its storage id, whether it needs grad."""

    shape: tuple[int, ...]
    storage: int
    itemsize: int
    requires_grad: bool = True

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


class _Builder:
    """Records layers as a model's forward pass would execute them; with ``autocast``, as it runs under CUDA's
    torch.autocast to 16 bit (see `autocast_bytes`), keeping the 16-bit weight copies per layer."""

    def __init__(self, dtype: str = "float32", dropout_mask_bytes: int = 1, autocast: bool = False):
        self.dtype = dtype
        self.itemsize = DTYPE_BYTES[dtype]
        self.dropout_mask_bytes = dropout_mask_bytes
        self.autocast = autocast
        # the element size of the ops autocast runs in 16 bit, and of those it runs in fp32
        self.low = LOW if autocast else self.itemsize
        self.fp32 = FP32 if autocast else self.itemsize
        self.layers: list[Layer] = []
        self.weight_copies: dict[str, int] = {}
        self._ids = itertools.count()
        self._saved: set[int] = set()

    # --- tensors --------------------------------------------------------------------------------------
    def tensor(self, shape, *, itemsize: int | None = None, requires_grad: bool = True) -> _Tensor:
        return _Tensor(tuple(shape), next(self._ids), itemsize or self.itemsize, requires_grad)

    def view(self, x: _Tensor, shape) -> _Tensor:
        """A view (flatten, reshape of contiguous data): same storage."""
        assert math.prod(shape) == x.numel, (shape, x.shape)
        return _Tensor(tuple(shape), x.storage, x.itemsize, x.requires_grad)

    def add(self, a: _Tensor, b: _Tensor) -> _Tensor:
        """A functional residual add: a new tensor, not a layer (the wider of the two types)."""
        return self.tensor(a.shape, itemsize=max(a.itemsize, b.itemsize))

    def cat(self, tensors: list[_Tensor], dim: int = 0) -> _Tensor:
        """A functional concat along a per-sample dim: a new tensor, not a layer."""
        shape = list(tensors[0].shape)
        shape[dim] = sum(t.shape[dim] for t in tensors)
        return self.tensor(shape, itemsize=max(t.itemsize for t in tensors))

    def _cast(self, x: _Tensor, itemsize: int) -> _Tensor:
        """Autocast's cast of an op's input: a new tensor, unless it already has that element size."""
        if x.itemsize == itemsize:
            return x
        return _Tensor(x.shape, next(self._ids), itemsize, x.requires_grad)

    def _weight(self, name: str, elements: int) -> int:
        """Bytes of the conv/linear weight that backward packs (not the bias): under autocast its 16-bit
        copy, kept apart as the layer's weight copy."""
        if self.autocast:
            self.weight_copies[name] = elements * LOW
            return elements * LOW
        return elements * self.itemsize

    def _save(self, x: _Tensor) -> int:
        """Bytes newly saved if autograd keeps ``x`` (0 when its storage is already kept)."""
        if x.storage in self._saved:
            return 0
        self._saved.add(x.storage)
        return x.nbytes

    def _record(self, name, kind, *, params=0, saved=0, saved_fixed=0, packed=0, packed_fixed=0,
                out: _Tensor | None = None, flops_f=0.0, flops_b=0.0, mem_f=0.0, mem_b=0.0, spatial=None,
                shared_params=0) -> None:
        """One layer. ``saved``: bytes newly kept for backward (storages de-duplicated); ``packed``: bytes of
        every tensor its backward packs, each time, and ``packed_fixed`` the parameters it packs too."""
        if len(self.layers) >= MAX_LAYERS:
            raise TrainsimError(f"the options make a model of more than {MAX_LAYERS:,} layers")
        self.layers.append(Layer(
            name=name, kind=kind, param_bytes=params * self.itemsize,
            shared_param_bytes=shared_params * self.itemsize,
            saved_activation_bytes_per_sample=saved, saved_activation_bytes_fixed=saved_fixed,
            saved_packed_bytes_per_sample=packed, saved_packed_bytes_fixed=saved_fixed + packed_fixed,
            output_bytes_per_sample=out.nbytes if out is not None else 0,
            flops_forward_per_sample=float(flops_f), flops_backward_per_sample=float(flops_b),
            memory_bytes_forward_per_sample=float(mem_f), memory_bytes_backward_per_sample=float(mem_b),
            spatial=spatial))

    @staticmethod
    def _grad_flops(x: _Tensor, forward: float) -> float:
        # weight grad always; input grad only when the input needs one
        return 2 * forward if x.requires_grad else forward

    @staticmethod
    def _grad_traffic(x: _Tensor, out: _Tensor) -> float:
        # read grad_out for the input grad and the weight grad, read the input, write grad_in
        return 2 * out.nbytes + 2 * x.nbytes if x.requires_grad else out.nbytes + x.nbytes

    # --- layers ---------------------------------------------------------------------------------------
    def conv2d(self, name, x: _Tensor, out_c: int, kernel: int, stride: int = 1, padding: int = 0,
               bias: bool = True) -> _Tensor:
        in_c, in_h, in_w = x.shape
        out_h = (in_h + 2 * padding - kernel) // stride + 1
        out_w = (in_w + 2 * padding - kernel) // stride + 1
        if out_h < 1 or out_w < 1:
            raise TrainsimError(f"input {in_h}x{in_w} is too small: {name} would output {out_h}x{out_w}",
                                field="image_size")
        x = self._cast(x, self.low)
        out = self.tensor((out_c, out_h, out_w), itemsize=self.low)
        flops = 2.0 * out_c * in_c * kernel * kernel * out_h * out_w
        self._record(name, "conv2d", params=out_c * in_c * kernel * kernel + (out_c if bias else 0),
                     saved=self._save(x), packed=x.nbytes,
                     packed_fixed=self._weight(name, out_c * in_c * kernel * kernel),
                     out=out, flops_f=flops, flops_b=self._grad_flops(x, flops),
                     mem_f=x.nbytes + out.nbytes, mem_b=self._grad_traffic(x, out),
                     spatial=SpatialShape(in_h=in_h, in_w=in_w, in_c=in_c, out_c=out_c, kernel_h=kernel,
                                          kernel_w=kernel, stride=stride, padding=padding, out_h=out_h,
                                          out_w=out_w))
        return out

    def linear(self, name, x: _Tensor, out_features: int, bias: bool = True, tied: bool = False) -> _Tensor:
        *lead, in_features = x.shape
        rows = math.prod(lead)
        x = self._cast(x, self.low)
        out = self.tensor((*lead, out_features), itemsize=self.low)
        flops = 2.0 * rows * in_features * out_features
        weights = in_features * out_features + (out_features if bias else 0)
        self._record(name, "linear", params=0 if tied else weights, shared_params=weights if tied else 0,
                     saved=self._save(x), packed=x.nbytes,
                     packed_fixed=self._weight(name, in_features * out_features), out=out, flops_f=flops,
                     flops_b=self._grad_flops(x, flops), mem_f=x.nbytes + out.nbytes,
                     mem_b=self._grad_traffic(x, out))
        return out

    def batchnorm(self, name, x: _Tensor) -> _Tensor:
        channels = x.shape[0]
        out = self.tensor(x.shape, itemsize=x.itemsize)
        self._record(name, "batchnorm", params=2 * channels, saved=self._save(x), packed=x.nbytes,
                     saved_fixed=4 * channels * 4, packed_fixed=channels * self.itemsize, out=out,
                     mem_f=2 * x.nbytes + out.nbytes, mem_b=2 * out.nbytes + 3 * x.nbytes)
        return out

    def relu(self, name, x: _Tensor) -> _Tensor:
        out = self.tensor(x.shape, itemsize=x.itemsize)
        self._record(name, "relu", saved=self._save(out), packed=out.nbytes, out=out, mem_f=2 * x.nbytes,
                     mem_b=3 * x.nbytes)
        return out

    def gelu(self, name, x: _Tensor) -> _Tensor:
        out = self.tensor(x.shape, itemsize=x.itemsize)
        self._record(name, "gelu", saved=self._save(x), packed=x.nbytes, out=out, mem_f=2 * x.nbytes,
                     mem_b=3 * x.nbytes)
        return out

    def maxpool(self, name, x: _Tensor, kernel: int, stride: int | None = None, padding: int = 0,
                ceil_mode: bool = False) -> _Tensor:
        stride = stride or kernel
        channels, in_h, in_w = x.shape
        out_h = _pool_out(in_h, kernel, stride, padding, ceil_mode)
        out_w = _pool_out(in_w, kernel, stride, padding, ceil_mode)
        if out_h < 1 or out_w < 1:
            raise TrainsimError(f"input is too small: {name} gets {in_h}x{in_w} and would output "
                                f"{out_h}x{out_w}", field="image_size")
        out = self.tensor((channels, out_h, out_w), itemsize=x.itemsize)
        indices = out.numel * INT64
        self._record(name, "maxpool", saved=self._save(x) + indices, packed=x.nbytes + indices, out=out,
                     mem_f=x.nbytes + out.nbytes + indices, mem_b=out.nbytes + indices + 2 * x.nbytes)
        return out

    def adaptive_avgpool(self, name, x: _Tensor, size: int) -> _Tensor:
        out = self.tensor((x.shape[0], size, size), itemsize=x.itemsize)
        saved = 0 if size == 1 else self._save(x)
        self._record(name, "avgpool", saved=saved, packed=0 if size == 1 else x.nbytes, out=out,
                     mem_f=x.nbytes + out.nbytes, mem_b=out.nbytes + x.nbytes)
        return out

    def dropout(self, name, x: _Tensor, p: float) -> _Tensor:
        if p == 0:
            # torch returns the input itself: no kernel, nothing saved
            self._record(name, "dropout", out=x)
            return x
        out = self.tensor(x.shape, itemsize=x.itemsize)
        mask = x.numel * self.dropout_mask_bytes
        self._record(name, "dropout", saved=mask, packed=mask, out=out, mem_f=x.nbytes + out.nbytes + mask,
                     mem_b=out.nbytes + mask + x.nbytes)
        return out

    def embedding(self, name, idx: _Tensor, num: int, dim: int, *, per_batch: bool = False) -> _Tensor:
        tokens = idx.numel
        out = self.tensor((*idx.shape, dim))
        # gather: read indices and rows, write rows; backward: read grad and indices, accumulate rows
        traffic_f = idx.nbytes + 2 * out.nbytes
        traffic_b = idx.nbytes + 3 * out.nbytes
        if per_batch:
            # position embeddings: computed once per batch and broadcast, nothing scales with the batch
            self._record(name, "embedding", params=num * dim, saved_fixed=tokens * INT64)
            self._saved.add(idx.storage)
        else:
            self._record(name, "embedding", params=num * dim, saved=self._save(idx), packed=idx.nbytes,
                         out=out, mem_f=traffic_f, mem_b=traffic_b)
        return out

    def layernorm(self, name, x: _Tensor) -> _Tensor:
        *lead, dim = x.shape
        stats = 2 * math.prod(lead) * 4  # fp32 mean and rstd per row
        x = self._cast(x, self.fp32)
        out = self.tensor(x.shape, itemsize=self.fp32)
        self._record(name, "layernorm", params=2 * dim, saved=self._save(x) + stats, packed=x.nbytes + stats,
                     packed_fixed=2 * dim * self.itemsize, out=out,
                     mem_f=2 * x.nbytes + stats, mem_b=3 * x.nbytes + stats)
        return out

    def attention(self, name, qkv: _Tensor, n_head: int) -> _Tensor:
        seq, three_c = qkv.shape
        dim = three_c // 3
        scores = n_head * seq * seq  # elements of one score matrix set
        s = qkv.itemsize
        out = self.tensor((seq, dim), itemsize=self.low)
        copies = 3 * seq * dim * s  # contiguous q, k, v batches for bmm
        # the softmax output, packed by the softmax and by the second bmm; under autocast it is fp32 and the
        # bmm keeps its own 16-bit copy of it
        probs = scores * self.fp32 + (scores * LOW if self.autocast else 0)
        self._record(name, "attention",
                     saved=copies + probs, packed=copies + scores * self.fp32 + scores * self.low,
                     saved_fixed=seq * seq,  # + the bool causal mask
                     out=out, flops_f=4.0 * seq * seq * dim, flops_b=8.0 * seq * seq * dim,
                     mem_f=(12 * seq * dim + 8 * scores) * s, mem_b=(16 * seq * dim + 11 * scores) * s)
        return out


def _pool_out(size: int, kernel: int, stride: int, padding: int, ceil_mode: bool) -> int:
    """PyTorch's pooling output size (aten pooling_output_shape)."""
    span = size + 2 * padding - kernel + (stride - 1 if ceil_mode else 0)
    out = span // stride + 1
    if ceil_mode and (out - 1) * stride >= size + padding:
        out -= 1
    return out


# --- model configs ------------------------------------------------------------------------------------

#: bytes per value of an image batch as it crosses to the device
IMAGE_INPUT_BYTES = {"uint8": 1, "float32": 4}


@dataclass
class ImageConfig:
    """A CNN on square images. ``dropout_mask_bytes``: 1 for CUDA (bool mask), 4 for torch on the CPU.
    ``input_dtype``: how a batch crosses to the device, uint8 (normalised on the GPU, as DALI does) or float32
    (normalised by the CPU pipeline, as torchvision's transforms and the executor's `data_prep` do)."""

    image_size: int = 224
    num_classes: int = 1000
    dropout_mask_bytes: int = 1
    dtype: str = "float32"
    input_dtype: str = "uint8"

    def __post_init__(self):
        _positive(self, "image_size", "num_classes")
        if self.dropout_mask_bytes not in (1, 2, 4):
            raise TrainsimError("must be 1, 2 or 4", field="dropout_mask_bytes")
        if self.dtype not in DTYPE_BYTES:
            raise unknown_name("dtype", self.dtype, DTYPE_BYTES, field="dtype")
        if self.input_dtype not in IMAGE_INPUT_BYTES:
            raise unknown_name("input_dtype", self.input_dtype, IMAGE_INPUT_BYTES, field="input_dtype")


@dataclass
class TinyCNNConfig(ImageConfig):
    image_size: int = 32
    num_classes: int = 10


@dataclass
class GPTConfig:
    """A nanoGPT-style decoder. Defaults: GPT-2 small (124 M params with the tied lm_head)."""

    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    vocab_size: int = 50257
    block_size: int = 1024
    dtype: str = "float32"

    def __post_init__(self):
        _positive(self, "n_layer", "n_head", "n_embd", "vocab_size", "block_size")
        if self.n_embd % self.n_head:
            raise TrainsimError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})",
                                field="n_embd")
        if self.dtype not in DTYPE_BYTES:
            raise unknown_name("dtype", self.dtype, DTYPE_BYTES, field="dtype")


def _positive(cfg, *names):
    for name in names:
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise TrainsimError(f"must be a positive integer, got {value!r}", field=name)


# --- models -------------------------------------------------------------------------------------------

def _image_input(b: _Builder, cfg: ImageConfig) -> tuple[_Tensor, InputSpec]:
    size = cfg.image_size
    x = b.tensor((3, size, size), requires_grad=False)
    return x, InputSpec(shape=[3, size, size], dtype=cfg.input_dtype,
                        bytes_per_sample=3 * size * size * IMAGE_INPUT_BYTES[cfg.input_dtype])


def _alexnet(b: _Builder, cfg: ImageConfig) -> InputSpec:
    x, spec = _image_input(b, cfg)
    x = b.conv2d("features.0", x, 64, 11, stride=4, padding=2)
    x = b.relu("features.1", x)
    x = b.maxpool("features.2", x, 3, 2)
    x = b.conv2d("features.3", x, 192, 5, padding=2)
    x = b.relu("features.4", x)
    x = b.maxpool("features.5", x, 3, 2)
    x = b.conv2d("features.6", x, 384, 3, padding=1)
    x = b.relu("features.7", x)
    x = b.conv2d("features.8", x, 256, 3, padding=1)
    x = b.relu("features.9", x)
    x = b.conv2d("features.10", x, 256, 3, padding=1)
    x = b.relu("features.11", x)
    x = b.maxpool("features.12", x, 3, 2)
    x = b.adaptive_avgpool("avgpool", x, 6)
    x = b.view(x, (x.numel,))
    x = b.dropout("classifier.0", x, 0.5)
    x = b.linear("classifier.1", x, 4096)
    x = b.relu("classifier.2", x)
    x = b.dropout("classifier.3", x, 0.5)
    x = b.linear("classifier.4", x, 4096)
    x = b.relu("classifier.5", x)
    b.linear("classifier.6", x, cfg.num_classes)
    return spec


_VGG16 = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]


def _vgg16(b: _Builder, cfg: ImageConfig) -> InputSpec:
    x, spec = _image_input(b, cfg)
    index = 0
    for item in _VGG16:
        if item == "M":
            x = b.maxpool(f"features.{index}", x, 2, 2)
            index += 1
        else:
            x = b.conv2d(f"features.{index}", x, item, 3, padding=1)
            x = b.relu(f"features.{index + 1}", x)
            index += 2
    x = b.adaptive_avgpool("avgpool", x, 7)
    x = b.view(x, (x.numel,))
    x = b.linear("classifier.0", x, 4096)
    x = b.relu("classifier.1", x)
    x = b.dropout("classifier.2", x, 0.5)
    x = b.linear("classifier.3", x, 4096)
    x = b.relu("classifier.4", x)
    x = b.dropout("classifier.5", x, 0.5)
    b.linear("classifier.6", x, cfg.num_classes)
    return spec


def _basic_block(b: _Builder, prefix: str, x: _Tensor, planes: int, stride: int) -> _Tensor:
    identity = x
    out = b.conv2d(f"{prefix}.conv1", x, planes, 3, stride=stride, padding=1, bias=False)
    out = b.batchnorm(f"{prefix}.bn1", out)
    out = b.relu(f"{prefix}.relu1", out)
    out = b.conv2d(f"{prefix}.conv2", out, planes, 3, padding=1, bias=False)
    out = b.batchnorm(f"{prefix}.bn2", out)
    if stride != 1 or x.shape[0] != planes:
        identity = b.conv2d(f"{prefix}.downsample.0", x, planes, 1, stride=stride, bias=False)
        identity = b.batchnorm(f"{prefix}.downsample.1", identity)
    return b.relu(f"{prefix}.relu2", b.add(out, identity))


def _bottleneck(b: _Builder, prefix: str, x: _Tensor, planes: int, stride: int) -> _Tensor:
    identity = x
    out = b.conv2d(f"{prefix}.conv1", x, planes, 1, bias=False)
    out = b.batchnorm(f"{prefix}.bn1", out)
    out = b.relu(f"{prefix}.relu1", out)
    out = b.conv2d(f"{prefix}.conv2", out, planes, 3, stride=stride, padding=1, bias=False)
    out = b.batchnorm(f"{prefix}.bn2", out)
    out = b.relu(f"{prefix}.relu2", out)
    out = b.conv2d(f"{prefix}.conv3", out, planes * 4, 1, bias=False)
    out = b.batchnorm(f"{prefix}.bn3", out)
    if stride != 1 or x.shape[0] != planes * 4:
        identity = b.conv2d(f"{prefix}.downsample.0", x, planes * 4, 1, stride=stride, bias=False)
        identity = b.batchnorm(f"{prefix}.downsample.1", identity)
    return b.relu(f"{prefix}.relu3", b.add(out, identity))


def _resnet(block, blocks: list[int]):
    def build(b: _Builder, cfg: ImageConfig) -> InputSpec:
        x, spec = _image_input(b, cfg)
        x = b.conv2d("conv1", x, 64, 7, stride=2, padding=3, bias=False)
        x = b.batchnorm("bn1", x)
        x = b.relu("relu", x)
        x = b.maxpool("maxpool", x, 3, 2, padding=1)
        for stage, (planes, count) in enumerate(zip([64, 128, 256, 512], blocks, strict=True), start=1):
            for i in range(count):
                stride = 2 if stage > 1 and i == 0 else 1
                x = block(b, f"layer{stage}.{i}", x, planes, stride)
        x = b.adaptive_avgpool("avgpool", x, 1)
        x = b.view(x, (x.numel,))
        b.linear("fc", x, cfg.num_classes)
        return spec
    return build


def _basic_conv(b: _Builder, prefix: str, x: _Tensor, out_c: int, kernel: int, stride: int = 1,
                padding: int = 0) -> _Tensor:
    """torchvision's BasicConv2d: conv without bias, batchnorm (eps 0.001), relu."""
    x = b.conv2d(f"{prefix}.conv", x, out_c, kernel, stride=stride, padding=padding, bias=False)
    x = b.batchnorm(f"{prefix}.bn", x)
    return b.relu(f"{prefix}.relu", x)


_INCEPTIONS = {  # name: (ch1x1, ch3x3red, ch3x3, ch5x5red, ch5x5, pool_proj), as torchvision
    "inception3a": (64, 96, 128, 16, 32, 32), "inception3b": (128, 128, 192, 32, 96, 64),
    "inception4a": (192, 96, 208, 16, 48, 64), "inception4b": (160, 112, 224, 24, 64, 64),
    "inception4c": (128, 128, 256, 24, 64, 64), "inception4d": (112, 144, 288, 32, 64, 64),
    "inception4e": (256, 160, 320, 32, 128, 128), "inception5a": (256, 160, 320, 32, 128, 128),
    "inception5b": (384, 192, 384, 48, 128, 128),
}


def _inception(b: _Builder, name: str, x: _Tensor) -> _Tensor:
    ch1, ch3red, ch3, ch5red, ch5, pool_proj = _INCEPTIONS[name]
    y1 = _basic_conv(b, f"{name}.branch1", x, ch1, 1)
    y2 = _basic_conv(b, f"{name}.branch2.0", x, ch3red, 1)
    y2 = _basic_conv(b, f"{name}.branch2.1", y2, ch3, 3, padding=1)
    y3 = _basic_conv(b, f"{name}.branch3.0", x, ch5red, 1)
    y3 = _basic_conv(b, f"{name}.branch3.1", y3, ch5, 3, padding=1)  # 3x3, as torchvision has it
    y4 = b.maxpool(f"{name}.branch4.0", x, 3, 1, padding=1, ceil_mode=True)
    y4 = _basic_conv(b, f"{name}.branch4.1", y4, pool_proj, 1)
    return b.cat([y1, y2, y3, y4])


def _googlenet(b: _Builder, cfg: ImageConfig) -> InputSpec:
    x, spec = _image_input(b, cfg)
    x = _basic_conv(b, "conv1", x, 64, 7, stride=2, padding=3)
    x = b.maxpool("maxpool1", x, 3, 2, ceil_mode=True)
    x = _basic_conv(b, "conv2", x, 64, 1)
    x = _basic_conv(b, "conv3", x, 192, 3, padding=1)
    x = b.maxpool("maxpool2", x, 3, 2, ceil_mode=True)
    x = _inception(b, "inception3a", x)
    x = _inception(b, "inception3b", x)
    x = b.maxpool("maxpool3", x, 3, 2, ceil_mode=True)
    for name in ("inception4a", "inception4b", "inception4c", "inception4d", "inception4e"):
        x = _inception(b, name, x)
    x = b.maxpool("maxpool4", x, 2, 2, ceil_mode=True)
    x = _inception(b, "inception5a", x)
    x = _inception(b, "inception5b", x)
    x = b.adaptive_avgpool("avgpool", x, 1)
    x = b.view(x, (x.numel,))
    x = b.dropout("dropout", x, 0.2)
    b.linear("fc", x, cfg.num_classes)
    return spec


def _tiny_cnn(b: _Builder, cfg: ImageConfig) -> InputSpec:
    x, spec = _image_input(b, cfg)
    x = b.conv2d("conv1", x, 16, 3, padding=1)
    x = b.relu("relu1", x)
    x = b.maxpool("pool1", x, 2)
    x = b.conv2d("conv2", x, 32, 3, padding=1)
    x = b.relu("relu2", x)
    x = b.maxpool("pool2", x, 2)
    x = b.view(x, (x.numel,))
    b.linear("fc", x, cfg.num_classes)
    return spec


def _gpt(b: _Builder, cfg: GPTConfig) -> InputSpec:
    seq, dim = cfg.block_size, cfg.n_embd
    idx = b.tensor((seq,), itemsize=INT64, requires_grad=False)
    pos = b.tensor((seq,), itemsize=INT64, requires_grad=False)
    tok = b.embedding("wte", idx, cfg.vocab_size, dim)
    b.embedding("wpe", pos, cfg.block_size, dim, per_batch=True)
    x = b.dropout("drop", b.add(tok, tok), 0.0)
    for i in range(cfg.n_layer):
        h = f"h.{i}"
        y = b.layernorm(f"{h}.ln_1", x)
        y = b.linear(f"{h}.attn.c_attn", y, 3 * dim)
        y = b.attention(f"{h}.attn.core", y, cfg.n_head)
        y = b.linear(f"{h}.attn.c_proj", y, dim)
        x = b.add(x, y)
        y = b.layernorm(f"{h}.ln_2", x)
        y = b.linear(f"{h}.mlp.c_fc", y, 4 * dim)
        y = b.gelu(f"{h}.mlp.gelu", y)
        y = b.linear(f"{h}.mlp.c_proj", y, dim)
        x = b.add(x, y)
    x = b.layernorm("ln_f", x)
    b.linear("lm_head", x, cfg.vocab_size, bias=False, tied=True)
    return InputSpec(shape=[seq], dtype="int64", bytes_per_sample=seq * INT64)


#: name -> (config class, builder)
MODELS = {
    "alexnet": (ImageConfig, _alexnet),
    "vgg16": (ImageConfig, _vgg16),
    "resnet18": (ImageConfig, _resnet(_basic_block, [2, 2, 2, 2])),
    "resnet50": (ImageConfig, _resnet(_bottleneck, [3, 4, 6, 3])),
    "googlenet": (ImageConfig, _googlenet),
    "tiny-cnn": (TinyCNNConfig, _tiny_cnn),
    "gpt": (GPTConfig, _gpt),
    "gpt2-small": (GPTConfig, _gpt),
}
#: today's decoder transformers from Hugging Face-style configs (`trainsim.sim.compute.transformers`)
TRANSFORMERS = transformer_models()
MODELS.update(TRANSFORMERS)

#: the files shipped in scenarios/workloads/ (name -> config overrides), each checked against the calibration
#: zoo's torch model
BUILTINS = {name: {} for name in MODELS if name != "gpt" and name not in TRANSFORMERS}
#: the transformer presets shipped there too (no zoo model: checked against torch in tests/test_transformers)
TRANSFORMER_BUILTINS = {name: {} for name in TRANSFORMERS if name != "transformer"}


def config_for(name: str, **cfg):
    """The validated config dataclass of model ``name``; unknown keys list the valid ones."""
    if name not in MODELS:
        raise unknown_name("model", name, MODELS)
    config_cls = MODELS[name][0]
    if hasattr(config_cls, "from_options"):  # a transformer preset: HF key names and aliases, text values
        return config_cls.from_options(**cfg)
    valid = {f.name for f in fields(config_cls)}
    for key in cfg:
        if key not in valid:
            raise unknown_name(f"{name} option", key, valid, field=key)
    return config_cls(**cfg)


def _with_loss(layers: list[Layer], input_spec: InputSpec, log_softmax_bytes: int) -> list[Layer]:
    """The cross-entropy loss saves the log-softmax of the last layer's output (``log_softmax_bytes`` per
    sample), the int64 targets (one per sample, or one per token) and its total weight, counted with the
    last layer, whose backward comes right after it. The log-softmax and the NLL both pack the log-probs."""
    targets = input_spec.bytes_per_sample if input_spec.dtype == "int64" else INT64
    last = layers[-1]
    weight = 4  # the NLL's total weight, one fp32 per batch
    return layers[:-1] + [last.model_copy(update={
        "saved_activation_bytes_per_sample": last.saved_activation_bytes_per_sample + log_softmax_bytes
        + targets,
        "saved_activation_bytes_fixed": last.saved_activation_bytes_fixed + weight,
        "saved_packed_bytes_per_sample": last.saved_packed_bytes_per_sample + 2 * log_softmax_bytes + targets,
        "saved_packed_bytes_fixed": last.saved_packed_bytes_fixed + weight})]


def autocast_bytes(name: str, config) -> list[AutocastBytes]:
    """Each layer's activation bytes with the forward under CUDA's torch.autocast to 16 bit (bf16 or fp16:
    the same bytes), for a model whose weights are fp32. CUDA autocast's op lists (PyTorch's AMP docs):

    - conv2d, linear and the attention's matmuls run in 16 bit: an fp32 input is cast, and the cast is what
      backward keeps; the output is 16-bit; backward keeps the weight's 16-bit copy too (``weight_copies``);
    - layer norm and softmax run in fp32: a 16-bit input is cast up, the output is fp32; the attention's
      second matmul then keeps its own 16-bit copy of the softmax output;
    - every other op here (batchnorm, relu, gelu, pooling, dropout, embedding) keeps its input's type, and a
      residual add or a concat takes the wider of its inputs' (the fp32 residual stream of a transformer);
    - the loss is computed on the output cast to fp32 (``output.float()``, as the executor does): its
      log-softmax is fp32.

    Packed bytes (what torch's ``save_on_cpu`` copies) count every tensor each time it is packed, the weight
    copies and the fp32 parameters of batchnorm and layer norm too."""
    builder = _Builder(config.dtype, getattr(config, "dropout_mask_bytes", 1), autocast=True)
    input_spec = MODELS[name][1](builder, config)
    last = builder.layers[-1]
    layers = _with_loss(builder.layers, input_spec, last.output_bytes_per_sample // LOW * FP32)
    out = []
    for layer in layers:
        copies = builder.weight_copies.get(layer.name, 0)
        out.append(AutocastBytes(
            saved_per_sample=layer.saved_activation_bytes_per_sample,
            saved_fixed=layer.saved_activation_bytes_fixed,
            packed_per_sample=layer.saved_packed_bytes_per_sample,
            packed_fixed=layer.saved_packed_bytes_fixed,
            output_per_sample=layer.output_bytes_per_sample,
            weight_copies=copies))
    return out


def build_analytic(name: str, **cfg) -> Workload:
    """The analytic workload of model ``name`` (see ``MODELS``) with config overrides ``cfg``; an fp32 one
    carries its bytes under autocast (`autocast_bytes`) for 16-bit runs."""
    config = config_for(name, **cfg)
    try:
        builder = _Builder(config.dtype, getattr(config, "dropout_mask_bytes", 1))
        input_spec = MODELS[name][1](builder, config)
        layers = _with_loss(builder.layers, input_spec, builder.layers[-1].output_bytes_per_sample)
        if config.dtype == "float32":
            layers = [layer.model_copy(update={"autocast": under})
                      for layer, under in zip(layers, autocast_bytes(name, config), strict=True)]
    except (ValidationError, OverflowError) as exc:  # a figure past its bound (trainsim.units), or past float
        detail = (f"{'.'.join(str(p) for p in exc.errors()[0]['loc'])} {pydantic_message(exc.errors()[0])}"
                  if isinstance(exc, ValidationError) else str(exc))
        raise TrainsimError(f"the options make a model out of range: {detail}",
                            field=next(iter(cfg)) if len(cfg) == 1 else None) from None
    except TrainsimError as exc:
        if exc.field is None and len(cfg) == 1:  # name the one option given
            raise TrainsimError(exc.reason, field=next(iter(cfg))) from None
        raise
    return Workload(
        name=name, dtype=config.dtype, input=input_spec, layers=layers,
        provenance=Provenance(device="analytic", device_spec=None, tool="trainsim",
                              generator="trainsim.sim.compute.analytic_models",
                              config={f.name: getattr(config, f.name) for f in fields(config)}))


def generate_builtins(out_dir: str | Path, builtins: dict | None = None) -> list[Path]:
    """Write every built-in workload (of ``builtins``, default `BUILTINS`) to ``out_dir`` (atomically,
    canonical JSON); returns the paths."""
    from trainsim.formats.workload import save_workload

    out_dir = Path(out_dir)
    return [save_workload(build_analytic(name, **cfg), out_dir / f"{name}.json")
            for name, cfg in (BUILTINS if builtins is None else builtins).items()]


def builtin_text(name: str) -> str:
    """The canonical JSON text the shipped file ``name.json`` must have."""
    return dumps_workload(build_analytic(name, **{**BUILTINS, **TRANSFORMER_BUILTINS}[name]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Regenerate the built-in analytic workloads.")
    default_out = Path(__file__).resolve().parents[2] / "scenarios" / "workloads"
    parser.add_argument("--out", default=str(default_out),
                        help="output folder (default: the package's scenarios/workloads)")
    parser.add_argument("--transformers", action="store_true",
                        help="write the transformer presets (llama3-8b, ...) instead of the zoo's models")
    args = parser.parse_args(argv)
    for path in generate_builtins(args.out, TRANSFORMER_BUILTINS if args.transformers else None):
        print(path)


if __name__ == "__main__":
    main()


def parse_options(pairs: list[str]) -> dict:
    """CLI ``--set`` pairs: ``["image_size=64", "dtype=float16"]`` -> ``{"image_size": 64, ...}``."""
    options = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise TrainsimError(f"expected KEY=VALUE, got {pair!r}", field="--set")
        for convert in (int, float):
            try:
                options[key.strip()] = convert(text)
                break
            except ValueError:
                continue
        else:
            options[key.strip()] = text.strip()
    return options
