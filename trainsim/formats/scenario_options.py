"""The option blocks a scenario carries: ``strategy.pipeline``, ``strategy.easgd``, ``strategy.jitter``,
``optimizations.param_compression``, and the rules that reject optimizations that make no sense together.

They are part of the scenario file format (`trainsim.formats.scenario`); the simulator's strategies and
optimizations read them (sim/strategies/pipeline.py, sim/strategies/easgd.py, sim/core/jitter.py,
sim/optimizations/compression.py, sim/optimizations/data_movement.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class JitterSpec(BaseModel):
    """``strategy.jitter``: noise on compute times (strategies pipeline and easgd; on a calibrated CPU box
    every strategy gets the spread the calibration measured, see
    `trainsim.sim.hosts.rank_step.rank_step_sigma`)."""

    model_config = ConfigDict(extra="forbid")

    distribution: Literal["lognormal", "uniform"] = "lognormal"
    sigma: float = Field(default=0.1, ge=0, description="lognormal: sigma of log; uniform: half-width")
    common_sigma: float = Field(default=0.0, ge=0,
                                description="lognormal: sigma of log of a factor every rank shares")
    centre: Literal["mean", "median"] = Field(default="mean", description="lognormal: which is 1")
    seed: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _uniform_positive(self):
        if self.distribution == "uniform" and self.sigma >= 1:
            raise ValueError("uniform jitter needs sigma < 1 (durations must stay positive)")
        if self.distribution == "uniform" and self.common_sigma:
            raise ValueError("common_sigma is lognormal only")
        return self


# ---- strategy.easgd ----------------------------------------------------------------------------------------

VARIANTS = ("original", "async", "async-momentum", "hogwild", "sync")
#: the compute model a scenario, a search and `workload times` use unless told (`compute_model`): the kernel
#: model, whose figures rest on measured kernels and beat the roofline's fixed fractions on every kernel
#: class held out of their fits (issue 42); ``roofline`` stays one field away
DEFAULT_COMPUTE_MODEL = "kernels"


class EasgdOptions(BaseModel):
    """``strategy.easgd``: the variant and the co-design switches of You et al. (SC17)."""

    model_config = ConfigDict(extra="forbid")

    variant: Literal["original", "async", "async-momentum", "hogwild", "sync"] = "sync"
    tau: int = Field(default=1, ge=1, description="communication period: iterations between exchanges")
    centre: Literal["host", "gpu", "replicated"] = Field(
        default="host",
        description="where the centre variable lives; replicated (sync): a copy on every worker, one "
        "all-reduce per exchange",
    )
    centre_gpu: int = Field(default=0, ge=0, description="rank holding the centre when centre: gpu")
    centre_socket: int = Field(default=0, ge=0, description="cpu socket holding the centre when centre: host")
    centre_cores: int = Field(default=1, ge=1, description="host cores doing one centre update")
    flat_buffer: bool = Field(default=True, description="one message for all layers (else one per layer)")
    tree_reduce: bool | None = Field(
        default=None, description="sync: binomial-tree broadcast/reduce (default) or linear (false)"
    )
    weights_on_gpu: bool = Field(default=True, description="else weights cross CPU<->GPU every iteration")
    overlap: bool = Field(default=False, description="parameter communication overlapped with compute")

    @model_validator(mode="after")
    def _replicated_is_sync(self):
        if self.centre == "replicated" and self.variant != "sync":
            raise ValueError(
                f"centre replicated applies to variant sync (all workers meet at once), not variant "
                f"{self.variant}, whose workers exchange with one centre one by one"
            )
        return self

    @model_validator(mode="after")
    def _tree_is_sync(self):
        if self.tree_reduce and self.variant != "sync":
            raise ValueError(
                f"tree_reduce applies to variant sync (its broadcast and reduce), not variant "
                f"{self.variant}, whose workers exchange with the centre one by one"
            )
        return self


# ---- strategy.pipeline -------------------------------------------------------------------------------------

SCHEDULES = ("gpipe", "1f1b", "message-driven")


class PipelineOptions(BaseModel):
    """``strategy.pipeline``: stages, micro-batches and schedule."""

    model_config = ConfigDict(extra="forbid")

    stages: int = Field(default=2, ge=1, description="pipeline stages (GPUs = stages x data parallelism)")
    micro_batches: int = Field(default=4, ge=1, description="micro-batches per replica per iteration")
    schedule: Literal["gpipe", "1f1b", "message-driven"] = "1f1b"
    stage_layers: list[int] | None = Field(
        default=None, description="layers per stage, in order (default: balanced by compute time)"
    )
    blocking_sends: bool = Field(
        default=True,
        description="gpipe/1f1b: each send is a rendezvous the stage waits for (Megatron's p2p); false: "
        "isend and go on, the sends waited for at the end of the iteration (message-driven never blocks)",
    )
    recompute: bool = Field(
        default=False,
        description="activation checkpointing per stage: keep only each micro-batch's stage input, rerun the "
        "stage's forward before its backward (memory for one micro-batch's activations at a time)",
    )

    @model_validator(mode="after")
    def _stage_layers(self):
        if self.stage_layers is not None:
            if len(self.stage_layers) != self.stages:
                raise ValueError(
                    f"stage_layers has {len(self.stage_layers)} entries for {self.stages} stages"
                )
            if any(k < 1 for k in self.stage_layers):
                raise ValueError("every stage needs at least one layer")
        return self


class MeshOptions(BaseModel):
    """``strategy.mesh``: the parallel dimensions of strategy ``mesh`` (large-model training as it is run
    today), mapped onto the GPUs with tensor parallelism innermost, then context, then data, then pipeline
    outermost; expert parallelism is carved out of data parallelism. The data-parallel degree is what is
    left: GPUs / (tp x cp x pp)."""

    model_config = ConfigDict(extra="forbid")

    tp: int = Field(default=1, ge=1, le=4096, description="tensor parallelism (Megatron column/row)")
    cp: int = Field(default=1, ge=1, le=4096, description="context parallelism: the sequence split")
    pp: int = Field(default=1, ge=1, le=4096, description="pipeline stages")
    ep: int = Field(default=1, ge=1, le=4096,
                    description="expert parallelism: experts split over this many data-parallel ranks")
    zero: Literal[0, 1, 2, 3] = Field(
        default=0, description="0: DDP (all-reduce); 1: optimizer state sharded; 2: and gradients; 3: and "
                               "parameters (FSDP: all-gathered per block, gradients reduce-scattered)")
    shard: int | None = Field(
        default=None, ge=1, le=262_144,
        description="HSDP: shard over groups of this many data-parallel ranks, replicate across groups "
                    "(an all-reduce of the shards); default: every data-parallel rank")
    sequence_parallel: bool = Field(
        default=False, description="with tp: norms and dropout split by tokens, all-gather and "
                                   "reduce-scatter instead of all-reduce")
    async_tp: bool = Field(
        default=False, description="with sequence_parallel: each all-gather and reduce-scatter split into tp "
                                   "steps under the GEMMs it feeds or follows (PyTorch's async tensor "
                                   "parallelism)")
    fp8: bool = Field(
        default=False, description="the linear layers' GEMMs in fp8 as Transformer Engine runs them (delayed "
                                   "scaling: casts of inputs, weights and output gradients); attention and "
                                   "norms in the scenario's precision; a GPU with fp8 tensor cores")
    micro_batch: int = Field(default=1, ge=1, le=2**24, description="samples (sequences) per micro-batch")
    recompute: Literal["none", "selective", "full"] = Field(
        default="none", description="selective: the attention core is recomputed in backward; full: each "
                                    "block keeps only its input and runs its forward again")
    schedule: Literal["1f1b", "gpipe", "zb-h1"] = Field(
        default="1f1b",
        description="the pipeline schedule: 1f1b, gpipe, or zb-h1 (zero bubble: each backward split into its "
                    "input and weight gradients, the weight gradients deferred into 1F1B's cool-down; at "
                    "most pp micro-batches held on a stage, as stage 0 under 1F1B; Qi et al. 2023)")
    virtual_stages: int = Field(
        default=1, ge=1, le=64,
        description="model chunks per pipeline rank (interleaved 1F1B: the bubble shrinks by this factor; "
                    "the blocks split into pp x virtual_stages chunks, chunk c on rank c mod pp)")
    stage_blocks: list[int] | None = Field(
        default=None, description="transformer blocks per pipeline stage, in order (default: blocks / pp "
                                  "each; Llama 3 405B ran 126 blocks over 16 stages as 7, 8 x 14, 7)")
    context: Literal["allgather", "ring"] = Field(
        default="allgather", description="cp: keys and values all-gathered before the attention (Llama 3), "
                                         "or passed around the ring under the attention compute")
    reshard_after_forward: bool = Field(
        default=True, description="zero 3: free a block's gathered parameters after its forward (and gather "
                                  "them again for backward), as FSDP2 does by default")
    expert_imbalance: float = Field(
        default=1.0, ge=1.0, le=64.0,
        description="the busiest expert rank's routed tokens over the average (top-k routing's imbalance)")
    mirror: bool = Field(
        default=True, description="simulate one rank per pipeline stage, standing for the stage's others "
                                  "(they run the same work); false: every rank (to check that, small runs)")

    @model_validator(mode="after")
    def _stage_blocks(self):
        if self.stage_blocks is not None:
            chunks = self.pp * self.virtual_stages
            if len(self.stage_blocks) != chunks:
                raise ValueError(f"stage_blocks has {len(self.stage_blocks)} entries for pp x virtual_stages "
                                 f"= {chunks} chunks")
            if any(k < 1 for k in self.stage_blocks):
                raise ValueError("every stage needs at least one block")
        if self.async_tp and not self.sequence_parallel:
            raise ValueError("async_tp overlaps sequence parallelism's all-gathers and reduce-scatters with "
                             "the GEMMs: give sequence_parallel: true (and tp > 1)")
        if self.virtual_stages > 1 and self.schedule == "zb-h1":
            raise ValueError("schedule zb-h1 runs one model chunk per pipeline rank: give virtual_stages 1 "
                             "(interleaved zero bubble, ZB-V, is not modelled)")
        if self.virtual_stages > 1 and (self.pp == 1 or self.schedule != "1f1b"):
            raise ValueError("virtual_stages interleaves a 1f1b pipeline: give pp > 1 and schedule 1f1b")
        return self


# ---- optimizations.param_compression -----------------------------------------------------------------------

class CompressionSpec(BaseModel):
    """``param_compression:`` a method name (``fp16``) or ``{method: topk, ratio: 0.01}`` /
    ``{method: powersgd, rank: 4}``."""

    model_config = ConfigDict(extra="forbid")

    method: Literal["fp16", "bf16", "int8", "topk", "powersgd"]
    ratio: float | None = Field(default=None, gt=0, le=1, description="topk: fraction of values sent")
    rank: int | None = Field(default=None, ge=1, description="powersgd: rank of the low-rank factors")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data):
        return {"method": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _parameters(self):
        if self.method == "topk" and self.ratio is None:
            raise ValueError("param_compression topk needs ratio (fraction of values sent, e.g. 0.01)")
        if self.method == "powersgd" and self.rank is None:
            raise ValueError("param_compression powersgd needs rank (e.g. 4)")
        if self.method != "topk" and self.ratio is not None:
            raise ValueError(f"param_compression ratio applies to method topk, not {self.method}")
        if self.method != "powersgd" and self.rank is not None:
            raise ValueError(f"param_compression rank applies to method powersgd, not {self.method}")
        return self

    def label(self) -> str:
        if self.method == "topk":
            return f"topk:{self.ratio:g}"
        if self.method == "powersgd":
            return f"powersgd:{self.rank}"
        return self.method


# ---- combinations of optimizations -------------------------------------------------------------------------

#: strategies whose ranks run the shared input copy / forward / backward of sim/strategies/context.py
INPUT_COPY_STRATEGIES = ("single", "ddp", "dp-gpu0", "parameter-server", "spatial", "hybrid")
PASS_STRATEGIES = ("single", "ddp", "dp-gpu0", "parameter-server")
COMPRESSION_STRATEGIES = ("dp-gpu0", "ddp")
SPLIT_STRATEGIES = ("dp-gpu0", "ddp", "parameter-server")  # ddp/parameter-server ranks already load shards


def one_grammar(block):
    """The ``optimizations:`` block has one grammar, the schema's (simulator and executor read the same
    fields). ``param_compression: none`` is no compression. The spellings an older executor took are
    refused with the field to write instead."""
    if not isinstance(block, dict):
        return block
    out = dict(block)
    preload = out.get("preload")
    if isinstance(preload, bool) or isinstance(preload, dict):
        depth = preload.get("depth", 1) if isinstance(preload, dict) else 1
        raise ValueError(f"preload is the number of batches copied ahead: write preload: {depth} (1: double "
                         "buffering; 0: off)")
    comp = out.get("param_compression")
    if comp == "none":
        out["param_compression"] = None
    elif comp is False:
        raise ValueError("param_compression: write none (or leave it out) for no compression")
    elif isinstance(comp, dict) and "name" in comp:
        raise ValueError(f"param_compression: write {{method: {comp['name']}, ...}}, not name")
    off = out.get("offload_activations")
    if isinstance(off, dict) or off in ("save_on_cpu", "prefetch", False):
        raise ValueError("offload_activations is none, all, conv or a list of layers; torch's save_on_cpu is "
                         "offload_activations: all with offload_copies: blocking and prefetch_distance: 0, "
                         "prefetching K layers ahead is offload_activations: all with prefetch_distance: K")
    return out


def _offload_on(policy) -> bool:
    return policy not in (None, "none") and policy != []


def check_combinations(scenario) -> None:
    """Raise ValueError (one line, naming both switches) for combinations that make no physical sense."""
    opts, strategy = scenario.optimizations, scenario.strategy.name
    if opts.cpu_batch_split and strategy not in SPLIT_STRATEGIES:
        raise ValueError(
            f"optimizations.cpu_batch_split splits the batch over several GPUs; strategy.name {strategy} "
            f"does not (use it with {', '.join(SPLIT_STRATEGIES)})"
        )
    if opts.preload and strategy not in INPUT_COPY_STRATEGIES:
        raise ValueError(
            f"optimizations.preload is modelled for strategy.name {', '.join(INPUT_COPY_STRATEGIES)}, "
            f"not {strategy}"
        )
    if opts.param_compression is not None:
        if strategy not in COMPRESSION_STRATEGIES:
            raise ValueError(
                f"optimizations.param_compression is modelled for strategy.name "
                f"{' and '.join(COMPRESSION_STRATEGIES)}, not {strategy}"
            )
        method = opts.param_compression.method
        if method in ("fp16", "bf16") and scenario.precision in ("fp16", "bf16"):
            raise ValueError(
                f"optimizations.param_compression {method} with precision {scenario.precision}: "
                "the gradients are already 2 bytes per value"
            )
    offload = _offload_on(opts.offload_activations)
    if offload and strategy not in PASS_STRATEGIES:
        raise ValueError(
            f"optimizations.offload_activations is modelled for strategy.name {', '.join(PASS_STRATEGIES)}, "
            f"not {strategy}"
        )
    if offload and scenario.host.memory_gib == 0:
        raise ValueError("optimizations.offload_activations needs pinned host memory; host.memory_gib is 0")
    if not offload:
        if opts.contention_aware:
            raise ValueError(
                "optimizations.contention_aware staggers offload/prefetch transfers; "
                "optimizations.offload_activations is off"
            )
        if opts.prefetch_distance != 1:
            raise ValueError(
                "optimizations.prefetch_distance applies to offloaded activations; "
                "optimizations.offload_activations is off"
            )
        if opts.offload_copies != "overlapped":
            raise ValueError("optimizations.offload_copies applies to offloaded activations; "
                             "optimizations.offload_activations is off")
    elif opts.offload_copies == "blocking" and opts.prefetch_distance != 0:
        raise ValueError("optimizations.prefetch_distance: blocking offload copies come back when backward "
                         f"needs them (distance 0), got {opts.prefetch_distance}")


