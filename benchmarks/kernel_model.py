"""The kernel model judged on GPUs it was not fitted on (issue 42), against today's fixed-fraction roofline.

    python benchmarks/kernel_model.py [--data DIR] [--json]

Reads the NeuSight per-kernel dataset (``DIR``: its ``train/`` and ``test/`` folders; by default
``../shared/kernels/neusight`` beside the repository; MIT licence, see
`trainsim.sim.compute.kernels.dataset`) and prints, per kernel class and GPU, the median and p90 of
|predicted / measured - 1| over that GPU's rows for:

- ``today``: the simulator's roofline as it stands (`roofline.kernel_seconds`: 70 % of the fp32 peak or
  80 % of the bandwidth, whichever is longer, plus 5 us per kernel the op launched);
- ``held out``: the kernel model with this GPU left out of the fit (each other GPU fitted on its own rows,
  the shared figures from them alone; this GPU takes its architecture's figures or the default's,
  dispatch included) -- leave one GPU out, over every row of every class;
- ``host known``: the same, but with the held-out GPU's own dispatch (its host's per-op overhead, fitted
  on its smallest calls), as a calibration measures the host: what is left is the GPU model's error;
- ``NeuSight split``: fitted on the train folder's GPUs' train rows only, predicting the H100 and L4 test
  rows (the dataset's own held-out GPUs).

Each measured row is one eager PyTorch op timed by CUDA events (dispatch + GPU time), so small ops measure
the host that ran them as much as the GPU.

Then the tensor-core figures (`trainsim.sim.compute.kernels.layer_fit`) on the H200 bundles' measured layers
(``benchmarks/data/h200-run3``): fitted on the GPU-bound layer passes of ResNet-50's stem, first and third
stages, judged on its second and fourth (shapes the fit did not see), with the fp32 GEMMs of GPT-2 small
(NeuSight's H100 figures, not fitted here) as a check on a GPU NeuSight did not measure. Takes about two
minutes in all; then the H200's kernel sweeps as `benchmarks/h200_kernels.py` prints them (about a minute
more; ``--no-h200-sweeps`` leaves them out).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from trainsim.errors import TrainsimError
from trainsim.sim.compute.kernels import fit
from trainsim.sim.compute.kernels.dataset import load_neusight
from trainsim.sim.compute.kernels.params import KernelParams
from trainsim.sim.compute.roofline import DEFAULT_EFFICIENCY, kernel_seconds
from trainsim.sim.core.devices import get_device

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "kernels" / "neusight"
H200 = ROOT / "benchmarks" / "data" / "h200-run3"
TRAIN_GPUS = ("a100-pcie-40gb", "a100-pcie-80gb", "v100-pcie-32gb", "p100-pcie", "t4", "p4")


def roofline_today(rows) -> np.ndarray:
    """Today's model: the fixed-fraction roofline plus its launch overhead per kernel the op launched."""
    out = np.empty(len(rows))
    for i, row in enumerate(rows):
        device = get_device(row.device)
        launches = max(1, len(row.kernels))
        out[i] = (kernel_seconds(device, row.flops, row.bytes, "fp32")
                  + launches * DEFAULT_EFFICIENCY.launch_overhead_s)
    return out


def neusight_split(rows) -> tuple[list, np.ndarray]:
    """The dataset's own protocol: fit on the training GPUs' train rows, predict the H100 and L4 rows."""
    train = [r for r in rows if r.split == "train" and r.device in TRAIN_GPUS]
    test = [r for r in rows if r.device in ("h100-sxm", "l4")]
    params = KernelParams(fit.assemble(fit.DeviceFitter(train).fit()))
    return test, fit.predict(params, test)


def _stats(predicted, measured) -> tuple[float, float]:
    err = np.abs(predicted / measured - 1)
    return float(np.median(err)), float(np.quantile(err, 0.9))


def table(rows, columns: dict[str, tuple[list, np.ndarray]]) -> list[dict]:
    """One record per (class, GPU) and per class over all GPUs: each column's median and p90 |error|."""
    index: dict = {name: defaultdict(list) for name in columns}
    for name, (subset, _) in columns.items():
        for i, row in enumerate(subset):
            index[name][(row.kernel_class, row.device)].append(i)
            index[name][(row.kernel_class, "all GPUs")].append(i)
    keys = sorted({k for name in columns for k in index[name]},
                  key=lambda k: (k[0], k[1] == "all GPUs", k[1]))
    records = []
    for cls, gpu in keys:
        record = {"class": cls, "gpu": gpu}
        for name, (subset, predicted) in columns.items():
            idx = index[name].get((cls, gpu))
            if idx:
                measured = np.array([subset[i].latency_s for i in idx])
                med, p90 = _stats(predicted[idx], measured)
                record[name] = {"rows": len(idx), "median": round(med, 4), "p90": round(p90, 4)}
        records.append(record)
    return records


def print_table(records: list[dict], names: list[str]) -> None:
    head = f"{'class':12s} {'GPU':16s} {'rows':>6s}" + "".join(f" | {n:>16s}" for n in names)
    print(head)
    print(f"{'':12s} {'':16s} {'':>6s}" + "".join(f" | {'median':>7s} {'p90':>8s}" for _ in names))
    print("-" * len(head))
    for record in records:
        rows = next((record[n]["rows"] for n in names if n in record), 0)
        cells = "".join(f" | {record[n]['median'] * 100:6.1f}% {record[n]['p90'] * 100:7.1f}%" if n in record
                        else f" | {'':>16s}" for n in names)
        print(f"{record['class']:12s} {record['gpu']:16s} {rows:6d}{cells}")


def tensor_table() -> dict:
    """The layer fit's split on the H200 bundles: figures, fitted and held-out errors per (kind, dtype)."""
    from fit_layer_figures import load_rows

    from trainsim.sim.compute.kernels import layer_fit

    rows = load_rows([str(H200)])
    out = layer_fit.split_fit(rows)
    fitted = {f"{cls}.{name}": round(v, 6) for (cls, name), v in out["fit"].figures.items()}
    if out["fit"].misaligned is not None:
        fitted["matmul.misaligned"] = round(out["fit"].misaligned, 4)
    key = "{0[0]} {0[1]}".format
    return {"figures": fitted, "tied": {f"{c}.{n}": (f"{v[0]}.{v[1]}" if isinstance(v, tuple) else v)
                                        for (c, n), v in out["tied"].items()},
            "fitted": {key(k): v for k, v in layer_fit.errors(out["train"], out["fit"]).items()},
            "held_out": {key(k): v for k, v in layer_fit.errors(out["test"], out["held"]).items()}
            if "held" in out else {}}


def print_tensor(table: dict) -> None:
    print("\ntensor-core figures on the H200's measured layers (benchmarks/data/h200-run3; layer_fit): "
          "|predicted / measured - 1|")
    for name, value in table["figures"].items():
        print(f"  {name} = {value:.4g}")
    for name, source in table["tied"].items():
        print(f"  {name}: too few GPU-bound rows, takes {source}")
    print("  (fit split: the fp32 linear and attention rows are checks of NeuSight's H100 figures on the "
          "H200, not fitted here)")
    for split in ("fitted", "held_out"):
        for key, e in table[split].items():
            print(f"  {split:9s} {key:24s} rows {e['rows']:4d}  median {e['median_abs'] * 100:5.1f} %  "
                  f"p10 {e['p10'] * 100:+6.1f} %  p90 {e['p90'] * 100:+6.1f} %")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(DATA), help="the NeuSight dataset folder (train/, test/)")
    parser.add_argument("--json", action="store_true", help="print the records as JSON")
    parser.add_argument("--no-h200-sweeps", action="store_true",
                        help="leave out the H200 kernel sweeps' section (benchmarks/h200_kernels.py)")
    parser.add_argument("--tensor-only", action="store_true",
                        help="only the tensor-core figures on the H200 layers (seconds, not minutes)")
    args = parser.parse_args(argv)
    if args.tensor_only:
        tensor = tensor_table()
        print(json.dumps(tensor, indent=1)) if args.json else print_tensor(tensor)
        return 0
    try:
        rows = load_neusight(args.data)
    except TrainsimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = [r for r in rows if r.device]
    fitter = fit.DeviceFitter(rows)
    columns = {
        "today": (rows, roofline_today(rows)),
        "held out": (rows, fit.leave_one_gpu_out(rows, fitter)),
        "host known": (rows, fit.leave_one_gpu_out(rows, fitter, own_dispatch=True)),
        "NeuSight split": neusight_split(rows),
    }
    records = table(rows, columns)
    tensor = tensor_table()
    if args.json:
        print(json.dumps({"neusight": records, "tensor": tensor}, indent=1))
        return 0
    print(f"kernel model vs today's roofline: |predicted / measured - 1| over {len(rows)} NeuSight rows "
          f"({len({r.device for r in rows})} GPUs)\n")
    print_table(records, list(columns))
    print_tensor(tensor)
    if not args.no_h200_sweeps:
        print("\nthe H200's kernel sweeps (benchmarks/h200_kernels.py): GPU time per kernel")
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import h200_kernels  # noqa: PLC0415 - a sibling script, only for this section

        h200_kernels.report()
    return 0


if __name__ == "__main__":
    sys.exit(main())
