"""Search over parallel layouts of strategy ``mesh``: enumerate, keep those that fit, rank in closed form.

    space = SearchSpace()                       # tp x cp x pp x ep x zero (and HSDP shards) x micro-batch x
                                                # recompute x schedule x virtual stages x sp x context
    ranking = rank_layouts(runs, space, objective=Objective("throughput"))
    ranking.candidates[:10]                     # the best, with memory (`memory`) and time (`analytic`)

A `Run` per GPU count gives the model, topology, batch, precision and optimizer; every layout the space
holds that the model, the GPUs and the batch admit (the same rules the strategy checks) is costed by
`memory.layout_memory` (per-GPU peak, the worst pipeline stage; physical count) and, where it fits the
GPU's memory, timed by `analytic.LayoutTimer`; the objective orders them. The API (`trainsim.api.search`)
then simulates the best few in full with strategy ``mesh`` and orders those by the simulated figure.

Objectives (`Objective`): ``throughput`` (tokens per second), ``time`` (to train ``tokens``), ``gpu-hours``
(GPUs x that time), ``energy`` (the GPUs at their rated board power, ``tdp_watts``, for that time: an upper
bound, GPUs seldom draw their TDP throughout) and ``cost`` (GPU-hours x a price per GPU-hour). For one GPU
count they all order layouts alike; across GPU counts (``gpus: [512, 1024]``) they differ.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from trainsim.errors import TrainsimError, unknown_name

from .analytic import IterationTime, LayoutTimer
from .memory import StageMemory, layout_memory
from .stage_costs import Layout, ModelCosts

__all__ = ["OBJECTIVES", "Candidate", "Objective", "Ranking", "SearchSpace", "balanced_blocks",
           "enumerate_layouts", "rank_layouts"]

OBJECTIVES = ("throughput", "time", "gpu-hours", "energy", "cost")
GIB = 2**30


def mesh_supports_virtual_stages() -> bool:
    """Whether the scenario schema's ``strategy.mesh`` has ``virtual_stages`` (interleaved 1F1B)."""
    from trainsim.formats.scenario_options import MeshOptions

    return "virtual_stages" in MeshOptions.model_fields


@dataclass(frozen=True)
class SearchSpace:
    """The values each dimension may take; None: the defaults that follow from the model and machine
    (tp: powers of two up to a machine's GPUs; cp: 1, 2, 4, 8; pp: powers of two up to 32 that leave two
    blocks a stage; ep: powers of two dividing the experts; HSDP shards of one and four machines' worth)."""

    tp: tuple[int, ...] | None = None
    cp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    ep: tuple[int, ...] | None = None
    zero: tuple[int, ...] = (0, 1, 2, 3)
    hsdp: bool = True
    micro_batch: tuple[int, ...] = (1, 2, 4)
    recompute: tuple[str, ...] = ("none", "selective", "full")
    # zb-h1 on request (``schedule=("1f1b", "gpipe", "zb-h1")``): its pass order is replayed per layout, which
    # takes the ranking of a 70B on 1,024 GPUs from about 11 s to 18-21 s on two shared cores
    schedule: tuple[str, ...] = ("1f1b", "gpipe")
    virtual_stages: tuple[int, ...] = (1, 2, 4)
    sequence_parallel: tuple[bool, ...] = (True, False)
    async_tp: tuple[bool, ...] = (False,)  # (False, True): also async TP where sequence parallelism is on
    context: tuple[str, ...] = ("allgather", "ring")


@dataclass(frozen=True)
class Objective:
    """What to minimise or maximise (see the module); ``tokens``: to train (time, GPU-hours, energy, cost);
    ``price``: per GPU-hour (cost); ``tdp_watts``: per GPU (energy)."""

    name: str = "throughput"
    tokens: float | None = None
    price: float | None = None
    tdp_watts: float | None = None

    def __post_init__(self):
        if self.name not in OBJECTIVES:
            raise unknown_name("objective", self.name, OBJECTIVES, field="--objective")
        if self.name != "throughput" and not self.tokens:
            raise TrainsimError(f"objective {self.name} is for training a number of tokens: give --tokens N",
                                field="--tokens")
        if self.name == "cost" and not self.price:
            raise TrainsimError("objective cost needs --price-per-gpu-hour", field="--price-per-gpu-hour")
        if self.name == "energy" and not self.tdp_watts:
            raise TrainsimError("objective energy needs the GPUs' rated power (tdp_watts), which their "
                                "device spec lacks", field="--objective")

    def figures(self, gpus: int, tokens_per_step: float, step_s: float) -> dict:
        """Every figure of one layout at ``step_s`` seconds per step."""
        rate = tokens_per_step / step_s if step_s > 0 else float("inf")
        out = {"tokens_per_s": rate, "step_s": step_s}
        if self.tokens:
            seconds = self.tokens / rate
            out["time_to_train_s"] = seconds
            out["gpu_hours"] = gpus * seconds / 3600
            if self.tdp_watts:
                out["energy_kwh_upper_bound"] = self.tdp_watts * gpus * seconds / 3.6e6
            if self.price:
                out["cost"] = self.price * out["gpu_hours"]
        return out

    def score(self, figures: dict) -> float:
        """Smaller is better."""
        key = {"throughput": "tokens_per_s", "time": "time_to_train_s", "gpu-hours": "gpu_hours",
               "energy": "energy_kwh_upper_bound", "cost": "cost"}[self.name]
        return -figures[key] if self.name == "throughput" else figures[key]


@dataclass
class Candidate:
    """One layout: its per-GPU memory peak (closed form), predicted step and, once simulated, the
    simulation's figures."""

    gpus: int
    layout: Layout
    memory: StageMemory
    predicted: IterationTime
    figures: dict  # `Objective.figures` of the predicted step
    score: float
    simulated_step_s: float | None = None
    simulated_memory: float | None = None
    simulated_oom: bool | None = None
    simulated_figures: dict | None = None

    @property
    def label(self) -> str:
        return self.layout.label(self.gpus)

    def to_dict(self) -> dict:
        out = {"gpus": self.gpus, "layout": self.label, "mesh": self.layout.mesh_options(),
               "memory_peak_gib": self.memory.peak / GIB, "memory": {k: v / GIB if isinstance(v, float) else v
                                                                  for k, v in self.memory.to_dict().items()},
               "predicted_step_s": self.predicted.iteration_s, "predicted": self.predicted.to_dict(),
               "predicted_figures": self.figures}
        if self.simulated_step_s is not None:
            out.update(simulated_step_s=self.simulated_step_s,
                       simulated_memory_peak_gib=self.simulated_memory / GIB,
                       simulated_oom=self.simulated_oom, simulated_figures=self.simulated_figures,
                       analytic_vs_simulated=self.predicted.iteration_s / self.simulated_step_s - 1)
        return out


@dataclass
class Ranking:
    """Every layout that fits, best first (``candidates``), and what the search saw."""

    candidates: list[Candidate]
    enumerated: int
    fitting: int
    capacity: dict[int, float]  # GPU count -> bytes per GPU
    least_memory: float | None  # the smallest peak of any layout (bytes), when none fits
    seconds: float
    per_gpus: dict[int, int] = field(default_factory=dict)  # GPU count -> layouts enumerated


def balanced_blocks(blocks: int, chunks: int) -> list[int] | None:
    """Blocks per pipeline chunk when ``chunks`` does not divide them: the extra blocks to the middle
    chunks (the first carries the embedding, the last the head), as Llama 3 405B's 7, 8 x 14, 7; None when
    they divide evenly (the default split) or a chunk would get none."""
    if blocks % chunks == 0:
        return None
    base, extra = divmod(blocks, chunks)
    if base < 1:
        return None
    counts = [base] * chunks
    middle = list(range(1, chunks - 1)) or list(range(chunks))
    order = middle + [i for i in range(chunks) if i not in middle]
    for i in order[:extra]:
        counts[i] += 1
    return counts


def _powers(limit: int) -> list[int]:
    out, k = [], 1
    while k <= limit:
        out.append(k)
        k *= 2
    return out


def enumerate_layouts(model: ModelCosts, gpus: int, batch: int, space: SearchSpace, *,
                      gpus_per_machine: int = 8, virtual: bool | None = None) -> list[Layout]:
    """Every layout of ``space`` that the model (heads, KV heads, blocks, experts, sequence), ``gpus`` and
    the global ``batch`` (sequences) admit."""
    cfg = model.config
    heads = cfg.get("num_attention_heads", 1)
    kv = cfg.get("num_key_value_heads") or heads
    seq = cfg.get("seq_len", 1)
    experts = cfg.get("num_local_experts") or 0
    causal = cfg.get("causal", True)
    blocks = model.n_blocks
    virtual = mesh_supports_virtual_stages() if virtual is None else virtual
    tps = space.tp or [t for t in _powers(gpus_per_machine)]
    tps = [t for t in tps if gpus % t == 0 and heads % t == 0 and (kv % t == 0 or t % kv == 0)]
    cps = [c for c in (space.cp or (1, 2, 4, 8)) if c == 1 or seq % (2 * c if causal else c) == 0]
    out = []
    for tp, cp in itertools.product(tps, cps):
        if gpus % (tp * cp):
            continue
        rest = gpus // (tp * cp)
        pps = space.pp or [p for p in _powers(min(32, rest)) if p == 1 or blocks // p >= 2]
        for pp in pps:
            if rest % pp or pp > blocks:
                continue
            dp = rest // pp
            eps = space.ep or ([e for e in _powers(min(experts, dp)) if experts % e == 0] if experts else [1])
            shards = [None]
            if space.hsdp and dp > 1:
                per_machine = max(1, gpus_per_machine // (tp * cp))
                shards += [s for s in (per_machine, 4 * per_machine) if 1 < s < dp and dp % s == 0]
            sps = [s for s in space.sequence_parallel if tp > 1 or not s] or [False]
            contexts = list(space.context) if cp > 1 else ["allgather"]
            for ep, mb in itertools.product(eps, space.micro_batch):
                if dp % ep or (ep > 1 and (not experts or experts % ep)) or batch % (dp * mb):
                    continue
                M = batch // (dp * mb)
                # interleaving: whole blocks per chunk, as Megatron-LM asks (layers over pp x v)
                vs = [v for v in space.virtual_stages
                      if v == 1 or (virtual and pp > 1 and M % pp == 0 and blocks % (pp * v) == 0)]
                for v in vs:
                    stage_blocks = balanced_blocks(blocks, pp) if v == 1 else None
                    if v == 1 and blocks % pp and stage_blocks is None:
                        continue
                    split = tuple(stage_blocks) if stage_blocks else None
                    scheds = [s for s in space.schedule if pp > 1 and (v == 1 or s == "1f1b")]
                    if pp == 1:
                        scheds = ["1f1b"]  # no pipeline: the schedule does not matter
                    elif not scheds:
                        continue  # interleaving is 1F1B's, and the space does not hold it
                    for schedule, sp, zero in itertools.product(scheds, sps, space.zero):
                        asyncs = [a for a in space.async_tp if sp or not a] or [False]
                        for shard, rc, context, at in itertools.product(shards if zero >= 1 else [None],
                                                                        space.recompute, contexts, asyncs):
                            out.append(Layout(tp=tp, cp=cp, pp=pp, ep=ep, zero=zero, shard=shard,
                                              sequence_parallel=sp, micro_batch=mb, recompute=rc,
                                              schedule=schedule, stage_blocks=split, context=context,
                                              virtual_stages=v, async_tp=at))
    return out


def rank_layouts(targets: Sequence[tuple[int, ModelCosts, LayoutTimer, float]], batch: int,
                 tokens_per_step: float, space: SearchSpace, objective: Objective, *,
                 gpus_per_machine: int = 8, headroom: float = 0.0,
                 progress: Callable[[int, int], None] | None = None) -> Ranking:
    """Rank every admissible layout for each (gpus, model costs, timer, GPU memory bytes) target: those
    whose closed-form peak fits ``capacity x (1 - headroom)``, best ``objective`` first."""
    start = time.perf_counter()
    layouts = {g: enumerate_layouts(m, g, batch, space, gpus_per_machine=gpus_per_machine)
               for g, m, _, _ in targets}
    total = sum(len(v) for v in layouts.values())
    done, fitting, least = 0, [], None
    capacity = {}
    for gpus, model, timer, mem in targets:
        limit = mem * (1 - headroom)
        capacity[gpus] = mem
        for layout in layouts[gpus]:
            peak = layout_memory(model, layout, gpus, batch)
            done += 1
            if progress is not None and done % 256 == 0:
                progress(done, total)
            if peak.peak > limit:
                least = peak.peak if least is None else min(least, peak.peak)
                continue
            predicted = timer.time(layout)
            figures = objective.figures(gpus, tokens_per_step, predicted.iteration_s)
            fitting.append(Candidate(gpus, layout, peak, predicted, figures, objective.score(figures)))
    if progress is not None:
        progress(total, total)
    fitting.sort(key=lambda c: (c.score, c.memory.peak))
    return Ranking(fitting, total, len(fitting), capacity, least if not fitting else None,
                   time.perf_counter() - start, {g: len(v) for g, v in layouts.items()})


def replace_layout(layout: Layout, **changes) -> Layout:
    return dataclasses.replace(layout, **changes)


# ---- the report ------------------------------------------------------------------------------------------

PLOT_AXES = {"memory": "per-GPU memory peak (GiB)", "gpu-hours": "GPU-hours to train the tokens",
             "cost": "cost to train the tokens", "energy": "energy to train the tokens (kWh, at rated power)",
             "gpus": "GPUs"}


@dataclass
class SearchReport:
    """What `trainsim.api.search` found: the ranking's figures and the best layouts, simulated."""

    model: str
    device: str
    gpus: list[int]
    batch: int
    seq_len: int
    objective: Objective
    ranking: Ranking
    top: list[Candidate]  # simulated, best simulated first
    simulate_seconds: float
    collectives: str
    notes: list[str] = field(default_factory=list)

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.seq_len

    def to_dict(self) -> dict:
        r = self.ranking
        return {
            "schema": "trainsim.search/1",
            "model": self.model, "device": self.device, "gpus": self.gpus, "batch": self.batch,
            "seq_len": self.seq_len, "tokens_per_step": self.tokens_per_step,
            "objective": self.objective.name, "tokens": self.objective.tokens,
            "price_per_gpu_hour": self.objective.price, "tdp_watts": self.objective.tdp_watts,
            "enumerated": r.enumerated, "fitting": r.fitting, "ranked_s": r.seconds,
            "simulated": len(self.top), "simulate_s": self.simulate_seconds, "collectives": self.collectives,
            "memory_per_gpu_gib": {str(g): c / GIB for g, c in r.capacity.items()},
            "least_memory_gib": None if r.least_memory is None else r.least_memory / GIB,
            "top": [dict(rank=i + 1, **c.to_dict()) for i, c in enumerate(self.top)],
            "notes": self.notes,
        }

    def figure(self, c: Candidate, key: str) -> float | None:
        figures = c.simulated_figures or c.figures
        return figures.get(key)


def plot_search(report: SearchReport, path, x: str = "memory") -> None:
    """Throughput (tokens/s) of every layout that fits against ``x`` (`PLOT_AXES`), the analytic Pareto
    front marked and the simulated best numbered, to the PNG ``path``."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from trainsim.files import write_atomic

    if x not in PLOT_AXES:
        raise unknown_name("plot axis", x, PLOT_AXES, field="--plot-x")
    key = {"gpu-hours": "gpu_hours", "cost": "cost", "energy": "energy_kwh_upper_bound"}.get(x)

    def xval(c: Candidate, figures: dict) -> float | None:
        if x == "memory":
            return c.memory.peak / GIB
        if x == "gpus":
            return float(c.gpus)
        return figures.get(key)

    if key is not None and xval(report.ranking.candidates[0], report.ranking.candidates[0].figures) is None:
        need = {"gpu-hours": "--tokens", "cost": "--tokens and --price-per-gpu-hour",
                "energy": "--tokens (and a GPU with a rated power)"}[x]
        raise TrainsimError(f"a plot against {x} needs {need}", field="--plot-x")
    points = [(xval(c, c.figures), c.figures["tokens_per_s"]) for c in report.ranking.candidates]
    front = pareto_front(points)
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    ax.scatter([p[0] for p in points], [p[1] for p in points], s=6, color="0.75", label="layouts (analytic)",
               zorder=2)
    ax.plot([points[i][0] for i in front], [points[i][1] for i in front], "o-", color="tab:red", ms=3,
            label="Pareto front (analytic)", zorder=3)
    sim = [(xval(c, c.simulated_figures or c.figures), (c.simulated_figures or c.figures)["tokens_per_s"])
           for c in report.top]
    ax.scatter([p[0] for p in sim], [p[1] for p in sim], color="tab:blue", marker="*", s=60,
               label="simulated best", zorder=4)
    for i, p in enumerate(sim):
        ax.annotate(str(i + 1), p, textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel(PLOT_AXES[x])
    ax.set_ylabel("throughput (tokens/s)")
    ax.set_title(f"{report.model} on {', '.join(map(str, report.gpus))} x {report.device}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    plt.close(fig)
    write_atomic(path, buffer.getvalue())


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the (x, y) points no other beats on both (x as small, y as large, better in one), by x
    (as `trainsim.sweeps.plot.pareto_front`, which sim/ does not import)."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best = [], float("-inf")
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def write_report(doc: dict, path) -> None:
    """The search document (``trainsim.search/1`` with provenance) as JSON, atomically."""
    import json

    from trainsim.files import write_atomic

    write_atomic(path, json.dumps(doc, indent=1, default=str) + "\n")


# ---- inputs ------------------------------------------------------------------------------------------------

def transformer_config_of(workload) -> dict:
    """The model config of an analytic transformer workload; any other is one line (the search splits a
    transformer's layers)."""
    from .split import transformer_config

    cfg = transformer_config(workload)
    if cfg is None:
        raise TrainsimError(f"workload {workload.name!r} is not an analytic transformer; the search splits a "
                            "transformer's layers (`trainsim workload list`: llama3-8b, llama3-70b, ...)",
                            field="--model")
    return cfg


def gpus_per_machine(topology) -> int:
    """GPUs in one machine (the first): tensor parallelism's default reach."""
    first = topology.machine_of(topology.gpus[0])
    return sum(1 for g in topology.gpus if topology.machine_of(g) == first)


def no_layout_reason(model: ModelCosts, counts: list[int], batch: int, space: SearchSpace,
                     per_machine: int) -> str:
    """Why no layout was enumerated, with GPU counts near the asked ones that admit some."""
    near = []
    for n in counts:
        for delta in range(1, max(2, n)):
            for m in (n - delta, n + delta):
                if m >= 1 and enumerate_layouts(model, m, batch, dataclasses.replace(
                        space, zero=(0,), recompute=("none",), sequence_parallel=(False,),
                        context=("allgather",), schedule=("1f1b",), virtual_stages=(1,)),
                        gpus_per_machine=per_machine):
                    near.append(m)
            if near:
                break
    asked = ", ".join(map(str, counts))
    valid = f"; valid GPU counts near it: {', '.join(map(str, sorted(set(near))))}" if near else ""
    return (f"no layout of {model.workload.name} splits {asked} GPUs with a global batch of {batch} "
            f"sequences (tp x cp x pp x dp = GPUs, the batch a multiple of dp x micro_batch){valid}")
