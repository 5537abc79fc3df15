"""Set up a run's data-movement optimizations (ScaleDNN, vDNN) on its Context.

`prepare` runs when a Simulation is built: it needs the workload and the machine (the offloaded layers, their
bytes vs host memory, the auto prefetch distance). Which combinations are allowed is part of the scenario
format (`trainsim.formats.scenario_options.check_combinations`).
"""

from __future__ import annotations

from trainsim.formats.scenario_options import _offload_on


def prepare(ctx, scenario, rerun=None) -> None:
    """Put the optimizations' per-run state on ``ctx`` (codec, preload depth, offloaders). ``rerun(scenario)
    -> Result`` simulates a variant on the same inputs: ``prefetch_distance: auto`` searches with it."""
    from .compression import make_codec

    opts = scenario.optimizations
    ctx.preload_depth = opts.preload
    ctx.cpu_batch_split = opts.cpu_batch_split
    ctx.codec = make_codec(ctx)
    if opts.offload_optimizer_state:
        from .optimizer_offload import StateStreamer

        ctx.state_streamer = StateStreamer(ctx, opts.offload_chunk_mb * 2**20)
    if not _offload_on(opts.offload_activations):
        return
    from .offload import Offloader, check_host_memory, offloaded_layers, resolve_auto_distance  # vDNN only

    blocking = opts.offload_copies == "blocking"
    layers = offloaded_layers(ctx.workload, opts.offload_activations, packed=blocking)
    check_host_memory(ctx, layers, scenario.host.memory_gib)
    distance = opts.prefetch_distance
    if distance == "auto":
        distance = resolve_auto_distance(scenario, len(ctx.workload.layers), rerun)
    ctx.offloader = Offloader(ctx, layers, distance, opts.contention_aware,
                              blocking=opts.offload_copies == "blocking")
    ctx.extra["offload"]["policy"] = (
        opts.offload_activations if isinstance(opts.offload_activations, str) else "layers"
    )
