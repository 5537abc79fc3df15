"""Singh & Bhatele, AxoNN (2022): optimizer-state offload to host memory in a message-driven pipeline.

The claims (abstract): keeping fp32 master weights and optimizer state in pinned host memory, streamed to the
GPU in chunks overlapped with communication, cuts GPU model state from about 16 to about 4 bytes per
parameter (4x less), and the freed memory (more parameters per GPU, fewer pipeline stages, less
communication) makes training more than 13 % faster. ``scenarios/papers/axonn-gpt-dgx1.yaml`` states the
assumptions (one DGX-1, a 2.7 B-parameter GPT, batch and micro-batch); every pipeline depth 8, 4, 2, 1 is
simulated with and without offload, and each setting's fastest configuration that fits 16 GB is compared.
"""

from __future__ import annotations

from functools import partial
from importlib import resources

from .physics import RunCache
from .ranges import Evaluation, FigureSpec, Setting, build, overrides
from .reproduce import register_paper

SCENARIO = "axonn-gpt-dgx1.yaml"
STAGES = (8, 4, 2, 1)
MODEL_STATE = ("params", "grads", "optimizer_state", "offload_buffers")
TITLE = "AxoNN (Singh & Bhatele): optimizer-state offload in a message-driven pipeline"
PHYSICAL = ("pcie_bandwidth", "nvlink_bandwidth", "gpu_flops")
PER_PARAM = "GPU model state per parameter, no offload"
PER_PARAM_OFF = "GPU model state per parameter, offload"
REDUCTION, FEWEST = "GPU memory reduction", "fewest pipeline stages that fit 16 GB, no offload / offload"
SPEED = "throughput, best fitting offload config / best fitting without"
SPECS = (
    FigureSpec(PER_PARAM, 16.0, "bytes", "fp16 weights + grads (4) + fp32 master, m, v (12), on 8 stages"),
    FigureSpec(PER_PARAM_OFF, 4.0, "bytes", "fp16 weights + grads, plus two streaming buffers (the excess)",
               "the two chunk buffers on the GPU add to the 4 bytes; the paper counts the parameters' state"),
    FigureSpec(REDUCTION, 4.0, "x", "the two figures above: bytes per parameter (arithmetic)",
               "the chunk buffers (see above)"),
    FigureSpec(FEWEST, None, "stages", "the freed memory lets the model run with less pipelining"),
    FigureSpec(SPEED, 1.13, "x",
               "streaming 12 bytes/param each way over PCIe Gen3 (two GPUs per switch) per iteration against "
               "the pipeline bubble that fewer stages save",
               "on one DGX-1 the stage all-reduce (NVLink) is far too short to hide the PCIe streaming, "
               "unlike the paper's 48-384 GPUs over the network (Summit's 6-GPU nodes are not "
               "modelled here)"),
)


def scenario_path() -> str:
    return str(resources.files("trainsim.scenarios") / "papers" / SCENARIO)


def bytes_per_parameter(result) -> float:
    """GPU model state (weights, gradients, optimizer state, offload buffers) per parameter of the first
    stage's GPU; its 16-bit weights give the parameter count."""
    at_peak = result.gpus[0].memory_at_peak
    params = at_peak["params"] / 2
    return sum(at_peak.get(k, 0.0) for k in MODEL_STATE) / params


def evaluate(setting: Setting, free, runs: RunCache, fits: dict) -> Evaluation:
    """Every pipeline depth with and without offload; a configuration that did not fit 16 GB at the stated
    physics is not run again under scaled physics (memory does not depend on bandwidths or FLOP/s)."""
    from trainsim.formats.scenario_loader import load_scenario

    base = load_scenario(scenario_path())
    rows, results = [], {}
    for variant in (None, "offload"):
        sets = overrides(setting, free, SCENARIO, variant)
        for stages in STAGES:
            key = (variant, stages, tuple(sets))
            if fits.get(key) is False:
                continue
            micro = base.batch_size // (8 // stages)
            sc = load_scenario(scenario_path(), [f"strategy.pipeline.stages={stages}",
                                                 f"strategy.pipeline.micro_batches={micro}", *sets],
                               variant=variant)
            result = runs.simulate(sc, setting.physics)
            fits[key] = not result.oom
            results[variant, stages] = result
            rows.append({"offload": variant == "offload", "stages": stages, "data_parallel": 8 // stages,
                         "iteration_s": round(result.iteration_time_s, 4),
                         "samples_per_s": round(result.samples_per_s, 3),
                         "memory_peak_gib": round(max(g.memory_peak_bytes for g in result.gpus) / 2**30, 2),
                         "fits": not result.oom, "bytes_per_param": round(bytes_per_parameter(result), 3)})

    def fitting(variant):
        return [s for s in STAGES if (variant, s) in results and not results[variant, s].oom]

    def best(variant):
        return min((results[variant, s] for s in fitting(variant)), key=lambda r: r.iteration_time_s,
                   default=None)

    plain, offload = best(None), best("offload")
    per_param = bytes_per_parameter(results[None, 8])
    per_param_off = bytes_per_parameter(results["offload", 8])
    fewest = [min(fitting(v), default=None) for v in (None, "offload")]
    figures = {
        PER_PARAM: round(per_param, 2), PER_PARAM_OFF: round(per_param_off, 2),
        REDUCTION: round(per_param / per_param_off, 2), FEWEST: f"{fewest[0]} / {fewest[1]}",
        SPEED: round(offload.samples_per_s / plain.samples_per_s, 3) if plain and offload else None,
    }
    return Evaluation(figures, {"configurations": rows})


@register_paper("axonn", TITLE)
def reproduce_axonn(**_options):
    evaluate_here = partial(evaluate, runs=RunCache(), fits={})
    return build("axonn", TITLE, [(SCENARIO, scenario_path())], SPECS, evaluate_here, PHYSICAL)
