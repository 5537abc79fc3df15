"""What a layout's pipeline stages cost, block by block, without a simulation: the per-block figures the
`mesh` strategy (sim/strategies/mesh.py) works from, for the closed forms `memory` and `analytic`.

A `Layout` is the parallel layout of strategy ``mesh`` (`MeshOptions`' fields, as a small frozen value the
search can make by the thousand). `ModelCosts` holds one run's workload, device, precision and optimizer;
``model.blocks(layout)`` gives a `BlockTable`: per block of the whole model (the embedding ``pre``, every
transformer block, the norm and head ``post``) one rank's forward and backward seconds at the layout's
micro-batch, its parameter bytes (its tensor/expert share), the activations it saves and the points where
tensor, context and expert parallelism talk. It depends only on tp, cp, ep, sequence parallelism, the expert
imbalance and the micro-batch, not on the pipeline split, and it is cached on that key: a stage is a slice
of it (`stage_ranges`), so a search over thousands of layouts costs the layers once per such key.

Blocks alike (every dense block of a Llama; the MoE blocks of a DeepSeek) are costed once: the layers of
one representative of each kind are split (`split.split_stages`, the same rule the strategy runs) and timed
(`costs.rank_costs`), and the others take its figures.
"""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass, field

from trainsim.errors import TrainsimError
from trainsim.formats.scenario_options import DEFAULT_COMPUTE_MODEL
from trainsim.formats.workload import Workload
from trainsim.sim.compute.costs import (
    STATE_BYTES,
    WEIGHT_BYTES,
    mixed,
    optimizer_traffic,
    rank_costs,
    state_bytes,
    weight_bytes,
)
from trainsim.sim.core.devices import DeviceSpec

from .split import _BLOCK, _partition, split_stages, transformer_config
from .zero_bubble import W_SHARE

__all__ = ["BlockTable", "Layout", "ModelCosts", "stage_ranges"]

RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("1f1b", "gpipe", "zb-h1")


@dataclass(frozen=True)
class Layout:
    """A parallel layout of strategy ``mesh``: the fields of `MeshOptions` (see its descriptions), plus
    ``virtual_stages`` (interleaved 1F1B: model chunks per pipeline rank; 1 without interleaving)."""

    tp: int = 1
    cp: int = 1
    pp: int = 1
    ep: int = 1
    zero: int = 0
    shard: int | None = None
    sequence_parallel: bool = False
    micro_batch: int = 1
    recompute: str = "none"
    schedule: str = "1f1b"
    stage_blocks: tuple[int, ...] | None = None
    context: str = "allgather"
    reshard_after_forward: bool = True
    expert_imbalance: float = 1.0
    virtual_stages: int = 1
    async_tp: bool = False

    @classmethod
    def of(cls, options) -> Layout:
        """A Layout from `MeshOptions`, a mapping of its fields, or a Layout."""
        if isinstance(options, Layout):
            return options
        if options is None:
            return cls()
        get = options.get if isinstance(options, dict) else (lambda k, d=None: getattr(options, k, d))
        values = {}
        for f in dataclasses.fields(cls):
            value = get(f.name, None)
            if value is not None:
                values[f.name] = tuple(value) if f.name == "stage_blocks" else value
        return cls(**values)

    def mesh_options(self) -> dict:
        """The layout as a scenario's ``strategy.mesh`` mapping (fields that differ from the defaults)."""
        default = Layout()
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value != getattr(default, f.name):
                out[f.name] = list(value) if f.name == "stage_blocks" else value
        return out

    def dp(self, gpus: int) -> int:
        return gpus // (self.tp * self.cp * self.pp)

    def label(self, gpus: int) -> str:
        """A short name: ``tp8 cp1 pp4 dp32 ep1 z1 sp mb1 rc=sel 1f1b``."""
        parts = [f"tp{self.tp}", f"cp{self.cp}", f"pp{self.pp}"]
        if self.virtual_stages > 1:
            parts[-1] += f"x{self.virtual_stages}"
        parts.append(f"dp{self.dp(gpus)}")
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        zero = f"z{self.zero}"
        if self.shard is not None:
            zero += f"/shard{self.shard}"
        parts.append(zero)
        if self.sequence_parallel:
            parts.append("sp+async" if self.async_tp else "sp")
        parts.append(f"mb{self.micro_batch}")
        if self.recompute != "none":
            parts.append(f"rc={self.recompute[:4]}")
        if self.pp > 1:
            parts.append(self.schedule)
        if self.cp > 1 and self.context != "allgather":
            parts.append(self.context)
        return " ".join(parts)


@dataclass
class BlockTable:
    """One rank's figures for every block of the model (whole-model order), at one micro-batch.

    Seconds: ``forward``, ``backward`` (without recomputation), ``core`` (the attention core's forward).
    Bytes: ``params`` (weights as held, this rank's tensor/expert share), ``experts`` (the part in experts),
    ``num_params`` (parameter count, for the optimizer step), ``saved`` (one micro-batch's saved
    activations, no recomputation), ``core_saved`` (the part the attention core saves), ``core_inputs``
    (what of that a recomputed core still needs: its queries, keys and values, and its output where only
    it counts it). ``row_layers``, ``attention``, ``moe``: the collective points (`split.Block`)."""

    names: list[str]
    forward: list[float]
    backward: list[float]
    core: list[float]
    params: list[float]
    experts: list[float]
    num_params: list[float]
    saved: list[float]
    core_saved: list[float]
    core_inputs: list[float]
    row_layers: list[int]
    attention: list[bool]
    moe: list[bool]
    column_inputs: list[float] = field(default_factory=list)  # what column-parallel linears save (inputs)
    # zero-bubble (sim/parallel/zero_bubble.py): the part of ``backward`` that is the weight gradient (W),
    # and the bytes W needs from B until it runs (each linear layer's saved input and output gradient)
    weight_grad: list[float] = field(default_factory=list)
    weight_kept: list[float] = field(default_factory=list)
    # async TP (sim/parallel/comms.py): per row-split layer, the seconds of the GEMMs its collectives overlap:
    # (the column-parallel linears before it, forward; their input gradient; the row layer forward; its
    # input gradient)
    tp_gemms: list[tuple] = field(default_factory=list)
    # the activation gradients a block's backward holds at its worst layer: the gradient of that layer's
    # output and of its input (as strategy single holds them, `context.gradients_in`); the loss's two fp32
    # gradients of the logits in the block with the head
    grad_held: list[float] = field(default_factory=list)
    kinds: list = field(default_factory=list)  # per block: "pre", "post" or the index of a block alike
    workspace_bytes: float = 0.0
    derived: dict = field(default_factory=dict)  # per-layout caches of `memory` and `analytic`
    _signatures: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.names)

    def grads_held(self, b: int) -> float:
        """`grad_held` of block ``b`` (0 for a table built without it)."""
        return self.grad_held[b] if self.grad_held else 0.0

    def signature(self, lo: int, hi: int) -> tuple:
        """Blocks [lo, hi) as runs of alike blocks ((kind, count), ...): two ranges with one signature cost
        the same (the middle stages of a pipeline)."""
        key = (lo, hi)
        sig = self._signatures.get(key)
        if sig is None:
            runs: list = []
            for kind in self.kinds[lo:hi]:
                if runs and runs[-1][0] == kind:
                    runs[-1][1] += 1
                else:
                    runs.append([kind, 1])
            sig = self._signatures[key] = tuple((k, n) for k, n in runs)
        return sig


def _column_linear(layer, config: dict) -> bool:
    """A column-parallel linear layer (its saved tensor is its input, which every tensor-parallel rank holds
    whole without sequence parallelism)."""
    if not config or layer.kind != "linear":
        return False
    from trainsim.sim.compute.transformers import layer_role

    try:
        return layer_role(layer.name) == "column"
    except KeyError:
        return False


def _weight_kept(layer, costs, i: int) -> float:
    """Bytes a layer's weight gradient (W) needs from its B until it runs: a linear layer's saved input and
    its output gradient (the size of its output); an embedding's output gradient; nothing for the rest."""
    share = W_SHARE.get(layer.kind, 0.0)
    if share == 0.0:
        return 0.0
    out = costs.output_bytes_per_layer[i]
    return out if layer.kind == "embedding" else costs.saved_bytes_per_layer[i] + out


def _tp_gemms(layers, idx, costs, config: dict) -> tuple:
    """Per row-split linear of a block, in order: (forward and input-gradient seconds of the column-split
    linears since the previous row layer, forward and input-gradient seconds of the row layer). A linear's
    input gradient is half its backward (dX and dW: two GEMMs of equal FLOPs)."""
    if not config:
        return ()
    from trainsim.sim.compute.transformers import layer_role

    out, col_f, col_b = [], 0.0, 0.0
    for i in idx:
        layer = layers[i]
        if layer.kind != "linear":
            continue
        try:
            role = layer_role(layer.name)
        except KeyError:
            continue
        if role == "column":
            col_f += costs.forward_s[i]
            col_b += costs.backward_s[i] / 2
        elif role == "row":
            out.append((col_f, col_b, costs.forward_s[i], costs.backward_s[i] / 2))
            col_f = col_b = 0.0
    return tuple(out)


def stage_ranges(blocks: int, pp: int, stage_blocks=None, *, pre: bool = True, post: bool = True
                 ) -> list[tuple[int, int]]:
    """Each pipeline stage's [start, end) in a `BlockTable` of ``blocks`` transformer blocks (plus the
    ``pre`` and ``post`` blocks, which go with the first and last stage)."""
    key = (blocks, pp, tuple(stage_blocks) if stage_blocks else None, pre, post)
    hit = _ranges.get(key)
    if hit is not None:
        return hit
    counts = list(stage_blocks) if stage_blocks else [blocks // pp] * pp
    out, start = [], 0
    offset = 1 if pre else 0
    for s, n in enumerate(counts):
        lo = 0 if s == 0 else start + offset
        hi = start + offset + n + (1 if post and s == pp - 1 else 0)
        out.append((lo, hi))
        start += n
    _ranges[key] = out
    return out


_ranges: dict = {}


_tables: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _grads_held(idx: list[int], costs, last: int) -> float:
    """The most activation-gradient bytes live while one of layers ``idx`` runs its backward: its output's
    gradient and its input's (the previous layer's output size; none before the first layer), and for the
    model's ``last`` layer the loss's two gradients of its fp32 input first (`context.gradients_in`)."""
    out = costs.output_bytes_per_layer
    held = max(out[i] + (out[i - 1] if i > 0 else 0.0) for i in idx)
    return max(held, 2.0 * costs.loss_input_bytes) if last in idx else held


class ModelCosts:
    """A workload on a device at a precision and optimizer (and ``compute_model``: how layer times are
    estimated, `rank_costs`; ``fp8``: the linear layers' GEMMs in fp8 as Transformer Engine runs them,
    `fp8.fp8_costs`; ``scale``: the factor on times measured on this device, a host plug-in's, as
    `rank_costs` takes it): `BlockTable`s for layouts (cached)."""

    def __init__(self, workload: Workload, device: DeviceSpec, precision: str = "bf16",
                 optimizer: str = "adam", mixed_precision: str = "master",
                 compute_model: str = DEFAULT_COMPUTE_MODEL, fp8: bool = False, scale: float = 1.0):
        self.workload, self.device, self.fp8, self.scale = workload, device, fp8, scale
        self.precision, self.optimizer, self.mixed_precision = precision, optimizer, mixed_precision
        self.compute_model = compute_model
        self.config = transformer_config(workload) or {}
        pre, blocks, post = _partition(workload)
        if not self.config and not blocks:
            pre, blocks, post = [], [[i] for i in range(len(workload.layers))], []
        self.pre, self.block_layers, self.post = pre, blocks, post
        self.n_blocks = len(blocks)
        self.weight = weight_bytes(precision, mixed_precision)
        master = 4 if mixed(precision) and mixed_precision == "master" else 0
        self.state_per_param = (STATE_BYTES[optimizer] + master) / self.weight
        assert state_bytes(1, precision, optimizer, mixed_precision) == self.state_per_param * self.weight
        self.act = WEIGHT_BYTES[precision]
        self._kinds = self._block_kinds()
        self._cache: dict = {}

    # ---- which blocks are alike --------------------------------------------------------------------------
    def _block_kinds(self) -> list[int]:
        """For each block, the index of the first block with the same layers (but for their names)."""
        first: dict = {}
        kinds = []
        for b, indices in enumerate(self.block_layers):
            sig = []
            for i in indices:
                layer = self.workload.layers[i]
                match = _BLOCK.match(layer.name)
                suffix = layer.name[match.end():] if match else layer.name
                sig.append((suffix, layer.model_dump_json(exclude={"name"})))
            kinds.append(first.setdefault(tuple(sig), b))
        return kinds

    # ---- the table --------------------------------------------------------------------------------------
    def blocks(self, layout: Layout) -> BlockTable:
        key = (layout.tp, layout.cp, layout.ep, layout.sequence_parallel, layout.expert_imbalance,
               layout.micro_batch)
        table = self._cache.get(key)
        if table is None:
            table = self._cache[key] = self._table(*key)
        return table

    def _table(self, tp, cp, ep, sp, imbalance, micro_batch) -> BlockTable:
        wl = self.workload
        unique = sorted(set(self._kinds))
        keep = list(self.pre) + [i for b in unique for i in self.block_layers[b]] + list(self.post)
        reduced = wl if len(unique) == self.n_blocks else wl.model_copy(
            update={"layers": [wl.layers[i] for i in keep]})
        split = split_stages(reduced, tp=tp, cp=cp, pp=1, ep=ep, sequence_parallel=sp,
                             expert_imbalance=imbalance)[0]
        costs = rank_costs(split.workload, self.device, micro_batch, self.precision, self.optimizer,
                           mixed_precision=self.mixed_precision, scale=self.scale,
                           compute_model=self.compute_model)
        if self.fp8:
            from .fp8 import fp8_costs

            costs = fp8_costs(costs, split.workload, self.device, micro_batch, self.act)
        layers = split.workload.layers
        per_block = {}
        for block in split.blocks:
            idx = block.layers
            attention = [i for i in idx if layers[i].kind.endswith("attention")]
            per_block[block.name] = (
                sum(costs.forward_s[i] for i in idx),
                sum(costs.backward_s[i] for i in idx),
                sum(costs.forward_s[i] for i in attention),
                sum(costs.grad_bytes_per_layer[i] for i in idx),
                sum(costs.grad_bytes_per_layer[i] for i in idx if layers[i].kind == "expert_linear"),
                sum(layers[i].param_bytes for i in idx) / split.workload.itemsize,
                sum(costs.saved_bytes_per_layer[i] for i in idx),
                sum(costs.saved_bytes_per_layer[i] for i in attention),
                self._core_inputs(layers, idx, costs, micro_batch, tp, cp),
                block.row_layers, block.attention, block.moe,
                sum(costs.saved_bytes_per_layer[i] for i in idx if _column_linear(layers[i], self.config)),
                sum(costs.backward_s[i] * W_SHARE.get(layers[i].kind, 0.0) for i in idx),
                sum(_weight_kept(layers[i], costs, i) for i in idx),
                _tp_gemms(layers, idx, costs, self.config),
                _grads_held(idx, costs, len(layers) - 1),
            )
        # the reduced split names its blocks by position: map the model's blocks to their representative's
        position = {b: k for k, b in enumerate(unique)}
        names, rows = [], []
        if self.pre:
            names.append("pre")
            rows.append(per_block["pre"])
        for b in range(self.n_blocks):
            names.append(f"block{b}")
            rows.append(per_block[f"block{position[self._kinds[b]]}"])
        if self.post:
            names.append("post")
            rows.append(per_block["post"])
        cols = list(zip(*rows, strict=True))
        kinds = (["pre"] if self.pre else []) + list(self._kinds) + (["post"] if self.post else [])
        return BlockTable(names, *[list(c) for c in cols], kinds=kinds, workspace_bytes=costs.workspace_bytes)

    def _core_inputs(self, layers, idx, costs, micro_batch, tp, cp) -> float:
        """Bytes a recomputed attention core still needs kept (selective recomputation): its queries, keys
        and values (not K/V repeated to every head), and its output where it alone counts it (flash: the
        output projection's saved input is the same storage)."""
        cfg = self.config
        cores = [i for i in idx if layers[i].kind.endswith("attention")]
        if not cores or not cfg:
            return 0.0
        from trainsim.sim.compute.transformer_configs import TransformerConfig

        t = TransformerConfig.from_options(cfg)
        elem = self.act if not (mixed(self.precision) and self.mixed_precision == "autocast") else 2
        kv = t.num_attention_heads if t.mla else t.kv_heads
        per_token = t.num_attention_heads * t.qk_head_dim + kv * (t.qk_head_dim + t.v_dim)
        out = t.num_attention_heads * t.v_dim
        o_proj = [i for i in idx if layers[i].name.endswith(".o_proj")]
        counts_out = bool(o_proj) and all(costs.saved_bytes_per_layer[i] == 0 for i in o_proj)
        per_token += out if counts_out else 0
        tokens = micro_batch * t.seq_len / cp
        return len(cores) * tokens * per_token * elem / tp

    # ---- per stage --------------------------------------------------------------------------------------
    def step_seconds(self, num_params: float) -> float:
        """The optimizer step over ``num_params`` (memory-bound, as `rank_costs` estimates it)."""
        from trainsim.sim.compute import roofline

        return roofline.streaming_seconds(
            self.device, optimizer_traffic(num_params, self.precision, self.optimizer, self.mixed_precision))

    def hidden_bytes(self, layout: Layout) -> float:
        """One micro-batch's hidden states on a context-parallel rank (the tensor-parallel messages)."""
        return layout.micro_batch * self.config.get("seq_len", 1) / layout.cp * \
            self.config.get("hidden_size", 0) * self.act

    def check(self, layout: Layout, gpus: int) -> None:
        """The layout against the model and the GPUs: one line naming the field (as the strategy says)."""
        from .split import _check

        if gpus % (layout.tp * layout.cp * layout.pp):
            raise TrainsimError(
                f"tp x cp x pp = {layout.tp} x {layout.cp} x {layout.pp} does not divide the {gpus} GPUs",
                field="strategy.mesh")
        _check(self.config or None, self.n_blocks, tp=layout.tp, cp=layout.cp, pp=layout.pp, ep=layout.ep,
               stage_blocks=list(layout.stage_blocks) if layout.stage_blocks else None)
