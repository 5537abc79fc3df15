"""FLOPs and bytes of a matrix multiply or a convolution, from the shapes a profiler recorded.

A trace recorded with ``record_shapes=True`` gives each aten op its ``Input Dims`` and ``Input type`` (and,
in newer PyTorch, its scalar arguments as ``Concrete Inputs``). For the ops whose kernels a what-if on
another GPU must tell apart, compute-bound or memory-bound, that is enough for a roofline:

- ``aten::mm`` ``[M, K] x [K, N]``, ``aten::addmm`` (bias, then the two), ``aten::bmm`` ``[B, M, K] x
  [B, K, N]``, ``aten::baddbmm``: ``2·B·M·K·N`` FLOPs; bytes: both operands, the output and the bias,
  each once (the least traffic any kernel for it can make).
- ``aten::convolution`` / ``aten::_convolution`` (input, weight, bias, stride, padding, dilation,
  transposed, output_padding, groups): ``2·N·positions·weight elements`` FLOPs, where positions are the
  output's (the input's for a transposed convolution); bytes: input, weight and output once. The output
  size needs stride, padding and dilation, so a forward convolution without ``Concrete Inputs`` is not
  known.
- ``aten::convolution_backward`` (grad_output, input, weight, ..., output_mask): the same FLOPs for each of
  grad_input and grad_weight it computes (``output_mask``, both when not recorded), the positions read
  from grad_output (from the input for a transposed one; not transposed when not recorded); bytes:
  grad_output and the tensors each product reads and writes.

- fused attention (``aten::_scaled_dot_product_flash_attention``, ``_efficient_attention``,
  ``_cudnn_attention``, ``_flash_attention_for_cpu``; query ``[B, H, L, E]``, key ``[B, Hk, S, E]``,
  value ``[B, Hk, S, Ev]``): ``2·B·H·pairs·(E + Ev)`` FLOPs, where pairs are the query-key pairs the mask
  keeps (``L·S``; causal, ``Σ min(i + 1, S)`` over the L rows, as the kernels skip masked blocks; not
  causal when not recorded); bytes: query, key, value and the output once. Backward (the ``_backward`` of
  each, grad_output first): ``2·B·H·pairs·(3E + 2Ev)``, the scores recomputed (these kernels do not keep
  them) and the four products of the gradients, as PyTorch's FLOP counter has it; bytes: grad_output,
  query, key, value and the output read, the three gradients written.

Any other op, or shapes that do not fit the op's signature, gives None: the what-if then goes by the
kernel's name. The backend ops under these (``aten::cudnn_convolution``, ``aten::mkldnn_convolution``)
order their arguments differently and are not read: the stack walk finds the ``aten::_convolution``
around them.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass

#: bytes per element of the dtypes the profiler names in ``Input type``
ELEMENT_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "c10::Float8_e4m3fn": 1,
                 "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1,
                 "c10::complex<float>": 8}
#: the peak a dtype's products run at, where the kernel's name does not say (tf32 shows in names only)
DTYPE_PRECISION = {"float": "fp32", "c10::Half": "fp16", "c10::BFloat16": "bf16"}

_MATMUL = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}
_CONVOLUTION = {"aten::convolution", "aten::_convolution"}
#: fused attention forward ops: where is_causal sits among their arguments
_ATTENTION = {"aten::_scaled_dot_product_flash_attention": 4,
              "aten::_scaled_dot_product_efficient_attention": 6,
              "aten::_scaled_dot_product_cudnn_attention": 6,
              "aten::_scaled_dot_product_flash_attention_for_cpu": 4}
#: their backward ops (grad_output, query, key, value, ...): where is_causal sits
_ATTENTION_BACKWARD = {"aten::_scaled_dot_product_flash_attention_backward": 11,
                       "aten::_scaled_dot_product_efficient_attention_backward": 11,
                       "aten::_scaled_dot_product_cudnn_attention_backward": 14,
                       "aten::_scaled_dot_product_flash_attention_for_cpu_backward": 7}


@dataclass(frozen=True, slots=True)
class OpWork:
    """What one op computes: FLOPs, the bytes it must move at least, and the precision its dtype implies
    (None where the dtype has no peak of its own: the kernel's name decides). ``shape``: the op's geometry
    as plain values, from which `op_kernels` makes the kernel model's specs: ``("gemm", batch, m, n, k)``,
    ``("conv", batch, in_c, out_c, h, w, kh, kw, stride, padding, groups, passes)`` with passes of
    ``forward``/``backward_data``/``backward_weight`` joined by ``+``, ``("attention", batch, heads, q_len,
    kv_len, head_dim, causal, backward)``; empty where the op has no such form (a 3-D convolution, a
    dilated or transposed one, uneven strides)."""

    op: str
    flops: float
    nbytes: float
    precision: str | None
    shape: tuple = ()


def op_work(name: str, shapes, types, concrete=None) -> OpWork | None:
    """The work of the aten op ``name`` from its recorded ``Input Dims`` (``shapes``), ``Input type``
    (``types``) and ``Concrete Inputs`` (``concrete``, may be None); None when the op is not a matrix
    multiply, convolution or fused attention read here, or its shapes do not fit its signature."""
    known = _MATMUL | _CONVOLUTION | _ATTENTION.keys() | _ATTENTION_BACKWARD.keys()
    if name not in known and name != "aten::convolution_backward":
        return None
    if not isinstance(shapes, list) or not isinstance(types, list):
        return None
    try:
        if name in _MATMUL:
            return _matmul(name, shapes, types)
        if name in _CONVOLUTION:
            return _convolution(name, shapes, types, concrete)
        if name in _ATTENTION or name in _ATTENTION_BACKWARD:
            backward = name in _ATTENTION_BACKWARD
            causal = _concrete(concrete, (_ATTENTION_BACKWARD if backward else _ATTENTION)[name])
            return _attention(name, shapes, types, bool(causal), backward)
        return _convolution_backward(name, shapes, types, concrete)
    except (ValueError, TypeError, IndexError, SyntaxError):
        return None


def _dims(shape) -> list[int]:
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ValueError(f"not a tensor shape: {shape!r}")
    return shape


def _element_bytes(types, index: int) -> int:
    size = ELEMENT_BYTES.get(types[index])
    if size is None:
        raise ValueError(f"no element size for {types[index]!r}")
    return size


def _matmul(name: str, shapes, types) -> OpWork:
    first = 1 if name in ("aten::addmm", "aten::baddbmm") else 0     # the bias comes first
    a, b = _dims(shapes[first]), _dims(shapes[first + 1])
    batched = name in ("aten::bmm", "aten::baddbmm")
    if len(a) != len(b) or len(a) != (3 if batched else 2):
        raise ValueError("operands of the wrong rank")
    batch = a[0] if batched else 1
    m, k = a[-2:]
    k2, n = b[-2:]
    if k != k2 or (batched and b[0] != batch):
        raise ValueError("operands that do not multiply")
    size = _element_bytes(types, first)
    elements = batch * (m * k + k * n + m * n)
    if first:
        elements += math.prod(_dims(shapes[0]))
    return OpWork(name, 2.0 * batch * m * k * n, float(elements * size), DTYPE_PRECISION.get(types[first]),
                  ("gemm", batch, m, n, k))


def _concrete(concrete, index: int):
    """The scalar argument ``index`` as Python data ('[2, 2]' -> [2, 2], 'False' -> False); None if not
    recorded."""
    if not isinstance(concrete, list) or index >= len(concrete) or concrete[index] in ("", None):
        return None
    return ast.literal_eval(str(concrete[index]))


def _spatial(value, rank: int, default: int) -> list[int]:
    if value is None:
        return [default] * rank
    values = [value] if isinstance(value, int) else list(value)
    if len(values) == 1:
        values *= rank
    if len(values) != rank or not all(isinstance(v, int) for v in values):
        raise ValueError(f"expected {rank} spatial values, got {value!r}")
    return values


def _convolution(name: str, shapes, types, concrete) -> OpWork | None:
    x, w = _dims(shapes[0]), _dims(shapes[1])
    rank = len(x) - 2
    if rank < 1 or len(w) != len(x):
        raise ValueError("input and weight of different ranks")
    stride, padding = _concrete(concrete, 3), _concrete(concrete, 4)
    if stride is None or padding is None:
        return None                         # the output's size depends on them
    stride, padding = _spatial(stride, rank, 1), _spatial(padding, rank, 0)
    dilation = _spatial(_concrete(concrete, 5), rank, 1)
    kernel = w[2:]
    if _concrete(concrete, 6):              # transposed: weight [in, out / groups, k...]
        extra = _spatial(_concrete(concrete, 7), rank, 0)
        out = [(size - 1) * s - 2 * p + d * (k - 1) + e + 1
               for size, k, s, p, d, e in zip(x[2:], kernel, stride, padding, dilation, extra, strict=True)]
        out_channels = w[1] * (_concrete(concrete, 8) or 1)
        positions = math.prod(x[2:])        # each input position meets the whole weight
    else:
        out = [(size + 2 * p - d * (k - 1) - 1) // s + 1
               for size, k, s, p, d in zip(x[2:], kernel, stride, padding, dilation, strict=True)]
        out_channels = w[0]
        positions = math.prod(out)          # each output position meets the whole weight
    if min(out) < 1:
        raise ValueError("an empty output")
    bias = math.prod(_dims(shapes[2])) if len(shapes) > 2 and shapes[2] else 0
    elements = math.prod(x) + math.prod(w) + x[0] * out_channels * math.prod(out) + bias
    transposed = bool(_concrete(concrete, 6))
    groups = _concrete(concrete, 8) or 1
    shape = _conv_shape(x, w, stride, padding, dilation, groups, "forward") if not transposed else ()
    return OpWork(name, 2.0 * x[0] * positions * math.prod(w), float(elements * _element_bytes(types, 0)),
                  DTYPE_PRECISION.get(types[0]), shape)


def _conv_shape(x, w, stride, padding, dilation, groups, passes: str) -> tuple:
    """A 2-D convolution's ``shape`` (see `OpWork`), empty where the kernel model has no form for it."""
    if len(x) != 4 or len(set(stride)) != 1 or len(set(padding)) != 1 or set(dilation) != {1} \
            or not isinstance(groups, int) or groups < 1:
        return ()
    return ("conv", x[0], x[1], w[0], x[2], x[3], w[2], w[3], stride[0], padding[0], groups, passes)


def _convolution_backward(name: str, shapes, types, concrete) -> OpWork:
    grad, x, w = _dims(shapes[0]), _dims(shapes[1]), _dims(shapes[2])
    if not (len(grad) == len(x) == len(w) and len(x) >= 3):
        raise ValueError("tensors of different ranks")
    transposed = _concrete(concrete, 7)
    mask = _concrete(concrete, 10)
    grad_input, grad_weight = (bool(mask[0]), bool(mask[1])) if isinstance(mask, list) and len(mask) >= 2 \
        else (True, True)
    positions = math.prod(x[2:]) if transposed else math.prod(grad[2:])
    products = int(grad_input) + int(grad_weight)
    elements = math.prod(grad)
    if grad_input:                          # reads the weight, writes grad_input
        elements += math.prod(w) + math.prod(x)
    if grad_weight:                         # reads the input, writes grad_weight
        elements += math.prod(x) + math.prod(w)
    size = _element_bytes(types, 0)
    passes = "+".join(p for p, on in (("backward_data", grad_input), ("backward_weight", grad_weight)) if on)
    shape = ()
    if not transposed and passes:
        rank = len(x) - 2
        stride, padding = _concrete(concrete, 4), _concrete(concrete, 5)
        if stride is not None and padding is not None:
            shape = _conv_shape(x, w, _spatial(stride, rank, 1), _spatial(padding, rank, 0),
                                _spatial(_concrete(concrete, 6), rank, 1), _concrete(concrete, 9) or 1,
                                passes)
    return OpWork(name, 2.0 * products * x[0] * positions * math.prod(w), float(elements * size),
                  DTYPE_PRECISION.get(types[0]), shape)


def _attention(name: str, shapes, types, causal: bool, backward: bool) -> OpWork:
    first = 1 if backward else 0                # backward: grad_output comes first
    q, k, v = (_dims(shapes[first + i]) for i in range(3))
    if not len(q) == len(k) == len(v) == 4:
        raise ValueError("attention tensors must be [batch, heads, sequence, features]")
    batch, heads, rows, features = q
    if k[0] != batch or v[0] != batch or k[1] != v[1] or k[1] < 1 or heads % k[1] or k[2] != v[2] \
            or k[3] != features:
        raise ValueError("query, key and value that do not attend")
    keys, value_features = k[2], v[3]
    if causal:                                  # row i keeps min(i + 1, keys) keys
        full = max(rows - keys, 0)
        pairs = (rows - full) * (rows - full + 1) // 2 + full * keys
    else:
        pairs = rows * keys
    products = 2.0 * batch * heads * pairs * (features + value_features)
    out = batch * heads * rows * value_features
    elements = math.prod(q) + math.prod(k) + math.prod(v) + out
    if backward:                                # + grad_output; the gradients of q, k and v written
        products = 2 * products + 2.0 * batch * heads * pairs * features
        elements = 2 * elements
    return OpWork(name, products, float(elements * _element_bytes(types, first)),
                  DTYPE_PRECISION.get(types[first]),
                  ("attention", batch, heads, rows, keys, features, causal, backward)
                  if features == value_features else ())
