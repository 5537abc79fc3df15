"""A GPU shared by its compute kernels and the communication kernels that overlap them.

An NCCL kernel in flight is resident on the GPU for its whole life, spinning on its peers' flags when it has
nothing to move: one CTA per channel, each on an SM of its own (NCCL 2.17's all-reduce CTA in the real
trace ``kineto-a100-ddp2-rank0``: 544 threads x 96 registers = 52 K of an SM's 64 K registers and 87.5 KB
of shared memory, so no GEMM or convolution CTA fits beside it). While its bytes move it also reads and
writes HBM (`trainsim.sim.collectives.footprint`). A compute kernel running at the same time has the SMs
left and the HBM bandwidth left:

- its arithmetic runs on ``s = (SMs - CTAs) / SMs`` of the SMs: ``1 / s`` times as long;
- its memory traffic shares HBM with the communication's: where the two ask for more than the achievable
  bandwidth (the demands ``hbm + h`` above 1, in units of it), both are served in proportion to what they
  ask (a DRAM controller serves requests in arrival order), so each runs ``hbm + h`` times as long.

A piece of work of nominal time ``T`` is described by its `Load` ``(sm, hbm)``: the shares of ``T`` its
arithmetic at full rate and its memory traffic at the achievable bandwidth take (its roofline split; the
rest, ``1 - max(sm, hbm)``, is launch overhead, which neither slows). Under a state ``(s, h)`` it takes

    T x [max(sm / s, hbm x max(1, hbm + h)) + 1 - max(sm, hbm)]

which is T when nothing is in flight (s = 1, h = 0). Matrix work therefore slows by the SM share the
channels take; memory-bound work by the HBM share the communication takes; launch-bound work not at all.

`Contention` is one GPU's state: the CTAs and the HBM demand of the communication in flight. `run_pieces`
runs a sequence of pieces (the layers of a pass) on the compute stream under it: one timeout while nothing
changes; where a collective starts or ends mid-way, the pieces' progress is carried over to the new state
(`Walk`), so a layer overlapped by a collective takes longer by exactly the modelled share and a layer that
is not takes its nominal time. The other way round, the compute pass's HBM demand slows the collective's
bytes by the same rule; `Contention` keeps the progress it lost and `settle` pays it at the collective's end.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import simpy

#: a piece of work's (sm, hbm): the shares of its nominal time its arithmetic and its memory traffic take
Load = tuple[float, float]
#: what work of unknown make-up is taken to be: matrix work (the bulk of a training step's compute)
MATRIX: Load = (1.0, 0.0)
#: a streaming kernel (an optimizer step, an elementwise pass): all memory traffic
STREAMING: Load = (0.0, 1.0)
#: the fraction of the datasheet HBM bandwidth streaming kernels reach (the roofline's ``Efficiency.memory``,
#: the same evidence: STREAM-like copy kernels reach 75-90 %); a communication's demand is counted in it
HBM_STREAM_FRACTION = 0.8
IDLE = (1.0, 0.0)  # (s, h) with nothing in flight


#: the loads of a pass's pieces: (sm, hbm) pairs, an (n, 2) array, or a function giving one when it is needed
#: (most passes never are: nothing overlaps them)
Loads = Sequence[Load] | np.ndarray | Callable[[], np.ndarray]


def as_pairs(loads: Loads) -> np.ndarray:
    """``loads`` as an (n, 2) array of (sm, hbm)."""
    if callable(loads):
        loads = loads()
    return np.asarray(loads, dtype=float).reshape(-1, 2)


def factor(load: Load, state: tuple[float, float]) -> float:
    """How many times its nominal time a piece of ``load`` takes under ``state`` = (s, h) (module doc)."""
    sm, hbm = load
    s, h = state
    bound = max(sm, hbm)
    return max(sm / s, hbm * max(1.0, hbm + h)) + 1.0 - bound


def state_beside(sm_count: int, hbm_bandwidth: float, ctas: int, demand: float) -> tuple[float, float]:
    """(s, h) on a GPU of ``sm_count`` SMs and ``hbm_bandwidth`` bytes/s of HBM (the datasheet's) while
    communication holds ``ctas`` of them and asks for ``demand`` bytes/s (a `footprint`'s ``ctas`` and
    ``demand``): what `factor` takes, for closed forms as for the simulation."""
    return max(1, sm_count - ctas) / sm_count, demand / (hbm_bandwidth * HBM_STREAM_FRACTION)


def overlapped_seconds(compute_s: float, comm_s: float, slowdown: float) -> float:
    """Closed form for analytic models: wall seconds of ``compute_s`` of compute that starts with a
    collective of ``comm_s`` seconds and runs ``slowdown`` (`factor`) times slower beside it. The part of
    the wall time the two share is min(comm_s, compute_s x slowdown); in it only 1 / slowdown of the nominal
    work gets done, so the compute ends that share x (1 - 1 / slowdown) later than alone."""
    if compute_s <= 0 or comm_s <= 0 or slowdown <= 1.0:
        return compute_s
    shared = min(comm_s, compute_s * slowdown)
    return compute_s + shared * (1.0 - 1.0 / slowdown)


def settle(env: simpy.Environment, contentions: Sequence[Contention], marks: Sequence[float]):
    """A process body, at the end of a collective's bytes: the progress its GPUs' compute took from it
    since ``marks`` (their `Contention.lost` at its start) is paid before it ends: the slowest rank's, at
    that rank's present rate (a collective ends together on all its ranks). Nothing where none was lost."""
    debt, rate = 0.0, 0.0
    for contention, mark in zip(contentions, marks, strict=True):
        lost = contention.lost - mark
        if lost > debt:
            debt, rate = lost, contention.loss_rate
    if debt > 0:
        yield env.timeout(debt / (1.0 - rate))


class Contention:
    """One GPU's communication in flight (CTAs held, HBM demand in bytes/s), the HBM demand of the compute
    pass running beside it, and who waits on a change.

    ``sm_count``: the GPU's SMs; ``hbm_bandwidth``: its achievable HBM bandwidth (bytes/s). At most one
    compute pass waits at a time (the compute stream runs one at a time).

    The other way round, compute slows communication: where the two ask HBM for more than it gives
    (``v + h > 1``, ``v`` the compute pass's demand), the communication's bytes move at ``1 / (v + h)`` of
    their rate too. The GPU keeps the integral of that loss (seconds of communication progress lost,
    `lost`); a collective reads it at its start and end, and pays the difference before it ends (`settle`)."""

    __slots__ = ("env", "sm_count", "hbm_bandwidth", "ctas", "demand", "waiting", "_holds", "_pass", "_v",
                 "_lost", "_since")

    def __init__(self, env: simpy.Environment, sm_count: int, hbm_bandwidth: float):
        self.env = env
        self.sm_count = sm_count
        self.hbm_bandwidth = hbm_bandwidth
        self.ctas = 0
        self.demand = 0.0
        self.waiting: simpy.Process | None = None
        self._holds = 0
        self._pass: tuple | None = None  # the running compute pass's (seconds, loads); its demand when asked
        self._v = 0.0
        self._lost = 0.0
        self._since = env.now

    @property
    def busy(self) -> bool:
        return self._holds > 0

    @property
    def state(self) -> tuple[float, float]:
        """(s, h): the share of SMs left to compute (at least one SM) and the communication's HBM demand in
        units of the achievable bandwidth."""
        if not self._holds:
            return IDLE
        return max(1, self.sm_count - self.ctas) / self.sm_count, self.demand / self.hbm_bandwidth

    @property
    def loss_rate(self) -> float:
        """The share of its rate the communication loses now to oversubscribed HBM: 1 - 1 / max(1, v + h)."""
        if not self._holds:
            return 0.0
        total = self.compute_hbm + self.demand / self.hbm_bandwidth
        return 1.0 - 1.0 / total if total > 1.0 else 0.0

    def _integrate(self) -> None:
        now = self.env.now
        if now > self._since:
            rate = self.loss_rate
            if rate:
                self._lost += (now - self._since) * rate
            self._since = now

    @property
    def lost(self) -> float:
        """Seconds of communication progress lost to compute's HBM traffic since the start."""
        self._integrate()
        return self._lost

    @property
    def compute_hbm(self) -> float:
        """The running compute pass's HBM demand in units of the achievable bandwidth: its pieces' time-
        weighted ``hbm`` (worked out only when communication runs beside it)."""
        if self._pass is not None:
            seconds, loads = self._pass
            busy = sum(seconds)
            moved = float(np.dot(seconds, as_pairs(loads)[:, 1])) if busy > 0 else 0.0
            self._v, self._pass = (moved / busy if busy > 0 else 0.0), None
        return self._v

    def set_compute_pass(self, seconds: Sequence[float] | None = None, loads: Loads = ()) -> None:
        """The compute pass of ``seconds`` and ``loads`` starts now (None: it ended)."""
        if self._holds:
            self._integrate()
        self._pass, self._v = (None, 0.0) if seconds is None else ((seconds, loads), 0.0)

    def hold(self, ctas: int, demand: float) -> tuple[int, float]:
        """A communication kernel starts: it holds ``ctas`` SMs and asks HBM for ``demand`` bytes/s. Returns
        what to pass to `release`."""
        self._integrate()
        self._holds += 1
        self.ctas += ctas
        self.demand += demand
        self._wake()
        return ctas, demand

    def release(self, held: tuple[int, float]) -> None:
        self._integrate()
        self._holds -= 1
        self.ctas -= held[0]
        self.demand = self.demand - held[1] if self._holds else 0.0  # no float dust once nothing is in flight
        self._wake()

    def _wake(self) -> None:
        waiting, self.waiting = self.waiting, None
        if waiting is not None:  # the compute pass running now re-plans its rest (`run_pieces`)
            waiting.interrupt("contention")


class Walk:
    """Where a sequence of pieces stands: piece ``k``, nominal seconds of it ``left`` (None: not begun), at
    time ``t``; the (start, end) of the pieces done. A piece begins no earlier than its ``ready`` time (the
    host began dispatching it) and ends no earlier than its ``until`` time (the host finished), as
    `trainsim.sim.compute.dispatch.gpu_spans` has it; its span is its work, ending when it ends. Pieces with
    no host times are walked with numpy (a pass of hundreds of layers, re-planned at every state change)."""

    __slots__ = ("seconds", "sm", "hbm", "launch", "ready", "until", "k", "left", "t", "begin", "spans",
                 "cached")

    def __init__(self, start: float, seconds: Sequence[float], loads: Loads,
                 ready: Sequence[float] | None = None, until: Sequence[float] | None = None):
        self.seconds = np.asarray(seconds, dtype=float)
        pairs = as_pairs(loads)
        self.sm, self.hbm = pairs[:, 0], pairs[:, 1]
        self.launch = 1.0 - np.maximum(self.sm, self.hbm)
        self.ready, self.until = ready, until
        self.k, self.left, self.t, self.begin = 0, None, start, start
        self.spans: list[tuple[float, float]] = []
        self.cached: tuple | None = None

    def _factors(self, state: tuple[float, float], k: int) -> np.ndarray:
        """`factor` of pieces k.. under ``state`` (the last state's kept: a change asks for it twice)."""
        if self.cached is None or self.cached[0] != state:
            s, h = state
            memory = self.hbm * np.maximum(1.0, self.hbm + h)
            self.cached = state, np.maximum(self.sm / s, memory) + self.launch
        return self.cached[1][k:]

    def _ends(self, state: tuple[float, float]) -> np.ndarray:
        """Back to back (no host times): when each piece from k on ends under ``state``."""
        k = self.k
        work = self.seconds[k:] * self._factors(state, k)
        if self.left is not None:
            work[0] = self.left * work[0] / self.seconds[k] if self.seconds[k] > 0 else 0.0
        work[0] += self.t
        return np.cumsum(work)

    def advance(self, now: float, state: tuple[float, float]) -> None:
        """Progress up to ``now`` under ``state`` (what held since the last call); past ``now`` where the
        next step is a wait for the host, which no state changes."""
        n = len(self.seconds)
        if self.k >= n or self.t >= now:
            return
        if self.ready is None:
            ends = self._ends(state)
            done = int(np.searchsorted(ends, now, side="right"))
            starts = [self.t if self.left is None else self.begin, *ends[:done - 1].tolist()]
            self.spans.extend(zip(starts, ends[:done].tolist(), strict=False))
            if done:
                self.t, self.k, self.left = float(ends[done - 1]), self.k + done, None
            if self.k < n:
                k = self.k
                if self.left is None:
                    self.left, self.begin = float(self.seconds[k]), self.t
                f = float(self._factors(state, k)[0])
                self.left -= (now - self.t) / f
                self.t = now
            return
        while self.k < n and self.t < now:
            k = self.k
            if self.left is None:
                self.t = self.begin = max(self.t, self.ready[k])
                self.left = float(self.seconds[k])
                continue
            f = factor((float(self.sm[k]), float(self.hbm[k])), state)
            need = self.left * f
            if self.t + need <= now:
                done = self.t + need
                end = max(done, self.until[k])
                self.spans.append((end - (done - self.begin), end))
                self.t, self.k, self.left = end, k + 1, None
            else:
                self.left -= (now - self.t) / f
                self.t = now

    def end(self, state: tuple[float, float]) -> float:
        """When the last piece ends if ``state`` holds from now on."""
        if self.k >= len(self.seconds):
            return self.t
        if self.ready is None:
            return float(self._ends(state)[-1])
        probe = Walk.__new__(Walk)
        for name in Walk.__slots__:
            setattr(probe, name, getattr(self, name))
        probe.spans = []
        probe.advance(math.inf, state)
        return probe.t

    def finish(self, state: tuple[float, float]) -> list[tuple[float, float]]:
        self.advance(math.inf, state)
        return self.spans


def run_pieces(env: simpy.Environment, contention: Contention | None, start: float, nominal_end: float,
               seconds: Sequence[float], loads: Loads, ready: Sequence[float] | None = None,
               until: Sequence[float] | None = None):
    """A process body: the pieces, from ``start`` (now) on the compute stream the caller holds; nominally
    they end at ``nominal_end``. Returns None where no communication overlapped them (they took their
    nominal spans), else their actual (start, end) spans. Without ``contention`` (interference off, a CPU
    rank, one rank) it is one timeout, as before the model; with it, still one timeout while nothing
    changes (a change interrupts the process, which re-plans the rest under the new state)."""
    if contention is None:
        if nominal_end > start:
            yield env.timeout(nominal_end - start)
        return None
    walk = None
    state = contention.state
    contention.set_compute_pass(seconds, loads)  # its HBM demand takes from the communication's
    try:
        while True:
            state = contention.state
            if walk is None and contention.busy:
                walk = Walk(start, seconds, loads, ready, until)
                walk.advance(env.now, IDLE)  # undisturbed so far
            end = nominal_end if walk is None else walk.end(state)
            if end <= env.now:
                break
            contention.waiting = env.active_process
            try:
                yield env.timeout(end - env.now)
                break
            except simpy.Interrupt:
                if walk is not None:
                    walk.advance(env.now, state)
    finally:
        contention.waiting = None
        contention.set_compute_pass(None)
    return None if walk is None else walk.finish(state)


def warp(nominal: Sequence[tuple[float, float]], actual: Sequence[tuple[float, float]]):
    """``t -> t'``: the piecewise-linear map taking each nominal span's start and end to its actual ones, for
    the records and memory events a pass stamped at its nominal times before it ran (the spans follow one
    another, so their ends are already in order)."""
    import bisect

    xs = [t for span in nominal for t in span]
    ys = [t for span in actual for t in span]

    def to_actual(t: float) -> float:
        i = bisect.bisect_left(xs, t)
        if i < len(xs) and xs[i] == t:
            return ys[i]
        if i == 0:
            return t + ys[0] - xs[0]
        if i == len(xs):
            return t + ys[-1] - xs[-1]
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (t - x0) * (y1 - y0) / (x1 - x0)

    return to_actual


def restamp(machine, memory, ops: tuple[int, int], events: tuple[int, int], to_actual) -> None:
    """Move the ops ``machine`` recorded at indices ``ops`` (first, end) and the memory events ``memory``
    recorded at ``events`` (a pass's, stamped at its nominal times before it ran) to their actual times."""
    for i in range(*ops):
        op = machine.ops[i]
        op.start, op.end = to_actual(op.start), to_actual(op.end)
    timeline = memory.timeline
    for i in range(*events):
        e = timeline[i]
        timeline[i] = type(e)(to_actual(e.time), e.in_use, e.delta, e.category)
