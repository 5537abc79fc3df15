"""AxoNN at the paper's scale: GPT models of 12-100 B parameters on 48-384 V100s of Summit nodes.

``scenarios/papers/axonn-gpt-summit.yaml`` states the setting: the base is 12 B on 48 GPUs (8 nodes), its
variants ``gpus96``, ``gpus192`` and ``gpus384`` the larger weak-scaling points. Two claims are simulated:

- percent of peak: the FLOPs the GPUs execute (forward, recomputed forward and backward of every sequence)
  per second per GPU, over the V100's fp16 tensor-core peak (scaled with ``gpu_flops`` in a sweep);
- the offload gain: at 48 GPUs, each of the pipeline depths in ``DEPTHS`` with and without optimizer-state
  offload; the fastest configuration that fits 16 GB with offload over the fastest without (AxoNN's "4x the
  parameters per GPU, fewer GPUs per pipeline, less communication").

`trainsim reproduce axonn` sweeps the scales in ``SWEPT`` (a 192-GPU run takes about a minute here, times
every setting of the sweep); ``benchmarks/axonn_summit_scale.py`` runs every scale once at the stated
setting and prints its percent of peak and wall time.
"""

from __future__ import annotations

from importlib import resources

from .physics import Physics, RunCache
from .ranges import Setting, Stated, overrides

SCENARIO = "axonn-gpt-summit.yaml"
SCALES = {None: 48, "gpus96": 96, "gpus192": 192, "gpus384": 384}  # variant -> GPUs
MODEL_B = {None: 12, "gpus96": 24, "gpus192": 50, "gpus384": 100}  # billions of parameters, as stated
# The scales `trainsim reproduce axonn` simulates in every setting of its sweep: those whose one run takes
# seconds here (benchmarks/axonn_summit_scale.py: 48 GPUs 1.8 s and 96 GPUs 9 s, their data-parallel replicas
# mirrored where they are exact copies, sim/symmetry.py; 192 GPUs 57 s and 384 GPUs 310 s, simulated whole:
# each replica crosses the 9-node leaves at another stage, so none is a copy of another)
SWEPT = (None, "gpus96")
PUBLISHED_PEAK = (49.4, 54.78)  # percent of peak, the paper's band over 48-384 GPUs
DEPTHS = (6, 12, 24)  # pipeline stages tried at 48 GPUs for the offload gain (data parallelism 8, 4, 2)
V100_FP16_PEAK = 125e12  # FLOP/s, tensor cores (the device library's v100-16gb)
CHUNK_FIELD = "optimizations.offload_chunk_mb"


def scenario_path() -> str:
    return str(resources.files("trainsim.scenarios") / "papers" / SCENARIO)


def peak_figure(variant) -> str:
    """The name of a scale's percent-of-peak figure."""
    return (f"percent of fp16 peak per GPU, {MODEL_B[variant]} B on {SCALES[variant]} V100 "
            f"(paper: 49.4-54.78 over 48-384 GPUs)")


def executed_flops(scenario) -> float:
    """FLOPs one iteration executes on all GPUs: every sequence's forward and backward, plus the forward
    again where activations are recomputed."""
    from trainsim.resolve import load_workload_ref

    workload = load_workload_ref(scenario.workload, scenario.base_dir)
    forwards = 2 if scenario.strategy.pipeline.recompute else 1
    per_sample = forwards * workload.flops_forward_per_sample + workload.flops_backward_per_sample
    return scenario.batch_size * per_sample


def percent_of_peak(scenario, result, physics: Physics) -> float:
    """Executed FLOP/s per GPU as a percent of the V100's fp16 peak under ``physics``."""
    gpus = len(result.gpus)
    peak = V100_FP16_PEAK * physics.factor("gpu_flops")
    return 100 * executed_flops(scenario) / (result.iteration_time_s * gpus * peak)


def _load(setting: Setting, free: list[Stated], variant: str | None, extra: list[str]):
    from trainsim.formats.scenario_loader import load_scenario

    sets = overrides(setting, free, SCENARIO, variant)
    plain = "optimizations.offload_optimizer_state=false" in extra
    if plain:  # the chunk size means nothing without offload: the plain runs are shared by every choice
        sets = [s for s in sets if not s.startswith(CHUNK_FIELD)]
    return load_scenario(scenario_path(), [*extra, *sets], variant=variant)


def scale_rows(setting: Setting, free, runs: RunCache, scales=None) -> list[dict]:
    """One row per GPU count in ``scales`` (default ``SWEPT``): the stated configuration's percent of peak
    and memory."""
    rows = []
    for variant in SWEPT if scales is None else scales:
        sc = _load(setting, free, variant, [])
        result = runs.simulate(sc, setting.physics)
        rows.append(_row(sc, result, setting.physics, gpus=SCALES[variant]))
    return rows


def _row(sc, result, physics: Physics, **first) -> dict:
    pipe = sc.strategy.pipeline
    return {**first, "params_b": round(parameter_count(sc) / 1e9, 2), "stages": pipe.stages,
            "data_parallel": len(result.gpus) // pipe.stages, "micro_batches": pipe.micro_batches,
            "offload": sc.optimizations.offload_optimizer_state,
            "iteration_s": round(result.iteration_time_s, 4),
            "samples_per_s": round(result.samples_per_s, 3),
            "percent_of_peak": round(percent_of_peak(sc, result, physics), 2),
            "memory_peak_gib": round(max(g.memory_peak_bytes for g in result.gpus) / 2**30, 2),
            "fits": not result.oom}


def parameter_count(sc) -> int:
    """The model's parameters (the workload's)."""
    from trainsim.resolve import load_workload_ref

    return load_workload_ref(sc.workload, sc.base_dir).num_params


def offload_gain(setting: Setting, free, runs: RunCache, fits: dict) -> tuple[float | None, list[dict]]:
    """At 48 GPUs: the fastest fitting configuration with offload over the fastest fitting without, and a
    row per configuration run. A configuration that did not fit 16 GB at the stated physics is not run
    again (memory does not depend on bandwidths or FLOP/s)."""
    base_batch = _load(setting, free, None, []).batch_size
    gpus = SCALES[None]
    best: dict[bool, float] = {}
    rows = []
    for offload in (True, False):
        for stages in DEPTHS:
            extra = [f"strategy.pipeline.stages={stages}",
                     f"strategy.pipeline.micro_batches={base_batch * stages // gpus}",
                     f"optimizations.offload_optimizer_state={str(offload).lower()}"]
            sc = _load(setting, free, None, extra)
            key = (SCENARIO, tuple(extra), sc.optimizations.offload_chunk_mb)
            if fits.get(key) is False:
                continue
            result = runs.simulate(sc, setting.physics)
            fits[key] = not result.oom
            rows.append(_row(sc, result, setting.physics, gpus=gpus))
            if not result.oom:
                best[offload] = max(best.get(offload, 0.0), result.samples_per_s)
    gain = best[True] / best[False] if True in best and False in best else None
    return gain, rows
