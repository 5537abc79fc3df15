"""The input pipeline of a rank: PyTorch-style DataLoaders whose worker processes prepare batches on host
cores ahead of the training loop (`DataLoader`, one per rank), or one per machine feeding all of its ranks in
turn (`SharedLoader`, ``host.loader: shared``); `Context.loader` makes them on first use. Each takes the
strategy's `Context` (``ctx``).

Mini-batch pre-loading (ScaleDNN's ``preload: k``): batch t+1..t+k copied from host memory (pinned, or
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

__all__ = ["DataLoader", "Preloader", "SharedLoader"]


class DataLoader:
    """A PyTorch-style DataLoader for one rank: ``workers`` processes on the rank's socket each prepare whole
    batches (``batch x prep_s_per_sample`` seconds on one core), at most two batches ahead per worker
    (``prefetch_factor=2``). With no preparation cost every batch is ready at once. With 0 workers the
    training loop prepares each batch itself when it asks for it (``num_workers=0``)."""

    PREFETCH = 2

    def __init__(self, ctx, gpu: str, batch: int):
        self.ctx = ctx
        self.gpu = gpu
        self.batch = batch
        self.host = ctx.machine.host_of(gpu)
        self.started = False
        self.store: simpy.Store | None = None

    def _start(self) -> None:
        self.started = True
        if self.ctx.settings.prep_s_per_sample <= 0:
            return
        workers = self.ctx.settings.data_workers
        self.store = simpy.Store(self.ctx.env, capacity=self.PREFETCH * workers)
        for w in range(workers):
            self.ctx.env.process(self._worker(w, workers))

    def _worker(self, w: int, workers: int):
        for iteration in range(w, self.ctx.total_iterations, workers):
            yield from self.ctx.machine.host_work(
                self.host,
                self.batch * self.ctx.settings.prep_s_per_sample,
                op="data_prep",
                iteration=iteration,
                gpu=self.gpu,
            )
            yield self.store.put(iteration)

    def get(self):
        if self.ctx.settings.data_workers == 0:  # num_workers=0: the loop prepares it, nothing overlaps
            duration = self.batch * self.ctx.settings.prep_s_per_sample
            if duration > 0:
                yield self.ctx.env.timeout(duration)
            return
        if not self.started:
            self._start()
        if self.store is not None:
            yield self.store.get()


class SharedLoader:
    """One DataLoader for the ranks of a machine (``host.loader: shared``: one process feeds every GPU, as
    torch.nn.DataParallel does). Its ``data_workers`` processes, on the socket of the machine's first rank,
    take the next task from one queue: a batch of the rank with the fewest batches handed out so far (ties
    in rank order), so the ranks are served in turn; each task is ``batch x prep_s_per_sample`` seconds on
    one core. At most two batches per worker wait to be taken, over all the ranks (``prefetch_factor=2``).
    With 0 workers the one training loop prepares each rank's batch itself, one after another."""

    PREFETCH = DataLoader.PREFETCH

    def __init__(self, ctx, machine: int):
        self.ctx = ctx
        first = next(g for g in ctx.ranks if ctx.machine.topology.machine_of(g) == machine)
        self.host = ctx.machine.host_of(first)
        self.order = {g: i for i, g in enumerate(ctx.ranks)}
        self.views: list[_SharedView] = []
        self.running = 0  # workers taking tasks
        self.room: simpy.Container | None = None  # batches prepared and not yet taken
        self.loop = simpy.Resource(ctx.env, capacity=1)  # the one process's loop (0 workers)

    def view(self, gpu: str, batch: int) -> _SharedView:
        view = _SharedView(self, gpu, batch)
        self.views.append(view)
        self.views.sort(key=lambda v: self.order[v.gpu])
        if self.room is not None and self.running == 0:  # a rank joined after the others were served
            self._start()
        return view

    def _start(self) -> None:
        workers = self.ctx.settings.data_workers
        if self.room is None:
            self.room = simpy.Container(self.ctx.env, capacity=self.PREFETCH * workers)
        for _ in range(workers):
            self.running += 1
            self.ctx.env.process(self._worker())

    def _next(self) -> _SharedView | None:
        open_ = [v for v in self.views if v.issued < self.ctx.total_iterations]
        if not open_:
            return None
        view = min(open_, key=lambda v: v.issued)  # stable: the first in rank order among the fewest
        view.issued += 1
        return view

    def _worker(self):
        while (view := self._next()) is not None:
            iteration = view.issued - 1
            yield from self.ctx.machine.host_work(self.host, view.batch * self.ctx.settings.prep_s_per_sample,
                                                  op="data_prep", iteration=iteration, gpu=view.gpu)
            yield self.room.put(1)
            yield view.store.put(iteration)
        self.running -= 1

    def get(self, view: _SharedView):
        if self.ctx.settings.prep_s_per_sample <= 0:  # nothing to prepare: every batch is ready at once
            return
        if self.ctx.settings.data_workers == 0:  # num_workers=0: the one loop prepares this rank's batch
            with self.loop.request() as turn:
                yield turn
                yield self.ctx.env.timeout(view.batch * self.ctx.settings.prep_s_per_sample)
            return
        if self.room is None:
            self._start()
        yield view.store.get()
        yield self.room.get(1)


class _SharedView:
    """One rank's view of a `SharedLoader`: ``get`` waits for that rank's next batch."""

    def __init__(self, shared: SharedLoader, gpu: str, batch: int):
        self.shared = shared
        self.gpu = gpu
        self.batch = batch
        self.issued = 0  # tasks handed to the workers for this rank
        self.store = simpy.Store(shared.ctx.env)

    def get(self):
        yield from self.shared.get(self)


class Preloader:
    """Mini-batch pre-loading for one rank (see the module)."""

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
            yield from machine.h2d(self.gpu, self.nbytes, iteration=it, op="h2d_preload",
                                   pinned=ctx.settings.pinned)
            yield self.ready.put(it)

    def take(self, iteration: int):
        """A process body: wait until batch ``iteration`` is on the GPU, then free a buffer for the next."""
        got = yield self.ready.get()
        assert got == iteration, f"preloaded batch {got}, the loop wants {iteration}"
        yield self.credits.put(1)
