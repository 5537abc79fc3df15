"""Pieces the generators share: the fields every generator file has, a spec from node and link mappings,
and copies of one machine for the generators that join machines by a network (cluster, fabrics)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from trainsim.errors import TrainsimError

from .schema import SCHEMA, TopologySpec
from .topology import natural_key

#: the most machines one generated network may join, and GPUs in all: the largest training clusters have
#: about 100k GPUs (`trainsim topo show` of one takes minutes); beyond these a number is a typo, which would
#: take hours and all memory to build, refused as one line naming the field
MAX_MACHINES = 65_536
MAX_GPUS = 262_144


class Meta(BaseModel):
    """The fields of a generator file besides the generator's parameters."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    schema_: Literal["trainsim.topology/1"] = Field(default=SCHEMA, alias="schema")
    name: str | None = None
    description: str | None = None
    sources: list[str] = Field(default_factory=list)


def make_spec(p: Meta, nodes: list[dict], links: list[dict], default_name: str, description: str,
          p2p: bool = True) -> TopologySpec:
    # the links validated as part of the spec, in one call (a LinkSpec per link costs more at 100k links)
    return TopologySpec(name=p.name or default_name, description=p.description or description,
                        sources=p.sources, p2p=p2p, nodes=nodes, links=links)


def copy_machines(node_source, count: int, *, load_node, base_dir: Path | None = None):
    """``count`` copies of one machine, named ``n<m>.<node>`` with ``machine: m``: ``(node_spec, nodes, links,
    nics)`` where ``nics[m]`` lists machine m's NIC names in natural order (nic0, nic1, ...).

    ``load_node(source, base_dir=...) -> (TopologySpec, label)`` loads the machine (the loader passes its
    own). Each NIC stays where the machine file puts it (behind its PCIe switch: GPUDirect RDMA)."""
    try:
        node_spec, _ = load_node(node_source, base_dir=base_dir)
    except TrainsimError as exc:
        if exc.file is not None:  # the machine's own file is wrong: it names itself
            raise
        raise TrainsimError(exc.reason, field="node" + (f".{exc.field}" if exc.field else "")) from None
    gpus = sum(node.kind == "gpu" for node in node_spec.nodes)
    if count * gpus > MAX_GPUS:
        raise TrainsimError(f"{count:,} machines of {gpus} GPUs are {count * gpus:,} GPUs; a topology may "
                            f"have at most {MAX_GPUS:,}", field="nodes")
    own_nics = sorted((n.name for n in node_spec.nodes if n.kind == "nic"), key=natural_key)
    nodes: list[dict] = []
    links: list[dict] = []
    nics: list[list[str]] = []
    if any(node.kind == "network_switch" or (node.machine or 0) != 0 for node in node_spec.nodes):
        raise TrainsimError("a cluster's node must be a single machine (no network switches)", field="node")
    own_nodes = [node.model_dump(exclude_none=True) for node in node_spec.nodes]  # dumped once, copied below
    own_links = [link.model_dump(exclude_none=True) for link in node_spec.links]
    for m in range(count):
        prefix = f"n{m}."
        nodes += [{**node, "name": prefix + node["name"], "machine": m} for node in own_nodes]
        links += [{**link, "a": prefix + link["a"], "b": prefix + link["b"]} for link in own_links]
        nics.append([prefix + n for n in own_nics])
    if not own_nics:
        raise TrainsimError(f"machine {node_spec.name!r} has no nic node to reach the network", field="node")
    return node_spec, nodes, links, nics


def network_link(p, a: str, b: str, default_generation, count: int = 1) -> dict:
    """A network link of ``p.network`` (``p.generation`` or the NIC's own, ``p.bandwidth_gbps``,
    ``p.latency_us`` when given) bonding ``count`` ports."""
    link = {"a": a, "b": b, "kind": p.network,
            "generation": p.generation if p.generation is not None else default_generation}
    if count != 1:
        link["count"] = count
    if p.bandwidth_gbps:
        link["bandwidth_gbps"] = p.bandwidth_gbps * count
    if p.latency_us is not None:
        link["latency_us"] = p.latency_us
    return link
