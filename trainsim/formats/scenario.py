"""The scenario file format `trainsim.scenario/1`: pydantic models, unknown fields rejected.

A scenario names what to simulate: a topology (preset, file or generator mapping), a workload (built-in name,
JSON path, or ``{name: resnet50, image_size: 32}`` for an analytic model with config overrides), a parallel
strategy with its options, the global batch size, which GPUs, how many iterations (warm-up excluded from the
figures), the optimizer, the precision, the host's data pipeline, an ``optimizations:`` block (the
switches of docs/techniques.md) and optional named ``variants`` (partial scenarios merged over this one).

Reading a file, overrides and variants: `trainsim.formats.scenario_loader`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from trainsim.errors import TrainsimError, from_validation_error
from trainsim.units import GiB, MiB, Seconds

from .scenario_options import (
    DEFAULT_COMPUTE_MODEL,
    CompressionSpec,
    EasgdOptions,
    JitterSpec,
    MeshOptions,
    PipelineOptions,
    check_combinations,
    one_grammar,
)

SCHEMA = "trainsim.scenario/1"
STRATEGIES = ("single", "dp-gpu0", "ddp", "parameter-server", "spatial", "hybrid", "pipeline", "easgd",
              "mesh")
#: the strategies whose ranks can stream their optimizer state (optimizations.offload_optimizer_state)
OPTIMIZER_OFFLOAD_STRATEGIES = ("single", "ddp", "pipeline")
OPTIMIZERS = ("sgd", "momentum", "adam")
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")


#: the most iterations (measured, or warm-up) one scenario may simulate: more is a typo, not a study
MAX_ITERATIONS = 10_000
#: the largest batch a scenario may give (global or per GPU): 2^24 samples is far beyond any training run
MAX_BATCH = 2**24
#: the most GPUs a topology has (topologies/machines.py builds no larger one)
MAX_GPUS = 262_144


class _Strict(BaseModel):
    # strict: no bool where a number is meant (batch_size: true); numbers must be finite
    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True, allow_inf_nan=False)


class WorkloadRef(_Strict):
    """A built-in analytic model with config overrides: ``{name: resnet50, image_size: 32}``. In the file
    the overrides sit beside ``name``; here they are ``config`` (any key: the analytic model checks them)."""

    #: the loader's ``--set workload.<key>=...`` accepts any key under this model
    OPEN_KEYS: ClassVar[bool] = True

    name: str = Field(min_length=1)
    config: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _collect(cls, data):
        if isinstance(data, dict):
            return {"name": data.get("name"), "config": {k: v for k, v in data.items() if k != "name"}}
        return data

    @model_serializer
    def _flat(self) -> dict[str, Any]:
        return {"name": self.name, **self.config}

    @property
    def overrides(self) -> dict[str, Any]:
        return dict(self.config)


class StrategySpec(_Strict):
    """The parallel strategy and its options (an option another strategy ignores is harmless)."""

    name: Literal["single", "dp-gpu0", "ddp", "parameter-server", "spatial", "hybrid", "pipeline", "easgd",
                  "mesh"]
    bucket_cap_mb: MiB = Field(default=25.0, gt=0, description="DDP gradient bucket size (MiB, as PyTorch)")
    first_bucket_cap_mb: MiB | None = Field(
        default=None, gt=0, description="DDP's first bucket (PyTorch: 1 MiB); default bucket_cap_mb"
    )
    collectives: Literal["flow", "analytic"] = Field(
        default="flow", description="flow: collectives decomposed into flows; analytic: alpha-beta time"
    )
    collective_algo: Literal["auto", "ring", "tree", "nvls", "nvls_tree"] = Field(
        default="auto", description="the algorithm NCCL is forced to (NCCL_ALGO); auto: its tuning tables")
    ps_cores: int | None = Field(
        default=None, ge=1, description="parameter server: cores updating (default: all of its socket)"
    )
    ps_socket: int = Field(default=0, ge=0, description="parameter server: index of its cpu socket")
    grid: list[int] | None = Field(
        default=None,
        min_length=3,
        max_length=3,
        description="spatial/hybrid: [samples, height, width] ways (product = GPUs; spatial: [1, GPUs, 1])",
    )
    layer_grids: dict[str, list[int]] | None = Field(
        default=None,
        description="spatial/hybrid: a [samples, height, width] grid per layer name (trainsim plan)",
    )
    halo_overlap: bool = Field(
        default=True,
        description="spatial/hybrid: compute a layer's interior while its halo is in flight (Distconv); "
        "false: exchange the halo first, then run the whole layer (blocking send/recv, as the executor)",
    )
    backward_halo: Literal["output-gradient", "input-gradient"] = Field(
        default="output-gradient",
        description="spatial/hybrid: what backward exchanges: the output gradient's halo rows, from which "
        "each GPU computes its own input gradient (Distconv); input-gradient: the gradient of the halo rows "
        "received in forward, sent back to their owner after the layer (autograd, as the executor)",
    )
    symmetric_ranks: bool = Field(
        default=False,
        description="spatial/hybrid: simulate the first block of sample groups only and mirror it onto the "
        "others (needs collectives: analytic; for large GPU counts)",
    )
    mesh: MeshOptions | None = Field(
        default=None, description="mesh: tensor, context, pipeline, expert and data parallelism, ZeRO/FSDP"
    )
    pipeline: PipelineOptions | None = Field(
        default=None, description="pipeline: stages, micro-batches, schedule"
    )
    easgd: EasgdOptions | None = Field(
        default=None, description="easgd: variant, tau, centre, co-design switches"
    )
    jitter: JitterSpec | None = Field(default=None, description="pipeline/easgd: noise on compute times")

    @model_validator(mode="after")
    def _options_match_strategy(self):
        for option, owners in (
            ("pipeline", ("pipeline",)),
            ("mesh", ("mesh",)),
            ("easgd", ("easgd",)),
            ("jitter", ("pipeline", "easgd")),
        ):
            if getattr(self, option) is not None and self.name not in owners:
                raise ValueError(
                    f"strategy.{option} applies to strategy {' or '.join(owners)}, "
                    f"not strategy.name {self.name}"
                )
        return self


class OptimizerSpec(_Strict):
    name: Literal["sgd", "momentum", "adam"] = "sgd"
    lr: float = Field(default=0.01, gt=0, description="learning rate (the executor uses it; time does not)")


_WORKSPACE_CONFIG = re.compile(r"(?::\d+:\d+)+")


def cublas_workspace_config_bytes(config: str) -> int:
    """The bytes ``CUBLAS_WORKSPACE_CONFIG`` = ``config`` gives one cuBLAS handle and stream: ``:SIZE:COUNT``
    pairs, SIZE in KiB, summed (PyTorch's CublasHandlePool.cpp); ValueError if it is not of that form."""
    text = config.strip()
    if not _WORKSPACE_CONFIG.fullmatch(text):
        raise ValueError(f"CUBLAS_WORKSPACE_CONFIG {config!r} is not ':SIZE:COUNT' pairs (SIZE in KiB), "
                         "e.g. ':4096:8' or ':4096:2:16:8'")
    numbers = [int(n) for n in text.strip(":").split(":")]
    return sum(size * 1024 * count for size, count in zip(numbers[::2], numbers[1::2], strict=True))


class HostSpec(_Strict):
    pinned: bool = Field(default=True, description="input batches in pinned (page-locked) host memory")
    data_workers: int = Field(
        default=4,
        ge=0,
        le=1024,
        description="worker processes per DataLoader (per rank, or per machine with loader: shared); 0: the "
        "training loop prepares each batch itself, between iterations (PyTorch num_workers=0)",
    )
    memory_gib: GiB | None = Field(
        default=None, ge=0, description="host memory per socket free for pinned buffers (default: no limit)"
    )
    loader: Literal["per-gpu", "shared"] = Field(
        default="per-gpu",
        description="data loader layout: per-gpu, every rank has a DataLoader with its own pool of "
        "data_workers (as trainsim execute runs it); shared, one DataLoader per machine (one process, as "
        "torch.nn.DataParallel has) whose data_workers prepare every rank's batch, handed out to the ranks "
        "in turn",
    )
    prep_s_per_sample: Seconds | None = Field(
        default=None, ge=0,
        description="CPU seconds one core spends preparing one sample (decode, augment); default: the "
        "workload's (measured by calibrate), none for analytic workloads",
    )
    cublas_workspace_config: str | None = Field(
        default=None,
        description="the training process's CUBLAS_WORKSPACE_CONFIG (':SIZE:COUNT' pairs, SIZE in KiB; "
        "deterministic training sets ':4096:8' or ':16:8'), which sizes the cuBLAS workspaces it holds on "
        "every GPU; default: what the calibration recorded, else PyTorch's default for the GPU",
    )

    @field_validator("cublas_workspace_config", mode="before")
    @classmethod
    def _workspace_config(cls, value):
        if isinstance(value, int | float) and not isinstance(value, bool):
            # YAML 1.1 reads 4096:8 (no leading colon) as a base-60 number
            raise ValueError(f"expected ':SIZE:COUNT' pairs (SIZE in KiB), e.g. ':4096:8', and YAML read a "
                             f"number ({value}): start it with a colon or quote it")
        if isinstance(value, str):
            cublas_workspace_config_bytes(value)
        return value


class ExecutorData(_Strict):
    """The executor's synthetic input pipeline: what one sample costs the CPU to prepare."""

    augment_repeats: int = Field(default=1, ge=1, le=10_000,
                                 description="times the crop/flip/convert/normalise chain runs per sample")
    source_size: int | None = Field(default=None, ge=1, le=65_536,
                                    description="stored uint8 image side (default: the model's image + 8)")
    pool_size: int = Field(default=64, ge=1, le=1_000_000, description="distinct stored samples, cycled")
    compress: bool = Field(default=True, description="samples stored zlib-compressed, decoded per sample")
    workers: int | None = Field(
        default=None, ge=0, le=1024,
        description="batch-preparing threads (preload) or DataLoader processes; default host.data_workers")


class ExecutorEasgd(_Strict):
    """The elastic moving rate the executor applies: ``moving_rate``, else ``lr`` x ``rho``."""

    moving_rate: float | None = Field(default=None, gt=0)
    rho: float = Field(default=0.1, gt=0)
    lr: float | None = Field(default=None, gt=0, description="default: optimizer.lr")


class ExecutorSpec(_Strict):
    """What only the real-hardware executor reads (`trainsim execute`, `validate`): the simulator ignores
    it."""

    device: Literal["cpu", "cuda"] | None = Field(
        default=None, description="default: cuda for a scenario on a machine's topology (its ranks are "
                                  "GPUs), cpu without a topology or on calibrated")
    seed: int = Field(default=0, ge=0)
    timeout_s: float = Field(default=600.0, gt=0, description="a run's limit, after which its ranks stop")
    easgd: ExecutorEasgd = Field(default_factory=ExecutorEasgd)
    data: ExecutorData = Field(default_factory=ExecutorData)


class Optimizations(_Strict):
    """Data-movement optimizations (docs/techniques.md); unknown keys are rejected."""

    offload_optimizer_state: bool = Field(
        default=False,
        description="single, ddp, pipeline: optimizer state (and 16-bit training's fp32 master weights) in "
        "pinned host memory, streamed through the GPU in chunks at every step (AxoNN)",
    )
    offload_chunk_mb: MiB = Field(
        default=64.0, gt=0, description="offload_optimizer_state: chunk size (MiB)"
    )
    # ScaleDNN (sim/strategies/dp_gpu0.py, sim/strategies/loaders.py, sim/optimizations/compression.py)
    cpu_batch_split: bool = Field(
        default=False, description="the host splits the batch and copies each GPU its shard (vs GPU0 scatter)"
    )
    preload: int = Field(
        default=0, ge=0, le=MAX_ITERATIONS,
        description="batches copied ahead on the H2D copy engine (1: double buffering)"
    )
    param_compression: CompressionSpec | None = Field(
        default=None, description="fp16 | bf16 | int8 | {method: topk, ratio} | {method: powersgd, rank}"
    )
    # hybrid GPU/CPU memory, vDNN / Kim et al. (sim/optimizations/offload.py)
    offload_activations: Literal["none", "all", "conv"] | list[str] = Field(
        default="none", description="saved activations offloaded to pinned host memory: all, conv or layers"
    )
    prefetch_distance: Annotated[int, Field(ge=0)] | Literal["auto"] = Field(
        default=1, description="offloaded layers prefetched this many layers ahead in backward, or auto"
    )
    contention_aware: bool = Field(
        default=False, description="stagger offload/prefetch copies of GPUs sharing a link"
    )
    offload_copies: Literal["overlapped", "blocking"] = Field(
        default="overlapped",
        description="offloaded activations: copies on a copy engine beside compute (vDNN), or blocking "
        "copies in the compute stream's order (torch save_on_cpu: the layer, then its copy out; "
        "backward's copy back when it needs the tensor)",
    )

    @model_validator(mode="before")
    @classmethod
    def _one_grammar(cls, data):
        return one_grammar(data)


Scalar = str | int | float | bool | None


class Assumption(_Strict):
    """A free assumption the source leaves open, fixed before the run: its stated ``value``, the ``choices``
    or numeric ``range`` a reproduction sweeps it over, and a one-line ``reason``. ``set`` is the scenario
    field (an override path such as ``strategy.easgd.tau``) that carries it; ``variants`` limits it to those
    variants (default: every run of the scenario)."""

    name: str = Field(min_length=1)
    value: Scalar
    choices: list[Scalar] | None = Field(default=None, min_length=2)
    range: list[float] | None = Field(default=None, min_length=2, max_length=2, description="[low, high]")
    reason: str = Field(min_length=1)
    set: str | None = Field(default=None, min_length=1, description="the scenario field it sets")
    variants: list[str] | None = Field(default=None, min_length=1)

    @field_validator("reason")
    @classmethod
    def _one_line(cls, reason: str) -> str:
        if "\n" in reason.strip():
            raise ValueError("a reason is one line")
        return reason.strip()

    @model_validator(mode="after")
    def _value_within(self):
        if (self.choices is None) == (self.range is None):
            raise ValueError(f"assumption {self.name!r}: give choices or range (one of them)")
        if self.choices is not None and self.value not in self.choices:
            raise ValueError(f"assumption {self.name!r}: value {self.value!r} is not one of its choices "
                             f"{self.choices}")
        if self.range is not None:
            low, high = self.range
            if not low <= high:
                raise ValueError(f"assumption {self.name!r}: range low {low} is above high {high}")
            if isinstance(self.value, bool) or not isinstance(self.value, int | float) or not (
                    low <= self.value <= high):
                raise ValueError(f"assumption {self.name!r}: value {self.value!r} is outside its range "
                                 f"[{low}, {high}]")
        return self

    @property
    def sweep(self) -> list[Scalar]:
        """The values a reproduction runs: the choices, or the range's ends (the stated value is the
        reproduction's stated run)."""
        return list(self.choices) if self.choices is not None else list(self.range)


class Scenario(_Strict):
    schema_: Literal["trainsim.scenario/1"] = Field(default=SCHEMA, alias="schema")
    name: str = Field(default="scenario", min_length=1)
    description: str = ""
    assumptions: list[str | Assumption] = Field(
        default_factory=list,
        description="what the scenario assumes that its source does not state: a sentence, or a free "
        "assumption {name, value, choices | range, reason, set, variants} that reproductions sweep",
    )
    # the machine to simulate on (the simulator needs it; the executor runs on the box it is on)
    topology: str | dict[str, Any] | None = None
    workload: str | WorkloadRef
    strategy: StrategySpec
    batch_size: int | None = Field(
        default=None, gt=0, le=MAX_BATCH,
        description="the global batch: samples per iteration over all the GPUs, split between them (moving a "
                    "scenario to more GPUs shrinks each GPU's share); give this or batch_per_gpu")
    batch_per_gpu: int | None = Field(
        default=None, gt=0, le=MAX_BATCH,
        description="samples per GPU per iteration: the global batch is this times the GPUs the run uses, so "
                    "it scales with the GPU count; give this or batch_size")
    gpus: list[int] | int | None = Field(default=None, description="GPU indices, a count, or all (default)")
    iterations: int = Field(default=3, ge=1, le=MAX_ITERATIONS,
                            description=f"measured iterations (at most {MAX_ITERATIONS})")
    warmup_iterations: int = Field(default=1, ge=0, le=MAX_ITERATIONS,
                                   description="simulated first, excluded from figures")
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    precision: Literal["fp32", "tf32", "fp16", "bf16"] = "fp32"
    mixed_precision: Literal["master", "autocast"] = Field(
        default="master",
        description="how fp16/bf16 training keeps its weights: master (16-bit weights and gradients, an fp32 "
                    "master copy in the optimizer: Megatron, DeepSpeed) or autocast (torch.autocast: fp32 "
                    "weights and gradients, 16-bit copies made in the forward; what `validate` executes)")
    compute_model: Literal["roofline", "kernels"] = Field(
        default=DEFAULT_COMPUTE_MODEL,
        description="how a layer's time is estimated where it was not measured on the GPU it runs on "
                    "(analytic workloads, and the ratio that moves measured times to another GPU or "
                    "precision): roofline (a fixed fraction of peak FLOP/s or bandwidth) or kernels (the "
                    "kernel model: each layer's kernels timed from figures fitted on measured kernels); CPU "
                    "devices keep the roofline")
    comm_interference: bool = Field(
        default=True,
        description="communication kernels share the GPU with the compute they overlap: while a collective "
                    "runs, its NCCL channels hold SMs (one CTA each) and its bytes take HBM bandwidth, so "
                    "overlapped layers slow by the share they lose (false: overlap is free)")
    host: HostSpec = Field(default_factory=HostSpec)
    optimizations: Optimizations = Field(default_factory=Optimizations)
    variants: dict[str, dict[str, Any]] = Field(default_factory=dict)
    executor: ExecutorSpec = Field(default_factory=lambda: ExecutorSpec(),
                                   description="what only the real-hardware executor reads")
    # where the file came from (relative topology/workload paths resolve against its folder)
    _source: str | None = PrivateAttr(default=None)
    _base_dir: str | None = PrivateAttr(default=None)
    # fields the command line set (--set): a relative path there is the working folder's, not the file's
    _set_here: frozenset[str] = PrivateAttr(default=frozenset())

    @property
    def source(self) -> str | None:
        return self._source

    @property
    def base_dir(self) -> str | None:
        return self._base_dir

    def path_base(self, field: str) -> str | None:
        """The folder a relative path in ``field`` (topology, workload) resolves against first: the
        scenario file's, unless ``--set`` gave the field (then the working folder's: None)."""
        return None if field in self._set_here else self._base_dir

    @field_validator("assumptions", mode="before")
    @classmethod
    def _assumption_entries(cls, entries):
        # a mapping is a free assumption: its own errors, not "should be a valid string"
        if not isinstance(entries, list):
            return entries
        out = []
        for index, entry in enumerate(entries):
            if isinstance(entry, dict):
                try:
                    entry = Assumption.model_validate(entry)
                except ValidationError as exc:
                    first = exc.errors()[0]
                    where = ".".join(str(part) for part in first.get("loc", ()))
                    msg = first.get("msg", str(exc)).removeprefix("Value error, ")
                    raise ValueError(f"entry {index}{'.' + where if where else ''}: {msg}") from None
            out.append(entry)
        return out

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, gpus):
        if isinstance(gpus, int) and not isinstance(gpus, bool) and gpus < 1:
            raise ValueError("a GPU count must be >= 1")
        if isinstance(gpus, int) and not isinstance(gpus, bool) and gpus > MAX_GPUS:
            raise ValueError(f"a GPU count must be at most {MAX_GPUS:,} (the largest topology there is)")
        if isinstance(gpus, list):
            if not gpus:
                raise ValueError("give at least one GPU index")
            if any(g < 0 for g in gpus):
                raise ValueError("GPU indices must be >= 0")
            if len(gpus) > MAX_GPUS or any(g >= MAX_GPUS for g in gpus):
                raise ValueError(f"GPU indices must be below {MAX_GPUS:,} (the largest topology there is)")
            if len(set(gpus)) != len(gpus):
                raise ValueError("a GPU index appears twice")
        return gpus

    @model_validator(mode="after")
    def _one_batch(self):
        if self.batch_size is None and self.batch_per_gpu is None:
            raise ValueError("give batch_size (the global batch) or batch_per_gpu (samples per GPU)")
        if self.batch_size is not None and self.batch_per_gpu is not None:
            raise ValueError("give batch_size (the global batch) or batch_per_gpu (samples per GPU), "
                             "not both")
        return self

    @model_validator(mode="after")
    def _single(self):
        if self.strategy.name == "single" and isinstance(self.gpus, list) and len(self.gpus) != 1:
            raise ValueError("strategy single runs on one GPU; give gpus: [index] or gpus: 1")
        if self.strategy.name == "single" and isinstance(self.gpus, int) and self.gpus != 1:
            raise ValueError("strategy single runs on one GPU; give gpus: 1")
        return self

    @model_validator(mode="after")
    def _offload_needs_a_streaming_strategy(self):
        name = self.strategy.name
        if self.optimizations.offload_optimizer_state and name not in OPTIMIZER_OFFLOAD_STRATEGIES:
            raise ValueError(
                "optimizations.offload_optimizer_state is modelled for strategy.name "
                f"{', '.join(OPTIMIZER_OFFLOAD_STRATEGIES)}, not {name}"
            )
        return self

    @model_validator(mode="after")
    def _data_movement(self):
        check_combinations(self)
        return self


def validate_scenario(data: dict, *, label: str | None = None) -> Scenario:
    """A `Scenario` from a mapping; a bad field is a one-line TrainsimError naming ``label`` and the field."""
    if "schema" in data and data["schema"] != SCHEMA:
        raise TrainsimError(
            f"unsupported schema {data['schema']!r}; expected {SCHEMA!r}", file=label, field="schema"
        )
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc, file=label) from None
