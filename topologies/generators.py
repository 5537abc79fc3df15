"""Generators for what-if machines: a PCIe tree, an NVLink mesh, an NVSwitch system, a cluster of N nodes.

Each generator takes validated parameters and returns an explicit `TopologySpec`, so a generated machine
goes through the same checks as a hand-written file. From YAML: ``generator: pcie_tree`` plus the
parameters at the top level of the file (besides ``schema``, ``name``, ``description``, ``sources``).
From Python::

    from trainsim.topologies import pcie_tree
    spec = pcie_tree(gpus=8, gpus_per_switch=2, generation=3, sockets=2, gpu="V100")
    topo = load_topology(spec)                 # or load_topology({"generator": "pcie_tree", ...})
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from trainsim.errors import TrainsimError, unknown_name
from trainsim.units import GBps, GiB, MTps

from .fabrics import ClusterParams, FatTreeParams, RailParams, build_cluster, build_fat_tree, build_rail
from .links import INTER_SOCKET, PcieLanes
from .machines import Meta, make_spec
from .schema import TopologySpec
from .validation import validation_error

#: the most of each part one generated machine may have: beyond them a number is a typo (a machine of 10^8
#: GPUs would take hours and all memory to build), refused as one line naming the field
MAX_PER_MACHINE = 4096


class PcieTreeParams(Meta):
    """GPUs under PCIe switches (or on the sockets' root ports), sockets joined by an inter-socket link."""

    generator: Literal["pcie_tree"] = "pcie_tree"
    gpus: int = Field(gt=0, le=MAX_PER_MACHINE)
    gpu: str = Field(default="V100", min_length=1, description="device spec name")
    memory_gib: GiB | None = Field(default=None, gt=0)
    gpus_per_switch: int = Field(default=2, ge=0, le=MAX_PER_MACHINE,
                                 description="0: GPUs on the sockets' root ports")
    generation: int = Field(default=3, ge=1, le=6, description="PCIe generation")
    gpu_generation: int | None = Field(
        default=None, ge=1, le=6,
        description="PCIe generation of each GPU's link, where the GPU's is older than the switches' (a Gen4 "
                    "card trains its link at Gen4 behind a Gen5 switch); default: generation")
    lanes: PcieLanes = Field(default=16, description="lanes of each GPU's link")
    uplink_lanes: PcieLanes = Field(default=16, description="lanes of each switch's link to its socket")
    sockets: int = Field(default=1, gt=0, le=MAX_PER_MACHINE)
    cores: int = Field(default=16, gt=0, le=MAX_PER_MACHINE, description="cores per socket")
    dram_bandwidth_gbps: GBps | None = Field(default=None, gt=0)
    dram_channels: int = Field(default=8, gt=0, le=MAX_PER_MACHINE)
    dram_mt_s: MTps = Field(default=3200, gt=0)
    inter_socket: str = Field(default="skl", description="qpi, skl, spr, emr, amd or xbus")
    inter_socket_links: int = Field(default=1, gt=0, le=MAX_PER_MACHINE,
                                    description="links bonded between each pair of sockets (the raw rate; "
                                                "GPU traffic gets NCCL's figure for the pair whatever the count)")
    nics_per_switch: int = Field(default=0, ge=0, le=MAX_PER_MACHINE)
    nic_network: Literal["ib", "ethernet"] = "ib"
    nic_generation: int | str = "hdr"
    p2p: bool = True

    @field_validator("inter_socket")
    @classmethod
    def _known_inter_socket(cls, value: str) -> str:
        if value.lower() not in INTER_SOCKET:
            raise ValueError(f"unknown inter-socket link {value!r}; valid choices: {', '.join(INTER_SOCKET)}")
        return value.lower()


class NvlinkMeshParams(PcieTreeParams):
    """A PCIe tree plus direct NVLink sets between GPUs, from a symmetric link-count matrix."""

    generator: Literal["nvlink_mesh"] = "nvlink_mesh"
    gpus: int | None = Field(default=None, gt=0, le=MAX_PER_MACHINE,
                             description="defaults to the matrix size")
    links: list[list[int]]
    nvlink_generation: int = Field(default=2, ge=1)

    @model_validator(mode="after")
    def _square(self):
        n = len(self.links)
        if self.gpus is None:
            self.gpus = n
        if n != self.gpus or any(len(row) != n for row in self.links):
            raise ValueError(f"links must be a {self.gpus}x{self.gpus} matrix")
        for i in range(n):
            for j in range(n):
                k = self.links[i][j]
                if k < 0 or k != self.links[j][i] or (i == j and k):
                    raise ValueError(f"links[{i}][{j}]: must be symmetric, >= 0, 0 on the diagonal")
        return self


class NvswitchParams(PcieTreeParams):
    """A PCIe tree plus NVSwitch fabrics: every GPU has ``links_per_gpu`` NVLinks into its board's fabric."""

    generator: Literal["nvswitch"] = "nvswitch"
    links_per_gpu: int = Field(gt=0, le=MAX_PER_MACHINE)
    nvlink_generation: int = Field(default=3, ge=1)
    switches: int | None = Field(default=None, gt=0, le=MAX_PER_MACHINE,
                                 description="NVSwitch chips per board")
    boards: int = Field(default=1, gt=0, le=MAX_PER_MACHINE,
                        description="fabrics joined by non-blocking cross-board links")
    reduce: bool | None = None
    nvls_gbps: GBps | None = Field(default=None, gt=0, description="each fabric's NVLS engine throughput")

    @model_validator(mode="after")
    def _boards_divide(self):
        if self.gpus % self.boards:
            raise ValueError(f"gpus ({self.gpus}) must divide evenly into boards ({self.boards})")
        return self


DEFAULT_NVSWITCH_CHIPS = {2: 6, 3: 6, 4: 4}


def _host(p: PcieTreeParams) -> tuple[list[dict], list[dict]]:
    """Sockets, PCIe switches, GPUs and NICs of a PCIe tree, as node and link mappings."""
    nodes: list[dict] = []
    links: list[dict] = []
    dram = ({"dram_bandwidth_gbps": p.dram_bandwidth_gbps} if p.dram_bandwidth_gbps
            else {"dram_channels": p.dram_channels, "dram_mt_s": p.dram_mt_s})
    cpus = [f"cpu{s}" for s in range(p.sockets)]
    for cpu in cpus:
        nodes.append({"name": cpu, "kind": "cpu", "cores": p.cores, **dram})
    for i, a in enumerate(cpus):
        for b in cpus[i + 1:]:
            links.append({"a": a, "b": b, "kind": "upi", "generation": p.inter_socket,
                          "count": p.inter_socket_links})
    gpu_node = {"kind": "gpu", "spec": p.gpu}
    if p.memory_gib:
        gpu_node["memory_gib"] = p.memory_gib
    pcie = {"kind": "pcie", "generation": p.generation}
    if p.gpus_per_switch:
        n_switches = math.ceil(p.gpus / p.gpus_per_switch)
        parents = [f"sw{s}" for s in range(n_switches)]
        for s, sw in enumerate(parents):
            nodes.append({"name": sw, "kind": "pcie_switch"})
            links.append({"a": cpus[s * p.sockets // n_switches], "b": sw, **pcie, "lanes": p.uplink_lanes})
        parent_of_gpu = [parents[i // p.gpus_per_switch] for i in range(p.gpus)]
    else:
        parents = cpus
        parent_of_gpu = [cpus[i * p.sockets // p.gpus] for i in range(p.gpus)]
    gpu_pcie = {**pcie, "generation": p.gpu_generation or p.generation}
    for i, parent in enumerate(parent_of_gpu):
        nodes.append({"name": f"gpu{i}", **gpu_node})
        links.append({"a": parent, "b": f"gpu{i}", **gpu_pcie, "lanes": p.lanes})
    nic = 0
    for parent in parents:
        for _ in range(p.nics_per_switch):
            nodes.append({"name": f"nic{nic}", "kind": "nic", "network": p.nic_network,
                          "generation": p.nic_generation})
            links.append({"a": parent, "b": f"nic{nic}", **pcie, "lanes": 16})
            nic += 1
    return nodes, links


def _pcie_words(p: PcieTreeParams) -> str:
    where = f"{p.gpus_per_switch} per PCIe switch" if p.gpus_per_switch else "on root ports"
    gpus = f" (GPUs at Gen{p.gpu_generation})" if p.gpu_generation not in (None, p.generation) else ""
    return f"PCIe Gen{p.generation}{gpus}, {where}, {p.sockets} socket{'s' if p.sockets > 1 else ''}"


def build_pcie_tree(p: PcieTreeParams) -> TopologySpec:
    nodes, links = _host(p)
    return make_spec(p, nodes, links, f"pcie-tree-{p.gpus}gpu", f"{p.gpus}x {p.gpu}, {_pcie_words(p)}", p.p2p)


def build_nvlink_mesh(p: NvlinkMeshParams) -> TopologySpec:
    nodes, links = _host(p)
    for i, row in enumerate(p.links):
        for j in range(i + 1, len(row)):
            if row[j]:
                links.append({"a": f"gpu{i}", "b": f"gpu{j}", "kind": "nvlink",
                              "generation": p.nvlink_generation, "count": row[j]})
    return make_spec(p, nodes, links, f"nvlink-mesh-{p.gpus}gpu",
                 f"{p.gpus}x {p.gpu}, NVLink {p.nvlink_generation} mesh, {_pcie_words(p)}", p.p2p)


def build_nvswitch(p: NvswitchParams) -> TopologySpec:
    nodes, links = _host(p)
    chips = p.switches or DEFAULT_NVSWITCH_CHIPS.get(p.nvlink_generation, 1)
    per_board = p.gpus // p.boards
    fabrics = [f"nvsw{b}" for b in range(p.boards)]
    for fabric in fabrics:
        node = {"name": fabric, "kind": "nvswitch", "nvlink_generation": p.nvlink_generation, "chips": chips}
        if p.reduce is not None:
            node["reduce"] = p.reduce
        if p.nvls_gbps is not None:
            node["nvls_gbps"] = p.nvls_gbps
        nodes.append(node)
    nvlink = {"kind": "nvlink", "generation": p.nvlink_generation}
    for i in range(p.gpus):
        links.append({"a": f"gpu{i}", "b": fabrics[i // per_board], **nvlink, "count": p.links_per_gpu})
    for i, a in enumerate(fabrics):  # cross-board trunks as wide as a board's GPU links: non-blocking
        for b in fabrics[i + 1:]:
            links.append({"a": a, "b": b, **nvlink, "count": p.links_per_gpu * per_board})
    boards = f" on {p.boards} boards" if p.boards > 1 else ""
    return make_spec(p, nodes, links, f"nvswitch-{p.gpus}gpu",
                 f"{p.gpus}x {p.gpu}, {chips} NVSwitch chips{boards} x {p.links_per_gpu} NVLink "
                 f"{p.nvlink_generation} per GPU, {_pcie_words(p)}", p.p2p)


GENERATORS = {"pcie_tree": (PcieTreeParams, build_pcie_tree),
              "nvlink_mesh": (NvlinkMeshParams, build_nvlink_mesh),
              "nvswitch": (NvswitchParams, build_nvswitch),
              "cluster": (ClusterParams, build_cluster),
              "fat_tree": (FatTreeParams, build_fat_tree),
              "rail_optimised": (RailParams, build_rail)}


def expand(data: dict, *, file: str | None = None, base_dir: Path | None = None,
           load_node=None) -> TopologySpec:
    """Run the generator named by ``data["generator"]`` on the rest of ``data``; ``load_node`` loads the node
    topology a cluster names (`loader.load_spec`, which passes itself)."""
    name = data.get("generator")
    if name not in GENERATORS:
        raise unknown_name("generator", str(name), GENERATORS, file=file, field="generator")
    params_model, build = GENERATORS[name]
    try:
        params = params_model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, file=file) from None
    try:
        if name in ("cluster", "fat_tree", "rail_optimised"):
            return build(params, base_dir=base_dir, load_node=load_node)
        return build(params)
    except TrainsimError as exc:
        if exc.file is None:
            raise TrainsimError(exc.reason, file=file, field=exc.field) from None
        raise
    except ValidationError as exc:
        raise validation_error(exc, file=file) from None
