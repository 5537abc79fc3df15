"""Spatial and hybrid decomposition (Dryden et al., IPDPS 2019): the geometry, the bytes and the slab costs.

A layer's decomposition is a grid ``(samples, height, width)`` = ``(S, H, W)`` over the ``n`` GPUs: the batch
is split ``S`` ways and each sample's activations ``H x W`` ways. ``S*H*W`` must divide ``n``; the quotient
``R = n / (S*H*W)`` is a replication factor (GPUs holding the same slab and computing it redundantly: the
policy for the classifier head). Rank ``r`` holds sample group ``s = r // (n/S)``; within its group its cell
is ``(r mod n/S) // R`` in row-major ``(h, w)`` order, so a spatial group is consecutive ranks (on one node
when it fits, as Dryden et al. place them).

What each GPU does and moves (everything per iteration, per rank):

- **Compute.** Its slab: ``B/S`` samples, ``1/(H*W)`` of each layer's spatial extent. Per-sample FLOPs,
  traffic and activations are scaled by the spatial share and the layer is timed at ``B/S`` samples; the
  parameters are read whole (each GPU holds all weights). Measured layer times are scaled by the roofline
  ratio slab/whole at ``B/S`` samples (fixed costs such as launches and weight reads do not shrink).
- **Halo exchange** (convolutions with ``k > 1`` split along an axis): forward sends each neighbour
  ``N·C_in·(k//2)·edge·bytes`` of its input ``x`` (``edge`` = the slab's extent along the other axis, at
  the input's resolution) and receives as much, i.e. ``2·N·C·(k//2)·edge·bytes`` cross each boundary;
  backward exchanges the output gradient ``dL/dy`` (``C_out``, output resolution) that the data-gradient
  convolution needs at the slab's edge (that tensor is the next layer's ``dL/dx``). With
  ``strategy.backward_halo: input-gradient`` (autograd's way, the executor's) each GPU instead computes the
  gradient of the halo rows it received and sends it back to their owner after the layer (``C_in``, input
  resolution: the forward halo's bytes), who adds it to its own. The first layer's input needs no gradient,
  so it has no backward halo. Corner halos of 2-D splits are left out (order ``k²``).
  Where the bundle measured gloo's halo swap (collectives.json ``exchange``: both neighbours send and
  receive at once), each halo pays that call's cost; a one-way message to a waiting receiver costs a
  fraction of it.
  The halo for a stride-s conv is taken as ``k//2`` rows too (an upper bound).
- **Overlap.** The interior of the output does not need the halo: it is computed while the halo is in
  flight; the boundary rows (``k//2`` per neighbour side, at the output resolution) wait for it. So a
  conv's pass takes ``max(interior, halo) + boundary``. In backward only the data gradient has a boundary
  (the weight gradient reads the saved input, halo included). ``strategy.halo_overlap: false`` models an
  implementation that exchanges first and then runs the whole layer (the executor's blocking send/recv).
- **Weight gradients** are all-reduced over all ``n`` GPUs (every GPU holds every weight), bucketed and
  overlapped with backward as in DDP.
- **Redistribution** between consecutive layers with different grids: the activation that changes owner
  (forward) and its gradient (backward) move as point-to-point flows: each GPU receives the part of its new
  box it did not hold (box intersections on the (sample, row, column) index space). Gathering a split
  activation for an unsplit layer is an all-gather: where calls have a measured cost (gloo), each message
  pays that call's.
- **Non-spatial layers** (the classifier head: everything after the last layer with a spatial extent, e.g.
  the global average pool and the fc): default grid ``(S, 1, 1)``, replicated over the spatial group, so the
  trunk's last activation is gathered within each spatial group (the "gather to data parallel" policy).
  Batch-norm statistics stay local to each slab (LBANN's "local" batchnorm; aggregating them would add one
  latency-bound all-reduce of ``2·C`` values per batchnorm per pass). Pools inside the trunk have no halo
  (their geometry is not in the workload; a 3x3/s2 max pool would need one row).

It stays one module: the grid's geometry, the halo and redistribution bytes and the slab costs are one
model whose parts share the grid arithmetic; the strategy (strategies/spatial.py) and the planner
(planning/spatial_plan.py) both read it whole.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction

from trainsim.errors import TrainsimError
from trainsim.formats.workload import Workload
from trainsim.sim.compute.costs import WEIGHT_BYTES, RankCosts, rank_costs

#: the factor on a device's measured times at a batch size (a host plug-in's `step_scale`)
StepScale = Callable[..., float]

Grid = tuple[int, int, int]  # (samples, height, width)
SPATIAL_STRATEGIES = ("spatial", "hybrid")
#: layer kinds that keep their input's spatial extent (they extend the trunk past its last conv)
ELEMENTWISE = {"batchnorm", "relu", "gelu", "dropout", "layernorm"}


def grid_str(grid: Grid) -> str:
    return "x".join(str(v) for v in grid)


# ---- the model's trunk and head ----------------------------------------------------------------------------


def trunk_end(workload: Workload) -> int:
    """Index of the first head layer: after the last conv and the elementwise layers and max-pools that
    follow it. A max-pool works on its own window of rows, as the executor's row slabs run it (pools between
    convolutions are split already); a global pool (``avgpool``) sums over every row and stays in the
    head."""
    convs = [i for i, layer in enumerate(workload.layers) if layer.spatial is not None]
    if not convs:
        return 0
    end = convs[-1] + 1
    last = workload.layers[convs[-1]].output_bytes_per_sample
    while end < len(workload.layers):
        layer = workload.layers[end]
        if layer.kind == "maxpool":
            last = layer.output_bytes_per_sample
        elif layer.kind not in ELEMENTWISE or layer.output_bytes_per_sample != last:
            break
        end += 1
    return end


# ---- rank geometry -----------------------------------------------------------------------------------------


def coords(grid: Grid, n: int, rank: int) -> tuple[int, int, int, int]:
    """(sample group, row block, column block, replica) of ``rank`` under ``grid``."""
    samples, height, width = grid
    per_group = n // samples
    replicas = n // (samples * height * width)
    s, q = divmod(rank, per_group)
    cell, rep = divmod(q, replicas)
    h, w = divmod(cell, width)
    return s, h, w, rep


def rank_of(grid: Grid, n: int, s: int, h: int, w: int, rep: int) -> int:
    samples, height, width = grid
    replicas = n // (samples * height * width)
    return s * (n // samples) + (h * width + w) * replicas + rep


def box(grid: Grid, n: int, rank: int) -> tuple[tuple[Fraction, Fraction], ...]:
    """The (sample, row, column) intervals of the whole batch's index space that ``rank`` holds."""
    s, h, w, _ = coords(grid, n, rank)
    return tuple((Fraction(i, d), Fraction(i + 1, d)) for i, d in zip((s, h, w), grid, strict=True))


def _overlaps(src: int, dst: int) -> tuple[list[list[tuple[int, int]]], int]:
    """Per block ``j`` of an axis cut ``dst`` ways: ``(block i of the axis cut src ways, overlap length)``, in
    integer units of the axis cut ``lcm(src, dst)`` ways; and that unit count."""
    unit = math.lcm(src, dst)
    a, b = unit // src, unit // dst
    out = []
    for j in range(dst):
        lo, hi = j * b, (j + 1) * b
        out.append([(i, min(hi, (i + 1) * a) - max(lo, i * a)) for i in range(lo // a, -(-hi // a))])
    return out, unit


def redistribution_units(src: Grid, dst: Grid, n: int) -> tuple[list[tuple[int, int, int]], int]:
    """:func:`redistribution` with shares as integer numerators over one common denominator (fast)."""
    if src == dst:
        return [], 1
    replicas = n // math.prod(src)
    axes, units = zip(*(_overlaps(a, b) for a, b in zip(src, dst, strict=True)), strict=True)
    moves = []
    for r in range(n):
        s0, h0, w0, _ = coords(dst, n, r)
        own = coords(src, n, r)[:3]
        for s, len_s in axes[0][s0]:
            for h, len_h in axes[1][h0]:
                for w, len_w in axes[2][w0]:
                    if (s, h, w) != own:
                        moves.append((rank_of(src, n, s, h, w, r % replicas), r, len_s * len_h * len_w))
    return moves, math.prod(units)


def redistribution(src: Grid, dst: Grid, n: int) -> list[tuple[int, int, Fraction]]:
    """``(from rank, to rank, share of the whole tensor)`` moving when a tensor laid out by ``src`` is needed
    laid out by ``dst``: each rank receives the part of its new box it does not hold, from the holder of that
    part (among replicas, the one with the receiver's replica index)."""
    moves, denominator = redistribution_units(src, dst, n)
    return [(s, d, Fraction(k, denominator)) for s, d, k in moves]


def neighbours(grid: Grid, n: int, rank: int) -> list[tuple[int, str]]:
    """``(rank, axis)`` of the halo neighbours of ``rank`` (axis ``h``: the row above/below; ``w``)."""
    samples, height, width = grid
    s, h, w, rep = coords(grid, n, rank)
    out = []
    for dh in (-1, 1):
        if 0 <= h + dh < height:
            out.append((rank_of(grid, n, s, h + dh, w, rep), "h"))
    for dw in (-1, 1):
        if 0 <= w + dw < width:
            out.append((rank_of(grid, n, s, h, w + dw, rep), "w"))
    return out


# ---- halo bytes --------------------------------------------------------------------------------------------


def halo_width(kernel: int, dilation: int = 1) -> int:
    """Rows (or columns) of halo a ``kernel``-wide convolution needs on each side: ``k//2`` for odd k."""
    return dilation * (kernel - 1) // 2


def halo_bytes(
    layer, grid: Grid, batch: int, element_bytes: int, axis: str, direction: str,
    backward_halo: str = "output-gradient",
) -> float:
    """Bytes one GPU sends one neighbour along ``axis`` for a conv in ``direction`` (forward: ``x``;
    backward: ``dL/dy``, or the halo rows' ``dL/dx`` with ``backward_halo="input-gradient"``):
    ``N·C·(k//2)·edge·bytes`` with ``N = batch/S`` local samples."""
    sp = layer.spatial
    samples, height, width = grid
    local = batch // samples
    if direction == "forward" or backward_halo == "input-gradient":
        channels, size_h, size_w = sp.in_c, sp.in_h, sp.in_w
    else:
        channels, size_h, size_w = sp.out_c, sp.out_h, sp.out_w
    if axis == "h":  # the halo rows span the slab's width
        rows, edge, cut = halo_width(sp.kernel_h, sp.dilation), size_w, width
    else:
        rows, edge, cut = halo_width(sp.kernel_w, sp.dilation), size_h, height
    return local * channels * rows * edge * element_bytes / cut


def boundary_share(layer, grid: Grid, sides_h: int, sides_w: int) -> float:
    """Share of an output slab that needs halo data with neighbours on ``sides_h`` row sides and ``sides_w``
    column sides (``k//2`` rows or columns per side)."""
    sp = layer.spatial
    if sp is None:
        return 0.0
    rows, cols = sp.out_h / grid[1], sp.out_w / grid[2]
    edge_rows = min(rows, sides_h * halo_width(sp.kernel_h, sp.dilation))
    edge_cols = min(cols, sides_w * halo_width(sp.kernel_w, sp.dilation))
    return 1 - (rows - edge_rows) * (cols - edge_cols) / (rows * cols)


def boundary_fraction(layer, grid: Grid, n: int, rank: int) -> float:
    """Share of ``rank``'s output slab that needs halo data (``k//2`` rows per neighbour side)."""
    axes = [axis for _, axis in neighbours(grid, n, rank)]
    return boundary_share(layer, grid, axes.count("h"), axes.count("w"))


def data_grad_share(layer, index: int) -> float:
    """Share of a conv's backward that is the data gradient (the part with a halo): none for the first layer
    (its input needs no gradient), else (backward FLOPs - forward FLOPs) / backward FLOPs (one half)."""
    if index == 0 or layer.flops_backward_per_sample <= 0:
        return 0.0
    return max(0.0, 1 - layer.flops_forward_per_sample / layer.flops_backward_per_sample)


# ---- grids per layer ---------------------------------------------------------------------------------------


def check_grid(values, field: str, file: str | None = None) -> Grid:
    if len(values) != 3 or any(not isinstance(v, int) or v < 1 for v in values):
        raise TrainsimError(
            f"a grid is [samples, height, width] of integers >= 1, got {list(values)}", file=file, field=field
        )
    return tuple(values)  # type: ignore[return-value]


def layer_grids(
    workload: Workload,
    n: int,
    batch: int,
    grid: Grid | None = None,
    overrides: dict[str, Grid] | None = None,
    *,
    strategy: str = "hybrid",
    file: str | None = None,
) -> list[Grid]:
    """The grid of every layer: ``grid`` on the trunk, ``(S, 1, 1)`` on the head, ``overrides`` by layer
    name; every check that can fail names the layer and both fields."""
    overrides = dict(overrides or {})
    if grid is None:
        if strategy == "hybrid" and set(overrides) != {layer.name for layer in workload.layers}:
            raise TrainsimError(
                "strategy hybrid needs strategy.grid: [samples, height, width] (or a grid for "
                "every layer in strategy.layer_grids)",
                file=file,
                field="strategy.grid",
            )
        grid = (1, n, 1)
    grid = check_grid(grid, "strategy.grid", file)
    if math.prod(grid) != n:
        raise TrainsimError(
            f"grid {list(grid)} has {math.prod(grid)} cells but the scenario runs on {n} GPUs (gpus)",
            file=file,
            field="strategy.grid",
        )
    if strategy == "spatial" and grid[0] != 1:
        raise TrainsimError(
            f"strategy spatial splits samples 1 way; grid {list(grid)} splits them "
            f"{grid[0]} ways (use strategy hybrid)",
            file=file,
            field="strategy.grid",
        )
    names = {layer.name: i for i, layer in enumerate(workload.layers)}
    for name in overrides:
        if name not in names:
            from trainsim.errors import unknown_name

            raise unknown_name("layer", name, names, file=file, field="strategy.layer_grids")
    head = trunk_end(workload)
    grids = []
    for i, layer in enumerate(workload.layers):
        where = f"strategy.layer_grids.{layer.name}" if layer.name in overrides else "strategy.grid"
        g = (
            check_grid(overrides[layer.name], where, file)
            if layer.name in overrides
            else (grid if i < head else (grid[0], 1, 1))
        )
        if n % math.prod(g):
            raise TrainsimError(
                f"grid {list(g)} of layer {layer.name!r} has {math.prod(g)} cells, which does not "
                f"divide the {n} GPUs (gpus)",
                file=file,
                field=where,
            )
        if batch % g[0]:
            raise TrainsimError(
                f"batch_size {batch} does not divide into the {g[0]} sample groups of grid {list(g)}",
                file=file,
                field=where,
            )
        if i >= head and (g[1] > 1 or g[2] > 1):
            raise TrainsimError(
                f"layer {layer.name!r} has no spatial extent (classifier head); its grid must be "
                f"[samples, 1, 1], got {list(g)}",
                file=file,
                field=where,
            )
        sp = layer.spatial
        if sp is not None and (sp.out_h % g[1] or sp.out_w % g[2]):
            raise TrainsimError(
                f"grid {list(g)} splits layer {layer.name!r} {g[1]}x{g[2]} but its output is "
                f"{sp.out_h}x{sp.out_w} (workload layers.{layer.name}.spatial.out_h/out_w)",
                file=file,
                field=where,
            )
        grids.append(g)
    return grids


# ---- slab costs --------------------------------------------------------------------------------------------


def slab_workload(workload: Workload, share: Fraction) -> Workload:
    """``workload`` with every per-sample figure of the trunk scaled by the spatial ``share``."""
    if share == 1:
        return workload
    head = trunk_end(workload)
    keys = (
        "saved_activation_bytes_per_sample",
        "output_bytes_per_sample",
        "flops_forward_per_sample",
        "flops_backward_per_sample",
        "memory_bytes_forward_per_sample",
        "memory_bytes_backward_per_sample",
    )
    layers = []
    for i, layer in enumerate(workload.layers):
        if i >= head:
            layers.append(layer)
            continue
        update = {k: getattr(layer, k) * share for k in keys}
        for k in ("saved_activation_bytes_per_sample", "output_bytes_per_sample"):
            update[k] = int(math.ceil(update[k]))
        update = {k: (float(v) if not isinstance(v, int) else v) for k, v in update.items()}
        layers.append(layer.model_copy(update=update))
    input_spec = workload.input.model_copy(
        update={"bytes_per_sample": int(math.ceil(workload.input.bytes_per_sample * share))}
    )
    return workload.model_copy(update={"layers": layers, "input": input_spec})


def slab_costs(
    workload: Workload,
    device,
    batch: int,
    share: Fraction,
    precision: str,
    optimizer: str,
    *,
    measured_on=None,
    step_scale: StepScale | None = None,
) -> RankCosts:
    """One rank's costs when it holds ``batch`` samples and ``share`` of each trunk layer's spatial extent
    (``step_scale``: the factor on measured times per device and batch, a host plug-in's; None: 1)."""
    from trainsim.sim.compute import roofline

    scale = step_scale(device, batch) if step_scale is not None else 1.0
    slab = slab_workload(workload, share)
    costs = rank_costs(slab, device, batch, precision, optimizer, measured_on=measured_on, scale=scale)
    if share == 1 or not any(layer.measured for layer in workload.layers):
        return costs  # analytic: the roofline already timed the slab
    whole = roofline.layer_times(workload, device, batch, precision, measured_on=measured_on)
    forward, backward = [], []
    for layer, part, (f, b) in zip(workload.layers, slab.layers, whole, strict=True):
        roof_whole = roofline.layer_time(layer, device, batch, precision, dtype=workload.dtype)
        roof_part = roofline.layer_time(part, device, batch, precision, dtype=workload.dtype)
        forward.append(scale * f * (roof_part[0] / roof_whole[0] if roof_whole[0] > 0 else 1.0))
        backward.append(scale * b * (roof_part[1] / roof_whole[1] if roof_whole[1] > 0 else 1.0))
    return dataclasses.replace(costs, forward_s=forward, backward_s=backward)


# ---- the layout a simulation runs --------------------------------------------------------------------------


@dataclass
class SpatialLayout:
    """Per-layer grids with everything the strategy needs: times, bytes, halos, redistributions."""

    workload: Workload
    n: int
    batch: int
    grids: list[Grid]
    precision: str
    forward_s: list[float]
    backward_s: list[float]
    saved_bytes: list[float]
    base: RankCosts  # params, gradients, optimizer state, step time (the same on every rank)
    backward_halo: str = "output-gradient"  # or "input-gradient": the halo rows' gradient, sent back after
    output_bytes: list[float] = field(default_factory=list)  # each layer's output slab: its gradient's size
    _moves: dict = field(default_factory=dict, repr=False)

    @property
    def element_bytes(self) -> int:
        return WEIGHT_BYTES[self.precision]  # activations follow the compute precision

    def local_samples(self, i: int) -> int:
        return self.batch // self.grids[i][0]

    @property
    def input_bytes(self) -> float:
        """The rank's slab of its samples' input (a spatial group splits the image too)."""
        g = self.grids[0]
        return self.local_samples(0) * self.workload.input.bytes_per_sample / (g[1] * g[2])

    def halos(self, i: int, rank: int, direction: str) -> list[tuple[int, float]]:
        """``(neighbour, bytes sent to it)`` for layer ``i`` in ``direction`` (forward/backward)."""
        layer = self.workload.layers[i]
        if layer.spatial is None or (direction == "backward" and data_grad_share(layer, i) == 0):
            return []
        out = []
        for peer, axis in neighbours(self.grids[i], self.n, rank):
            nbytes = halo_bytes(
                layer, self.grids[i], self.batch, self.element_bytes, axis, direction, self.backward_halo
            )
            if nbytes > 0:
                out.append((peer, nbytes))
        return out

    def boundary(self, i: int, rank: int, direction: str) -> float:
        """Share of layer ``i``'s pass on ``rank`` that waits for the halo."""
        if not self.halos(i, rank, direction):
            return 0.0
        layer = self.workload.layers[i]
        share = boundary_fraction(layer, self.grids[i], self.n, rank)
        return share if direction == "forward" else share * data_grad_share(layer, i)

    def moves(self, i: int, direction: str) -> list[tuple[int, int, float]]:
        """``(from, to, bytes)`` at the boundary before layer ``i``: forward moves layer ``i-1``'s output from
        its grid to layer ``i``'s; backward moves that tensor's gradient back."""
        key = (i, direction)
        if key not in self._moves:
            a, b = self.grids[i - 1], self.grids[i]
            if direction == "backward":
                a, b = b, a
            per_sample = (
                self.workload.layers[i - 1].output_bytes_per_sample
                * self.element_bytes
                / self.workload.itemsize
            )
            whole = per_sample * self.batch
            self._moves[key] = [(s, d, float(share * whole)) for s, d, share in redistribution(a, b, self.n)]
        return self._moves[key]

    def gathers(self, i: int) -> bool:
        """Layer ``i`` runs unsplit (replicated over its spatial group) after a split layer: the activation
        before it is gathered, an all-gather within each group."""
        a, b = self.grids[i - 1], self.grids[i]
        return b[1] * b[2] == 1 and a[1] * a[2] > 1

    @property
    def block(self) -> int:
        """Ranks ``0..block-1``: the smallest leading block that is a union of sample groups under every
        layer's grid, so no halo or redistribution crosses it (``n / gcd`` of the sample splits)."""
        return self.n // math.gcd(*(g[0] for g in self.grids))

    def halo_bytes_per_iteration(self, rank: int = 0) -> float:
        """Bytes ``rank`` sends its neighbours per iteration, forward and backward."""
        return sum(
            nbytes
            for i in range(len(self.grids))
            for direction in ("forward", "backward")
            for _, nbytes in self.halos(i, rank, direction)
        )

    def redistribution_bytes_per_iteration(self) -> float:
        """Bytes all ranks together move between layers of different grids per iteration."""
        return sum(
            nbytes
            for i in range(1, len(self.grids))
            if self.grids[i] != self.grids[i - 1]
            for direction in ("forward", "backward")
            for _, _, nbytes in self.moves(i, direction)
        )

    def summary(self) -> dict:
        """The decomposition in a few figures (for Result.extra): grids as runs of layers."""
        runs = []
        for layer, g in zip(self.workload.layers, self.grids, strict=True):
            if runs and runs[-1]["grid"] == list(g):
                runs[-1]["last"] = layer.name
                runs[-1]["layers"] += 1
            else:
                runs.append({"grid": list(g), "first": layer.name, "last": layer.name, "layers": 1})
        return {
            "grids": runs,
            "halo_bytes_per_iteration_rank0": self.halo_bytes_per_iteration(0),
            "redistribution_bytes_per_iteration": self.redistribution_bytes_per_iteration(),
        }


def scenario_grids(scenario, workload: Workload, n: int) -> list[Grid]:
    """The per-layer grids of a ``spatial``/``hybrid`` scenario (``strategy.grid`` and ``layer_grids``)."""
    st = scenario.strategy
    overrides = {k: tuple(v) for k, v in (st.layer_grids or {}).items()}
    return layer_grids(
        workload,
        n,
        scenario.batch_size,
        tuple(st.grid) if st.grid else None,
        overrides,
        strategy=st.name,
        file=scenario.source,
    )


def check_scenario(scenario, workload: Workload, n: int) -> int:
    """Check a scenario's grids (one line naming the layer and both fields); the first layer's local batch."""
    grids = scenario_grids(scenario, workload, n)
    st = scenario.strategy
    if st.symmetric_ranks and st.collectives != "analytic":
        raise TrainsimError(
            "strategy.symmetric_ranks simulates one block of ranks, so the all-reduce over all of "
            f"them must be analytic; strategy.collectives is {st.collectives!r}",
            file=scenario.source,
            field="strategy.symmetric_ranks",
        )
    return scenario.batch_size // grids[0][0]


def prepare_layout(
    spec,
    workload: Workload,
    batch: int,
    ranks: list[str],
    machine,
    precision: str = "fp32",
    optimizer: str = "sgd",
    *,
    measured_on=None,
    file: str | None = None,
    host=None,
) -> SpatialLayout:
    """The layout of a ``spatial``/``hybrid`` strategy ``spec`` (a StrategySpec) on ``ranks``; ``host``: the
    simulation's host plug-in (`trainsim.sim.hosts`), None for the plain model."""
    n = len(ranks)
    overrides = {k: tuple(v) for k, v in (spec.layer_grids or {}).items()}
    grids = layer_grids(
        workload, n, batch, tuple(spec.grid) if spec.grid else None, overrides, strategy=spec.name, file=file
    )
    devices = {machine.gpus[g].device.name for g in ranks}
    if len(devices) > 1:
        raise TrainsimError(
            f"spatial decomposition needs identical GPUs, got {', '.join(sorted(devices))}",
            file=file,
            field="gpus",
        )
    device = machine.gpus[ranks[0]].device
    sharing = max(machine.host_sharing(ranks).values())
    step_scale = None if host is None else (lambda d, b: host.step_scale(d, b, sharing))
    return build_layout(workload, device, n, batch, grids, precision, optimizer, measured_on=measured_on,
                        step_scale=step_scale, backward_halo=spec.backward_halo)


def build_layout(
    workload: Workload,
    device,
    n: int,
    batch: int,
    grids: list[Grid],
    precision: str = "fp32",
    optimizer: str = "sgd",
    *,
    measured_on=None,
    step_scale: StepScale | None = None,
    backward_halo: str = "output-gradient",
) -> SpatialLayout:
    cache: dict[tuple[int, Fraction], RankCosts] = {}
    forward, backward, saved, outputs = [], [], [], []
    for i, g in enumerate(grids):
        key = (batch // g[0], Fraction(1, g[1] * g[2]))
        if key not in cache:
            cache[key] = slab_costs(
                workload, device, key[0], key[1], precision, optimizer, measured_on=measured_on,
                step_scale=step_scale,
            )
        costs = cache[key]
        forward.append(costs.forward_s[i])
        backward.append(costs.backward_s[i])
        saved.append(costs.saved_bytes_per_layer[i])
        outputs.append(costs.output_bytes_per_layer[i])
    base = next(iter(cache.values()))
    return SpatialLayout(
        workload, n, batch, list(grids), precision, forward, backward, saved, base, backward_halo, outputs
    )
