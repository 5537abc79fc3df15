"""What runs one point, in whichever process or Ray worker gets it: simulate, and reduce the Result to the
figures of its row. It never raises: a failure is the point's error, so the sweep goes on."""

from __future__ import annotations

import time

from trainsim.errors import TrainsimError
from trainsim.formats.scenario import Scenario


def run_point(scenario: Scenario) -> dict:
    """``{"status": "ok", <figures of results.METRICS>}`` or ``{"status": "error", "error": one line}``."""
    from trainsim.resolve import resolve  # the simulator, imported where a point runs
    from trainsim.sim.simulation import Simulation

    start = time.perf_counter()
    try:
        result = Simulation(resolve(scenario), record=False).run()  # a row needs no per-op records
    except TrainsimError as exc:
        return failure(str(exc))
    except Exception as exc:  # noqa: BLE001 - any failure is this point's, recorded in its row
        return failure(f"{type(exc).__name__}: {exc}")
    row = {key: _digits(value) for key, value in figures(result).items()}
    return {"status": "ok", **row, "sim_wall_s": round(time.perf_counter() - start, 6)}


def failure(message: str) -> dict:
    """An error row's status and message, on one line."""
    return {"status": "error", "error": " ".join(message.split())}


def figures(result) -> dict:
    """The row figures of a `trainsim.sim.core.result.Result`."""
    gpus = len(result.gpus)
    throughput = result.samples_per_s
    return {
        "scenario": result.scenario,
        "topology": result.topology,
        "strategy": result.strategy,
        "workload": result.workload,
        "precision": result.precision,
        "num_gpus": gpus,
        "batch_size": result.batch_size,
        "iteration_time_s": result.iteration_time_s,
        "samples_per_s": throughput,
        "gpu_seconds_per_sample": gpus / throughput if throughput > 0 else None,
        **{f"{name}_s": seconds for name, seconds in result.breakdown_s.items()},
        "memory_peak_gib": max(g.memory_peak_bytes for g in result.gpus) / 2**30,
        "oom": bool(result.oom),
        "events": result.stats.get("events"),
    }


def _digits(value):
    """Floats to 9 significant digits, as the simulator's JSON gives them."""
    return float(f"{value:.9g}") if isinstance(value, float) else value
