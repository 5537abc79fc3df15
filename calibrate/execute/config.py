"""What the real executor runs: `ExecConfig`, validated, and its mapping from a scenario.

No torch at import time (the zoo, imported to validate the model name, brings it in).

A scenario (``trainsim.scenario/1``) describes the same run for the simulator and for the executor, in one
schema with one set of defaults (`trainsim.formats.scenario`). `exec_config(scenario)` reads a validated
scenario (`trainsim.resolve.resolve_scenario`: overrides and variant applied); `exec_config_from_scenario`
resolves one first. The fields the executor reads:

- ``workload`` (zoo name or ``{name: tiny-cnn, image_size: 32}``) -> model, model_cfg
- ``strategy.name`` / ``bucket_cap_mb`` / ``strategy.easgd`` (``variant``, ``tau``, ``centre``) /
  ``strategy.pipeline`` (``stages``, ``micro_batches``, ``schedule``, ``stage_layers``, ``blocking_sends``,
  ``recompute``) / ``strategy.mesh`` (``tp``, ``cp``, ``zero``, ``sequence_parallel``, ``micro_batch``,
  ``reshard_after_forward``, ...) / ``halo_overlap``, ``backward_halo`` -> strategy options
- ``batch_size`` (global) or ``batch_per_gpu``, ``gpus`` (a count or a list of indices; none: one rank)
- ``iterations``, ``warmup_iterations``, ``optimizer.name``, ``optimizer.lr``, ``precision``
- ``host.pinned``, ``host.data_workers`` -> pinned host batches; prefetch threads with preload, else on
  CUDA ranks DataLoader worker processes (CPU ranks prepare in the loop without preload)
- ``optimizations``: ``preload``, ``cpu_batch_split``, ``param_compression`` (none, fp16, bf16,
  ``{method: powersgd, rank}``), ``offload_activations: all`` with ``offload_copies: blocking`` (torch's
  save_on_cpu) or with ``prefetch_distance: K`` (prefetching hooks), ``offload_optimizer_state``,
  ``offload_chunk_mb``
- ``executor:`` (executor-only): ``device`` (cpu|cuda; by default cuda for a scenario on a machine's
  topology, whose ranks are GPUs, so a box without CUDA skips it rather than running it on its cores, and
  cpu without a topology or on ``calibrated``), ``seed``, ``timeout_s``, ``easgd:`` (the elastic
  moving rate: ``moving_rate``, or ``rho`` [and ``lr``]) and ``data:`` (the synthetic pipeline's per-sample
  cost: ``augment_repeats``, ``source_size``, ``pool_size``, ``compress``, ``workers``).

Fields the executor has no use for (topology, description, the simulator's collective options) are ignored.
Strategies, EASGD variants and optimizations the simulator knows but the executor does not run map onto a
config that `infeasible_reason` reports, so the variant is skipped with the reason.

It stays one module: the executor's configuration, validated field by field, and its mapping from a
scenario must change together.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

from trainsim.errors import TrainsimError, unknown_name
from trainsim.formats.scenario import Optimizations, Scenario
from trainsim.formats.scenario_loader import deep_merge, read_scenario_data
from trainsim.resolve import resolve_scenario

DEVICES = ("cpu", "cuda")
# what the executor runs
STRATEGIES = ("single", "dp-gpu0", "ddp", "parameter-server", "easgd", "pipeline", "spatial", "mesh")
# what a scenario may name (the simulator's strategies): the executor reports the others as skipped
SCENARIO_STRATEGIES = (*STRATEGIES, "hybrid")
BATCHNORM_MODELS = ("resnet18", "resnet50", "googlenet")  # no spatial split without synchronised BatchNorm
PIPELINE_SCHEDULES = ("gpipe", "1f1b", "message-driven")
OPTIMIZERS = ("sgd", "momentum", "adam")
PRECISIONS = ("fp32", "fp16", "bf16")
COMPRESSIONS = ("none", "fp16", "bf16", "powersgd")  # what the executor runs
SCENARIO_COMPRESSIONS = (*COMPRESSIONS, "int8", "topk")  # what a scenario may name (the others are skipped)
OFFLOADS = ("none", "save_on_cpu", "prefetch")  # what the executor runs
# what the simulator also models, named so that such a variant is skipped with the reason
SCENARIO_OFFLOADS = (*OFFLOADS, "conv", "layers", "contention-aware", "auto-distance")
EASGD_VARIANTS = ("sync", "original")  # what the executor runs
SCENARIO_EASGD_VARIANTS = (*EASGD_VARIANTS, "async", "async-momentum", "hogwild")


def _positive_int(value, name: str, *, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TrainsimError(f"must be an integer >= {minimum}, got {value!r}", field=name)


def _choice(value, valid: tuple[str, ...], kind: str, name: str) -> None:
    if value not in valid:
        raise unknown_name(kind, str(value), valid, field=name)


@dataclass(frozen=True)
class DataConfig:
    """The synthetic input pipeline. Its per-sample CPU cost grows with ``augment_repeats`` and
    ``source_size`` (the stored image side that is randomly cropped down to the model's image size)."""

    augment_repeats: int = 1  # times the crop/flip/convert/normalise chain runs per sample
    source_size: int | None = None  # stored uint8 image side; default: the model's image size + 8
    pool_size: int = 64  # distinct stored samples, cycled (their content is the same on every rank)
    compress: bool = True  # samples are stored zlib-compressed and decoded per sample, like JPEG files
    # preload: background threads preparing batches; without preload, on CUDA ranks: DataLoader worker
    # processes (0: the training loop prepares each batch itself, as CPU ranks always do without preload)
    workers: int = 1

    def __post_init__(self):
        _positive_int(self.augment_repeats, "data.augment_repeats")
        _positive_int(self.pool_size, "data.pool_size")
        _positive_int(self.workers, "data.workers", minimum=0)
        if self.source_size is not None:
            _positive_int(self.source_size, "data.source_size")


@dataclass(frozen=True)
class EasgdConfig:
    """Elastic averaging SGD: every ``tau`` local steps each worker meets the centre with the moving rate
    alpha (worker W_i -= alpha (W_i - C); centre C += alpha sum_i (W_i - C)). alpha = ``moving_rate`` when
    given (the scenario's ``strategy.easgd.moving_rate``), else lr * rho (lr: the optimizer's by default)."""

    variant: str = "sync"  # sync: all-reduce, every rank keeps the centre | original: round-robin via rank 0
    tau: int = 1
    rho: float = 0.1
    lr: float | None = None
    moving_rate: float | None = None
    # original: the centre in rank 0's host memory ("host") or on its device ("gpu"); sync keeps a copy on
    # every rank ("replicated", its only layout); None: the variant's own
    centre: str | None = None

    def __post_init__(self):
        _choice(self.variant, SCENARIO_EASGD_VARIANTS, "easgd variant", "easgd.variant")
        _positive_int(self.tau, "easgd.tau")
        for name in ("rho", "lr", "moving_rate"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int | float) and value > 0):
                raise TrainsimError(f"must be > 0, got {value!r}", field=f"easgd.{name}")
        if self.centre is not None:
            _choice(self.centre, ("host", "gpu", "replicated"), "easgd centre", "easgd.centre")

    @property
    def where(self) -> str:
        """Where the centre lives: as given, else a copy on every rank (sync) or rank 0's host (original)."""
        return self.centre or ("replicated" if self.variant == "sync" else "host")


@dataclass(frozen=True)
class PipelineConfig:
    """Pipeline parallelism: ``stages`` consecutive stages (default: one per rank; ranks / stages replicas do
    data parallelism), ``micro_batches`` per replica and iteration, and the schedule."""

    stages: int | None = None
    micro_batches: int = 4
    schedule: str = "1f1b"  # gpipe | 1f1b | message-driven
    stage_layers: tuple[int, ...] | None = None  # leaf layers per stage (default: balanced by forward time)
    # gpipe/1f1b: a stage waiting for each send at once (Megatron's p2p, the simulator's default) is not run:
    # the executor issues isend and goes on, waiting for its sends at the end of the iteration
    blocking_sends: bool = False
    recompute: bool = False  # activation checkpointing: the simulator models it, the executor does not run it

    def __post_init__(self):
        if not isinstance(self.recompute, bool):
            raise TrainsimError(f"must be true or false, got {self.recompute!r}", field="pipeline.recompute")
        if not isinstance(self.blocking_sends, bool):
            raise TrainsimError(f"must be true or false, got {self.blocking_sends!r}",
                                field="pipeline.blocking_sends")
        if self.stages is not None:
            _positive_int(self.stages, "pipeline.stages")
        _positive_int(self.micro_batches, "pipeline.micro_batches")
        _choice(self.schedule, PIPELINE_SCHEDULES, "pipeline schedule", "pipeline.schedule")
        if self.stage_layers is not None:
            object.__setattr__(self, "stage_layers", tuple(self.stage_layers))
            for k in self.stage_layers:
                _positive_int(k, "pipeline.stage_layers")
            if self.stages is not None and len(self.stage_layers) != self.stages:
                raise TrainsimError(f"{len(self.stage_layers)} entries for {self.stages} stages",
                                    field="pipeline.stage_layers")


@dataclass(frozen=True)
class MeshConfig:
    """Strategy ``mesh`` as the executor runs it (calibrate/execute/mesh.py): ``tp`` x ``cp`` x data parallel
    ranks on a DeviceMesh (tensor parallelism innermost, as the simulator lays it out). The fields are the
    scenario's ``strategy.mesh``; what the simulator models but the executor does not run (pipeline or
    expert parallelism, ZeRO-1/2, HSDP, recomputation) maps here so that `infeasible_reason` names it."""

    tp: int = 1
    cp: int = 1
    pp: int = 1
    ep: int = 1
    zero: int = 0  # 3: FSDP2 (fully_shard per block); 0: replicated (no data parallelism beside tp/cp)
    shard: int | None = None
    sequence_parallel: bool = False
    micro_batch: int = 1  # samples per micro-batch: batch / (dp x micro_batch) accumulated per iteration
    recompute: str = "none"
    reshard_after_forward: bool = True
    context: str = "allgather"

    def __post_init__(self):
        for name in ("tp", "cp", "pp", "ep", "micro_batch"):
            _positive_int(getattr(self, name), f"mesh.{name}")
        _choice(self.zero, (0, 1, 2, 3), "zero stage", "mesh.zero")
        if self.sequence_parallel and self.tp == 1:
            raise TrainsimError("sequence_parallel splits the norms over tensor parallelism: give tp > 1",
                                field="mesh.sequence_parallel")

    def dp(self, ranks: int) -> int:
        """Data-parallel replicas (what is left of ``ranks`` after tp x cp x pp)."""
        return ranks // (self.tp * self.cp * self.pp)


@dataclass(frozen=True)
class OptimizationsConfig:
    preload: int = 0  # batches prepared ahead by background threads (0: off); on CUDA also async H2D copies
    cpu_batch_split: bool = False  # dp-gpu0: each rank loads its own shard instead of rank 0 scattering
    param_compression: str = "none"  # ddp comm hook: none | fp16 | bf16 | powersgd
    powersgd_rank: int = 1  # PowerSGD matrix approximation rank
    offload_activations: str = "none"  # none | save_on_cpu | prefetch
    prefetch_distance: int = 1  # prefetch: saved activations of this many layers ahead are brought back
    offload_optimizer_state: bool = False  # optimizer state in host memory, streamed through the GPU
    offload_chunk_mb: float = 64.0  # offload_optimizer_state: MiB of state per streamed chunk

    def __post_init__(self):
        _positive_int(self.preload, "optimizations.preload", minimum=0)
        if not isinstance(self.cpu_batch_split, bool):
            raise TrainsimError(f"must be true or false, got {self.cpu_batch_split!r}",
                                field="optimizations.cpu_batch_split")
        _choice(self.param_compression, SCENARIO_COMPRESSIONS, "compression",
                "optimizations.param_compression")
        _positive_int(self.powersgd_rank, "optimizations.param_compression.rank")
        _choice(self.offload_activations, SCENARIO_OFFLOADS, "offload mode",
                "optimizations.offload_activations")
        _positive_int(self.prefetch_distance, "optimizations.offload_activations.distance")
        chunk = self.offload_chunk_mb
        if isinstance(chunk, bool) or not isinstance(chunk, int | float) or not chunk > 0:
            raise TrainsimError(f"must be a number > 0, got {self.offload_chunk_mb!r}",
                                field="optimizations.offload_chunk_mb")


@dataclass(frozen=True)
class ExecConfig:
    """One real run: a zoo model trained for ``warmup + iterations`` steps on ``ranks`` devices."""

    model: str = "tiny-cnn"
    model_cfg: dict = field(default_factory=dict)  # zoo options, e.g. {"image_size": 32}
    device: str = "cpu"
    ranks: int = 1
    strategy: str = "single"
    bucket_cap_mb: float = 25.0  # ddp
    easgd: EasgdConfig = field(default_factory=EasgdConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)
    # spatial: the executor exchanges each halo before its layer (blocking send/recv); a scenario asking for
    # the interior computed while the halo is in flight (strategy.halo_overlap, its default) is not run
    halo_overlap: bool = False
    # its backward sends the halo rows' gradient back to their owner (autograd), not the output gradient's
    # halo rows (strategy.backward_halo's default, Distconv's)
    backward_halo: str = "input-gradient"
    batch_size: int = 32  # global: samples per iteration over all ranks
    optimizer: str = "sgd"
    lr: float = 0.01
    precision: str = "fp32"  # fp16/bf16: autocast (fp16 with a GradScaler)
    iterations: int = Scenario.model_fields["iterations"].default  # measured (the scenario schema's default)
    warmup: int = Scenario.model_fields["warmup_iterations"].default  # run first, excluded from the figures
    pinned: bool = True  # CUDA: input batches in pinned host memory
    data: DataConfig = field(default_factory=DataConfig)
    optimizations: OptimizationsConfig = field(default_factory=OptimizationsConfig)
    seed: int = 0
    capture_params: bool = False  # return every rank's final flat parameters (tests, correctness checks)
    oversubscribe: bool = False  # more CPU ranks than cores (correctness checks only: timings mean little)
    timeout_s: float = 600.0
    # torch.profiler (Chrome trace) of one iteration, the last warm-up one (the measured iterations carry no
    # profiler overhead), written by every rank to ``<profile_trace>.rank<R>.json``
    profile_trace: str | None = None
    # CPU: cores (= torch threads) per rank; None splits all cores over the ranks. `validate` sets the
    # bundle's threads_per_rank so every rank is the device the calibration measured, one rank or several
    cores_per_rank: int | None = None

    def __post_init__(self):
        from trainsim.calibrate.zoo import canonical_name, model_config  # zoo validates names and options

        object.__setattr__(self, "model", canonical_name(self.model))
        model_config(self.model, **self.model_cfg)
        _choice(self.device, DEVICES, "device", "device")
        _positive_int(self.ranks, "ranks")
        _choice(self.strategy, SCENARIO_STRATEGIES, "strategy", "strategy")
        if self.strategy == "single" and self.ranks != 1:
            raise TrainsimError(f"strategy single runs on one rank, got ranks={self.ranks}", field="ranks")
        if not (isinstance(self.bucket_cap_mb, int | float) and self.bucket_cap_mb > 0):
            raise TrainsimError(f"must be > 0, got {self.bucket_cap_mb!r}", field="bucket_cap_mb")
        _positive_int(self.batch_size, "batch_size")
        if self.strategy not in ("pipeline", "spatial", "mesh") and self.batch_size % self.ranks:
            raise TrainsimError(f"global batch {self.batch_size} does not divide over {self.ranks} ranks",
                                field="batch_size")
        _choice(self.optimizer, OPTIMIZERS, "optimizer", "optimizer")
        if not (isinstance(self.lr, int | float) and self.lr > 0):
            raise TrainsimError(f"must be > 0, got {self.lr!r}", field="lr")
        _choice(self.precision, PRECISIONS, "precision", "precision")
        _positive_int(self.iterations, "iterations")
        _positive_int(self.warmup, "warmup", minimum=0)
        opts = self.optimizations
        if opts.param_compression != "none" and self.strategy != "ddp":
            raise TrainsimError("parameter compression is a DDP communication hook; use strategy ddp",
                                field="optimizations.param_compression")
        if opts.param_compression == "powersgd" and self.warmup < 2:
            raise TrainsimError("PowerSGD runs plain all-reduce for its first 2 iterations; give warmup >= 2",
                                field="warmup")
        if opts.cpu_batch_split and self.strategy != "dp-gpu0":
            raise TrainsimError("cpu_batch_split changes dp-gpu0's input flow; other strategies already load "
                                "per-rank shards", field="optimizations.cpu_batch_split")
        if self.strategy == "pipeline":
            stages = self.pipeline.stages or self.ranks
            if self.ranks % stages:
                raise TrainsimError(f"{self.ranks} ranks are not a multiple of {stages} stages",
                                    field="pipeline.stages")
            per_replica = self.batch_size // (self.ranks // stages)
            if self.batch_size % (self.ranks // stages) or per_replica % self.pipeline.micro_batches:
                raise TrainsimError(f"global batch {self.batch_size} does not split into "
                                    f"{self.ranks // stages} replica(s) x {self.pipeline.micro_batches} "
                                    "micro-batches", field="batch_size")
        if self.strategy == "mesh":
            self._check_mesh()
        if self.precision == "fp16" and opts.offload_optimizer_state:
            raise TrainsimError("fp16 loss scaling needs the optimizer on the device; use bf16 with "
                                "offload_optimizer_state", field="precision")
        if self.precision == "fp16" and self.strategy in ("dp-gpu0", "parameter-server", "pipeline"):
            raise TrainsimError("fp16 needs a loss scaler per stepping rank; use bf16 with "
                                f"{self.strategy}", field="precision")

    def _check_mesh(self) -> None:
        mesh = self.mesh
        group = mesh.tp * mesh.cp * mesh.pp
        if self.ranks % group:
            raise TrainsimError(f"tp x cp x pp = {group} does not divide the {self.ranks} ranks",
                                field="mesh.tp")
        per_replica = mesh.dp(self.ranks) * mesh.micro_batch
        if self.batch_size % per_replica:
            raise TrainsimError(f"global batch {self.batch_size} does not split into {mesh.dp(self.ranks)} "
                                f"data-parallel replica(s) x micro_batch {mesh.micro_batch}",
                                field="batch_size")

    @property
    def local_batch(self) -> int:
        """Samples one rank loads per iteration: its data-parallel replica's share (mesh: the ranks of a
        tensor/context-parallel group load the same samples)."""
        if self.strategy == "mesh":
            return self.batch_size // self.mesh.dp(self.ranks)
        return self.batch_size // self.ranks

    @property
    def easgd_alpha(self) -> float:
        """The elastic moving rate alpha (= eta * rho)."""
        if self.easgd.moving_rate is not None:
            return self.easgd.moving_rate
        return (self.easgd.lr if self.easgd.lr is not None else self.lr) * self.easgd.rho

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------- what this box can run


def infeasible_reason(cfg: ExecConfig) -> str | None:
    """Why this box cannot run ``cfg`` (None: it can). The executor skips such variants, reporting this."""
    if cfg.strategy not in STRATEGIES:
        return f"the executor does not run strategy {cfg.strategy} yet (it runs {', '.join(STRATEGIES)})"
    opts = cfg.optimizations
    if opts.param_compression not in COMPRESSIONS:
        return (f"the executor's DDP hooks compress with {', '.join(COMPRESSIONS[1:])}, not "
                f"{opts.param_compression} (the simulator models it)")
    every = "the executor offloads every layer's saved tensors (offload_activations: all), not"
    offload_reasons = {
        "conv": f"{every} conv layers", "layers": f"{every} a list of layers",
        "contention-aware": "the executor does not stagger offload copies (contention_aware)",
        "auto-distance": "the executor prefetches a fixed distance: give prefetch_distance a number"}
    if opts.offload_activations in offload_reasons:
        return offload_reasons[opts.offload_activations]
    if cfg.strategy == "easgd" and cfg.easgd.variant not in EASGD_VARIANTS:
        return f"the executor runs EASGD {' and '.join(EASGD_VARIANTS)}, not {cfg.easgd.variant}"
    if cfg.strategy == "easgd" and (cfg.easgd.variant == "sync") != (cfg.easgd.where == "replicated"):
        return ("the executor's sync EASGD keeps a copy of the centre on every rank (one all-reduce) and its "
                "original one a single centre; set strategy.easgd.centre: replicated for sync, host or gpu "
                "for original")
    if cfg.strategy == "pipeline":
        from trainsim.calibrate.zoo import model_spec

        if model_spec(cfg.model).kind != "image":
            return f"the executor cuts only image models into pipeline stages, not {cfg.model}"
        if cfg.pipeline.recompute:
            return "the executor does not checkpoint activations (strategy.pipeline.recompute)"
        if cfg.pipeline.blocking_sends and cfg.pipeline.schedule != "message-driven":
            return ("the executor's gpipe and 1f1b issue each send and go on, they do not wait for it; set "
                    "strategy.pipeline.blocking_sends: false to run and predict that")
    if cfg.strategy == "mesh":
        reason = mesh_infeasible(cfg)
        if reason:
            return reason
    if cfg.strategy == "spatial":
        from trainsim.calibrate.zoo import model_spec

        if model_spec(cfg.model).kind != "image" or cfg.model in BATCHNORM_MODELS:
            return (f"the executor splits rows of convolutional models without BatchNorm (tiny-cnn, alexnet, "
                    f"vgg16), not {cfg.model}")
        if cfg.halo_overlap:
            return ("the executor exchanges each halo before its layer, it does not compute the interior "
                    "meanwhile; set strategy.halo_overlap: false to run and predict that")
        if cfg.backward_halo != "input-gradient":
            return ("the executor's backward sends the halo rows' gradient back to their owner, it does not "
                    "exchange the output gradient's halo; set strategy.backward_halo: input-gradient to run "
                    "and predict that")
    if cfg.device == "cuda":
        try:
            import torch
        except ImportError:
            return "needs CUDA, but torch is not installed"
        if not torch.cuda.is_available():
            return "needs CUDA, and no CUDA GPU is available here"
        if cfg.ranks > torch.cuda.device_count():
            return f"needs {cfg.ranks} GPUs, this box has {torch.cuda.device_count()}"
        if cfg.precision == "bf16" and not torch.cuda.is_bf16_supported():
            return "bf16 is not supported by this GPU"
    else:
        cores = len(os.sched_getaffinity(0))
        if cfg.ranks > cores and not cfg.oversubscribe:
            return f"needs {cfg.ranks} CPU ranks, each on its own core, but only {cores} cores are available"
        if cfg.cores_per_rank and cfg.ranks * cfg.cores_per_rank > cores and not cfg.oversubscribe:
            return (f"needs {cfg.ranks} CPU ranks of {cfg.cores_per_rank} cores each, but only {cores} cores "
                    "are available")
        if cfg.precision == "fp16":
            return "fp16 autocast with a loss scaler is a CUDA path; CPU ranks run fp32 or bf16"
        if cfg.optimizations.param_compression == "bf16":
            return "gloo (CPU ranks) cannot all-reduce bf16; use fp16 or powersgd compression"
    return None


MESH_MODELS = ("llama-tiny",)  # zoo models whose blocks the executor's mesh knows how to shard


def mesh_infeasible(cfg: ExecConfig) -> str | None:
    """Why the executor does not run ``cfg``'s strategy mesh (None: it does). What it runs: FSDP2
    (``zero: 3``, fully_shard per block), tensor parallelism with or without sequence parallelism,
    recomputation, and on CUDA ranks context parallelism, on one DeviceMesh (calibrate/execute/mesh.py)."""
    from trainsim.calibrate.zoo import model_config

    mesh, field = cfg.mesh, "strategy.mesh"
    if cfg.model not in MESH_MODELS:
        return f"the executor shards the zoo's Llama ({', '.join(MESH_MODELS)}) over a mesh, not {cfg.model}"
    if mesh.pp > 1:
        return f"the executor runs {field}.pp 1 (pipeline stages of image models: strategy pipeline)"
    if mesh.ep > 1:
        return f"the zoo's Llama has no experts: {field}.ep must be 1 to execute"
    if mesh.zero in (1, 2):
        return (f"{field}.zero {mesh.zero} is not executed: PyTorch's FSDP2 shards parameters too (zero 3); "
                "with reshard_after_forward false it still all-gathers them every iteration, which is not "
                "ZeRO-1/2's replicated parameters")
    dp_cp = mesh.dp(cfg.ranks) * mesh.cp
    if mesh.zero == 0 and dp_cp > 1:
        return (f"{field}.zero 0 over {dp_cp} data/context-parallel ranks (DDP on a mesh) is not executed; "
                "give zero 3 (FSDP2)")
    if mesh.shard is not None and mesh.shard != mesh.dp(cfg.ranks):
        return f"{field}.shard (HSDP) is not executed: FSDP2 shards over every data-parallel rank"
    config = model_config(cfg.model, **cfg.model_cfg)
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    if heads % mesh.tp or kv % mesh.tp:
        return (f"{field}.tp {mesh.tp} must divide the {heads} query and {kv} key/value heads (the fused "
                "projection is split by whole key/value groups)")
    if mesh.cp > 1:
        if cfg.device != "cuda":
            return ("context parallelism (torch's context_parallel) shards SDPA's CUDA flash/efficient "
                    "kernels; PyTorch has no sharding rule for the CPU flash kernel: it runs on CUDA ranks")
        if config["seq_len"] % (2 * mesh.cp):
            return f"the sequence of {config['seq_len']} tokens does not split into 2 x {field}.cp chunks"
    opts = cfg.optimizations
    if opts.offload_activations != "none" or opts.offload_optimizer_state or opts.preload:
        return "the executor's mesh runs without offload or preload optimizations"
    if cfg.precision == "fp16":
        return "the executor's mesh trains fp32 or bf16 (fp16 needs a sharded loss scaler)"
    return None


# ---------------------------------------------------------------- scenario -> ExecConfig


merge = deep_merge  # variants apply to the executor exactly as to the simulator


def scenario_variants(scenario: dict) -> list[str]:
    """The variant names of a scenario mapping, in file order (empty: the base scenario is the only run)."""
    return list((scenario.get("variants") or {}).keys())


def _default_device(topology: Any) -> str:
    """A machine's topology (a built-in name, a file or a generator) has GPU ranks; ``calibrated`` is this
    box's own, whose device the scenario's ``executor.device`` says (cpu unless it says cuda)."""
    return "cpu" if topology in (None, "calibrated") else "cuda"


def _ranks(scenario: Scenario) -> int:
    """The ranks the executor starts: the scenario's GPU count or indices; one when it names none (the
    executor runs on the box it is on, not on a topology's GPUs)."""
    gpus = scenario.gpus
    return 1 if gpus is None else len(gpus) if isinstance(gpus, list) else gpus


def _compression(opts: Optimizations) -> dict[str, Any]:
    spec = opts.param_compression
    if spec is None:
        return {"param_compression": "none"}
    out: dict[str, Any] = {"param_compression": spec.method}
    if spec.rank is not None:
        out["powersgd_rank"] = spec.rank
    return out


def _offload(opts: Optimizations) -> dict[str, Any]:
    """The executor's offload mode: torch's save_on_cpu (every layer, blocking copies) or its prefetching
    hooks (every layer, ``prefetch_distance`` ahead); what else the simulator models is named so that the
    variant is skipped with the reason (`infeasible_reason`)."""
    policy = opts.offload_activations
    if policy == "none" or policy == []:
        return {"offload_activations": "none"}
    if policy != "all":
        return {"offload_activations": "conv" if policy == "conv" else "layers"}
    if opts.contention_aware:
        return {"offload_activations": "contention-aware"}
    if opts.offload_copies == "blocking":
        return {"offload_activations": "save_on_cpu"}
    if opts.prefetch_distance == "auto":
        return {"offload_activations": "auto-distance"}
    return {"offload_activations": "prefetch", "prefetch_distance": opts.prefetch_distance}


def exec_config(scenario: Scenario, **overrides) -> ExecConfig:
    """The ExecConfig of a validated scenario (`trainsim.resolve.resolve_scenario`: overrides and variant
    applied); ``overrides`` are ExecConfig fields that win (e.g. ``iterations=3`` for a quick run). What the
    schema has no field for is the executor's own (``executor:``); every default is the schema's."""
    sc, st, opts, ex = scenario, scenario.strategy, scenario.optimizations, scenario.executor
    workload = sc.workload
    model, model_cfg = (workload, {}) if isinstance(workload, str) else (workload.name, workload.overrides)
    if sc.host.loader != "per-gpu":  # the simulator's other layout has no runner here
        raise TrainsimError(f"{sc.host.loader!r}: the executor runs per-gpu only (every rank a DataLoader of "
                            "its own); shared is simulated, not executed", field="host.loader")
    ranks = _ranks(sc)
    batch = sc.batch_size if sc.batch_size is not None else sc.batch_per_gpu * ranks
    easgd = st.easgd
    data = ex.data.model_dump()
    if data["workers"] is None:
        # preload needs a thread to prepare with; without it 0 is the loop preparing its own batches
        workers = sc.host.data_workers
        data["workers"] = max(1, workers) if opts.preload else workers
    pipe = st.pipeline
    mesh = st.mesh
    precision = "fp32" if sc.precision == "tf32" else sc.precision  # TF32 is a matmul mode of fp32 training
    if precision in ("fp16", "bf16") and sc.mixed_precision != "autocast":
        # the simulator would model 16-bit weights and an fp32 master copy, which this executor lacks
        raise TrainsimError("the executor trains 16-bit precisions with torch.autocast (fp32 weights); set "
                            "mixed_precision: autocast so that the simulator models the same run",
                            field="mixed_precision")
    values: dict[str, Any] = dict(
        model=model, model_cfg=model_cfg,
        device=ex.device or _default_device(sc.topology),
        ranks=ranks, strategy=st.name, bucket_cap_mb=st.bucket_cap_mb,
        easgd=EasgdConfig(
            variant=easgd.variant if easgd else "sync", tau=easgd.tau if easgd else 1,
            centre=easgd.centre if easgd else None, rho=ex.easgd.rho, lr=ex.easgd.lr,
            moving_rate=ex.easgd.moving_rate),
        pipeline=PipelineConfig(
            stages=pipe.stages, micro_batches=pipe.micro_batches, schedule=pipe.schedule,
            stage_layers=pipe.stage_layers, blocking_sends=pipe.blocking_sends,
            recompute=pipe.recompute) if pipe is not None else PipelineConfig(blocking_sends=True),
        mesh=MeshConfig(
            tp=mesh.tp, cp=mesh.cp, pp=mesh.pp, ep=mesh.ep, zero=mesh.zero, shard=mesh.shard,
            sequence_parallel=mesh.sequence_parallel, micro_batch=mesh.micro_batch, recompute=mesh.recompute,
            reshard_after_forward=mesh.reshard_after_forward,
            context=mesh.context) if mesh is not None else MeshConfig(),
        halo_overlap=st.halo_overlap, backward_halo=st.backward_halo,
        batch_size=batch, optimizer=sc.optimizer.name, lr=sc.optimizer.lr, precision=precision,
        iterations=sc.iterations, warmup=sc.warmup_iterations, pinned=sc.host.pinned,
        data=DataConfig(**data),
        optimizations=OptimizationsConfig(
            preload=opts.preload, cpu_batch_split=opts.cpu_batch_split, **_compression(opts),
            **_offload(opts),
            offload_optimizer_state=opts.offload_optimizer_state, offload_chunk_mb=opts.offload_chunk_mb),
        seed=ex.seed, timeout_s=ex.timeout_s,
    )
    values.update(overrides)
    return ExecConfig(**values)


def exec_config_from_scenario(scenario: str | dict | Scenario, variant: str | None = None, *,
                              file: str | None = None, **overrides) -> ExecConfig:
    """The ExecConfig of ``variant`` of ``scenario`` (a shipped name, a YAML path, a parsed mapping or a
    Scenario), read through the scenario schema (`exec_config`); ``file`` names a mapping's file in errors.
    Bad fields -> a TrainsimError naming the file, the variant and the field."""
    where = None
    if file is not None:
        where = f"{file} variant {variant}" if variant is not None else file
    sc = resolve_scenario(scenario, variant=variant, where=where)
    try:
        return exec_config(sc, **overrides)
    except TrainsimError as exc:
        if exc.file is None:
            raise TrainsimError(exc.reason, file=where or sc.source, field=exc.field) from None
        raise


def load_scenario_dict(path: str) -> dict:
    """Parse a scenario YAML into a mapping (its variants listed by `scenario_variants`). ``path`` may also be
    the name of a scenario shipped in trainsim's scenarios folder."""
    return read_scenario_data(path)[0]
