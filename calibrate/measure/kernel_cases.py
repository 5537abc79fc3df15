"""The cases of a kernel sweep: which kernels `kernel_sweep` times, and the precisions a GPU can run.

`sweep_cases` lists them: GEMMs from 256 to 16384 on a side, a transformer's linear layers (forward and
weight-gradient shapes), skinny and unaligned ones, attention-shaped batched GEMMs and, on request, shapes
drawn log-uniform (`sampled_gemm_shapes`); every distinct convolution of ResNet-50 (224x224 input) in its
three passes; attention fused (SDPA's flash or memory-efficient kernels) and unfused (written out as matmul,
scale, mask, softmax, matmul), forward and backward, at sequence lengths 512 to 8192; elementwise,
layer-norm and softmax kernels from 256 Ki to 256 Mi elements. Each in the precisions asked for (fp32 with
TF32 off, tf32, bf16, fp16, fp8: the matrix products only) that the GPU has matrix units for
(`check_precisions`). No torch here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from trainsim.errors import TrainsimError, unknown_name

#: precisions a sweep can ask for
SWEEP_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")

#: ResNet-50's distinct convolutions at 224x224: (in, out, kernel, stride, padding, input height, where)
RESNET50_CONVS = (
    (3, 64, 7, 2, 3, 224, "conv1"),
    (64, 64, 1, 1, 0, 56, "layer1.conv1"), (64, 64, 3, 1, 1, 56, "layer1.conv2"),
    (64, 256, 1, 1, 0, 56, "layer1.conv3"), (256, 64, 1, 1, 0, 56, "layer1.1.conv1"),
    (256, 128, 1, 1, 0, 56, "layer2.0.conv1"), (128, 128, 3, 2, 1, 56, "layer2.0.conv2"),
    (128, 512, 1, 1, 0, 28, "layer2.conv3"), (256, 512, 1, 2, 0, 56, "layer2.downsample"),
    (512, 128, 1, 1, 0, 28, "layer2.1.conv1"), (128, 128, 3, 1, 1, 28, "layer2.1.conv2"),
    (512, 256, 1, 1, 0, 28, "layer3.0.conv1"), (256, 256, 3, 2, 1, 28, "layer3.0.conv2"),
    (256, 1024, 1, 1, 0, 14, "layer3.conv3"), (512, 1024, 1, 2, 0, 28, "layer3.downsample"),
    (1024, 256, 1, 1, 0, 14, "layer3.1.conv1"), (256, 256, 3, 1, 1, 14, "layer3.1.conv2"),
    (1024, 512, 1, 1, 0, 14, "layer4.0.conv1"), (512, 512, 3, 2, 1, 14, "layer4.0.conv2"),
    (512, 2048, 1, 1, 0, 7, "layer4.conv3"), (1024, 2048, 1, 2, 0, 14, "layer4.downsample"),
    (2048, 512, 1, 1, 0, 7, "layer4.1.conv1"), (512, 512, 3, 1, 1, 7, "layer4.1.conv2"),
)
CONV_PASSES = ("forward", "backward_data", "backward_weight")
#: the label of the unfused attention cases: Q·Kᵀ, scale, mask, softmax and ·V as separate ops in the
#: inputs' precision. (PyTorch's SDPA math backend, which sweeps of 2026-11-28 timed as unfused, casts 16-bit
#: inputs to fp32 and runs SIMT GEMMs: another path.)
UNFUSED = "matmul softmax matmul"


@dataclass(frozen=True)
class Case:
    """One kernel to time: its table op, precision, dimensions (table columns) and a label."""

    op: str  # gemm, bmm, conv, attention, elementwise, layernorm, softmax
    dtype: str
    dims: dict = field(hash=False)
    what: str = ""

    @property
    def key(self) -> str:
        dims = " ".join(f"{k}={v}" for k, v in self.dims.items())
        return f"{self.op} {self.dtype} {self.what or ''} {dims}"


def sampled_gemm_shapes(count: int, seed: int) -> list[tuple[int, int, int, str]]:
    """``count`` GEMM shapes drawn log-uniform from 64 to 16384 on each side (seeded), a third of them
    rounded to multiples of 64, a third to multiples of 8 and a third left as drawn: the grid a fit of tile
    and wave quantisation needs, beyond the named shapes."""
    import random

    draw = random.Random(seed)
    shapes = []
    for i in range(count):
        align = (64, 8, 1)[i % 3]
        m, n, k = (max(align, round(math.exp(draw.uniform(math.log(64), math.log(16384))) / align) * align)
                   for _ in range(3))
        shapes.append((m, n, k, f"sample {seed}.{i}"))
    return shapes


def _gemm_cases(dtypes: list[str], quick: bool, samples: int = 0, seed: int = 0) -> list[Case]:
    squares = (256, 1024) if quick else (256, 512, 1024, 2048, 4096, 8192, 16384)
    shapes = [(s, s, s, f"square {s}") for s in squares]
    if not quick:
        shapes += [  # a transformer's linear layers, tokens x out x in, and their weight gradients
            (8192, 12288, 4096, "qkv 4096"), (8192, 4096, 4096, "proj 4096"), (8192, 16384, 4096, "fc1 4096"),
            (8192, 4096, 16384, "fc2 4096"), (4096, 16384, 8192, "wgrad fc1 4096"),
            (4096, 2304, 768, "qkv 768"), (4096, 768, 768, "proj 768"), (4096, 3072, 768, "fc1 768"),
            (4096, 768, 3072, "fc2 768"), (4096, 50304, 768, "lm head 768"),
            (768, 3072, 4096, "wgrad fc1 768"),
            (16, 4096, 4096, "skinny 16"), (128, 4096, 4096, "skinny 128"), (65536, 64, 64, "narrow 64"),
            (1000, 1000, 1000, "unaligned 1000"), (4096, 4096, 4095, "unaligned k 4095"),
        ]
    shapes += sampled_gemm_shapes(samples, seed)
    # fp8's cuBLASLt kernels take k and n in multiples of 16 only
    cases = [Case("gemm", d, {"m": m, "n": n, "k": k, "batch": 1}, what) for d in dtypes
             for m, n, k, what in shapes if not (d == "fp8" and (k % 16 or n % 16))]
    batched = [(96, 512, 512, 64, "scores 512x64"), (96, 512, 64, 512, "context 512x64")]
    if not quick:
        batched += [(32, 2048, 2048, 128, "scores 2048x128"), (32, 2048, 128, 2048, "context 2048x128"),
                    (512, 128, 128, 128, "small 128")]
    cases += [Case("bmm", d, {"m": m, "n": n, "k": k, "batch": b}, what) for d in dtypes if d != "fp8"
              for b, m, n, k, what in batched]
    return cases


def _conv_cases(dtypes: list[str], quick: bool, batch: int = 64) -> list[Case]:
    convs = RESNET50_CONVS[:3] if quick else RESNET50_CONVS
    batch = 4 if quick else batch
    return [Case("conv", d, {"batch": batch, "in_channels": ic, "out_channels": oc, "height": h, "width": h,
                             "kernel": k, "stride": s, "padding": p, "pass": pass_}, f"resnet50.{where}")
            for d in dtypes if d != "fp8" for pass_ in CONV_PASSES for ic, oc, k, s, p, h, where in convs]


def _attention_cases(dtypes: list[str], quick: bool) -> list[Case]:
    lengths = (256,) if quick else (512, 1024, 2048, 4096, 8192)
    cases = []
    for d in dtypes:
        if d in ("fp8", "tf32"):
            continue
        for q_len in lengths:
            batch = max(1, 16384 // q_len)  # the same tokens at every length
            for head_dim in ((64,) if quick else (64, 128)):
                heads = 2048 // head_dim if not quick else 2
                for causal in (False, True):
                    for fused in (True, False):
                        if not fused and (q_len > 4096 or d == "fp32"):
                            continue  # the scores of the unfused path: GiBs, and fp32 only as a check
                        if d == "fp32" and (causal or head_dim != 64):
                            continue
                        for backward in (False, True):
                            cases.append(Case("attention", d, {
                                "batch": batch, "heads": heads, "q_len": q_len, "kv_len": q_len,
                                "head_dim": head_dim, "causal": causal, "fused": fused,
                                "backward": backward}, "" if fused else UNFUSED))
    return cases


def _streaming_cases(dtypes: list[str], quick: bool) -> list[Case]:
    sizes = (1 << 16, 1 << 18) if quick else tuple(1 << p for p in (18, 20, 22, 24, 26, 28))
    rows = (768, 4096) if quick else (768, 1024, 4096, 8192)
    cases = []
    for d in dtypes:
        if d in ("fp8", "tf32"):
            continue
        for elements in sizes:
            cases += [Case("elementwise", d, {"elements": elements, "reads": 2, "writes": 1}, "add"),
                      Case("elementwise", d, {"elements": elements, "reads": 1, "writes": 1}, "mul scalar"),
                      Case("elementwise", d, {"elements": elements, "reads": 1, "writes": 1}, "gelu")]
            for row in rows:
                if elements % row or elements // row < 1:
                    continue
                cases += [Case("layernorm", d, {"elements": elements, "reads": 1, "writes": 1, "row": row},
                               "layer_norm"),
                          Case("softmax", d, {"elements": elements, "reads": 1, "writes": 1, "row": row},
                               "softmax")]
    return cases


CLASSES = {"matmul": _gemm_cases, "conv": _conv_cases, "attention": _attention_cases,
           "memory": _streaming_cases}


#: the compute capability a precision's matrix units need (TF32 and bf16 arrived with Ampere, fp8 with Ada
#: and Hopper); fp32 and fp16 run on every CUDA GPU
CAPABILITY = {"tf32": (8, 0), "bf16": (8, 0), "fp8": (8, 9)}


def check_precisions(dtypes: list[str], gpu: str, capability: tuple[int, int]) -> None:
    """Refuse (one error naming ``--dtypes`` and the valid choices) a precision ``gpu`` of compute
    ``capability`` has no matrix units for, before anything is timed or written."""
    valid = [d for d in SWEEP_DTYPES if capability >= CAPABILITY.get(d, (0, 0))]
    for dtype in dtypes:
        if dtype not in valid:
            raise TrainsimError(f"{gpu} (compute capability {capability[0]}.{capability[1]}) has no {dtype} "
                                f"matrix units; valid choices: {', '.join(valid)}", field="--dtypes")


def parse_list(text: str, valid: tuple[str, ...], option: str) -> list[str]:
    """A comma list of names, each one of ``valid``; else one error naming the option and the choices."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise TrainsimError(f"give at least one of {', '.join(valid)}", field=option)
    for name in names:
        if name not in valid:
            raise unknown_name(option.lstrip("-").rstrip("s"), name, valid, field=option)
    return names


def sweep_cases(dtypes: list[str], classes: list[str], quick: bool = False, *, gemm_samples: int = 0,
                seed: int = 0, conv_batch: int = 64) -> list[Case]:
    """Every case of the sweep for ``dtypes`` and kernel ``classes`` (`CLASSES`); ``quick``: a few small ones;
    ``gemm_samples``: that many drawn GEMM shapes more (`sampled_gemm_shapes`); ``conv_batch``: the batch of
    the convolutions."""
    extra = {"matmul": {"samples": gemm_samples, "seed": seed}, "conv": {"batch": conv_batch}}
    return [case for cls in classes for case in CLASSES[cls](dtypes, quick, **extra.get(cls, {}))]
