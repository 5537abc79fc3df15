"""Optimizer state in pinned host memory, streamed through the GPU at every step (AxoNN;
docs/techniques.md, section 4).

``optimizations.offload_optimizer_state`` keeps a rank's ``state_bytes`` (the optimizer's moments and, in
16-bit training, the fp32 master weights) in host memory. At each step the state crosses to the GPU in
``ceil(state / offload_chunk_mb)`` equal chunks on the H2D engine; each chunk is stepped on the compute stream
(its share of the step's time) and goes back on the D2H engine. The GPU holds two chunk buffers instead of
the state, so chunk c+1 comes in while chunk c steps and chunk c-1 goes out. The executor runs the same
(`trainsim.calibrate.execute.offload_optimizer`).
"""

from __future__ import annotations

import math

import simpy


class StateStreamer:
    """The chunked state traffic of one run (``chunk_bytes`` per chunk at most), per GPU."""

    def __init__(self, ctx, chunk_bytes: float):
        self.ctx = ctx
        self.chunk = chunk_bytes
        self._buffers: dict[str, simpy.Resource] = {}

    def hold(self, gpu: str, state_bytes: float) -> None:
        """Allocate ``gpu``'s two chunk buffers (what stays on the GPU instead of the state)."""
        self._buffers[gpu] = simpy.Resource(self.ctx.env, capacity=2)
        self.ctx.machine.gpus[gpu].memory.alloc(self.ctx.env.now, min(state_bytes, 2 * self.chunk),
                                                "offload_buffers")

    def step(self, gpu: str, it: int, state_bytes: float, step_s: float, before_step=None):
        """A process body: the optimizer step of ``gpu`` with its state streamed. ``before_step``: an event
        each chunk's step waits for (e.g. the gradients' all-reduce, which the chunks' H2D overlaps)."""
        ctx, machine = self.ctx, self.ctx.machine
        n_chunks = max(1, math.ceil(state_bytes / self.chunk))
        nbytes = state_bytes / n_chunks
        buffers = self._buffers[gpu]

        def chunk(c: int):
            with buffers.request() as req:
                yield req
                yield from machine.h2d(gpu, nbytes, iteration=it, op="h2d_optimizer_state")
                if before_step is not None:
                    yield before_step
                yield from machine.run(gpu, "compute", step_s / n_chunks, op="optimizer", iteration=it,
                                       optimizer=ctx.settings.optimizer, chunk=c)
                yield from machine.d2h(gpu, nbytes, iteration=it, op="d2h_optimizer_state")

        yield ctx.env.all_of([ctx.env.process(chunk(c)) for c in range(n_chunks)])
