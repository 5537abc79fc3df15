"""A transformer workload split over a mesh: the layers one rank of a pipeline stage runs, each scaled to
that rank's share, and the blocks they form.

A transformer workload (sim/compute/transformers.py) is embedding layers, ``num_hidden_layers`` blocks
(``model.layers.{i}.*``) and the final norm and LM head. Pipeline stage ``s`` of ``pp`` runs an equal run of
blocks, the first stage the embedding too, the last the norm and head. Within a stage each layer is split as
its role says (`transformers.LAYER_ROLES`):

- ``column``, ``row``, ``heads``, ``vocab``: work and parameters over tensor parallelism (``tp``);
- ``sequence`` (norms, dropout): work over ``tp`` only under sequence parallelism; parameters replicated;
- ``replicated`` (the router, latent projections): the same work on every tensor-parallel rank;
- ``tokens`` (MoE dispatch and combine): token rows, over ``tp`` under sequence parallelism;
- ``expert``: parameters over expert parallelism (``ep``); the work is the rank's own routed tokens (the
  experts of an expert-parallel group see, together, the group's tokens), times ``expert_imbalance``, over
  ``tp`` under sequence parallelism;

and every layer's work and activations over context parallelism (``cp``: the sequence is split; causal
attention balanced over the ranks, as load-balanced context parallelism arranges). One sample stays one
sequence, so a rank's costs at ``micro_batch`` samples are its share of that many sequences.

A *measured* layer (a calibration's, its times a curve over the batch, `TimeModel`) is split the same way,
by physics rather than by its FLOPs: a rank doing 1/k of the layer's work per sample (k = tp, cp or tp x
cp, an integer) does at batch b what the whole layer did at batch b / k: the same matrix shapes but for
one dimension, the same per-call cost. So the rank's curve is the layer's stretched along the batch: each
measured point (b, t) becomes (k b, t) and the fit t(b) becomes t(b / k) (`_stretch`). A layer whose work
is not split (norms without sequence parallelism, replicated layers) keeps its curve. The collectives are
the strategy's, as for analytic layers. Expert parallelism's imbalance (not an integer share) is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from trainsim.errors import TrainsimError
from trainsim.formats.workload import Layer, TimeModel, Workload

__all__ = ["Block", "StageSplit", "split_stages", "transformer_config"]

_BLOCK = re.compile(r"^model\.layers\.(\d+)\.")


@dataclass(frozen=True)
class Block:
    """A run of a stage's layers that FSDP gathers as one unit: a transformer block, or the embedding (pre)
    and the norm and head (post). ``layers`` index the stage's workload."""

    name: str
    layers: tuple[int, ...]
    row_layers: int  # tensor parallelism's collective points (one after each row-split layer)
    attention: bool  # has an attention core (context parallelism's exchange)
    moe: bool  # has dispatch and combine (expert parallelism's all-to-alls)


@dataclass(frozen=True)
class StageSplit:
    """One rank's share of pipeline stage ``index``: its workload (split layers) and blocks."""

    index: int
    workload: Workload
    blocks: tuple[Block, ...]


def transformer_config(workload: Workload) -> dict | None:
    """The model config an analytic transformer workload was built from (None for other workloads)."""
    config = getattr(workload.provenance, "config", None)
    if config is None:
        config = (workload.provenance.model_extra or {}).get("config")
    return config if isinstance(config, dict) and "hidden_size" in config else None


def _partition(workload: Workload) -> tuple[list[int], list[list[int]], list[int]]:
    """(pre, blocks, post): layer indices before the first block, of each block, after the last."""
    pre, post, blocks = [], [], {}
    for i, layer in enumerate(workload.layers):
        match = _BLOCK.match(layer.name)
        if match:
            blocks.setdefault(int(match.group(1)), []).append(i)
        elif blocks:
            post.append(i)
        else:
            pre.append(i)
    return pre, [blocks[k] for k in sorted(blocks)], post


def _stretch(model: TimeModel | None, k: int) -> TimeModel | None:
    """A measured pass's time curve for 1/k of its work per sample: t'(b) = t(b / k) (see the module)."""
    if model is None or k == 1:
        return model
    fit = model.fit
    if fit is not None:
        fit = dict(fit)
        fit["b"] = fit["b"] / k if fit["model"] == "affine" else fit["b"] * k ** -fit["c"]
    return TimeModel(points=[(b * k, t, spread) for b, t, spread in model.points], fit=fit)


def _scale(layer: Layer, work: float, params: float, saved: float | None = None) -> Layer:
    """``layer`` with its work and activations times ``work`` (its saved tensors times ``saved``, default
    ``work``), its parameters times ``params``; a measured layer's times stretched to its share."""
    saved = work if saved is None else saved
    update = {
        "param_bytes": layer.param_bytes * params,
        "shared_param_bytes": layer.shared_param_bytes * params,
        "saved_activation_bytes_per_sample": layer.saved_activation_bytes_per_sample * saved,
        "saved_activation_bytes_fixed": layer.saved_activation_bytes_fixed * saved,
        "output_bytes_per_sample": layer.output_bytes_per_sample * work,
        "flops_forward_per_sample": layer.flops_forward_per_sample * work,
        "flops_backward_per_sample": layer.flops_backward_per_sample * work,
        "memory_bytes_forward_per_sample": layer.memory_bytes_forward_per_sample * work,
        "memory_bytes_backward_per_sample": layer.memory_bytes_backward_per_sample * work,
    }
    for name in ("saved_packed_bytes_per_sample", "saved_packed_bytes_fixed"):
        if getattr(layer, name) is not None:
            update[name] = getattr(layer, name) * saved
    if layer.autocast is not None:
        a = layer.autocast
        update["autocast"] = a.model_copy(
            update={
                "saved_per_sample": a.saved_per_sample * saved,
                "saved_fixed": a.saved_fixed * saved,
                "packed_per_sample": a.packed_per_sample * saved,
                "packed_fixed": a.packed_fixed * saved,
                "output_per_sample": a.output_per_sample * work,
                "weight_copies": a.weight_copies * params,
            }
        )
    if layer.measured and work != 1.0:
        k = round(1.0 / work)
        if abs(k * work - 1.0) > 1e-9:
            raise TrainsimError(f"layer {layer.name!r} carries measured times, which split over an integer "
                                f"number of ranks, not a share of {work:g}", field="strategy.mesh")
        update["forward"], update["backward"] = _stretch(layer.forward, k), _stretch(layer.backward, k)
    return layer.model_copy(update=update)


def _shares(role: str, tp: int, cp: int, ep: int, sp: bool, imbalance: float) -> tuple[float, float]:
    """(work, parameters) of one rank, as fractions of the layer's, for a layer of ``role``."""
    over_tp = 1.0 / tp
    work, params = {
        "vocab": (over_tp, over_tp),
        "column": (over_tp, over_tp),
        "row": (over_tp, over_tp),
        "heads": (over_tp, over_tp),
        "sequence": (over_tp if sp else 1.0, 1.0),
        "replicated": (1.0, 1.0),
        "tokens": (over_tp if sp else 1.0, 1.0),
        "expert": ((over_tp if sp else 1.0) * imbalance, 1.0 / ep),
    }[role]
    return work / cp, params


def split_stages(
    workload: Workload,
    *,
    tp: int = 1,
    cp: int = 1,
    pp: int = 1,
    ep: int = 1,
    sequence_parallel: bool = False,
    expert_imbalance: float = 1.0,
    stage_blocks: list[int] | None = None,
) -> list[StageSplit]:
    """Each pipeline stage's share of ``workload`` on one of its ranks (see the module); ``stage_blocks``:
    the blocks of each stage (default: an equal share). A workload that is not an analytic transformer can
    only be split by whole layers' stages with no tensor, context or expert parallelism."""
    from trainsim.sim.compute.transformers import layer_role

    config = transformer_config(workload)
    pre, blocks, post = _partition(workload)
    if config is None:
        if tp > 1 or cp > 1 or ep > 1:
            raise TrainsimError(
                f"tensor, context and expert parallelism split a transformer's layers; workload "
                f"{workload.name!r} is not one (analytic transformers: `trainsim workload list`)",
                field="strategy.mesh",
            )
        if not blocks:  # a CNN: each layer a block of its own
            pre, blocks, post = [], [[i] for i in range(len(workload.layers))], []
    if any(layer.measured for layer in workload.layers) and ep > 1:
        raise TrainsimError(
            "expert parallelism's share of a layer's work carries the routing imbalance, not an integer "
            f"split; workload {workload.name!r} carries measured times (split analytic ones by ep)",
            field="strategy.mesh.ep",
        )
    _check(config, len(blocks), tp=tp, cp=cp, pp=pp, ep=ep, stage_blocks=stage_blocks)
    counts = stage_blocks or [len(blocks) // pp] * pp
    starts = [sum(counts[:s]) for s in range(pp)]
    out = []
    for s in range(pp):
        chosen = [("pre", pre)] if s == 0 and pre else []
        chosen += [(f"block{starts[s] + k}", blocks[starts[s] + k]) for k in range(counts[s])]
        if s == pp - 1 and post:
            chosen.append(("post", post))
        layers, made = [], []
        for name, indices in chosen:
            first = len(layers)
            roles = []
            for i in indices:
                layer = workload.layers[i]
                role = layer_role(layer.name) if config is not None else "replicated"
                roles.append(role)
                work, params = _shares(role, tp, cp, ep, sequence_parallel, expert_imbalance)
                # a column-parallel linear saves its input, which without sequence parallelism every
                # tensor-parallel rank holds whole (Korthikanti et al.'s replicated activations)
                whole_input = role == "column" and layer.kind == "linear" and not sequence_parallel
                saved = 1.0 / cp if whole_input else work
                scaled = (work, params, saved) != (1.0, 1.0, 1.0)
                layers.append(_scale(layer, work, params, saved) if scaled else layer)
            made.append(
                Block(
                    name,
                    tuple(range(first, len(layers))),
                    roles.count("row"),
                    "heads" in roles and any(workload.layers[i].kind.endswith("attention") for i in indices),
                    "tokens" in roles,
                )
            )
        stage = workload.model_copy(update={"name": f"{workload.name}[stage {s}]", "layers": layers})
        out.append(StageSplit(s, stage, tuple(made)))
    return out


def _check(
    config: dict | None,
    blocks: int,
    *,
    tp: int,
    cp: int,
    pp: int,
    ep: int,
    stage_blocks: list[int] | None = None,
) -> None:
    """The mesh against the model: one line naming the field and what would be valid."""
    field = "strategy.mesh"
    if stage_blocks is not None:
        if sum(stage_blocks) != blocks:
            raise TrainsimError(
                f"stage_blocks add up to {sum(stage_blocks)}, the model has {blocks} blocks",
                field=f"{field}.stage_blocks",
            )
    elif blocks % pp:
        valid = ", ".join(str(d) for d in range(1, blocks + 1) if blocks % d == 0)
        raise TrainsimError(
            f"pp {pp} does not divide the {blocks} blocks of the model; valid: {valid} (or give "
            "stage_blocks)",
            field=f"{field}.pp",
        )
    if config is None:
        return
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    if heads % tp:
        raise TrainsimError(f"tp {tp} does not divide the {heads} attention heads", field=f"{field}.tp")
    if kv % tp and tp % kv:
        raise TrainsimError(
            f"tp {tp} neither divides the {kv} key/value heads nor is a multiple of them "
            "(then each is replicated)",
            field=f"{field}.tp",
        )
    experts = config.get("num_local_experts") or 0
    if ep > 1 and (not experts or experts % ep):
        what = f"the {experts} experts" if experts else "a model without experts"
        raise TrainsimError(f"ep {ep} does not divide {what}", field=f"{field}.ep")
    seq = config["seq_len"]
    if cp > 1 and seq % (2 * cp if config.get("causal", True) else cp):
        raise TrainsimError(
            f"the sequence of {seq} tokens does not split into 2 x cp = {2 * cp} chunks (a "
            "causal mask's work is balanced over the ranks by giving each two)",
            field=f"{field}.cp",
        )
