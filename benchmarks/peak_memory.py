"""Peak memory of one training step, by category: the simulator against a real step under a memory tracker.

    python benchmarks/peak_memory.py [--device cpu|cuda] [--runs NAME ...]

For each run of H200 run 3 (benchmarks/results/h200-run3-*.txt), one real training step runs as the executor
takes it: the forward (under autocast for bf16), the loss on ``output.float()`` while the loop keeps the
output, backward, the optimizer's step with its foreach kernels (CUDA's default), and
``zero_grad(set_to_none=True)``. The step after a warm-up one (the optimizer's state exists) runs under
torch's ``MemTracker``, which sorts every tensor's storage into parameters, gradients, optimizer state,
activations and temporaries and keeps the breakdown at the peak. On the CPU, CUDA autocast's fp32 ops are
emulated (`calibrate.measure.cuda_autocast`); on CUDA the row also gives ``torch.cuda.max_memory_allocated``,
whose excess over the tracker is what no tensor holds (library workspaces). The simulator runs the workload
described from the same model (for bf16 with its activation bytes measured under CUDA's autocast on
``--device``), and the built-in analytic workload of the model (its bytes under autocast derived from CUDA
autocast's op lists), both on dgx-h100 (memory does not depend on the GPU).

Columns, MiB: params, grads, state, activations (with the input batch and the loop's output), temporaries (the
simulator's activation gradients; the tracker's temporaries), workspaces (the simulator's cuBLAS workspaces,
`sim.compute.workspaces`; on CUDA those the real step allocated, which no tensor holds), the total, and its
error against the H200's measured peak.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from dataclasses import fields
from pathlib import Path

import torch
from autocast_memory import RESULTS, ROOT, measured_peak, with_autocast_bytes
from torch.distributed._tools.mem_tracker import MemTracker

from trainsim.api import load_scenario, simulate
from trainsim.calibrate import zoo
from trainsim.calibrate.execute.strategies import make_optimizer
from trainsim.calibrate.measure.cuda_autocast import CudaFloat32Ops
from trainsim.calibrate.measure.describe import describe
from trainsim.sim.compute.analytic_models import MODELS, build_analytic

MIB = 2**20
#: (run, scenario, variant, the results file that measured it)
RUNS = [
    ("resnet18", "scenarios/validate-gpu.yaml", "single", "h200-run3-validate-gpu.txt"),
    ("resnet18-bf16", "scenarios/validate-gpu.yaml", "single-bf16", "h200-run3-validate-gpu.txt"),
    ("resnet50", "benchmarks/gpu/resnet50.yaml", "resnet50", "h200-run3-resnet50.txt"),
    ("resnet50-bf16", "benchmarks/gpu/resnet50.yaml", "resnet50-bf16", "h200-run3-resnet50.txt"),
    ("gpt2-small", "benchmarks/gpu/gpt2-small.yaml", "gpt2-small", "h200-run3-gpt2-small.txt"),
    ("gpt2-small-bf16", "benchmarks/gpu/gpt2-small.yaml", "gpt2-small-bf16", "h200-run3-gpt2-small.txt"),
]
COLUMNS = ("params", "grads", "state", "activations", "temporaries", "workspaces")
#: the simulator's memory categories in the columns above
SIM_COLUMNS = {"params": "params", "grads": "grads", "optimizer_state": "state", "activations": "activations",
               "output": "activations", "input": "activations", "buffers": "activations",
               "activation_grads": "temporaries", "workspaces": "workspaces"}
#: MemTracker's reference types in the columns above
TRACKER_COLUMNS = {"Parameter": "params", "Gradient": "grads", "Optstate": "state",
                   "Activation": "activations", "Buffer": "activations", "Other": "activations",
                   "Temp": "temporaries"}


def tracked_step(name: str, cfg: dict, batch: int, precision: str, optimizer: dict, device: str):
    """The peak of one real step by column (bytes); on CUDA also max_memory_allocated and the bytes of
    PyTorch's cuBLAS workspaces (allocated through the caching allocator, held by no tensor), else None."""
    torch.manual_seed(0)
    model = zoo.build_model(name, **cfg).to(device)
    opt = make_optimizer(optimizer["name"], model.parameters(), optimizer.get("lr", 0.01))
    for group in opt.param_groups:
        group["foreach"] = True  # the default for CUDA tensors, whichever device runs this
    inputs, targets = zoo.example_batch(name, batch, device, **cfg)
    sixteen = precision in ("bf16", "fp16")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16

    def step() -> None:
        cast = torch.autocast(torch.device(device).type, dtype=dtype) if sixteen else contextlib.nullcontext()
        emulate = CudaFloat32Ops() if sixteen and device == "cpu" else contextlib.nullcontext()
        with cast, emulate:
            output = model(inputs)
        zoo.loss_fn(name, output.float(), targets).backward()  # ``output`` lives to the end of backward
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # warm-up: the optimizer's state
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    tracker = MemTracker()
    tracker.track_external(model, opt, inputs, targets)
    with tracker:
        step()
    allocated = workspaces = None
    if cuda:
        allocated = torch.cuda.max_memory_allocated()
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)  # private: absent in some builds
        if clear is not None:
            before = torch.cuda.memory_allocated()
            clear()  # what this frees was the workspaces
            workspaces = before - torch.cuda.memory_allocated()
    peak = tracker.get_tracker_snapshot("peak")[torch.device(device)]
    by_column = dict.fromkeys(COLUMNS, 0.0)
    for kind, nbytes in peak.items():
        if kind in TRACKER_COLUMNS:
            by_column[TRACKER_COLUMNS[kind]] += nbytes
    return by_column, allocated, workspaces


def simulated(scenario: str, variant: str, workload: Path) -> dict[str, float]:
    """The simulator's peak by column (bytes)."""
    result = simulate(ROOT / scenario, variant=variant, record=False,
                      overrides=[f"workload={workload}", "topology=dgx-h100"])
    gpu = max(result.gpus, key=lambda g: g.memory_peak_bytes)
    by_column = dict.fromkeys(COLUMNS, 0.0)
    for category, nbytes in gpu.memory_at_peak.items():
        by_column[SIM_COLUMNS.get(category, "activations")] += nbytes
    return by_column


def built_in(name: str, cfg: dict):
    """The built-in analytic workload of ``name`` (its bytes under autocast from CUDA's op lists), its images
    crossing as float32, as the executor's pipeline hands them over."""
    images = "input_dtype" in {f.name for f in fields(MODELS[name][0])}
    return build_analytic(name, **cfg, **({"input_dtype": "float32"} if images else {}))


def row(label: str, by_column: dict[str, float], measured_gib: float | None) -> str:
    total = sum(by_column.values())
    error = "-" if not measured_gib else f"{(total / (measured_gib * 2**30) - 1) * 100:+.1f} %"
    cells = " ".join(f"{by_column[c] / MIB:>11.0f}" for c in COLUMNS)
    return f"    {label:<20} {cells} {total / MIB:>9.0f} {error:>9}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="where the tracked step runs (cpu, cuda)")
    parser.add_argument("--runs", nargs="*", choices=[r[0] for r in RUNS], help="default: all")
    args = parser.parse_args()
    print(f"# peak memory of one step (MiB): a real step on {args.device} under MemTracker, the simulator on "
          "dgx-h100; error against the H200's torch.cuda.max_memory_allocated (benchmarks/results)")
    print(f"    {'':<20} " + " ".join(f"{c:>11}" for c in COLUMNS) + f" {'total':>9} {'error':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for run, scenario, variant, results in RUNS:
            if args.runs and run not in args.runs:
                continue
            sc = load_scenario(str(ROOT / scenario), [], variant=variant)
            cfg = sc.workload.config
            workload = describe(sc.workload.name, **cfg)
            if sc.precision in ("bf16", "fp16"):
                workload = with_autocast_bytes(workload, sc.workload.name, args.device, cfg, cuda_policy=True)
            path = Path(tmp) / f"{run}.json"
            path.write_text(workload.model_dump_json())
            analytic = Path(tmp) / f"{run}-analytic.json"
            analytic.write_text(built_in(sc.workload.name, cfg).model_dump_json())
            measured = measured_peak(RESULTS / results, variant)
            print(f"  {run} (batch {sc.batch_size}, {sc.precision}, {sc.optimizer.name}): H200 measured "
                  f"{measured * 1024 if measured else float('nan'):.0f} MiB")
            tracked, allocated, workspaces = tracked_step(sc.workload.name, cfg, sc.batch_size, sc.precision,
                                                          sc.optimizer.model_dump(), args.device)
            if workspaces is not None:  # the real step holds them, though no tensor does
                tracked["workspaces"] = workspaces
            print(row("real step, tracked", tracked, measured))
            if allocated is not None:
                print(f"    {'max_memory_allocated':<20} {allocated / MIB:>{12 * len(COLUMNS) + 9}.0f} "
                      f"(what no tensor holds: {(allocated - sum(tracked.values())) / MIB:.0f} MiB; cuBLAS "
                      f"workspaces {'?' if workspaces is None else f'{workspaces / MIB:.0f}'} MiB)")
            print(row("simulated", simulated(scenario, variant, path), measured))
            print(row("simulated, built-in", simulated(scenario, variant, analytic), measured))


if __name__ == "__main__":
    main()
