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
the host that ran them as much as the GPU. Takes about a minute and a half.
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(DATA), help="the NeuSight dataset folder (train/, test/)")
    parser.add_argument("--json", action="store_true", help="print the records as JSON")
    args = parser.parse_args(argv)
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
    if args.json:
        print(json.dumps(records, indent=1))
        return 0
    print(f"kernel model vs today's roofline: |predicted / measured - 1| over {len(rows)} NeuSight rows "
          f"({len({r.device for r in rows})} GPUs)\n")
    print_table(records, list(columns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
