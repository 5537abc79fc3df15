"""How right the built-in analytic workloads are, and what the roofline makes of them (not a test).

1. Parameters and forward multiply-adds per sample of each built-in workload next to the published figures
   (torchvision's model docs; nanoGPT for GPT-2 small, whose MACs follow 2·N·T + attention).
2. Roofline compute time of one training iteration (forward + backward, no communication, default
   Efficiency) per device at a fixed per-device batch, and the images (sequences) per second it implies.
3. The cost of generating every built-in workload.

Run: python benchmarks/analytic_workloads.py [--batch 64] [--precision fp32]
"""

from __future__ import annotations

import argparse
import time

from trainsim.errors import TrainsimError
from trainsim.sim.compute.analytic_models import BUILTINS, build_analytic
from trainsim.sim.compute.roofline import compute_time

# (params, forward GMACs per sample) as published; None where no published figure exists
PUBLISHED = {
    "alexnet": (61_100_840, 0.71), "vgg16": (138_357_544, 15.47), "resnet18": (11_689_512, 1.81),
    "resnet50": (25_557_032, 4.09), "googlenet": (6_624_904, 1.50), "gpt2-small": (124_439_808, None),
    "tiny-cnn": (None, None),
}
DEVICES = ("k80", "p100", "v100", "t4", "a100", "h100")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--precision", default="fp32")
    args = parser.parse_args()

    t0 = time.perf_counter()
    workloads = {name: build_analytic(name) for name in BUILTINS}
    build_s = time.perf_counter() - t0

    print(f"{'model':<11} {'params':>12} {'published':>12} {'GMAC/sample':>12} {'published':>10}")
    for name, wl in workloads.items():
        params, gmacs = PUBLISHED[name]
        print(f"{name:<11} {wl.num_params:>12,} {params or '-':>12} "
              f"{wl.flops_forward_per_sample / 2e9:>12.3f} {gmacs or '-':>10}")

    print(f"\nroofline iteration compute (fwd+bwd) at batch {args.batch}, {args.precision}: ms (samples/s)")
    print(f"{'model':<11}" + "".join(f"{d:>18}" for d in DEVICES))
    for name, wl in workloads.items():
        batch = min(args.batch, 8) if name.startswith("gpt") else args.batch
        cells = []
        for device in DEVICES:
            try:
                fwd, bwd = compute_time(wl, device, batch, args.precision)
                cells.append(f"{(fwd + bwd) * 1e3:8.1f} ({batch / (fwd + bwd):6.0f})")
            except TrainsimError:  # a precision the device lacks
                cells.append(f"{'-':>16}")
        print(f"{name:<11}" + "".join(f"{c:>18}" for c in cells))
    print(f"\ngenerated {len(workloads)} workloads in {build_s * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
