"""The topology file format `trainsim.topology/1`: pydantic models, unknown fields rejected.

A file is either explicit (``nodes`` + ``links``) or a generator call (``generator: pcie_tree`` and its
parameters, see generators.py). Units live in field names: ``bandwidth_gbps`` (1e9 B/s per direction),
``latency_us``, ``memory_gib``.

An ``nvswitch`` node stands for a set of ``chips`` identical NVSwitch chips that every GPU is wired to:
a GPU stripes its NVLink traffic evenly over all its links, so at flow level the set behaves as one
non-blocking switch whose port to each GPU is the GPU's whole bonded NVLink set (e.g. DGX A100: 6 chips,
12 links per GPU). ``reduce: true`` marks switches that reduce in the network (NVLS, NVSwitch gen 3).
``nvls_gbps`` gives the set's NVLS engines (in-switch reduction and multicast) a throughput of their own:
the bytes per second of NVLS traffic they take in from all GPUs together (each GPU's ``multimem`` loads and
stores). Unset, the engines keep up with the ports: on DGX H100 the published NVLS runs of 5 to 8 GPUs move
the same bytes per port (benchmarks/nccl_curves.py), which an engine shared by all ports would not allow.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trainsim.units import GBps, GiB, Microseconds, MTps

from .links import PcieLanes

SCHEMA = "trainsim.topology/1"
NODE_KINDS = ("gpu", "cpu", "pcie_switch", "nvswitch", "nic", "network_switch")

# Memory of GPUs whose file gives only the spec name (GiB; the smallest common variant).
DEFAULT_GPU_MEMORY_GIB = {"K80": 12, "P100": 16, "V100": 16, "T4": 16, "A100": 40, "H100": 80, "B200": 180,
                          "RTX3090": 24, "RTX4090": 24, "RTX5090": 32}


class _Strict(BaseModel):
    # strict: no bool for a number, no "16" for 16; numbers must be finite
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class _Node(_Strict):
    name: str = Field(min_length=1)
    machine: int | None = Field(default=None, ge=-1,
                                description="machine of a cluster; default 0 (-1 for network switches)")


class GpuNode(_Node):
    kind: Literal["gpu"]
    spec: str = Field(min_length=1, description='device spec name, e.g. "V100", "A100", "H100"')
    memory_gib: GiB | None = Field(default=None, gt=0)


class CpuNode(_Node):
    kind: Literal["cpu"]
    cores: int = Field(gt=0)
    model: str | None = None
    dram_bandwidth_gbps: GBps | None = Field(default=None, gt=0, description="what copies reach")
    pageable_gbps: GBps | None = Field(
        default=None, gt=0,
        description="what a copy of an input batch from pageable memory to a GPU reaches (a core stages it); "
                    "default 10.5; `trainsim calibrate --device cuda` measures it")
    dram_channels: int | None = Field(default=None, gt=0)
    dram_mt_s: MTps | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _dram_given(self):
        if self.dram_bandwidth_gbps is None and (self.dram_channels is None or self.dram_mt_s is None):
            raise ValueError("give dram_bandwidth_gbps, or dram_channels and dram_mt_s")
        return self


class PcieSwitchNode(_Node):
    kind: Literal["pcie_switch"]
    model: str | None = None


class NvswitchNode(_Node):
    kind: Literal["nvswitch"]
    nvlink_generation: int = Field(ge=1)
    chips: int = Field(default=1, gt=0)
    reduce: bool | None = Field(default=None, description="in-network reduction (NVLS); default: NVLink 4+")
    nvls_gbps: GBps | None = Field(default=None, gt=0, description="NVLS engines' throughput, GB/s of NVLS "
                                    "traffic taken in from all GPUs; default: not a limit (the ports bind)")


class NicNode(_Node):
    kind: Literal["nic"]
    network: Literal["ib", "ethernet"] = "ib"
    generation: int | str | None = None


class NetworkSwitchNode(_Node):
    kind: Literal["network_switch"]
    network: Literal["ib", "ethernet"] = "ib"


NodeSpec = Annotated[GpuNode | CpuNode | PcieSwitchNode | NvswitchNode | NicNode | NetworkSwitchNode,
                     Field(discriminator="kind")]


class LinkSpec(_Strict):
    a: str
    b: str
    kind: Literal["pcie", "nvlink", "upi", "ib", "ethernet"]
    generation: int | str | None = None
    lanes: PcieLanes | None = None
    count: int = Field(default=1, gt=0, description="bonded links (NVLink sets, inter-socket links)")
    bandwidth_gbps: GBps | None = Field(default=None, gt=0,
                                         description="per direction, what transfers reach")
    raw_bandwidth_gbps: GBps | None = Field(default=None, gt=0)
    latency_us: Microseconds | None = Field(default=None, ge=0)


class NcclFigure(_Strict):
    """One collective's measured NCCL cost with a forced algorithm and protocol: t = latency + S / algbw,
    with busbw = algbw x nccl-tests' bus factor (fitted from `trainsim calibrate`'s sweep)."""

    collective: Literal["allreduce", "allgather", "reduce_scatter", "broadcast", "reduce"]
    algo: Literal["ring", "tree", "nvls"]
    proto: Literal["ll", "ll128", "simple"]
    latency_us: Microseconds = Field(ge=0)
    busbw_gbps: GBps = Field(gt=0)
    rel_rms: float | None = Field(default=None, ge=0, description="the fit's relative RMS error")


class NcclMeasured(_Strict):
    """NCCL's figures measured on this box: they replace NCCL's tuning tables for the collectives they name
    (sim/collectives/measured.py). ``ranks``: the group they were measured on, the topology's first GPUs."""

    ranks: int = Field(ge=2)
    source: str = ""
    figures: list[NcclFigure] = Field(min_length=1)

    @model_validator(mode="after")
    def _one_figure_each(self):
        keys = [(f.collective, f.algo, f.proto) for f in self.figures]
        if len(keys) != len(set(keys)):
            raise ValueError("a collective, algo and proto appear twice")
        return self


class TopologySpec(_Strict):
    """An explicit topology: every node and physical link."""

    schema_: Literal["trainsim.topology/1"] = Field(default=SCHEMA, alias="schema")
    name: str = Field(min_length=1)
    description: str = ""
    sources: list[str] = Field(default_factory=list)
    p2p: bool = Field(default=True, description="whether GPU peer-to-peer copies are allowed")
    nodes: list[NodeSpec]
    links: list[LinkSpec]
    nccl: NcclMeasured | None = Field(default=None, description="NCCL's figures measured on this box")

    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True, allow_inf_nan=False)

    def to_yaml_dict(self) -> dict:
        """The file form: field names as in YAML, defaults left out."""
        data = self.model_dump(by_alias=True, exclude_none=True, exclude_defaults=True)
        return {"schema": SCHEMA, **data}
