"""A run's data-movement optimizations (ScaleDNN, vDNN, AxoNN: docs/techniques.md) as its plug-ins.

`plugins_for` gives the function a `Context` calls once, when it is made, to build its `Plugins` against it:
the gradient codec (``param_compression``), the optimizer-state streamer (``offload_optimizer_state``) and the
activation offloader (``offload_activations``: which layers, their bytes against host memory, the prefetch
distance). Which combinations are allowed is part of the scenario format
(`trainsim.formats.scenario_options.check_combinations`).
"""

from __future__ import annotations

from collections.abc import Callable

from trainsim.formats.scenario_options import _offload_on
from trainsim.sim.strategies.plugins import HostModel, Plugins


def plugins_for(scenario, *, host: HostModel | None = None, codec_s: float | None = None,
                prefetch_distance: int | None = None) -> Callable:
    """``ctx -> Plugins`` for ``scenario``: ``host``, the host plug-in; ``codec_s``, a compression hook's cost
    per step as measured on the box (the codec's passes are scaled to it); ``prefetch_distance``, the
    distance an ``auto`` prefetch resolved to (`trainsim.sim.planning.prefetch`)."""

    def build(ctx) -> Plugins:
        from .compression import make_codec

        opts = scenario.optimizations
        codec = make_codec(ctx)
        stream = None
        if opts.offload_optimizer_state:
            from .optimizer_offload import StateStreamer

            stream = StateStreamer(ctx, opts.offload_chunk_mb * 2**20)
        offload = None
        if _offload_on(opts.offload_activations):
            offload = _offloader(ctx, scenario, prefetch_distance)
        if codec_s is not None and codec is not None:  # measured on the box
            codec.fit_to(codec_s, ctx.costs[ctx.ranks[0]].grad_bytes_per_layer)
        return Plugins(offload=offload, codec=codec, state_stream=stream, host=host)

    return build


def _offloader(ctx, scenario, prefetch_distance: int | None):
    from .offload import Offloader, check_host_memory, offloaded_layers  # vDNN only

    opts = scenario.optimizations
    blocking = opts.offload_copies == "blocking"
    layers = offloaded_layers(ctx.workload, opts.offload_activations, packed=blocking)
    check_host_memory(ctx, layers, scenario.host.memory_gib)
    distance = opts.prefetch_distance
    if distance == "auto":
        if prefetch_distance is None:
            raise ValueError("prefetch_distance: auto is resolved before the run "
                             "(trainsim.sim.planning.prefetch)")
        distance = prefetch_distance
    offloader = Offloader(ctx, layers, distance, opts.contention_aware, blocking=blocking)
    ctx.extra["offload"]["policy"] = (
        opts.offload_activations if isinstance(opts.offload_activations, str) else "layers"
    )
    return offloader
