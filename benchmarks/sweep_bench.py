"""A 64-point sweep run one by one and on N local worker processes (and on a local Ray instance with --ray):
wall times of the whole command, the speed-up, and whether the rows agree.

    python benchmarks/sweep_bench.py [--workers 2] [--ray]

The sweep: ResNet-50 DDP at 256, 512, 1024 and 2048 samples per iteration on 1, 2, 4 and 8 GPUs of a DGX
A100 and a DGX-1, with and without double-buffered input copies (4 x 4 x 2 x 2 = 64 points, fp32, one
warm-up and three measured iterations each, as the shipped scenarios). Each run is its own `trainsim sweep`
process writing a fresh CSV, so every run pays the same start-up and none inherits another's caches. The
CPU seconds show the work each run did: with the same work, a parallel run short of the ideal speed-up
shared its cores with other processes.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SPEC = {
    "schema": "trainsim.sweep/1",
    "name": "bench-64",
    "scenario": "ddp-resnet50-dgx-a100",
    "set": {"precision": "fp32", "iterations": 3, "warmup_iterations": 1},
    "grid": {
        "gpus": [1, 2, 4, 8],
        "batch_size": [256, 512, 1024, 2048],
        "topology": ["dgx-a100", "dgx1-v100"],
        "optimizations.preload": [0, 1],
    },
}


def run(spec: Path, out: Path, *args: str) -> tuple[float, float, dict]:
    """Wall seconds and CPU seconds (its processes together) of one `trainsim sweep`, and its JSON report."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "trainsim", "sweep", str(spec), "-o", str(out), *args,
                           "--json"], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"sweep failed: {proc.stderr.strip()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, json.loads(proc.stdout)


def rows(path: Path) -> dict:
    with open(path, newline="") as fh:
        return {r["key"]: {k: v for k, v in r.items() if k != "sim_wall_s"} for r in csv.DictReader(fh)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="local worker processes (default 2)")
    parser.add_argument("--ray", action="store_true", help="also time a local Ray instance (--workers CPUs)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        spec = folder / "bench.yaml"
        spec.write_text(json.dumps(SPEC))  # JSON is YAML
        load = os.getloadavg()[0]
        serial_s, serial_cpu, serial = run(spec, folder / "serial.csv", "--workers", "1")
        parallel_s, parallel_cpu, _ = run(spec, folder / "parallel.csv", "--workers", str(args.workers))
        print(f"cores available: {len(os.sched_getaffinity(0))} (load average before: {load:.2f}; other "
              f"work on them slows the parallel run); points: {serial['points']} (failed {serial['failed']})")
        point_s = sum(float(r["sim_wall_s"] or 0) for r in serial["rows"])
        print(f"one by one:          {serial_s:7.2f} s wall, {serial_cpu:6.2f} s CPU  "
              f"(simulating alone {point_s:.2f} s)")
        print(f"{args.workers} local workers:     {parallel_s:7.2f} s wall, {parallel_cpu:6.2f} s CPU  "
              f"({parallel_s / serial_s:.2f} of one by one, x{serial_s / parallel_s:.2f})")
        same = rows(folder / "serial.csv") == rows(folder / "parallel.csv")
        if args.ray:
            ray_s, _, _ = run(spec, folder / "ray.csv", "--workers", str(args.workers), "--ray")
            print(f"Ray, {args.workers} CPUs (local): {ray_s:7.2f} s wall  "
                  f"({ray_s / serial_s:.2f} of one by one, the Ray instance's start-up included; "
                  "its workers' CPU is not counted)")
            same = same and rows(folder / "serial.csv") == rows(folder / "ray.csv")
        print(f"rows identical (but for sim_wall_s): {same}")
        return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
