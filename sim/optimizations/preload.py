"""Mini-batch pre-loading (ScaleDNN's ``preload: k``): batch t+1..t+k copied from host memory (pinned, or
pageable staged by a CPU core when ``host.pinned`` is false) on the GPU's H2D copy engine while batch t
computes.

A rank's `Preloader` is a SimPy process that, for every iteration in turn, takes a buffer credit, waits for
the batch from the rank's data loader, allocates the batch on the GPU and copies it on the H2D engine. The
training loop's input copy becomes a wait for that batch; taking a batch hands a credit back. With ``k``
credits the copy of batch u may start once the loop has taken batch u - k: k batches in flight or ready
besides the one computing (k = 1 is double buffering), so the GPU holds up to k + 1 input batches.

Without compute to hide under, an iteration costs copy + compute ("sum"); with pre-loading it costs
max(copy, compute) in the steady state.
"""

from __future__ import annotations

import simpy


class Preloader:
    def __init__(self, ctx, gpu: str, nbytes: float, depth: int):
        self.ctx = ctx
        self.gpu = gpu
        self.nbytes = nbytes
        env = ctx.env
        self.credits = simpy.Container(env, capacity=depth + ctx.total_iterations, init=depth)
        self.ready = simpy.Store(env)
        env.process(self._run())

    def _run(self):
        ctx, machine = self.ctx, self.ctx.machine
        for it in range(ctx.total_iterations):
            yield self.credits.get(1)
            yield from ctx.loader_wait(self.gpu, it)
            machine.gpus[self.gpu].memory.alloc(ctx.env.now, self.nbytes, "input")
            # from pageable memory (host.pinned: false) a core stages the copy, as the loader's thread would
            yield from machine.h2d(self.gpu, self.nbytes, iteration=it, op="h2d_preload", pinned=ctx.pinned)
            yield self.ready.put(it)

    def take(self, iteration: int):
        """A process body: wait until batch ``iteration`` is on the GPU, then free a buffer for the next."""
        got = yield self.ready.get()
        assert got == iteration, f"preloaded batch {got}, the loop wants {iteration}"
        yield self.credits.put(1)
