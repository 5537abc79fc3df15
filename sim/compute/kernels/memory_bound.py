"""Memory-bound work: elementwise ops, normalisation, softmax, optimizer steps, embeddings, copies.

Such a kernel streams its tensors through HBM: ``bytes × passes / (bandwidth × efficiency)``, where bytes are
its least traffic (`Streaming.bytes`: every input read once, every output written once) and ``efficiency``
the share of the datasheet bandwidth the device's elementwise kernels reach (`params.json`, fitted per device
on the evidence's elementwise ops). A norm or a softmax makes more than one pass: ``passes`` while a row fits
one warp's or block's registers, ``long_row_passes`` beyond ``LONG_ROW`` values (PyTorch's softmax switches
from its one-warp-per-row kernel to a block per row there; the evidence's kernel names show the switch at
1024), and it does arithmetic per value (``flops_per_element``: the mean, the variance, the exponentials)
that bounds it where the GPU's fp32 peak is low for its bandwidth: its time is the sum of the two. Where a
GPU's own rows show it (``long_row_flops_per_element``: the H200's softmax rows longer than 2,048 run at the
same values per second in fp32, bf16 and fp16), a long row's block kernel does more work per value, and
``long_row`` moves where the long rows begin. Those
three are properties of PyTorch's kernels, fitted per device and shared as medians; the bandwidth share is
the device's. A ``strided`` kernel (over an operand that is not contiguous: a mask broadcast across the
others, as a causal mask is over a batch of score matrices, or a transposed view copied into batches) leaves
TensorIterator's vectorised path for its generic one, which loads one value of each operand at a time: its
bytes stream at a share of the bandwidth of their own, ``strided.efficiency_fp32`` or
``strided.efficiency_16bit`` (a warp's loads of 2-byte values fetch half the bytes of its loads of 4-byte
ones; the H200's fp32 masks run 2.5 times the bytes per second its 16-bit ones do). cuDNN's training batch
norm over NCHW tensors (``batchnorm``, ``batchnorm_backward``) streams its bytes ``passes`` times, and no
faster than its channels allow: each channel is a row, ``rows_per_sm`` rows run on an SM at once, and a row
streams its bytes at ``row_bytes_per_s`` (the blocks of one channel: as many bytes as they keep in flight per
memory latency, not a share of the HBM), so a layer of few channels over large images (64 channels at 56x56)
is bound by its rows on a GPU whose HBM is fast enough, not by the HBM. Kinds without evidence of their own
(optimizer, embedding, copy, reduction) stream as elementwise kernels: an optimizer step is elementwise over
its tensors.

A kernel's fixed cost (launching it, and the host dispatching it) is `launch`'s, not this module's.
"""

from __future__ import annotations

import numpy as np

from trainsim.errors import TrainsimError
from trainsim.sim.core.devices import DeviceSpec

from .params import KernelParams
from .specs import DTYPE_BYTES, KernelEstimate, Streaming

#: the row length beyond which norms and softmax make their long-row passes (NeuSight's PyTorch 2.1 switched
#: softmax to a block per row there; a GPU's own ``long_row`` figure says where its PyTorch does: the H200's
#: 2.11 ran its one-warp-per-row kernel up to 2,048 values, fp32 included)
LONG_ROW = 1024
#: the kinds with figures of their own; the others are elementwise
FITTED_KINDS = ("elementwise", "layernorm", "softmax")
ROW_KINDS = ("layernorm", "softmax")
#: the kinds bound by how many rows run at once, and the class whose held-out band they carry
CHANNEL_KINDS = {"batchnorm": "layernorm", "batchnorm_backward": "layernorm"}


def streaming_core(nbytes, elements, row, *, bandwidth: float, efficiency, passes=1.0, long_row_passes=None,
                   flops_per_element=0.0, long_row_flops_per_element=0.0, long_row=LONG_ROW, peak=np.inf):
    """Seconds of memory-bound kernels given as arrays (or scalars): ``nbytes`` streamed ``passes`` times
    (``long_row_passes`` where ``row`` > ``long_row``) at ``bandwidth × efficiency``, plus
    ``flops_per_element × elements`` at ``peak`` (and ``long_row_flops_per_element`` more per value where
    the row is long: the block-per-row kernels' work per value, whatever its bytes)."""
    nbytes, elements, row = (np.asarray(x, dtype=float) for x in (nbytes, elements, row))
    long_passes = passes if long_row_passes is None else long_row_passes
    times = np.where(row > long_row, long_passes, passes)
    memory = nbytes * times / (bandwidth * np.asarray(efficiency, dtype=float))
    work = work_per_value(row, flops_per_element, long_row_flops_per_element, long_row)
    return memory + work * elements / peak


def work_per_value(row, flops_per_element, long_row_flops_per_element=0.0, long_row=LONG_ROW):
    """The fp32 operations' worth of work per value of a row kernel: ``flops_per_element``, and
    ``long_row_flops_per_element`` more where the row is longer than ``long_row``."""
    long = np.asarray(row, dtype=float) > long_row
    return flops_per_element + np.where(long, long_row_flops_per_element, 0.0)


def figures(device: DeviceSpec, params: KernelParams, kind: str, dtype: str = "fp32") -> tuple[dict, str]:
    """The figures of a memory-bound ``kind`` of ``dtype`` values on ``device`` (efficiency, passes,
    long_row_passes, flops_per_element) and where its efficiency comes from."""
    efficiency, where = params.figure(device, "elementwise", "efficiency")
    if kind == "strided":
        name = "efficiency_fp32" if DTYPE_BYTES[dtype] >= 4 else "efficiency_16bit"
        efficiency, where = params.figure(device, "strided", name)
    out = {"efficiency": efficiency, "passes": 1.0, "long_row_passes": 1.0, "flops_per_element": 0.0}
    if kind in CHANNEL_KINDS:
        out["passes"], _ = params.figure(device, kind, "passes")
        out["long_row_passes"] = out["passes"]
    if kind in ROW_KINDS:
        for name in ("long_row_passes", "flops_per_element"):
            out[name], _ = params.figure(device, kind, name)
        for name in ("long_row_flops_per_element", "long_row"):  # where a GPU's own rows show them
            try:
                out[name], _ = params.figure(device, kind, name)
            except TrainsimError:
                pass
    return out, where


def rows_seconds(spec: Streaming, device: DeviceSpec, params: KernelParams) -> float:
    """How long a `CHANNEL_KINDS` kernel's rows take, ``rows_per_sm`` to an SM at once, each streaming its
    share of the bytes at ``row_bytes_per_s`` (0 for other kinds, a kernel without rows, or a device without
    an SM count)."""
    sms = getattr(device, "sm_count", None)
    if spec.kind not in CHANNEL_KINDS or not spec.row or not sms:
        return 0.0
    rate, _ = params.figure(device, spec.kind, "row_bytes_per_s")
    per_sm, _ = params.figure(device, spec.kind, "rows_per_sm")
    rows = max(1.0, spec.elements / spec.row)
    waves = np.ceil(rows / (per_sm * sms))
    return float(waves * (spec.bytes / rows) / rate)


def streaming_time(spec: Streaming, device: DeviceSpec, params: KernelParams) -> KernelEstimate:
    """The kernel model's time for a memory-bound kernel on ``device``."""
    fig, where = figures(device, params, spec.kind, spec.dtype)
    peak = device.peak("fp32")
    row = spec.row or 0
    seconds = float(streaming_core(spec.bytes, spec.elements, row, bandwidth=device.memory_bandwidth,
                                   peak=peak, **fig))
    rows_bound = rows_seconds(spec, device, params)
    if rows_bound > seconds:
        seconds = rows_bound
        fig = {**fig, "rows_bound": True}
    cls = spec.kind if spec.kind in FITTED_KINDS else CHANNEL_KINDS.get(spec.kind, "elementwise")
    low, high = params.held_out(cls)
    long_row = fig.get("long_row", LONG_ROW)
    work = float(work_per_value(row, fig["flops_per_element"], fig.get("long_row_flops_per_element", 0.0),
                                long_row))
    compute = work * spec.elements / peak
    bound = "compute" if compute >= seconds else "memory"
    achieved = (work * spec.elements if bound == "compute" else spec.bytes) / seconds
    return KernelEstimate(seconds=seconds, bound=bound, achieved=achieved, low=seconds * (1 + low),
                          high=seconds * (1 + high), kernel_class=cls,
                          detail={**fig, "efficiency_from": where,
                                  "passes_used": fig["long_row_passes"] if row > long_row else fig["passes"]})
