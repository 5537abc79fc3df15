"""Set up a run's data-movement optimizations (ScaleDNN, vDNN) on its Context, and check the combinations.

`check_combinations` runs when a scenario is validated (scenarios/schema.py): it knows only the scenario, and
rejects switches that make no sense together with one line naming both. `prepare` runs when a Simulation is
built: it needs the workload and the machine (the offloaded layers, their bytes vs host memory, the auto
prefetch distance).
"""

from __future__ import annotations

#: strategies whose ranks run the shared input copy / forward / backward of sim/strategies/base.py
INPUT_COPY_STRATEGIES = ("single", "ddp", "dp-gpu0", "parameter-server", "spatial", "hybrid")
PASS_STRATEGIES = ("single", "ddp", "dp-gpu0", "parameter-server")
COMPRESSION_STRATEGIES = ("dp-gpu0", "ddp")
SPLIT_STRATEGIES = ("dp-gpu0", "ddp", "parameter-server")  # ddp/parameter-server ranks already load shards


def normalise(block):
    """Accept the executor's spellings (calibrate/execute/config.py) of the same switches, so one scenario file
    serves both: ``preload: true`` / ``{depth: k}``, ``param_compression: none`` / ``{name: powersgd, rank}``,
    ``offload_activations: save_on_cpu`` (offload all, no prefetch ahead: distance 0) / ``prefetch`` (all,
    with ``prefetch_distance``) / ``{mode: prefetch, distance: k}``."""
    if not isinstance(block, dict):
        return block
    out = dict(block)
    preload = out.get("preload")
    if isinstance(preload, bool):
        out["preload"] = 1 if preload else 0  # double buffering
    elif isinstance(preload, dict):
        out["preload"] = preload.get("depth", 1) if preload.get("enabled", True) else 0
    comp = out.get("param_compression")
    if comp in ("none", False):
        out["param_compression"] = None
    elif isinstance(comp, dict) and "name" in comp and "method" not in comp:
        out["param_compression"] = {("method" if k == "name" else k): v for k, v in comp.items()}
    off = out.get("offload_activations")
    if isinstance(off, dict):
        if "distance" in off:
            out.setdefault("prefetch_distance", off["distance"])
        off = off.get("mode", "prefetch")
    if off is False:
        off = "none"
    if off == "save_on_cpu":  # torch's save_on_cpu unpacks on demand: no prefetch ahead
        out.setdefault("prefetch_distance", 0)
        off = "all"
    elif off == "prefetch":
        off = "all"
    if off is not None:
        out["offload_activations"] = off
    return out


def _offload_on(policy) -> bool:
    return policy not in (None, "none") and policy != []


def check_combinations(scenario) -> None:
    """Raise ValueError (one line, naming both switches) for combinations that make no physical sense."""
    opts, strategy = scenario.optimizations, scenario.strategy.name
    if opts.cpu_batch_split and strategy not in SPLIT_STRATEGIES:
        raise ValueError(
            f"optimizations.cpu_batch_split splits the batch over several GPUs; strategy.name {strategy} "
            f"does not (use it with {', '.join(SPLIT_STRATEGIES)})"
        )
    if opts.preload and strategy not in INPUT_COPY_STRATEGIES:
        raise ValueError(
            f"optimizations.preload is modelled for strategy.name {', '.join(INPUT_COPY_STRATEGIES)}, "
            f"not {strategy}"
        )
    if opts.param_compression is not None:
        if strategy not in COMPRESSION_STRATEGIES:
            raise ValueError(
                f"optimizations.param_compression is modelled for strategy.name "
                f"{' and '.join(COMPRESSION_STRATEGIES)}, not {strategy}"
            )
        method = opts.param_compression.method
        if method in ("fp16", "bf16") and scenario.precision in ("fp16", "bf16"):
            raise ValueError(
                f"optimizations.param_compression {method} with precision {scenario.precision}: "
                "the gradients are already 2 bytes per value"
            )
    offload = _offload_on(opts.offload_activations)
    if offload and strategy not in PASS_STRATEGIES:
        raise ValueError(
            f"optimizations.offload_activations is modelled for strategy.name {', '.join(PASS_STRATEGIES)}, "
            f"not {strategy}"
        )
    if offload and scenario.host.memory_gib == 0:
        raise ValueError("optimizations.offload_activations needs pinned host memory; host.memory_gib is 0")
    if not offload:
        if opts.contention_aware:
            raise ValueError(
                "optimizations.contention_aware staggers offload/prefetch transfers; "
                "optimizations.offload_activations is off"
            )
        if opts.prefetch_distance != 1:
            raise ValueError(
                "optimizations.prefetch_distance applies to offloaded activations; "
                "optimizations.offload_activations is off"
            )


def prepare(ctx, scenario, rerun=None) -> None:
    """Put the optimizations' per-run state on ``ctx`` (codec, preload depth, offloader). ``rerun(scenario)
    -> Result`` simulates a variant on the same inputs: ``prefetch_distance: auto`` searches with it."""
    from .compression import make_codec
    from .offload import Offloader, check_host_memory, offloaded_layers, resolve_auto_distance

    opts = scenario.optimizations
    ctx.preload_depth = opts.preload
    ctx.cpu_batch_split = opts.cpu_batch_split
    ctx.codec = make_codec(ctx)
    if not _offload_on(opts.offload_activations):
        return
    layers = offloaded_layers(ctx.workload, opts.offload_activations)
    check_host_memory(ctx, layers, scenario.host.memory_gib)
    distance = opts.prefetch_distance
    if distance == "auto":
        distance = resolve_auto_distance(scenario, len(ctx.workload.layers), rerun)
    ctx.offloader = Offloader(ctx, layers, distance, opts.contention_aware)
    ctx.extra["offload"]["policy"] = (
        opts.offload_activations if isinstance(opts.offload_activations, str) else "layers"
    )
