"""Timing one case of a kernel sweep (`kernel_cases.Case`) with torch.

`time_case` builds the case's inputs once (`build`) and times its calls. On CUDA it captures ``reps``
back-to-back calls in a CUDA graph and replays it between CUDA events (the median of five replays over
``reps``), so the figure is the GPU's time per call, not the host's dispatch; where capture fails it times the
same calls launched eagerly. With ``timing "stream"`` it launches them eagerly instead, queued behind a
sleeping kernel until the host has issued them all, so that they run back to back as in a GPU-bound eager
step, each with its launch's own GPU cost. It then records one call under torch.profiler for the kernels it
launched (names, and the sum of their durations). On the CPU it takes the median of ``perf_counter`` over the
calls. cuDNN takes its heuristics' algorithm, PyTorch's default and what trainsim's own runs use, or with
``cudnn_benchmark`` the fastest it times per shape (as a training script that sets
``torch.backends.cudnn.benchmark`` does). Inputs stay resident between calls, so a problem that fits in L2
is timed from L2, as back-to-back layers of a step are not always.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .kernel_cases import Case

_TORCH_DTYPES = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def build(case: Case, device: str, cudnn_benchmark: bool = False) -> Callable[[], object]:
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

    fn = build(case, device, cudnn_benchmark)
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
