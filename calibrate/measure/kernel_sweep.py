"""A kernel sweep: time single kernels of every class the kernel model knows on this box's GPU (or CPU).

`run_sweep` times every case of `kernel_cases.sweep_cases` (`kernel_timing.time_case`) within a time budget
and writes the rows as a ``trainsim.kernels/1`` table (`trainsim.sim.compute.kernels.dataset`) with its
provenance beside it; the table is rewritten as rows come, so a stopped run keeps what it measured.
"""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Callable
from pathlib import Path

from trainsim.errors import TrainsimError
from trainsim.files import write_atomic
from trainsim.provenance import provenance

from .kernel_cases import Case, check_precisions, sweep_cases
from .kernel_timing import Timing, time_case

#: columns of the table a sweep writes, in order (a row leaves blank those its op has not)
COLUMNS = ("op", "device", "gpu", "dtype", "what", "m", "n", "k", "batch", "in_channels", "out_channels",
           "height", "width", "kernel", "stride", "padding", "pass", "elements", "reads", "writes", "row",
           "heads", "q_len", "kv_len", "head_dim", "causal", "fused", "backward", "latency_us", "kernel_us",
           "reps", "timing", "kernels")
TABLE_NAME = "kernels.csv"
PROVENANCE_NAME = "provenance.json"


def _row(case: Case, device_name: str, gpu: str, timing: Timing) -> dict:
    row = {c: "" for c in COLUMNS}
    row.update({k: (str(v).lower() if isinstance(v, bool) else v) for k, v in case.dims.items()})
    row.update(op=case.op, device=device_name, gpu=gpu, dtype=case.dtype, what=case.what,
               latency_us=f"{timing.seconds * 1e6:.4f}", reps=timing.reps, timing=timing.method,
               kernel_us=f"{timing.kernel_s * 1e6:.4f}" if timing.kernel_s else "",
               kernels=";".join(k.replace(";", ",") for k in timing.kernels))
    return row


def _table_text(rows: list[dict]) -> str:
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return text.getvalue()


def _gpu_provenance(device: str, cudnn_benchmark: bool, timing: str = "graph") -> dict:
    import torch

    if device == "cpu":
        return {"gpu": "cpu", "timing": "perf_counter median per call"}
    props = torch.cuda.get_device_properties(0)
    return {"gpu": torch.cuda.get_device_name(0), "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), "sm_count": props.multi_processor_count,
            "memory_bytes": props.total_memory, "capability": f"{props.major}.{props.minor}",
            "driver": _driver_version(),
            "timing": ("CUDA graph of back-to-back calls replayed between CUDA events, median of 5 per call"
                       if timing == "graph" else "eager calls queued behind a sleeping kernel, between CUDA "
                       "events, median of 5 per call"),
            "cudnn_benchmark": cudnn_benchmark}


def _driver_version() -> str | None:
    try:
        import subprocess

        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def run_sweep(out: str | Path, *, device: str = "cuda", dtypes: list[str], classes: list[str],
              quick: bool = False, budget_s: float = 540.0, target_s: float = 0.01, gemm_samples: int = 0,
              seed: int = 0, conv_batch: int = 64, cudnn_benchmark: bool = False, timing: str = "graph",
              progress: Callable[[str, int, int], None] | None = None) -> dict:
    """Time every case of the sweep on ``device`` within ``budget_s`` and write ``out``/kernels.csv and
    ``out``/provenance.json. Returns the summary (rows, failures, cases not reached, seconds)."""
    import torch

    from trainsim.sim.core.devices import match_cuda_name

    if device != "cpu" and "fp8" in dtypes and not hasattr(torch, "_scaled_mm"):
        raise TrainsimError(f"this torch ({torch.__version__}) has no _scaled_mm for fp8", field="--dtypes")
    if device != "cpu":
        gpu = torch.cuda.get_device_name(0)
        check_precisions(dtypes, gpu, torch.cuda.get_device_capability(0))
        spec = match_cuda_name(gpu, torch.cuda.get_device_properties(0).total_memory)
        device_name = spec.name if spec else gpu
    else:
        gpu = device_name = "cpu"
    cases = sweep_cases(dtypes, classes, quick, gemm_samples=gemm_samples, seed=seed, conv_batch=conv_batch)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    record = provenance(**_gpu_provenance(device, cudnn_benchmark, timing), device_spec=device_name,
                        dtypes=dtypes, classes=classes, quick=quick, target_s=target_s,
                        gemm_samples=gemm_samples, seed=seed, conv_batch=conv_batch)
    rows, failed, began = [], [], time.monotonic()
    last_write = began
    reached = 0
    try:
        for i, case in enumerate(cases):
            if time.monotonic() - began > budget_s:
                break
            reached = i + 1
            if progress:
                progress(case.key, i, len(cases))
            try:
                measured = time_case(case, device, target_s=target_s, kernel_names=device != "cpu",
                                     cudnn_benchmark=cudnn_benchmark, timing=timing)
            except Exception as exc:  # noqa: BLE001 - a case the library refuses (shape, dtype) is noted
                failed.append({"case": case.key, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
                if device != "cpu":
                    torch.cuda.empty_cache()
                continue
            rows.append(_row(case, device_name, gpu, measured))
            if time.monotonic() - last_write > 15:
                write_atomic(folder / TABLE_NAME, _table_text(rows))
                last_write = time.monotonic()
    finally:
        summary = {"rows": len(rows), "cases": len(cases), "not_reached": len(cases) - reached,
                   "failed": failed, "seconds": round(time.monotonic() - began, 1),
                   "table": str(folder / TABLE_NAME)}
        write_atomic(folder / TABLE_NAME, _table_text(rows))
        write_atomic(folder / PROVENANCE_NAME, json.dumps({**record, **summary}, indent=1) + "\n")
    return summary
