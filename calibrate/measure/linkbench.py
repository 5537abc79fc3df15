"""Link microbenchmarks: time copies over a log-spaced size sweep, fit latency and bandwidth per link class.

On CUDA (events on the device's stream, back-to-back copies timed together):
  ``h2d_pinned``, ``h2d_pageable``, ``d2h_pinned``, ``d2h_pageable`` per GPU (host memory <-> GPU, PCIe),
  ``d2d`` per GPU (a copy inside one GPU's memory), ``p2p`` for every GPU pair i < j (i -> j, NVLink or
  PCIe peer-to-peer where the driver allows it, staged through the host where not: ``can_access_peer``),
  ``h2d_batch`` per GPU: a pageable copy of a batch as a DataLoader worker hands it over (see
  `loader_batch_points`), the copy a training loop without ``pin_memory`` makes every iteration.
On the CPU (perf_counter), the copies that stand in for them:
  ``rank_copy``  one thread copying between two buffers, as one CPU rank's data reaches another rank's
                 buffer (gloo moves tensors between ranks with single-threaded memcpys). This is the "link"
                 between a CPU-rank device and its socket in the calibrated topology.
  ``dram_copy``  every core copying at once: the socket's memory bandwidth, counted like STREAM's Copy
                 (bytes read + bytes written), which becomes the socket's ``dram_bandwidth_gbps``.
Sizes that fit in the caches measure the caches, not DRAM; the sweep goes past the last-level cache so the
fitted bandwidth is the memory's, and the relative-error fit keeps the small sizes' latency honest.

Each point is (bytes, median seconds per copy, interquartile range); each class gets an alpha-beta fit.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from trainsim.calibrate.measure.alphabeta import AlphaBeta, fit_alpha_beta, log_sizes
from trainsim.calibrate.sampling import iterations_for, median_spread
from trainsim.errors import TrainsimError

KIB, MIB, GIB = 1024, 1024**2, 1024**3
_UNMEASURED_BETA = 1e15  # bytes/s: no memory or link on a box comes near this
Progress = Callable[[str], None]


@dataclass(frozen=True)
class SweepConfig:
    """How hard to measure: the size range, repeats per size, and the time one timing should last."""

    min_bytes: int = KIB
    max_bytes: int = GIB
    factor: int = 4
    repeats: int = 5
    target_s: float = 0.01

    def __post_init__(self):
        if self.min_bytes < 1 or self.max_bytes < self.min_bytes:
            raise ValueError(f"bad size range {self.min_bytes}..{self.max_bytes}")
        if self.repeats < 1:
            raise ValueError("repeats must be >= 1")

    def sizes(self) -> list[int]:
        return log_sizes(self.min_bytes, self.max_bytes, self.factor)


def sweep_for(device: str, quick: bool) -> SweepConfig:
    """The sweep of a run: 1 KiB..1 GiB on GPUs; trimmed on the CPU (and further with --quick).

    The CPU sweeps still end above a typical last-level cache (32 MiB here) so they reach DRAM.
    """
    if device == "cuda":
        return SweepConfig(max_bytes=256 * MIB, repeats=3, target_s=0.002) if quick else SweepConfig()
    if quick:
        return SweepConfig(max_bytes=64 * MIB, repeats=3, target_s=0.002)
    return SweepConfig(max_bytes=512 * MIB, factor=2, repeats=5, target_s=0.02)


@dataclass
class LinkClass:
    """One measured link class: where the bytes went, the raw points and the fit."""

    name: str  # e.g. "h2d_pinned/gpu0", "p2p/gpu0-gpu1", "rank_copy"
    kind: str  # h2d_pinned|h2d_pageable|h2d_batch|d2h_pinned|d2h_pageable|d2d|p2p|rank_copy|dram_copy
    src: str
    dst: str
    points: list[tuple[int, float, float]] = field(default_factory=list)  # (bytes moved, median s, IQR s)
    fit: AlphaBeta | None = None
    note: str | None = None

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "src": self.src,
            "dst": self.dst,
            "points": [list(p) for p in self.points],
            "fit": self.fit.to_json() if self.fit else None,
            "note": self.note,
        }


def _sweep(
    link: LinkClass,
    cfg: SweepConfig,
    run_k: Callable[[int, int], float],
    *,
    bytes_factor: int = 1,
    progress: Progress | None = None,
) -> LinkClass:
    """Measure ``run_k(nbytes, k)`` (seconds for k back-to-back copies) at every size; fit the result."""
    for nbytes in cfg.sizes():
        if progress:
            progress(f"{link.name} {nbytes} B")
        one = run_k(nbytes, 1)  # warm-up (first touch, allocation) and a first estimate
        k = iterations_for(run_k(nbytes, 1) or one, cfg.target_s)
        per_op = [run_k(nbytes, k) / k for _ in range(cfg.repeats)]
        med, spread = median_spread(per_op)
        link.points.append((nbytes * bytes_factor, med, spread))
    link.fit = fit_alpha_beta([p[0] for p in link.points], [p[1] for p in link.points])
    return link


# ---------------------------------------------------------------------------------------------- CPU


def last_level_cache_bytes(default: int = 32 * MIB) -> int:
    """Size of the largest CPU cache (from sysfs), used to keep copies out of the caches."""
    best = 0
    cache_dir = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in os.listdir(cache_dir):
            if entry.startswith("index"):
                with open(os.path.join(cache_dir, entry, "size")) as fh:
                    text = fh.read().strip().upper()
                scale = {"K": KIB, "M": MIB, "G": GIB}.get(text[-1:], 1)
                best = max(best, int(text.rstrip("KMG")) * scale)
    except (OSError, ValueError):
        return default
    return best or default


class _CpuBuffers:
    """Source and destination pools four times the last-level cache, walked so copies hit DRAM.

    Consecutive copies of one timing take their bytes from places spread over the whole pool, and every
    timing starts somewhere new, so a small copy is not served from the cache a previous copy warmed:
    data moving between two ranks has usually not just been touched by the receiver.
    """

    def __init__(self, max_bytes: int):
        import torch

        self.pool = max(max_bytes, 4 * last_level_cache_bytes())
        self.src = torch.ones(self.pool, dtype=torch.uint8)
        self.dst = torch.zeros(self.pool, dtype=torch.uint8)
        self._phase = 0

    def copy_k(self, nbytes: int, k: int) -> float:
        room = self.pool - nbytes
        stride = max(nbytes, room // max(k, 1))
        starts = [((self._phase + i * stride) % (room + 1)) // 64 * 64 for i in range(k)]
        self._phase += 7919 * 64 + stride // 3
        pairs = [(self.dst[o : o + nbytes], self.src[o : o + nbytes]) for o in starts]
        start = time.perf_counter()
        for dst, src in pairs:
            dst.copy_(src)
        return time.perf_counter() - start


def cpu_links(cfg: SweepConfig, *, progress: Progress | None = None) -> list[LinkClass]:
    """The CPU stand-ins: one-thread rank-to-rank copies and the all-core DRAM copy bandwidth."""
    import torch

    threads = torch.get_num_threads()
    cores = len(os.sched_getaffinity(0))
    buffers = _CpuBuffers(cfg.max_bytes)
    try:
        torch.set_num_threads(1)
        rank_copy = _sweep(
            LinkClass(
                "rank_copy",
                "rank_copy",
                "rank buffer",
                "rank buffer",
                note="one thread, torch copy_ between two host buffers, out of cache",
            ),
            cfg,
            buffers.copy_k,
            progress=progress,
        )
        # All cores only pay off (and only measure the memory) for copies large enough to split.
        torch.set_num_threads(cores)
        big = SweepConfig(
            min_bytes=min(4 * MIB, cfg.max_bytes // 4),
            max_bytes=cfg.max_bytes,
            factor=cfg.factor,
            repeats=cfg.repeats,
            target_s=cfg.target_s,
        )
        dram = _sweep(
            LinkClass(
                "dram_copy",
                "dram_copy",
                "dram",
                "dram",
                note=f"{cores} threads; bytes counted as read + written (STREAM Copy)",
            ),
            big,
            buffers.copy_k,
            bytes_factor=2,
            progress=progress,
        )
    finally:
        torch.set_num_threads(threads)
    return [rank_copy, dram]


def scales_with_size(link: LinkClass) -> bool:
    """Whether a sweep measured bytes moving: at its largest size, the bytes cost more than the fixed part.

    A fit failing this measured stalls (e.g. threads waiting for a core another process holds), whose
    tiny slope would read as an absurd bandwidth.
    """
    if link.fit is None or not link.points or link.fit.beta_bytes_per_s >= _UNMEASURED_BETA:
        return False
    largest = max(p[0] for p in link.points)
    return largest / link.fit.beta_bytes_per_s >= link.fit.alpha_s


def dram_bandwidth(links: list[LinkClass]) -> float:
    """The socket's memory bandwidth (bytes/s, STREAM-Copy convention) from the CPU link classes.

    At least what one core pulled through (its copy read and wrote every byte): on a busy box the all-core
    copy can come out lower than that, which says the other cores were taken, not that the memory is slower.
    """
    candidates = []
    for link in links:
        if not scales_with_size(link):
            continue
        if link.kind == "dram_copy":
            candidates.append(link.fit.beta_bytes_per_s)
        elif link.kind == "rank_copy":
            candidates.append(2.0 * link.fit.beta_bytes_per_s)
    if not candidates:
        raise TrainsimError(
            "no copy measurement gave a memory bandwidth (the box may be overloaded)", field="links"
        )
    return max(candidates)


def gemm_flops_per_core(n: int = 512, repeats: int = 5) -> float:
    """Measured fp32 GEMM FLOP/s of one core (one torch thread): 2 n^3 / median time."""
    import torch

    threads = torch.get_num_threads()
    a, b = torch.randn(n, n), torch.randn(n, n)
    try:
        torch.set_num_threads(1)
        torch.mm(a, b)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            torch.mm(a, b)
            times.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return 2.0 * n**3 / median_spread(times)[0]


# --------------------------------------------------------------------------------------------- CUDA


def _cuda_copy_timer(dst, src, device_index: int) -> Callable[[int, int], float]:
    """k back-to-back copies of the first n bytes of src into dst, timed with CUDA events on the stream."""
    import torch

    def run(nbytes: int, k: int) -> float:
        with torch.cuda.device(device_index):
            d, s = dst[:nbytes], src[:nbytes]
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(k):
                d.copy_(s, non_blocking=True)
            end.record()
            end.synchronize()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1e3

    return run


class _WorkerBatches:
    """A map-style dataset whose item ``i`` is a batch of ``sizes[i]`` bytes, made in the worker (so it
    reaches the loading process in shared memory that process has not touched yet)."""

    def __init__(self, sizes: list[int]):
        self.sizes = sizes

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i: int):
        import torch

        return torch.ones(self.sizes[i], dtype=torch.uint8)


def batch_sizes(cfg: SweepConfig) -> list[int]:
    """The sizes the loader-batch copy is measured at: the sweep's, between 1 MiB and 256 MiB (input batches;
    every one is made anew by a worker, so the largest sizes of a link sweep would cost seconds each)."""
    sizes = [n for n in cfg.sizes() if MIB <= n <= 256 * MIB]
    return sizes or [MIB]


def loader_batch_points(sizes: list[int], repeats: int,
                        copy: Callable[[object], None]) -> list[tuple[int, float, float]]:
    """(bytes, median seconds, IQR) of ``copy(batch)`` for batches a DataLoader worker process made.

    A worker hands its batch over in shared memory: the loading process maps those pages fresh, so the
    first pass over them pays a page fault per page on top of the copy. A copy from pageable memory (the
    CUDA driver stages it through a pinned buffer on the calling thread) is that first pass, every
    iteration; a warm buffer, as the ``h2d_pageable`` sweep times, never pays it. ``copy`` must return once
    the bytes have moved. The first batch of each size (the worker's and the allocator's first use) is not
    counted."""
    from torch.utils.data import DataLoader

    order = [n for n in sizes for _ in range(repeats + 1)]
    times: dict[int, list[float]] = {n: [] for n in sizes}
    seen: set[int] = set()
    loader = DataLoader(_WorkerBatches(order), batch_size=None, num_workers=1, prefetch_factor=2)
    for batch in loader:
        nbytes = batch.numel()
        start = time.perf_counter()
        copy(batch)
        elapsed = time.perf_counter() - start
        if nbytes in seen:
            times[nbytes].append(elapsed)
        seen.add(nbytes)
        del batch
    points = []
    for n in sizes:
        med, spread = median_spread(times[n])
        points.append((n, med, spread))
    return points


def cuda_batch_link(cfg: SweepConfig, device_index: int, *, progress: Progress | None = None) -> LinkClass:
    """``h2d_batch/gpuI``: `loader_batch_points` copied to GPU ``device_index`` as a training loop without
    pinned memory does (``tensor.to(device)``: a blocking copy from pageable memory)."""
    import torch

    sizes = batch_sizes(cfg)
    dev = torch.empty(max(sizes), dtype=torch.uint8, device=f"cuda:{device_index}")

    def copy(batch) -> None:
        dev[: batch.numel()].copy_(batch)
        torch.cuda.synchronize(device_index)

    link = LinkClass(f"h2d_batch/gpu{device_index}", "h2d_batch", "host", f"gpu{device_index}",
                     note="pageable copies of batches a DataLoader worker made (pages mapped fresh)")
    if progress:
        progress(f"{link.name} {sizes[0]}..{sizes[-1]} B")
    torch.cuda.synchronize(device_index)
    link.points = loader_batch_points(sizes, cfg.repeats, copy)
    link.fit = fit_alpha_beta([p[0] for p in link.points], [p[1] for p in link.points])
    return link


def cuda_links(cfg: SweepConfig, *, progress: Progress | None = None) -> list[LinkClass]:
    """H2D/D2H pinned and pageable, loader batches and D2D per GPU, P2P for every GPU pair."""
    import torch

    links: list[LinkClass] = []
    count = torch.cuda.device_count()
    n = cfg.max_bytes
    pinned = torch.empty(n, dtype=torch.uint8).pin_memory()
    pageable = torch.empty(n, dtype=torch.uint8)
    for i in range(count):
        gpu = f"gpu{i}"
        dev = torch.empty(n, dtype=torch.uint8, device=f"cuda:{i}")
        dev2 = torch.empty(n, dtype=torch.uint8, device=f"cuda:{i}")
        for kind, dst, src, a, b in (
            ("h2d_pinned", dev, pinned, "host", gpu),
            ("h2d_pageable", dev, pageable, "host", gpu),
            ("d2h_pinned", pinned, dev, gpu, "host"),
            ("d2h_pageable", pageable, dev, gpu, "host"),
            ("d2d", dev2, dev, gpu, gpu),
        ):
            links.append(
                _sweep(
                    LinkClass(f"{kind}/{gpu}", kind, a, b),
                    cfg,
                    _cuda_copy_timer(dst, src, i),
                    progress=progress,
                )
            )
        del dev, dev2
        links.append(cuda_batch_link(cfg, i, progress=progress))
        torch.cuda.empty_cache()
    for i in range(count):
        for j in range(i + 1, count):
            peer = torch.cuda.can_device_access_peer(i, j)
            src = torch.empty(n, dtype=torch.uint8, device=f"cuda:{i}")
            dst = torch.empty(n, dtype=torch.uint8, device=f"cuda:{j}")
            note = "peer access enabled" if peer else "no peer access: the driver stages through host memory"
            links.append(
                _sweep(
                    LinkClass(f"p2p/gpu{i}-gpu{j}", "p2p", f"gpu{i}", f"gpu{j}", note=note),
                    cfg,
                    _cuda_copy_timer(dst, src, i),
                    progress=progress,
                )
            )
            del src, dst
            torch.cuda.empty_cache()
    return links


def measure_links(device: str, cfg: SweepConfig, *, progress: Progress | None = None) -> list[LinkClass]:
    """All link classes of this box for ``device`` ("cpu" or "cuda")."""
    return cuda_links(cfg, progress=progress) if device == "cuda" else cpu_links(cfg, progress=progress)


def quick_memory_bandwidth(repeats: int = 3) -> float:
    """A first estimate of the socket's memory bandwidth (bytes/s, STREAM-Copy convention) in ~0.1 s.

    Copies of four times the last-level cache, with one thread and with all of them; the best of both
    (see ``dram_bandwidth``). The links step replaces it with the fit over the whole sweep.
    """
    import torch

    nbytes = 4 * last_level_cache_bytes()
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.zeros(nbytes, dtype=torch.uint8)
    threads = torch.get_num_threads()
    best = 0.0
    try:
        for count in (1, len(os.sched_getaffinity(0))):
            torch.set_num_threads(count)
            for _ in range(repeats):
                start = time.perf_counter()
                dst.copy_(src)
                best = max(best, 2 * nbytes / (time.perf_counter() - start))
    finally:
        torch.set_num_threads(threads)
    return best
