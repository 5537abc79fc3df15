"""Peak GPU memory of the 16-bit validation runs: the simulator with activation bytes scaled by the element
size, and with the bytes measured under autocast (`calibrate.measure.describe.autocast_bytes`), next to
what `torch.cuda.max_memory_allocated` measured on the H200 (benchmarks/results/h200-run3-*.txt).

The autocast bytes are measured here on ``--device`` (default the CPU). CPU autocast runs softmax and layer
norm in their input's dtype, CUDA autocast in fp32 (PyTorch's AMP documentation, "CUDA Ops that can autocast
to float32"), so on the CPU a third column measures them again with those ops in fp32, as a CUDA calibration
would. The scenarios say ``mixed_precision: autocast`` (fp32 weights and gradients, 16-bit weight copies
until the backward), as the executor trains. Memory does not depend on the GPU's speed, so the runs are
simulated on dgx-h100.

    python benchmarks/autocast_memory.py [--device cpu]
"""

from __future__ import annotations

import argparse
import re
import tempfile
from pathlib import Path

from trainsim.api import load_scenario, simulate
from trainsim.calibrate.measure.describe import autocast_bytes, describe

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
#: (scenario, its 16-bit variant, the variant at fp32 beside it, the results file that measured both)
CASES = [
    ("scenarios/validate-gpu.yaml", "single-bf16", "single", "h200-run3-validate-gpu.txt"),
    ("benchmarks/gpu/resnet50.yaml", "resnet50-bf16", "resnet50", "h200-run3-resnet50.txt"),
    ("benchmarks/gpu/gpt2-small.yaml", "gpt2-small-bf16", "gpt2-small", "h200-run3-gpt2-small.txt"),
]


def with_autocast_bytes(plain, name: str, device: str, cfg: dict, cuda_policy: bool = False):
    under = autocast_bytes(name, device, "bf16", cuda_policy=cuda_policy, **cfg)
    return plain.model_copy(update={"layers": [
        layer.model_copy(update={"autocast": a}) for layer, a in zip(plain.layers, under, strict=True)]})


def measured_peak(results: Path, variant: str) -> float | None:
    """The first repeat's measured peak (GiB) of ``variant`` in a validate_accuracy output file."""
    lines = results.read_text().splitlines()
    for i, line in enumerate(lines):
        if re.match(rf"\s+{re.escape(variant)}\s+pred", line) and i + 1 < len(lines):
            found = re.search(r"meas\s+([\d.]+) GiB", lines[i + 1])
            if found:
                return float(found.group(1))
    return None


def peak_gib(scenario: str, variant: str, workload: Path) -> float:
    result = simulate(ROOT / scenario, variant=variant, record=False,
                      overrides=[f"workload={workload}", "topology=dgx-h100"])
    return max(gpu.memory_peak_bytes for gpu in result.gpus) / 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="where to measure the autocast bytes (cpu, cuda)")
    args = parser.parse_args()
    print(f"# peak GPU memory (GiB): simulated on dgx-h100, autocast bytes measured on {args.device}; "
          f"measured: H200, benchmarks/results")
    emulate = args.device == "cpu"
    header = f"# {'variant':<18} {'measured':>9} | {'scaled':>7} {'error':>8} | {'autocast':>8} {'error':>8}"
    print(header + (f" | {'CUDA ops':>8} {'error':>8}" if emulate else ""))
    with tempfile.TemporaryDirectory() as tmp:
        for scenario, variant, fp32_variant, results in CASES:
            ref = load_scenario(str(ROOT / scenario), [], variant=variant).workload
            plain = describe(ref.name, **ref.config)
            workloads = {"scaled": plain,
                         "autocast": with_autocast_bytes(plain, ref.name, args.device, ref.config)}
            if emulate:
                workloads["cuda"] = with_autocast_bytes(plain, ref.name, args.device, ref.config,
                                                        cuda_policy=True)
            files = {}
            for label, wl in workloads.items():
                files[label] = Path(tmp) / f"{variant}-{label}.json"
                files[label].write_text(wl.model_dump_json())
            for shown in (fp32_variant, variant):
                meas = measured_peak(RESULTS / results, shown)
                scaled = peak_gib(scenario, shown, files["scaled"])
                row = f"  {shown:<18} {meas if meas is not None else float('nan'):9.2f} | {scaled:7.2f} "
                row += f"{_err(scaled, meas):>8}"
                if shown == variant:
                    for label in list(files)[1:]:
                        pred = peak_gib(scenario, shown, files[label])
                        row += f" | {pred:8.2f} {_err(pred, meas):>8}"
                print(row)


def _err(pred: float, meas: float | None) -> str:
    return "-" if not meas else f"{(pred / meas - 1) * 100:+.1f} %"


if __name__ == "__main__":
    main()
