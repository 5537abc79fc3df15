"""The largest batch that fits in GPU memory, with and without activation offload, and the throughput at each.

Out of memory is a simulation result (sim/core/memory.py), so "fits" is a simulated run whose memory peak
stays
within every GPU's capacity. The per-GPU batch is doubled until a run does not fit, then bisected: about
2 log2(batch) short runs (no warm-up, two iterations, nothing recorded). The throughput at each batch is a
full run of the scenario (its iterations and warm-up) at that batch.

"With offload" uses the scenario's ``offload_activations`` settings, or ``policy`` (default ``all``) when
the scenario has none; "without" switches offload off (and its prefetch/contention settings with it).
"""

from __future__ import annotations

from trainsim.errors import TrainsimError
from trainsim.sim.run import Run

#: strategies whose ranks each take batch_size / GPUs samples (single: all of it)
SHARDED = ("single", "ddp", "dp-gpu0", "parameter-server")
LIMIT = 2**20  # per-GPU samples: a search that reaches this has no memory limit in sight


def _with(scenario, batch: int, offload, **top):
    opts = scenario.optimizations
    if offload is None:
        opts = opts.model_copy(
            update={"offload_activations": "none", "prefetch_distance": 1, "contention_aware": False}
        )
    else:
        opts = opts.model_copy(update={"offload_activations": offload})
    return scenario.model_copy(update={"optimizations": opts, "batch_size": batch, **top})


def _simulate(run: Run):
    from trainsim.sim.simulation import Simulation

    return Simulation(run, record=False).run()


def largest_batch(run: Run, offload, simulate=None) -> int:
    """The largest per-GPU batch of ``run`` whose run fits in every GPU's memory (0 if not even one sample
    fits). ``simulate(run) -> Result``: how a probe is simulated (default: a plain Simulation)."""
    n = len(run.ranks)
    simulate = simulate or _simulate

    def fits(per_gpu: int) -> bool:
        probe = _with(run.scenario, per_gpu * n, offload, iterations=2, warmup_iterations=0)
        return not simulate(run.with_scenario(probe)).oom

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while fits(hi):
        lo, hi = hi, hi * 2
        if hi > LIMIT:
            raise TrainsimError(
                f"more than {LIMIT} samples per GPU fit: the workload's memory does not grow with the batch",
                field="batch_size",
            )
    while hi - lo > 1:  # fits(lo), not fits(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def _figures(run: Run, per_gpu: int, offload, simulate=None) -> dict:
    n = len(run.ranks)
    out: dict = {"per_gpu_batch": per_gpu, "global_batch": per_gpu * n}
    if per_gpu == 0:
        return {**out, "samples_per_s": 0.0, "iteration_s": None, "memory_peak_gib": None}
    simulate = simulate or _simulate
    result = simulate(run.with_scenario(_with(run.scenario, per_gpu * n, offload)))
    out.update(
        samples_per_s=result.samples_per_s,
        iteration_s=result.iteration_time_s,
        memory_peak_gib=max(g.memory_peak_bytes for g in result.gpus) / 2**30,
        memory_capacity_gib=min(g.memory_capacity_bytes for g in result.gpus) / 2**30,
    )
    if offload is not None:
        stats = result.extra.get("offload", {})
        out["prefetch_distance"] = stats.get("prefetch_distance")
        from trainsim.sim.optimizations.offload import offload_stall_s

        out["stall_s_per_iteration"] = offload_stall_s(result)
        out["offload_wait_s_per_iteration"] = offload_stall_s(result, "offload_wait_s_by_iteration")
    return out


def max_batch(run: Run, *, policy: str | list[str] = "all", simulate=None) -> dict:
    """The largest per-GPU batch of the resolved ``run`` without and with offload, and the samples/s at each
    (see the module). ``simulate(run) -> Result``: how a probe is simulated (default: a plain Simulation; a
    reproduction's sweep passes one on a machine with scaled physics)."""
    scenario = run.scenario
    if scenario.strategy.name not in SHARDED:
        raise TrainsimError(
            f"max-batch searches the per-GPU batch of strategies {', '.join(SHARDED)}, "
            f"not strategy.name {scenario.strategy.name}",
            file=scenario.source,
            field="strategy.name",
        )
    current = scenario.optimizations.offload_activations
    offload = current if current not in ("none", []) else policy
    n = len(run.ranks)
    without = _figures(run, largest_batch(run, None, simulate), None, simulate)
    with_ = _figures(run, largest_batch(run, offload, simulate), offload, simulate)

    def gain(key):
        return with_[key] / without[key] if without[key] else None

    return {
        "schema": "trainsim.max_batch/1",
        "scenario": scenario.name,
        "gpus": n,
        "offload": offload,
        "without_offload": without,
        "with_offload": with_,
        "batch_gain": gain("per_gpu_batch"),
        "throughput_gain": gain("samples_per_s"),
    }
