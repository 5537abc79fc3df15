"""`trainsim plan`: choose each layer's decomposition (samples x height x width) with a fast performance
model.

As Dryden et al. do, the model is per-layer compute plus alpha-beta communication, and a dynamic program over
the layers picks the grid of each layer minimising the sum of layer costs and of the redistribution costs
between consecutive layers. The pieces are the simulator's own (sim/spatial/decomposition.py): the same slab
compute times,
the same halo and redistribution bytes; links come from the topology: a point-to-point transfer takes the
route's latency plus bytes over its bottleneck bandwidth (staged legs one after the other without P2P).

- Layer cost (worst rank of the first sample group): forward ``max(interior, halo) + boundary``, the same in
  backward with the output-gradient halo; the halo to several neighbours goes out at once.
- Redistribution (forward activation + backward gradient): per receiving rank, its incoming pieces one after
  the other (they share its ingress link); the largest latency and per-byte terms over the ranks (an upper
  bound of the slowest rank).
- Input copies: every rank's slab from host memory, on the most loaded link of its route (GPUs under one
  PCIe switch share its uplink).
- Weight-gradient all-reduce: DDP's buckets replayed against the plan's backward (the analytic collective
  time per bucket, a bucket starting when backward has produced it and the previous one is done); its exposed
  tail is added once the plan is chosen (it barely depends on the decomposition, as every plan all-reduces
  every weight over all GPUs).

What the model leaves out, the simulator has: link sharing between the other concurrent flows (halo sends
sharing a PCIe switch, redistribution flows crossing the network), the all-reduce competing with halos. So
the final figures (:func:`plan` with ``simulate=True``) come from simulating the chosen plan and pure data
parallelism.
Memory is not a constraint of the search; the simulated peak of the chosen plan is reported.

It stays one module: the fast per-layer cost model and the dynamic programme over the layers that
uses it are one planner; comparing the plan with its simulation is a thin end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

from trainsim.errors import TrainsimError
from trainsim.formats.workload import Workload
from trainsim.sim.compute.costs import RankCosts
from trainsim.sim.spatial.decomposition import (
    Grid,
    boundary_share,
    data_grad_share,
    grid_str,
    halo_bytes,
    neighbours,
    redistribution_units,
    slab_costs,
    trunk_end,
)
from trainsim.sim.strategies.ddp import assign_buckets

BUCKET_CAP = 25 * 2**20
FIRST_BUCKET_CAP = 2**20


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidate_grids(workload: Workload, n: int, batch: int) -> list[list[Grid]]:
    """Per layer, the grids a plan may give it: trunk layers any ``(S, H, W)`` with ``S*H*W | n``
    (replicated over the rest), ``S | batch`` and ``H, W`` dividing the output of the surrounding
    convolutions; head layers ``(S, 1, 1)`` with ``S | n`` and ``S | batch``."""
    head = trunk_end(workload)
    convs = [i for i, layer in enumerate(workload.layers) if layer.spatial is not None]
    # S*H*W may be a divisor of n (the rest replicate the slab): what a layer too small to split takes
    full = [
        (s, h, w)
        for s in _divisors(n)
        if batch % s == 0
        for h in _divisors(n // s)
        for w in _divisors(n // (s * h))
    ]
    out = []
    for i in range(len(workload.layers)):
        if i >= head:
            out.append([(s, 1, 1) for s in _divisors(n) if batch % s == 0])
            continue
        around = [j for j in convs if j == i] or [j for j in convs if j < i][-1:] + [
            j for j in convs if j > i
        ][:1]
        grids = [
            g
            for g in full
            if all(
                workload.layers[j].spatial.out_h % g[1] == 0 and workload.layers[j].spatial.out_w % g[2] == 0
                for j in around
            )
        ]
        # replicating a slab only pays where no grid uses every GPU (a layer too small to split further)
        whole = [g for g in grids if math.prod(g) == n]
        out.append(whole or grids)
    if any(not grids for grids in out):
        bad = workload.layers[[i for i, g in enumerate(out) if not g][0]].name
        raise TrainsimError(
            f"no decomposition of layer {bad!r} fits {n} GPUs and batch {batch}", field="gpus"
        )
    return out


@dataclass
class PerfModel:
    """Seconds of a per-layer decomposition on a topology, from compute and alpha-beta communication."""

    workload: Workload
    topology: object
    ranks: list[str]
    batch: int
    device: object
    precision: str = "fp32"
    optimizer: str = "sgd"
    measured_on: object = None
    _costs: dict = field(default_factory=dict, repr=False)
    _p2p: dict = field(default_factory=dict, repr=False)
    _moves: dict = field(default_factory=dict, repr=False)
    _layer: dict = field(default_factory=dict, repr=False)
    _input_routes: tuple | None = field(default=None, repr=False)

    @property
    def n(self) -> int:
        return len(self.ranks)

    @property
    def element_bytes(self) -> int:
        from trainsim.sim.compute.costs import WEIGHT_BYTES

        return WEIGHT_BYTES[self.precision]

    def costs(self, grid: Grid) -> RankCosts:
        key = (self.batch // grid[0], Fraction(1, grid[1] * grid[2]))
        if key not in self._costs:
            self._costs[key] = slab_costs(
                self.workload,
                self.device,
                key[0],
                key[1],
                self.precision,
                self.optimizer,
                measured_on=self.measured_on,
            )
        return self._costs[key]

    def p2p(self, src: int, dst: int, nbytes: float) -> float:
        """Alpha-beta seconds of a copy between ranks (staged legs in sequence where there is no P2P)."""
        key = (src, dst)
        if key not in self._p2p:
            topo = self.topology
            legs = topo.gpu_copy_legs(self.ranks[src], self.ranks[dst])
            self._p2p[key] = [(topo.route_latency(leg), topo.bottleneck(leg)) for leg in legs]
        return sum(alpha + nbytes / beta for alpha, beta in self._p2p[key])

    def _group(self, grid: Grid) -> list[int]:
        """The ranks of the first sample group, one per replica set (the others are symmetric)."""
        replicas = self.n // math.prod(grid)
        return list(range(0, self.n // grid[0], replicas))

    def layer_cost(self, i: int, grid: Grid) -> float:
        """Forward + backward seconds of layer ``i`` under ``grid`` on its slowest rank, halos overlapped."""
        key = (i, grid)
        if key not in self._layer:
            self._layer[key] = self._layer_cost(i, grid)
        return self._layer[key]

    def _layer_cost(self, i: int, grid: Grid) -> float:
        costs = self.costs(grid)
        layer = self.workload.layers[i]
        if layer.spatial is None or grid[1] * grid[2] == 1:
            return costs.forward_s[i] + costs.backward_s[i]
        # per rank of the first sample group: its neighbours and the share of its slab that waits for them
        ranks = [(r, neighbours(grid, self.n, r)) for r in self._group(grid)]
        shares: dict[tuple[int, int], float] = {}
        total = 0.0
        for direction, seconds in (("forward", costs.forward_s[i]), ("backward", costs.backward_s[i])):
            waits = 1.0 if direction == "forward" else data_grad_share(layer, i)
            if waits == 0:
                total += seconds
                continue
            nbytes = {
                axis: halo_bytes(layer, grid, self.batch, self.element_bytes, axis, direction)
                for axis in ("h", "w")
            }
            worst = 0.0
            for r, peers in ranks:
                halo = max((self.p2p(r, peer, nbytes[axis]) for peer, axis in peers), default=0.0)
                axes = [axis for _, axis in peers]
                key = (axes.count("h"), axes.count("w"))
                if key not in shares:
                    shares[key] = boundary_share(layer, grid, *key)
                share = shares[key] * waits
                worst = max(worst, max(seconds * (1 - share), halo) + seconds * share)
            total += worst
        return total

    def _move_terms(self, src: Grid, dst: Grid) -> tuple[float, float]:
        """``(latency, seconds per byte of the whole tensor)`` of the slowest receiving rank (each term's
        maximum over ranks: an upper bound), a rank receiving its pieces one after the other."""
        key = (src, dst)
        if key not in self._moves:
            per_rank: dict[int, list[float]] = {}
            moves, denominator = redistribution_units(src, dst, self.n)
            for s, d, units in moves:
                if (s, d) not in self._p2p:
                    self.p2p(s, d, 0.0)
                terms = per_rank.setdefault(d, [0.0, 0.0])
                for alpha, beta in self._p2p[s, d]:
                    terms[0] += alpha
                    terms[1] += units / denominator / beta
            self._moves[key] = (
                max((t[0] for t in per_rank.values()), default=0.0),
                max((t[1] for t in per_rank.values()), default=0.0),
            )
        return self._moves[key]

    def move_cost(self, i: int, a: Grid, b: Grid) -> float:
        """Seconds of the redistribution before layer ``i`` from ``a`` to ``b`` (forward and backward)."""
        if a == b:
            return 0.0
        whole = (
            self.workload.layers[i - 1].output_bytes_per_sample
            * self.element_bytes
            / self.workload.itemsize
            * self.batch
        )
        total = 0.0
        for src, dst in ((a, b), (b, a)):
            alpha, per_byte = self._move_terms(src, dst)
            total += alpha + whole * per_byte if per_byte > 0 else 0.0
        return total

    def input_time(self, grid: Grid) -> float:
        """Seconds of every rank's input copy (its slab of its samples) from its host memory, the copies
        sharing the links their routes have in common (a PCIe switch's uplink, the host's DRAM)."""
        if self._input_routes is None:
            topo = self.topology
            routes = [topo.route(topo.host_memory(g), g) for g in self.ranks]
            load: dict = {}
            for route in routes:
                for edge in route:
                    load[edge] = load.get(edge, 0) + 1
            # seconds per byte of one rank's copy on the most loaded link of each route, and the latency
            per_byte = max(max(load[e] / topo.graph.edges[e]["bandwidth"] for e in route) for route in routes)
            self._input_routes = (max(topo.route_latency(r) for r in routes), per_byte)
        latency, per_byte = self._input_routes
        nbytes = self.batch // grid[0] * self.workload.input.bytes_per_sample / (grid[1] * grid[2])
        return latency + nbytes * per_byte

    def allreduce_tail(self, grids: list[Grid]) -> float:
        """Exposed seconds of DDP-style bucketed all-reduce after the plan's backward ends."""
        from trainsim.sim.collectives.ops import collective_time

        if self.n < 2:
            return 0.0
        base = self.costs(grids[0])
        buckets = assign_buckets(base.grad_bytes_per_layer, BUCKET_CAP, FIRST_BUCKET_CAP)
        done_at, t = {}, 0.0
        for i in reversed(range(len(grids))):
            t += self.costs(grids[i]).backward_s[i]
            done_at[i] = t
        finish = 0.0
        for bucket in buckets:
            nbytes = sum(base.grad_bytes_per_layer[i] for i in bucket)
            finish = max(finish, done_at[bucket[-1]]) + collective_time(
                self.topology, "allreduce", self.ranks, nbytes
            )
        return max(0.0, finish - t)

    def predict(self, grids: list[Grid]) -> float:
        """Model seconds of one iteration under ``grids``."""
        layers = sum(self.layer_cost(i, g) for i, g in enumerate(grids))
        moves = sum(self.move_cost(i, grids[i - 1], grids[i]) for i in range(1, len(grids)))
        return (
            self.input_time(grids[0])
            + layers
            + moves
            + self.allreduce_tail(grids)
            + self.costs(grids[0]).step_s
        )

    def best(self, candidates: list[list[Grid]]) -> tuple[list[Grid], float]:
        """Dynamic programming over the layers: the grids minimising layer + redistribution costs."""
        best = {g: self.layer_cost(0, g) + self.input_time(g) for g in candidates[0]}
        back: list[dict[Grid, Grid]] = []
        for i in range(1, len(candidates)):
            here, choice = {}, {}
            for g in candidates[i]:
                cost, prev = min((best[p] + self.move_cost(i, p, g), p) for p in best)
                here[g] = cost + self.layer_cost(i, g)
                choice[g] = prev
            best = here
            back.append(choice)
        last = min(best, key=lambda g: (best[g], g))
        grids = [last]
        for choice in reversed(back):
            grids.append(choice[grids[-1]])
        grids.reverse()
        return grids, self.predict(grids)


@dataclass
class Plan:
    """The chosen per-layer decomposition and what it buys over data parallelism."""

    workload: str
    topology: str
    gpus: int
    batch: int
    layer_names: list[str]
    grids: list[Grid]
    model_s: float  # the model's iteration time of the plan
    dp_grids: list[Grid] | None  # pure data parallelism on all GPUs, when the batch allows it
    model_dp_s: float | None
    simulated_s: float | None = None
    simulated_dp_s: float | None = None
    dp_label: str = ""
    memory_peak_bytes: float | None = None
    dp_gpus: int | None = None
    memory_dp_peak_bytes: float | None = None
    memory_capacity_bytes: float | None = None  # the smallest memory of the GPUs the plan runs on
    notes: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool | None:
        """Whether the plan's simulated peak fits every GPU's memory (None when not simulated)."""
        if self.memory_peak_bytes is None or self.memory_capacity_bytes is None:
            return None
        return self.memory_peak_bytes <= self.memory_capacity_bytes

    @property
    def dp_fits(self) -> bool | None:
        """Whether data parallelism's simulated peak fits (None when not simulated)."""
        if self.memory_dp_peak_bytes is None or self.memory_capacity_bytes is None:
            return None
        return self.memory_dp_peak_bytes <= self.memory_capacity_bytes

    def runs(self) -> list[dict]:
        """The plan as runs of consecutive layers sharing a grid."""
        out: list[dict] = []
        for name, g in zip(self.layer_names, self.grids, strict=True):
            if out and out[-1]["grid"] == list(g):
                out[-1]["last"], out[-1]["layers"] = name, out[-1]["layers"] + 1
            else:
                out.append({"grid": list(g), "first": name, "last": name, "layers": 1})
        return out

    @property
    def layer_grids(self) -> dict[str, list[int]]:
        return {name: list(g) for name, g in zip(self.layer_names, self.grids, strict=True)}

    @property
    def speedup(self) -> float | None:
        if self.simulated_s and self.simulated_dp_s:
            return self.simulated_dp_s / self.simulated_s
        return None

    def to_dict(self) -> dict:
        return {
            "schema": "trainsim.plan/1",
            "workload": self.workload,
            "topology": self.topology,
            "gpus": self.gpus,
            "batch_size": self.batch,
            "plan": self.runs(),
            "layer_grids": self.layer_grids,
            "model_s": self.model_s,
            "model_dp_s": self.model_dp_s,
            "simulated_s": self.simulated_s,
            "simulated_dp_s": self.simulated_dp_s,
            "data_parallel": self.dp_label,
            "speedup_vs_data_parallel": self.speedup,
            "memory_peak_bytes": self.memory_peak_bytes,
            "data_parallel_gpus": self.dp_gpus,
            "data_parallel_memory_peak_bytes": self.memory_dp_peak_bytes,
            "memory_capacity_bytes": self.memory_capacity_bytes,
            "fits": self.fits,
            "data_parallel_fits": self.dp_fits,
            "notes": self.notes,
        }


def make_model(
    workload: Workload,
    topology,
    batch: int,
    gpus: int | None = None,
    precision: str = "fp32",
    optimizer: str = "sgd",
) -> PerfModel:
    """The performance model of ``workload`` on the first ``gpus`` GPUs of ``topology`` (default all)."""
    from trainsim.sim.core.devices import get_device

    if batch < 1:
        raise TrainsimError(f"batch must be >= 1, got {batch}", field="batch")
    if gpus is not None and not 1 <= gpus <= len(topology.gpus):
        raise TrainsimError(
            f"asks for {gpus} GPUs but topology {topology.name!r} has {len(topology.gpus)}", field="gpus"
        )
    ranks = topology.gpus[: gpus or len(topology.gpus)]
    specs = {topology.gpu_spec(g) for g in ranks}
    if len(specs) > 1:
        raise TrainsimError(
            f"spatial decomposition needs identical GPUs, got {', '.join(sorted(specs))}", field="gpus"
        )
    device = get_device(topology.gpu_spec(ranks[0]))
    return PerfModel(workload, topology, ranks, batch, device, precision, optimizer)


def choose(
    workload: Workload,
    topology,
    batch: int,
    gpus: int | None = None,
    precision: str = "fp32",
    optimizer: str = "sgd",
) -> Plan:
    """The model's best per-layer plan and its figures next to pure data parallelism (no simulation)."""
    model = make_model(workload, topology, batch, gpus, precision, optimizer)
    grids, seconds = model.best(candidate_grids(workload, model.n, batch))
    dp = [(model.n, 1, 1)] * len(workload.layers) if batch % model.n == 0 else None
    return Plan(
        workload.name,
        topology.name,
        model.n,
        batch,
        [layer.name for layer in workload.layers],
        grids,
        seconds,
        dp,
        model.predict(dp) if dp else None,
    )


def _simulate(base: dict, strategy: dict, gpus: int, batch: int, workload: Workload, topology):
    """The Result of ``base`` with ``strategy`` on the first ``gpus`` GPUs of ``topology`` at ``batch``."""
    from trainsim.formats.scenario import validate_scenario
    from trainsim.sim.run import Run, rank_names
    from trainsim.sim.simulation import Simulation

    data = {**base, "strategy": {**base.get("strategy", {}), **strategy}, "gpus": gpus, "batch_size": batch}
    data.pop("batch_per_gpu", None)
    sc = validate_scenario(data)
    run = Run(scenario=sc, topology=topology, workload=workload, ranks=rank_names(sc, topology))
    return Simulation(run).run()


def plan(
    workload: Workload,
    topology,
    batch: int,
    gpus: int | None = None,
    precision: str = "fp32",
    optimizer: str = "sgd",
    *,
    simulate: bool = True,
    base: dict | None = None,
    collectives: str = "flow",
    symmetric: bool = False,
    simulate_dp: bool = True,
) -> Plan:
    """Choose the plan with the model; with ``simulate``, simulate it and pure data parallelism (``ddp`` on
    all GPUs, or on the most GPUs dividing the batch when it is smaller) for the final figures.

    ``symmetric`` (needs ``collectives="analytic"``): simulate one block of sample groups and mirror it
    (``strategy.symmetric_ranks``), data parallelism as the equivalent ``hybrid`` grid ``[GPUs, 1, 1]``; for
    large GPU counts.
    """
    result = choose(workload, topology, batch, gpus, precision, optimizer)
    if not simulate:
        return result
    base = dict(base or {})
    base.setdefault("name", "plan")
    base.update(
        topology=base.get("topology", topology.name),
        workload=base.get("workload", workload.name),
        precision=precision,
        optimizer={"name": optimizer},
    )
    base.setdefault("iterations", 1)
    base.setdefault("warmup_iterations", 1)
    common = {"collectives": collectives, "symmetric_ranks": symmetric, "grid": None, "layer_grids": None}
    hybrid = {**common, "name": "hybrid", "layer_grids": result.layer_grids}
    res = _simulate(base, hybrid, result.gpus, batch, workload, topology)
    result.simulated_s = res.iteration_time_s
    result.memory_peak_bytes = max(g.memory_peak_bytes for g in res.gpus)
    result.memory_capacity_bytes = min(g.memory_capacity_bytes for g in res.gpus)
    dp_gpus = data_parallel_gpus(batch, result.gpus)
    result.dp_gpus = dp_gpus
    result.dp_label = f"ddp on {dp_gpus} GPUs" + (
        "" if dp_gpus == result.gpus else f" (batch {batch} cannot split over {result.gpus})"
    )
    if simulate_dp:  # (a caller scaling over GPU counts may already have it)
        ddp = (
            {**common, "name": "hybrid", "grid": [dp_gpus, 1, 1]} if symmetric else {**common, "name": "ddp"}
        )
        res = _simulate(base, ddp, dp_gpus, batch, workload, topology)
        result.simulated_dp_s = res.iteration_time_s
        result.memory_dp_peak_bytes = max(g.memory_peak_bytes for g in res.gpus)
    result.notes.append(
        f"model {result.model_s * 1e3:.3f} ms vs simulated {result.simulated_s * 1e3:.3f} ms for the plan"
    )
    return result


def data_parallel_gpus(batch: int, gpus: int) -> int:
    """The most of ``gpus`` GPUs pure data parallelism can use: the largest divisor of ``gpus`` dividing
    ``batch``."""
    return max(d for d in _divisors(gpus) if batch % d == 0)


def plan_scenario(
    run, *, simulate: bool = True, symmetric: bool = False, simulate_dp: bool = True
) -> Plan:
    """:func:`plan` for a resolved Run: its topology, workload, batch, GPU count, precision, optimizer and
    collectives; the GPUs are the first ``gpus`` of the topology."""
    sc, topology, workload = run.scenario, run.topology, run.workload
    gpus = sc.gpus if isinstance(sc.gpus, int) else (len(sc.gpus) if sc.gpus else None)
    base = sc.model_dump(by_alias=True, exclude={"variants"})
    try:
        return plan(
            workload,
            topology,
            sc.batch_size,
            gpus,
            sc.precision,
            sc.optimizer.name,
            simulate=simulate,
            base=base,
            collectives=sc.strategy.collectives,
            symmetric=symmetric,
            simulate_dp=simulate_dp,
        )
    except TrainsimError as exc:
        if exc.file is None:
            raise TrainsimError(
                str(exc).removeprefix(f"{exc.field}: " if exc.field else ""), file=sc.source, field=exc.field
            ) from None
        raise


def plan_lines(p: Plan) -> list[str]:
    """The plan as text lines for the CLI."""
    lines = [
        f"{p.workload} on {p.gpus} GPUs of {p.topology}, batch {p.batch}",
        f"{'grid (SxHxW)':>13}  {'layers':>6}  from -> to",
    ]
    for run in p.runs():
        lines.append(
            f"{grid_str(tuple(run['grid'])):>13}  {run['layers']:>6}  {run['first']} -> {run['last']}"
        )
    lines.append(
        f"model:     plan {p.model_s * 1e3:.3f} ms"
        + (f", data parallel {p.model_dp_s * 1e3:.3f} ms" if p.model_dp_s else "")
    )
    if p.simulated_s is not None:
        lines.append(
            f"simulated: plan {p.simulated_s * 1e3:.3f} ms, {p.dp_label} {p.simulated_dp_s * 1e3:.3f} ms"
            f" -> speedup {p.speedup:.2f}x"
        )
        if p.speedup is not None and p.speedup < 1:
            lines.append(f"{p.dp_label} is faster: splitting further does not pay on this model and machine")
    if p.memory_peak_bytes is not None:
        line = f"memory peak of the plan: {p.memory_peak_bytes / 2**30:.2f} GiB per GPU"
        if p.memory_dp_peak_bytes is not None:
            line += f", {p.dp_label} {p.memory_dp_peak_bytes / 2**30:.2f} GiB"
        lines.append(line)
        for what, peak, fits in (("the plan", p.memory_peak_bytes, p.fits),
                                 (p.dp_label, p.memory_dp_peak_bytes, p.dp_fits)):
            if fits is False:
                lines.append(f"OUT OF MEMORY (a result, not an error): {what} needs {peak / 2**30:.2f} GiB "
                             f"per GPU, the GPUs have {p.memory_capacity_bytes / 2**30:.2f} GiB")
    return lines


def write_plan(doc: dict, path) -> None:
    """Write a plan document (``trainsim.plan/1`` with provenance) as JSON, atomically."""
    import json
    from pathlib import Path

    from trainsim.files import write_atomic

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(doc, indent=1, default=str) + "\n")
