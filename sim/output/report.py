"""The human-readable summary of a simulation (rich tables), for `trainsim simulate`."""

from __future__ import annotations

from rich.table import Table

from trainsim.sim.core.memory import GIB
from trainsim.sim.core.result import Result

BREAKDOWN_LABELS = {
    "compute": "compute",
    "exposed_communication": "exposed communication",
    "exposed_transfer": "exposed host-device transfer",
    "data_preparation": "data preparation",
    "idle": "idle",
}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def headline(result: Result) -> str:
    """One line: what ran and how long an iteration takes; a run that does not fit in GPU memory says so
    first, and gives no throughput (it cannot train)."""
    run = (f"{result.scenario}: {result.strategy} on {len(result.gpus)} GPU(s) of {result.topology}, "
           f"{result.workload}, batch {result.batch_size}, {result.precision}")
    mean = f"(mean of {result.iterations} after {result.warmup_iterations} warm-up)"
    if result.oom:
        short = sum(g.oom for g in result.gpus)
        return (f"OUT OF MEMORY: {run} does not fit: {short} of {len(result.gpus)} GPU(s) need more memory "
                f"than they have; the iteration would take {_ms(result.iteration_time_s)} {mean}")
    return f"{run} -> iteration {_ms(result.iteration_time_s)}, {result.samples_per_s:,.1f} samples/s {mean}"


def notes(result: Result) -> list[str]:
    """The strategy's notes on the run (e.g. strategy mesh: a tensor-parallel group that crosses the
    network between machines), from ``result.extra``."""
    out = []
    for value in result.extra.values():
        if isinstance(value, dict):
            out += [str(note) for note in value.get("notes", ())]
    return out


def host_dispatch(result: Result) -> str | None:
    """One line on the host's dispatch of a rank's layers against the GPU's time for them, where modelled."""
    host = result.extra.get("host_dispatch")
    if not host:
        return None
    dispatch, gpu = host["forward_s"] + host["backward_s"], host["gpu_forward_s"] + host["gpu_backward_s"]
    bound = "the host bounds the passes" if dispatch > gpu else "the GPU bounds the passes"
    return (f"host dispatch of {host['rank']}'s layers: forward {_ms(host['forward_s'])}, backward "
            f"{_ms(host['backward_s'])}, against the GPU's {_ms(host['gpu_forward_s'])} and "
            f"{_ms(host['gpu_backward_s'])}: {bound}")


def tables(result: Result, *, max_gpus: int = 16, max_links: int = 5) -> list[Table]:
    total = result.iteration_time_s
    parts = Table(title=f"Where an iteration goes (critical GPU {result.critical_gpu})")
    parts.add_column("part")
    parts.add_column("time", justify="right")
    parts.add_column("%", justify="right")
    for key, label in BREAKDOWN_LABELS.items():
        value = result.breakdown_s.get(key, 0.0)
        parts.add_row(label, _ms(value), f"{100 * value / total:.1f}" if total > 0 else "-")
    parts.add_row("iteration", _ms(total), "100.0", style="bold")

    gpus = Table(title="GPUs")
    for col in ("gpu", "device", "compute util.", "memory peak", "capacity", ""):
        gpus.add_column(col, justify="right" if col not in ("gpu", "device", "") else "left")
    for g in result.gpus[:max_gpus]:
        gpus.add_row(
            g.name,
            g.device,
            f"{100 * g.utilisation:.1f} %",
            f"{g.memory_peak_bytes / GIB:.2f} GiB",
            f"{g.memory_capacity_bytes / GIB:.2f} GiB",
            "OUT OF MEMORY" if g.oom else "",
        )
    if len(result.gpus) > max_gpus:
        gpus.add_row(f"... {len(result.gpus) - max_gpus} more", "", "", "", "", "")

    links = Table(title="Busiest links (measured iterations)")
    for col in ("link", "kind", "bandwidth", "bytes/iteration", "utilisation"):
        links.add_column(col, justify="left" if col in ("link", "kind") else "right")
    for link in result.busiest_links(max_links):
        links.add_row(
            link.name,
            link.kind,
            f"{link.bandwidth / 1e9:.1f} GB/s",
            f"{link.bytes / result.iterations / 1e6:,.1f} MB",
            f"{100 * link.utilisation:.1f} %",
        )
    return [parts, gpus, links]
