"""Matrix work: GEMM, batched GEMM and convolution (implicit GEMM or Winograd), by tiles and waves.

A GEMM's output is cut into thread-block tiles of ``tm x tn``; the GPU runs one wave of ``sm_count`` tiles
at a time, so a kernel takes ``ceil(tiles / sm_count)`` waves and a partial last wave leaves SMs idle. Each
tile computes ``2·tm·tn·(K + k0)`` FLOPs' worth of time (``k0``: its prologue and epilogue, in steps of K)
on one SM at ``peak / sm_count × efficiency × f(tile)``, where ``f = (1 + a/64) / (1 + a(1/tm + 1/tn))`` is
how much smaller tiles lose to loading their operands (1 at 128 x 128). When the tiles are too few to fill
the GPU the library splits K over ``s`` tiles (split-K) and sums the ``s`` partial products afterwards in
HBM. The kernel takes the fastest tile and split its architecture's libraries offer (`params` ``tiles``:
those seen launched in the evidence), and no less than its least traffic at the GPU's achieved bandwidth
(`memory_efficiency`: a device's tensor-core kernels may stream their operands faster than SIMT ones).

Efficiency: a device's own where it was measured; for a GPU never measured, its generation's (or all
measured GPUs') over the boards whose power does not cap them, capped in turn by its own board power
(`params.KernelParams.efficiency`: a 70 W T4 or L4 cannot hold its boost clock through an SGEMM).

Precision: fp32 runs on the SIMT cores at the fp32 peak; tf32/fp16/bf16/fp8 on the tensor cores at that
precision's peak, where the architecture has it (`hardware.matrix_peak` refuses TF32 on a V100, FP8 before
Ada/Hopper). A tensor-core precision takes its own figures where its architecture has rows (`gemm_time`:
tiles, share of peak, K prologue, small-tile penalty, a call's fixed time, the measured ceiling), else the
stand-in chain of `TENSOR_STAND_IN` (`params.json` ``unfitted`` says which).

A 3x3 stride-1 convolution may run as Winograd, as cuDNN picks it (the evidence's kernel names show it for
most of them), in one of two forms. Non-fused, F(4x4, 3x3): 36 batched GEMMs of a quarter of the direct
FLOPs between input, filter and output transforms that stream through HBM (four kernels: ``winograd_nonfused``
transforms around an SGEMM). Fused, F(2x2, 3x3): 16 batched GEMMs of 4/9 of the direct FLOPs whose
transforms stay in shared memory (two kernels: the filter transform, then ``scudnn_winograd_128x128``); its
measured direct-equivalent rate reaches 1.7x the fp32 peak, which no direct algorithm can, and stays under
the 2.25x of F(2x2, 3x3). The kernel takes the fastest of the three, each with the fixed GPU time of the
kernels it launches (``conv.kernel_s`` each) and its own fitted share of peak.
"""

from __future__ import annotations

import math

import numpy as np

from trainsim.errors import TrainsimError
from trainsim.sim.core.devices import DeviceSpec

from .hardware import matrix_peak, require
from .params import KernelParams
from .specs import DTYPE_BYTES, Conv2d, Gemm, KernelEstimate

SPLITS = (1, 2, 4, 8, 16)
#: kernels a convolution launches (each costs ``conv.kernel_s`` on the GPU): cuDNN's implicit GEMM computes
#: its offsets first; its Winograd transforms the filter and the input, multiplies, transforms the output
IMPLICIT_KERNELS, WINOGRAD_KERNELS = 2, 4
#: cuDNN's fused Winograd launches two: the filter transform, then one kernel that transforms, multiplies
#: and transforms back in shared memory
FUSED_WINOGRAD_KERNELS = 2
PARTIAL_BYTES = 4  # split-K partial sums are fp32


def tile_factor(tm, tn, tile_a: float):
    """Efficiency of a ``tm x tn`` tile relative to 128 x 128 (operand loads per FLOP grow as tiles
    shrink)."""
    return (1.0 + tile_a / 64.0) / (1.0 + tile_a * (1.0 / tm + 1.0 / tn))


def gemm_core(m, n, k, batch, nbytes, *, rate_per_sm: float, sms: int, efficiency, tile_a: float, k0: float,
              tiles, bandwidth, splits=SPLITS):
    """Seconds of GEMMs given as arrays (or scalars): the fastest tile and split, no less than ``nbytes`` at
    ``bandwidth``. Returns (seconds, compute seconds, memory seconds, tile index, split) as arrays."""
    m, n, k, batch, nbytes = (np.asarray(x, dtype=float) for x in (m, n, k, batch, nbytes))
    efficiency = np.asarray(efficiency, dtype=float)
    best = np.full(np.broadcast(m, n, k, batch).shape, np.inf)
    best_tile = np.zeros(best.shape, dtype=int)
    best_split = np.ones(best.shape, dtype=int)
    for index, (tm, tn) in enumerate(tiles):
        per_tile = 2.0 * tm * tn / (rate_per_sm * efficiency * tile_factor(tm, tn, tile_a))
        blocks = batch * np.ceil(m / tm) * np.ceil(n / tn)
        for split in splits:
            waves = np.ceil(blocks * split / sms)
            seconds = waves * per_tile * (np.ceil(k / split) + k0)
            if split > 1:
                seconds = seconds + 2.0 * split * batch * m * n * PARTIAL_BYTES / bandwidth
                seconds = np.where(k >= 2 * split, seconds, np.inf)
            better = seconds < best
            best = np.where(better, seconds, best)
            best_tile = np.where(better, index, best_tile)
            best_split = np.where(better, split, best_split)
    memory = nbytes / bandwidth
    return np.maximum(best, memory), best, memory, best_tile, best_split


def winograd_core(batch, in_c, out_c, height, width, out_h, out_w, **gemm):
    """Seconds of a 3x3 stride-1 convolution as Winograd F(4x4, 3x3): 36 batched GEMMs over the input's
    4x4 output tiles, a quarter of the direct FLOPs, and transforms of input, filter and output through HBM
    at ``gemm['bandwidth']``."""
    out_tile = 4
    points = (out_tile + 2) ** 2
    tiles = batch * np.ceil(np.asarray(out_h, dtype=float) / out_tile) * np.ceil(
        np.asarray(out_w, dtype=float) / out_tile)
    size = 4.0
    gemm_bytes = size * (points * tiles * in_c + points * in_c * out_c + points * tiles * out_c)
    seconds, _, _, _, _ = gemm_core(tiles, out_c, in_c, points, gemm_bytes, **gemm)
    transforms = size * (batch * in_c * height * width + points * tiles * in_c  # input transform
                         + points * tiles * out_c + batch * out_c * out_h * out_w  # output transform
                         + 9 * in_c * out_c + points * in_c * out_c)  # filter transform
    return seconds + transforms / gemm["bandwidth"]


def fused_winograd_core(batch, in_c, out_c, height, width, out_h, out_w, **gemm):
    """Seconds of a 3x3 stride-1 convolution as cuDNN's fused Winograd F(2x2, 3x3): 16 batched GEMMs over
    the output's 2x2 tiles (4/9 of the direct FLOPs) whose input and output transforms run in shared
    memory, so that HBM sees the direct convolution's input, filter and output once, and a separate filter
    transform (3x3 to 4x4) through HBM at ``gemm['bandwidth']``."""
    out_tile, points, size = 2, 16, 4.0
    tiles = batch * np.ceil(np.asarray(out_h, dtype=float) / out_tile) * np.ceil(
        np.asarray(out_w, dtype=float) / out_tile)
    in_c, out_c = np.asarray(in_c, dtype=float), np.asarray(out_c, dtype=float)
    gemm_bytes = size * (batch * in_c * height * width + points * in_c * out_c
                         + batch * out_c * out_h * out_w)
    seconds, _, _, _, _ = gemm_core(tiles, out_c, in_c, points, gemm_bytes, **gemm)
    return seconds + size * (9 + points) * in_c * out_c / gemm["bandwidth"]


#: tensor-core precisions without rows of their own take the next one's figure: fp8 fp16's, fp16 bf16's
#: (one peak for both since Ampere), bf16 tf32's (a stand-in: the same fraction of a higher peak)
TENSOR_STAND_IN = {"fp8": "fp16", "fp16": "bf16", "bf16": "tf32"}
#: the fraction of a tensor-core peak taken where no precision of the chain has a figure: the roofline's
#: compute efficiency (`trainsim.sim.compute.roofline.Efficiency.compute`), not fitted
ROOFLINE_FRACTION = 0.7
#: elements a tensor-core GEMM's leading dimensions must be a multiple of (16 bytes) for cuBLAS's aligned
#: kernels; a misaligned operand (GPT-2's vocabulary of 50,257) runs narrower loads at ``misaligned`` of it
ALIGN_BYTES = 16


def tensor_precision(device: DeviceSpec, params: KernelParams, cls: str, dtype: str) -> str | None:
    """The precision whose tensor-core figures class ``cls`` takes for ``dtype`` on ``device``: ``dtype``
    where it has ``tensor_efficiency_<dtype>`` (the device's, its architecture's, or the default's: the
    measured architectures' median), else the next of `TENSOR_STAND_IN` that has one; None: none has."""
    name = dtype
    while name is not None:
        try:
            params.figure(device, cls, f"tensor_efficiency_{name}")
        except TrainsimError:
            name = TENSOR_STAND_IN.get(name)
            continue
        return name
    return None


def tensor_efficiency(device: DeviceSpec, params: KernelParams, cls: str, dtype: str) -> tuple[float, str]:
    """The fraction of ``dtype``'s tensor-core peak class ``cls`` reaches on ``device``: the figure
    ``tensor_efficiency_<p>`` of `tensor_precision`'s ``p``, found as `params.KernelParams.figure` finds
    figures; else `ROOFLINE_FRACTION` (``unfitted`` in params.json)."""
    name = tensor_precision(device, params, cls, dtype)
    if name is None:
        return ROOFLINE_FRACTION, "roofline fraction (no tensor-core rows)"
    value, where = params.figure(device, cls, f"tensor_efficiency_{name}")
    return value, where if name == dtype else f"{where} ({name} figure: no {dtype} rows)"


def _setup(device: DeviceSpec, params: KernelParams, dtype: str, cls: str):
    peak = matrix_peak(device, dtype)
    sms = int(require(device, "sm_count", cls))
    if dtype != "fp32":
        efficiency, where = tensor_efficiency(device, params, cls, dtype)
    else:
        efficiency, where = params.efficiency(device, cls, "efficiency")
    return peak, sms, efficiency, where, device.memory_bandwidth * memory_efficiency(device, params, dtype)


def memory_efficiency(device: DeviceSpec, params: KernelParams, dtype: str) -> float:
    """The share of the bandwidth a GEMM's operands stream at where memory bounds it: for a tensor-core
    precision ``tensor_memory_efficiency`` where fitted (the tensor-core kernels' own: the H200's stream
    their operands faster than SIMT kernels do), else ``memory_efficiency`` (fitted on fp32 SIMT GEMMs)."""
    simt, _ = params.figure(device, "matmul", "memory_efficiency")
    if dtype == "fp32":
        return simt
    try:
        return params.figure(device, "matmul", "tensor_memory_efficiency")[0]
    except TrainsimError:
        return simt


def aligned(spec: Gemm) -> bool:
    """Whether a tensor-core GEMM's dimensions are multiples of 16 bytes of its elements (fp32 SIMT GEMMs
    need no alignment)."""
    if spec.dtype == "fp32":
        return True
    step = ALIGN_BYTES // DTYPE_BYTES[spec.dtype]
    return all(d % step == 0 for d in (spec.n, spec.k))


def gemm_k0(device: DeviceSpec, params: KernelParams, dtype: str) -> float:
    """A GEMM tile's fixed cost in steps of K (its prologue and epilogue): ``k0_<dtype>`` for a tensor-core
    precision where fitted, else ``k0`` (fitted on fp32 SIMT kernels)."""
    return tensor_figure(device, params, dtype, "k0", params.figure(device, "matmul", "k0")[0])


def misaligned_factor(device: DeviceSpec, params: KernelParams, dtype: str) -> float | None:
    """The factor on a tensor-core GEMM's efficiency when an operand is misaligned: the figure
    ``misaligned_<dtype>`` (narrower loads cost more the narrower the element), else ``misaligned``; None
    where neither is given."""
    for name in (f"misaligned_{dtype}", "misaligned"):
        try:
            return params.figure(device, "matmul", name)[0]
        except TrainsimError:
            continue
    return None


def tensor_figure(device: DeviceSpec, params: KernelParams, dtype: str, name: str, otherwise: float) -> float:
    """A tensor-core GEMM figure ``<name>_<p>`` of the matmul class, ``p`` the precision whose efficiency
    ``dtype`` takes (`tensor_precision`: fp16 takes bf16's whole set, not its efficiency alone), as
    `params.KernelParams.figure` finds it; else ``otherwise``; fp32 (SIMT) always takes ``otherwise``."""
    if dtype != "fp32":
        source = tensor_precision(device, params, "matmul", dtype)
        if source is not None:
            try:
                return params.figure(device, "matmul", f"{name}_{source}")[0]
            except TrainsimError:
                pass
    return otherwise


def gemm_time(spec: Gemm, device: DeviceSpec, params: KernelParams, *,
              misaligned: bool | None = None) -> KernelEstimate:
    """The kernel model's time for a (batched) GEMM on ``device``. ``misaligned``: whether the library runs
    its misaligned kernels (a trace's kernel name says so); None: decided from the shape (`aligned`).

    A tensor-core GEMM uses its precision's figures where fitted: the ``tensor`` tiles of its architecture
    (else the SIMT kernels' tiles), ``tile_a_<dtype>`` (its operand-load penalty of small tiles),
    ``k0_<dtype>`` and ``call_s_<dtype>``, the fixed GPU time of one call (its smallest GEMMs take it
    whatever their FLOPs), and ``ceiling_<dtype>``: the largest share of the peak any measured GEMM of
    the precision reached on the architecture (its clocks under the power cap), which no predicted call
    beats (the tile model, fitted on shapes up to 4096, would otherwise run past it on longer K)."""
    peak, sms, efficiency, where, bandwidth = _setup(device, params, spec.dtype, "matmul")
    if (not aligned(spec) if misaligned is None else misaligned) and spec.dtype != "fp32":
        scale = misaligned_factor(device, params, spec.dtype)
        if scale is not None:
            efficiency, where = efficiency * scale, f"{where}, misaligned x{scale:.3f}"
    kind = "batched" if spec.batch > 1 and not spec.shared_b else "single"
    tensor = spec.dtype != "fp32"
    tiles = params.tiles(device, "tensor", fallback=kind) if tensor else params.tiles(device, kind)
    tile_a = tensor_figure(device, params, spec.dtype, "tile_a", params.figure(device, "matmul", "tile_a")[0])
    call_s = tensor_figure(device, params, spec.dtype, "call_s", 0.0)
    seconds, compute, memory, tile, split = gemm_core(
        spec.m, spec.n, spec.k, spec.batch, spec.bytes, rate_per_sm=peak / sms, sms=sms,
        efficiency=efficiency, tile_a=tile_a, k0=gemm_k0(device, params, spec.dtype), tiles=tiles,
        bandwidth=bandwidth)
    tm, tn = tiles[int(tile)]
    blocks = spec.batch * math.ceil(spec.m / tm) * math.ceil(spec.n / tn) * int(split)
    ceiling = tensor_figure(device, params, spec.dtype, "ceiling", 0.0)
    floor = spec.flops / (peak * ceiling) if ceiling > 0 else 0.0
    seconds, compute = max(float(seconds) + call_s, floor), max(float(compute) + call_s, floor)
    detail = {"tile": f"{tm}x{tn}", "split_k": int(split), "waves": math.ceil(blocks / sms),
              "efficiency": efficiency, "efficiency_from": where, "peak": peak, "call_s": call_s,
              "ceiling": ceiling}
    return _estimate(seconds, compute, float(memory), spec, params, "matmul", detail, device)


def conv_time(spec: Conv2d, device: DeviceSpec, params: KernelParams) -> KernelEstimate:
    """The kernel model's time for a convolution pass: the fastest of its implicit GEMM and, for a 3x3
    stride-1 fp32 forward, the two Winograd algorithms (`winograd_core`, `fused_winograd_core`).

    An fp32 pass runs cuDNN's SIMT kernels: the ``conv`` tiles and the SIMT GEMM's figures, and the fixed
    GPU time of the kernels it launches (``conv.kernel_s`` each). A tensor-core pass runs the tensor-core
    GEMM kernels' tiles and costs (`gemm_time`'s ``tensor`` tiles, ``tile_a_<p>``, ``k0_<p>``, ``call_s_<p>``
    and ceiling) at the convolution's own share of the peak (``conv.tensor_efficiency_<p>``), plus cuDNN's
    layout transforms around it (`layout_bytes`) and their fixed time (``conv.tensor_call_s``): the H200's
    kernels show a 1x1 convolution run by the very GEMM kernels of a matrix product (nvjet, sm90_xmma):
    such a pass (`runs_as_gemm`) takes the GEMM's share of the peak and no transform."""
    tensor = spec.dtype != "fp32"
    plain = tensor and runs_as_gemm(spec)
    peak, sms, efficiency, where, bandwidth = _setup(device, params, spec.dtype,
                                                     "matmul" if plain else "conv")
    gemm = plain_gemm(spec) if plain else spec.as_gemm()
    simt_a, simt_k0 = params.figure(device, "matmul", "tile_a")[0], params.figure(device, "matmul", "k0")[0]
    if tensor:
        common = {"tile_a": tensor_figure(device, params, spec.dtype, "tile_a", simt_a),
                  "k0": gemm_k0(device, params, spec.dtype),
                  "tiles": params.tiles(device, "tensor", fallback="conv")}
        fixed = tensor_figure(device, params, spec.dtype, "call_s", 0.0)
    else:
        kernel_s, _ = params.figure(device, "conv", "kernel_s")
        common = {"tile_a": simt_a, "k0": simt_k0, "tiles": params.tiles(device, "conv")}
        fixed = IMPLICIT_KERNELS * kernel_s
    common.update(rate_per_sm=peak / sms, sms=sms, bandwidth=bandwidth)
    seconds, compute, memory, tile, split = gemm_core(gemm.m, gemm.n, gemm.k, gemm.batch, spec.bytes,
                                                      efficiency=efficiency, **common)
    seconds = float(seconds) + fixed
    compute, memory = float(compute), float(memory)
    algorithm = "implicit_gemm"
    if spec.winograd_eligible and spec.pass_ == "forward" and not tensor:
        shape = (spec.batch, spec.in_channels, spec.out_channels, spec.height, spec.width, spec.out_h,
                 spec.out_w)
        for name, core, kernels in (("winograd", winograd_core, WINOGRAD_KERNELS),
                                    ("fused_winograd", fused_winograd_core, FUSED_WINOGRAD_KERNELS)):
            eff, _ = params.efficiency(device, "conv", f"{name}_efficiency")
            wino = float(core(*shape, efficiency=eff, **common)) + kernels * kernel_s
            if wino < seconds:
                seconds, compute, algorithm = wino, wino, name
    if tensor:
        ceiling = tensor_figure(device, params, spec.dtype, "ceiling", 0.0)
        floor = spec.flops / (peak * ceiling) if ceiling > 0 else 0.0
        seconds, compute = max(seconds, floor), max(compute, floor)
    transforms = layout_bytes(spec)
    if transforms:
        stream, _ = params.figure(device, "elementwise", "efficiency")
        seconds += transforms / (device.memory_bandwidth * stream)
    if tensor and not plain:
        seconds += tensor_call_seconds(device, params)
    detail = {"algorithm": "gemm" if plain else algorithm, "efficiency": efficiency, "efficiency_from": where,
              "peak": peak, "layout_bytes": transforms}
    return _estimate(seconds, compute, memory, spec, params, "conv", detail, device)


def tensor_call_seconds(device: DeviceSpec, params: KernelParams) -> float:
    """The fixed GPU time of a tensor-core convolution pass beyond its GEMM (``conv.tensor_call_s``: the
    workspace initialisation, filter transforms, split reductions and the gaps between them that the traces
    show around each), 0 where not fitted."""
    try:
        return params.figure(device, "conv", "tensor_call_s")[0]
    except TrainsimError:
        return 0.0


#: the fewest positions per image at which cuDNN runs a 1x1 stride-1 tensor-core convolution as a plain GEMM:
#: on the H200 every such pass at 56x56 and 28x28 ran cuBLAS's GEMM kernels, at 14x14 and 7x7 the implicit
#: GEMM between layout transforms (the geometric mean of 784 and 196)
GEMM_POSITIONS = 392


def runs_as_gemm(spec: Conv2d) -> bool:
    """Whether cuDNN runs a tensor-core convolution pass as a plain GEMM over its NCHW tensors: a 1x1
    stride-1 unpadded filter, whose every pass is a matrix product per image, over images of at least
    `GEMM_POSITIONS` positions (the H200's kernels show cuBLAS's own GEMM kernels, nvjet and sm90_xmma_gemm,
    with no layout transform around them). It then takes the GEMM's share of the peak, not the
    implicit-GEMM convolution's."""
    return (spec.kernel == (1, 1) and spec.stride == 1 and spec.padding == 0 and spec.groups == 1
            and spec.height * spec.width >= GEMM_POSITIONS)


def plain_gemm(spec: Conv2d) -> Gemm:
    """The GEMM a `runs_as_gemm` pass is over NCHW tensors: per image, the filter (OC x IC) times the
    image's IC x HW positions (forward), its transpose times the output's gradient (data gradient); the
    weight gradient sums the images' OC x HW by HW x IC products, one GEMM over all positions."""
    positions = spec.height * spec.width
    if spec.pass_ == "forward":
        return Gemm(m=spec.out_channels, n=positions, k=spec.in_channels, batch=spec.batch, dtype=spec.dtype)
    if spec.pass_ == "backward_data":
        return Gemm(m=spec.in_channels, n=positions, k=spec.out_channels, batch=spec.batch, dtype=spec.dtype)
    return Gemm(m=spec.out_channels, n=spec.in_channels, k=spec.batch * positions, dtype=spec.dtype)


def layout_bytes(spec: Conv2d) -> float:
    """Bytes cuDNN's layout transforms move around a tensor-core convolution of NCHW tensors: its NHWC
    kernels need the tensors they read turned to NHWC and what they write turned back (the H200 traces
    show ``nchwToNhwcKernel`` and ``nhwcToNchwKernel`` around every tf32 convolution). Each transform
    reads and writes its tensor once: the forward turns its input and output, the data gradient the
    output's gradient and the input's, the weight gradient the output's gradient and the input. 0 for fp32
    (SIMT kernels read NCHW) and for a 1x1 stride-1 convolution, which cuDNN runs as a GEMM over the NCHW
    tensors as they are (the traces' ``xmma_gemm`` kernels with no transform around them)."""
    if spec.dtype == "fp32" or runs_as_gemm(spec):
        return 0.0
    size = DTYPE_BYTES[spec.dtype]
    inputs = spec.batch * spec.in_channels * spec.height * spec.width
    outputs = spec.batch * spec.out_channels * spec.out_h * spec.out_w
    return 2.0 * size * (inputs + outputs)


def _estimate(seconds, compute, memory, spec, params, cls, detail, device=None) -> KernelEstimate:
    low, high = params.held_out(cls)
    band = {"conv": f"tensor.conv2d.{spec.dtype}", "matmul": f"tensor.matmul.{spec.dtype}"}[cls]
    tensor_band = params.held_out(band, device) if spec.dtype != "fp32" else (0.0, 0.0)
    if tensor_band != (0.0, 0.0):
        low, high = tensor_band  # the tensor-core fit's held-out band (the GPU's own first)
    compute_bound = compute >= memory
    achieved = (spec.flops if compute_bound else spec.bytes) / seconds if seconds > 0 else 0.0
    return KernelEstimate(seconds=seconds, bound="compute" if compute_bound else "memory", achieved=achieved,
                          low=seconds * (1 + low), high=seconds * (1 + high), kernel_class=cls, detail=detail)
