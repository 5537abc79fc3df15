"""A simulated run's own Kineto trace, replayed with a what-if GPU, against the simulator on that GPU.

`simulate --trace` writes what torch.profiler would have recorded on each rank (sim/output/kineto_ranks.py);
`replay --gpu` rescales the trace's GPU work to another device and re-times the steps. Where the trace keeps
the run's dependencies (launches ahead of the GPU, a synchronisation per step, event waits between streams),
the replayed step on the what-if GPU should come close to the simulator's own step on a machine with that
GPU. This prints both for each scenario and GPU, and their difference.

The replay rescales a kernel by the GPUs' peak FLOP/s at the precision its name shows when the name says it
is compute-bound (gemm, conv, cuDNN/cuBLAS names) and by their memory bandwidth otherwise; the simulator's
kernels are named by what their layer computes and the run's precision, as a profiler's are ("forward
conv2d tf32: layer1.0.conv1", "backward gemm: fc"). The simulator times each layer by its roofline on the
new GPU instead, so a convolution that is memory-bound there moves less in the simulator than in the
replay, which has no FLOP or byte counts per kernel.

    python benchmarks/replay_own_trace.py [--gpus h100-sxm,a100-40gb,k80]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import yaml

from trainsim import api, topologies
from trainsim.errors import TrainsimError
from trainsim.sim.output.kineto_ranks import write_rank_traces
from trainsim.sim.replay.whatif import WhatIf
from trainsim.traces import replay_traces

SCENARIOS = {"ddp-resnet50-pcie-4gpu-gen3": "pcie-4gpu-gen3", "ddp-vgg16-dgx1-v100": "dgx1-v100",
             "single-gpu-resnet50": "dgx-a100"}
OVERRIDES = ["iterations=2"]


def with_gpu(topology: str, spec: str, folder: Path) -> Path:
    """The preset ``topology`` with every GPU of spec ``spec`` (memory as the preset gives it)."""
    data = yaml.safe_load((Path(topologies.__file__).parent / f"{topology}.yaml").read_text())
    if "generator" in data:
        data["gpu"] = spec
    for node in data.get("nodes", []):
        if node.get("kind") == "gpu":
            node["spec"] = spec
    data["name"] = f"{topology}-{spec}"
    path = folder / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", default="h100-sxm,a100-40gb,k80",
                        help="what-if GPUs, comma-separated (trainsim device list)")
    gpus = parser.parse_args().gpus.split(",")
    print(f"{'scenario':<30} {'what-if GPU':<12} {'measured ms':>12} {'simulated ms':>13} "
          f"{'replayed ms':>12} {'replay vs sim':>14}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for scenario, topology in SCENARIOS.items():
            result = api.simulate(scenario, overrides=OVERRIDES, record=True)
            trace = folder / scenario
            write_rank_traces(result, trace)
            for gpu in gpus:
                what_if = with_gpu(topology, gpu, folder)
                try:
                    simulated = api.simulate(scenario, overrides=[*OVERRIDES, f"topology={what_if}"],
                                             record=False).iteration_time_s
                except TrainsimError as exc:  # e.g. a scenario in tf32 on a GPU without it
                    print(f"{scenario:<30} {gpu:<12} not simulated: {exc.reason}")
                    continue
                report = replay_traces([trace / "rank-0.json.gz"], whatif=WhatIf(gpu=gpu), checks=False)
                measured = report.replay.steps[-1].measured_s
                replayed = report.whatif.steps[-1].replayed_s
                print(f"{scenario:<30} {gpu:<12} {measured * 1e3:>12.2f} {simulated * 1e3:>13.2f} "
                      f"{replayed * 1e3:>12.2f} {100 * (replayed / simulated - 1):>+13.1f}%")


if __name__ == "__main__":
    main()
