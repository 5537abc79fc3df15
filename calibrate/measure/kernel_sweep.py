"""A kernel sweep: time single kernels of every class the kernel model knows on this box's GPU (or CPU).

`sweep_cases` lists the cases: GEMMs from 256 to 16384 on a side, a transformer's linear layers (forward and
weight-gradient shapes), skinny and unaligned ones, attention-shaped batched GEMMs; every distinct
convolution of ResNet-50 (224x224 input) in its three passes; attention fused (SDPA's flash or
memory-efficient kernels) and unfused (written out as matmul, scale, mask, softmax, matmul), forward and
backward, at sequence lengths 512 to 8192; elementwise, layer-norm and softmax kernels
from 256 Ki to 256 Mi elements. Each in the precisions asked for (fp32 with TF32 off, tf32, bf16, fp16,
fp8: the matrix products only, through ``torch._scaled_mm`` on GPUs that have it).

`time_case` times one case. On CUDA it captures ``reps`` back-to-back calls in a CUDA graph and replays it
between CUDA events (the median of five replays over ``reps``), so the figure is the GPU's time per call, not
the host's dispatch; where capture fails it times the same calls launched eagerly. With ``timing "stream"`` it
launches them eagerly instead, queued behind a sleeping kernel until the host has issued them all, so that
they run back to back as in a GPU-bound eager step, each with its launch's own GPU cost. It then records one
call under torch.profiler for the kernels it launched (names, and the sum of their durations). On the CPU it
takes the median of ``perf_counter`` over the calls. cuDNN takes its heuristics' algorithm, PyTorch's default
and what trainsim's own runs use, or with ``cudnn_benchmark`` the fastest it times per shape (as a training
script that sets ``torch.backends.cudnn.benchmark`` does). Inputs stay resident between calls, so a problem
that fits in L2 is timed from L2, as back-to-back layers of a step are not always.

`run_sweep` times every case within a time budget and writes the rows as a ``trainsim.kernels/1`` table
(`trainsim.sim.compute.kernels.dataset`) with its provenance beside it; the table is rewritten as rows come,
so a stopped run keeps what it measured.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trainsim.errors import TrainsimError, unknown_name
from trainsim.files import write_atomic
from trainsim.provenance import provenance

#: precisions a sweep can ask for
SWEEP_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")
#: columns of the table a sweep writes, in order (a row leaves blank those its op has not)
COLUMNS = ("op", "device", "gpu", "dtype", "what", "m", "n", "k", "batch", "in_channels", "out_channels",
           "height", "width", "kernel", "stride", "padding", "pass", "elements", "reads", "writes", "row",
           "heads", "q_len", "kv_len", "head_dim", "causal", "fused", "backward", "latency_us", "kernel_us",
           "reps", "timing", "kernels")
TABLE_NAME = "kernels.csv"
PROVENANCE_NAME = "provenance.json"

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


# ---- building and timing a case (torch) -----------------------------------------------------------------

_TORCH_DTYPES = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _build(case: Case, device: str, cudnn_benchmark: bool = False) -> Callable[[], object]:
    """A no-argument function that launches ``case`` once, its inputs made and kept; cuDNN in benchmark
    mode (the fastest algorithm it times) or, as PyTorch defaults to, its heuristics' pick."""
    import torch
    import torch.nn.functional as F

    tf32 = case.dtype == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = cudnn_benchmark
    dt = getattr(torch, _TORCH_DTYPES.get(case.dtype, "bfloat16"))
    d = case.dims

    def rand(*shape, grad=False):
        return torch.randn(*shape, device=device, dtype=dt, requires_grad=grad)

    if case.op in ("gemm", "bmm") and case.dtype == "fp8":
        a = torch.randn(d["m"], d["k"], device=device).to(torch.float8_e4m3fn)
        # the second operand column-major, as _scaled_mm requires
        b = torch.randn(d["n"], d["k"], device=device).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=device)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    if case.op == "gemm":
        a, b = rand(d["m"], d["k"]), rand(d["k"], d["n"])
        return lambda: torch.mm(a, b)
    if case.op == "bmm":
        a, b = rand(d["batch"], d["m"], d["k"]), rand(d["batch"], d["k"], d["n"])
        return lambda: torch.bmm(a, b)
    if case.op == "conv":
        x = rand(d["batch"], d["in_channels"], d["height"], d["width"])
        w = rand(d["out_channels"], d["in_channels"], d["kernel"], d["kernel"])
        stride, padding = (d["stride"],) * 2, (d["padding"],) * 2
        if d["pass"] == "forward":
            return lambda: F.conv2d(x, w, stride=stride, padding=padding)
        grad = torch.randn_like(F.conv2d(x, w, stride=stride, padding=padding))
        mask = [d["pass"] == "backward_data", d["pass"] == "backward_weight", False]
        return lambda: torch.ops.aten.convolution_backward(grad, x, w, None, stride, padding, (1, 1), False,
                                                           (0, 0), 1, mask)
    if case.op == "attention":
        shape = (d["batch"], d["heads"], d["q_len"], d["head_dim"])
        q, k, v = rand(*shape, grad=True), rand(*shape, grad=True), rand(*shape, grad=True)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
        hidden = torch.ones(d["q_len"], d["kv_len"], device=device, dtype=torch.bool).triu(1)

        def forward():
            if not d["fused"]:  # written out, as a model without SDPA does (nanoGPT's slow path)
                scores = torch.matmul(q, k.transpose(-2, -1)) * d["head_dim"] ** -0.5
                if d["causal"]:
                    scores = scores.masked_fill(hidden, float("-inf"))
                return torch.matmul(torch.softmax(scores, dim=-1), v)
            with sdpa_kernel(backends):
                return F.scaled_dot_product_attention(q, k, v, is_causal=d["causal"])

        if not d["backward"]:
            return lambda: forward().detach()
        out = forward()
        grad = torch.randn_like(out)
        return lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)
    x = rand(d["elements"])
    if case.op == "elementwise":
        if case.what == "add":
            y = rand(d["elements"])
            return lambda: x + y
        if case.what == "gelu":
            return lambda: F.gelu(x)
        return lambda: x * 1.5
    rows = x.view(-1, d["row"])
    if case.op == "layernorm":
        weight, bias = rand(d["row"]), rand(d["row"])
        return lambda: F.layer_norm(rows, (d["row"],), weight, bias)
    return lambda: torch.softmax(rows, dim=-1)


@dataclass
class Timing:
    """What `time_case` measured: seconds per call, how, over how many calls, and the kernels of one call."""

    seconds: float
    method: str  # graph, eager (CUDA events) or clock (CPU perf_counter)
    reps: int
    kernels: list[str] = field(default_factory=list)
    kernel_s: float | None = None


def _reps_for(once_s: float, target_s: float) -> int:
    return int(min(200, max(1, math.ceil(target_s / max(once_s, 1e-7)))))


#: how a sweep times a call on CUDA: replayed from a CUDA graph, or launched eagerly into a stream held by a
#: sleeping kernel until the host has queued them all (so the GPU runs them back to back, as in a GPU-bound
#: eager step, with the per-kernel costs a graph saves)
TIMINGS = ("graph", "stream")
#: GPU clock cycles per second assumed to size the holding sleep (an overestimate only sleeps longer)
SLEEP_CYCLES_PER_S = 2.1e9


def _held_stream(fn, reps: int, start, end) -> tuple[float, bool]:
    """Seconds per call of ``reps`` eager calls of ``fn`` queued behind a sleeping kernel, and whether the
    host finished queueing them before the sleep ended (else the figure is partly the host's)."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    hold_s = 2 * (time.perf_counter() - t0) + 1e-3
    t0 = time.perf_counter()
    torch.cuda._sleep(int(hold_s * SLEEP_CYCLES_PER_S))
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    queued_in_time = time.perf_counter() - t0 < hold_s / 2  # the sleep runs at least hold_s / 2 at 1 GHz
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e-3 / reps, queued_in_time


def time_case(case: Case, device: str, *, target_s: float = 0.01, kernel_names: bool = True,
              cudnn_benchmark: bool = False, timing: str = "graph") -> Timing:
    """Time ``case`` on ``device`` (module doc): seconds per call over about ``target_s`` a measurement;
    on CUDA as ``timing`` says (`TIMINGS`)."""
    import torch

    fn = _build(case, device, cudnn_benchmark)
    if device == "cpu":
        fn()
        t0 = time.perf_counter()
        fn()
        reps = _reps_for(time.perf_counter() - t0, target_s)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return Timing(statistics.median(times), "clock", reps)
    for _ in range(3):  # warm-up: cuDNN's benchmark search, cuBLAS's handles and workspaces
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    reps = _reps_for(start.elapsed_time(end) * 1e-3, target_s)
    if timing == "stream":
        runs = [_held_stream(fn, reps, start, end) for _ in range(5)]
        method = "stream" if all(ok for _, ok in runs) else "stream (host-bound)"
        measured = Timing(statistics.median(s for s, _ in runs), method, reps)
        if kernel_names:
            measured.kernels, measured.kernel_s = _kernels_of(fn)
        return measured
    try:
        if case.op == "attention" and case.dims["backward"]:
            raise NotImplementedError("autograd is timed eagerly: long kernels, and a failed capture could "
                                      "leave the stream unusable")
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(graph):
            for _ in range(reps):
                fn()
        launch, method = graph.replay, "graph"
        launch()
    except Exception:  # an op that cannot be captured: the same calls launched one by one
        torch.cuda.synchronize()

        def launch():
            for _ in range(reps):
                fn()

        method = "eager"
    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        start.record()
        launch()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e-3 / reps)
    measured = Timing(statistics.median(times), method, reps)
    if kernel_names:
        measured.kernels, measured.kernel_s = _kernels_of(fn)
    return measured


def _kernels_of(fn) -> tuple[list[str], float | None]:
    """The kernels one call of ``fn`` launches, in order, and the sum of their durations (torch.profiler)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]
    kernels.sort(key=lambda e: e.time_range.start)
    total = sum(e.time_range.elapsed_us() for e in kernels) * 1e-6
    return [e.name for e in kernels], (total if kernels else None)


# ---- the sweep and its table ------------------------------------------------------------------------------


def _row(case: Case, device_name: str, gpu: str, timing: Timing) -> dict:
    row = {c: "" for c in COLUMNS}
    row.update({k: (str(v).lower() if isinstance(v, bool) else v) for k, v in case.dims.items()})
    row.update(op=case.op, device=device_name, gpu=gpu, dtype=case.dtype, what=case.what,
               latency_us=f"{timing.seconds * 1e6:.4f}", reps=timing.reps, timing=timing.method,
               kernel_us=f"{timing.kernel_s * 1e6:.4f}" if timing.kernel_s else "",
               kernels=";".join(k.replace(";", ",") for k in timing.kernels))
    return row


def _table_text(rows: list[dict]) -> str:
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return text.getvalue()


def _gpu_provenance(device: str, cudnn_benchmark: bool, timing: str = "graph") -> dict:
    import torch

    if device == "cpu":
        return {"gpu": "cpu", "timing": "perf_counter median per call"}
    props = torch.cuda.get_device_properties(0)
    return {"gpu": torch.cuda.get_device_name(0), "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), "sm_count": props.multi_processor_count,
            "memory_bytes": props.total_memory, "capability": f"{props.major}.{props.minor}",
            "driver": _driver_version(),
            "timing": ("CUDA graph of back-to-back calls replayed between CUDA events, median of 5 per call"
                       if timing == "graph" else "eager calls queued behind a sleeping kernel, between CUDA "
                       "events, median of 5 per call"),
            "cudnn_benchmark": cudnn_benchmark}


def _driver_version() -> str | None:
    try:
        import subprocess

        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def run_sweep(out: str | Path, *, device: str = "cuda", dtypes: list[str], classes: list[str],
              quick: bool = False, budget_s: float = 540.0, target_s: float = 0.01, gemm_samples: int = 0,
              seed: int = 0, conv_batch: int = 64, cudnn_benchmark: bool = False, timing: str = "graph",
              progress: Callable[[str, int, int], None] | None = None) -> dict:
    """Time every case of the sweep on ``device`` within ``budget_s`` and write ``out``/kernels.csv and
    ``out``/provenance.json. Returns the summary (rows, failures, cases not reached, seconds)."""
    import torch

    from trainsim.sim.core.devices import match_cuda_name

    if device != "cpu" and "fp8" in dtypes and not hasattr(torch, "_scaled_mm"):
        raise TrainsimError(f"this torch ({torch.__version__}) has no _scaled_mm for fp8", field="--dtypes")
    if device != "cpu":
        gpu = torch.cuda.get_device_name(0)
        check_precisions(dtypes, gpu, torch.cuda.get_device_capability(0))
        spec = match_cuda_name(gpu, torch.cuda.get_device_properties(0).total_memory)
        device_name = spec.name if spec else gpu
    else:
        gpu = device_name = "cpu"
    cases = sweep_cases(dtypes, classes, quick, gemm_samples=gemm_samples, seed=seed, conv_batch=conv_batch)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    record = provenance(**_gpu_provenance(device, cudnn_benchmark, timing), device_spec=device_name,
                        dtypes=dtypes, classes=classes, quick=quick, target_s=target_s,
                        gemm_samples=gemm_samples, seed=seed, conv_batch=conv_batch)
    rows, failed, began = [], [], time.monotonic()
    last_write = began
    reached = 0
    try:
        for i, case in enumerate(cases):
            if time.monotonic() - began > budget_s:
                break
            reached = i + 1
            if progress:
                progress(case.key, i, len(cases))
            try:
                measured = time_case(case, device, target_s=target_s, kernel_names=device != "cpu",
                                     cudnn_benchmark=cudnn_benchmark, timing=timing)
            except Exception as exc:  # noqa: BLE001 - a case the library refuses (shape, dtype) is noted
                failed.append({"case": case.key, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
                if device != "cpu":
                    torch.cuda.empty_cache()
                continue
            rows.append(_row(case, device_name, gpu, measured))
            if time.monotonic() - last_write > 15:
                write_atomic(folder / TABLE_NAME, _table_text(rows))
                last_write = time.monotonic()
    finally:
        summary = {"rows": len(rows), "cases": len(cases), "not_reached": len(cases) - reached,
                   "failed": failed, "seconds": round(time.monotonic() - began, 1),
                   "table": str(folder / TABLE_NAME)}
        write_atomic(folder / TABLE_NAME, _table_text(rows))
        write_atomic(folder / PROVENANCE_NAME, json.dumps({**record, **summary}, indent=1) + "\n")
    return summary
