"""How fast a batch from a DataLoader worker is copied, against the same copy from a warm buffer.

    python benchmarks/loader_batch_copy.py [--device cpu|cuda] [--repeats 5]

A worker hands its batch over in shared memory that the training process maps fresh, so the first pass
over it (a pageable H2D copy, staged by the CUDA driver on the calling thread) pays a page fault per page.
`trainsim calibrate --device cuda` measures that copy (``h2d_batch``) and writes it into the topology as the
socket's ``pageable_gbps``; its ``h2d_pageable`` sweep times a warm buffer. This prints both, per size: on
CUDA the copy to the GPU, on the CPU a copy into a host buffer (the same first touch, no PCIe). Nothing is
asserted; the figures are this box's.
"""

from __future__ import annotations

import argparse
import time

import torch

from trainsim.calibrate.measure.linkbench import MIB, loader_batch_points
from trainsim.calibrate.sampling import median_spread

SIZES = [MIB, 4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = "cuda" if torch.cuda.is_available() else "cpu"
    parser.add_argument("--device", choices=("cpu", "cuda"), default=default)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    dst = torch.empty(max(SIZES), dtype=torch.uint8, device=args.device)

    def sync() -> None:
        if args.device == "cuda":
            torch.cuda.synchronize()

    def copy(batch) -> None:
        dst[: batch.numel()].copy_(batch)
        sync()

    fresh = loader_batch_points(SIZES, args.repeats, copy)
    warm_src = torch.ones(max(SIZES), dtype=torch.uint8)  # pageable, every page touched once already
    print(f"# {args.device}: {torch.cuda.get_device_name() if args.device == 'cuda' else 'host memory'}; "
          f"torch {torch.__version__}; median of {args.repeats} per size (IQR)")
    print(f"{'size':>10} {'loader batch GB/s':>20} {'warm buffer GB/s':>18} {'fresh/warm':>10}")
    for nbytes, med, spread in fresh:
        copy(warm_src[:nbytes])
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            copy(warm_src[:nbytes])
            times.append(time.perf_counter() - start)
        warm, warm_spread = median_spread(times)
        print(f"{nbytes // MIB:>7} MiB {nbytes / med / 1e9:>11.2f} ({spread * 1e3:5.2f} ms) "
              f"{nbytes / warm / 1e9:>9.2f} ({warm_spread * 1e3:5.2f} ms) {warm / med:>10.2f}")


if __name__ == "__main__":
    main()
