"""Print what a calibration bundle measured: copy bandwidth, collective busbw, per-layer spread, timings.

    python benchmarks/calibration_figures.py BUNDLE_DIR

Produce a bundle first, e.g. ``trainsim calibrate --model tiny-cnn --device cpu --quick --out cal-quick``.
Figures are what this box measured, with the fits the simulator uses; nothing here is asserted.
"""

from __future__ import annotations

import sys

import numpy as np

from trainsim.api import load_bundle


def main(path: str) -> None:
    bundle = load_bundle(path)
    meta = bundle.meta
    cfg = meta.config
    print(
        f"bundle {path}: {meta.status}, model {cfg.get('model')}, device {cfg.get('device')}, "
        f"{cfg.get('ranks')} ranks, quick={cfg.get('quick')}"
    )
    total = sum(step.seconds for step in meta.steps_done.values())
    print(
        "steps: "
        + ", ".join(f"{name} {step.seconds:.1f} s" for name, step in meta.steps_done.items())
        + f"; total {total:.1f} s"
    )
    if bundle.machine:
        cpu = bundle.machine.cpu
        print(
            f"cpu: {cpu.model}, {cpu.cores} cores, {cpu.threads_per_rank} threads per rank, fp32 GEMM "
            f"{cpu.gemm_flops_per_core / 1e9:.1f} GFLOP/s per core, "
            f"memory {cpu.memory_bandwidth_bytes_per_s / 1e9:.1f} GB/s (read + write)"
        )
    if bundle.links:
        print("links (fit: bandwidth, latency, rms relative error; then measured GB/s at sizes):")
        for link in bundle.links.classes:
            fit = link.fit
            at = "  ".join(
                f"{b / 2**20:g} MiB {b / t / 1e9:.2f}"
                for b, t, _ in link.points
                if b in (2**20, 2**26, link.points[-1][0])
            )
            print(
                f"  {link.name:<22} {fit.bandwidth_gbps:8.2f} GB/s {fit.latency_us:9.2f} us  "
                f"rms {fit.rel_rms:.2f}   {at}"
            )
    if bundle.collectives:
        print(
            f"collectives ({bundle.collectives.backend}, {bundle.collectives.world_size} ranks; busbw GB/s):"
        )
        for res in bundle.collectives.results:
            if res.skipped:
                print(f"  {res.collective:<15} skipped: {res.skipped}")
                continue
            at = "  ".join(
                f"{p.bytes / 2**10:g} KiB {p.busbw_gbps:.3f}"
                for p in res.points
                if p.bytes in (2**10, 2**16, 2**20, 2**22) or p is res.points[-1]
            )
            print(
                f"  {res.collective:<15} fit busbw {res.fit.busbw_gbps:.3f} GB/s "
                f"+ {res.fit.latency_us:.0f} us   {at}"
            )
    if bundle.workload:
        spreads = [
            s / m
            for layer in bundle.workload.layers
            for tm in (layer.forward, layer.backward)
            if tm
            for _, m, s in tm.points
            if m > 0
        ]
        p50, p90, pmax = np.percentile(spreads, [50, 90, 100]) * 100
        print(
            f"layers: {len(bundle.workload.layers)} layers; spread (IQR / median) per layer and batch: "
            f"median {p50:.0f} %, p90 {p90:.0f} %, max {pmax:.0f} %"
        )
        iteration = bundle.workload.provenance.iteration
        for point in iteration.plain if iteration else []:
            print(f"  iteration at batch {point.batch}: {point.s * 1e3:.2f} ms "
                  f"(IQR {(point.iqr_s or 0.0) * 1e3:.2f} ms)")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
