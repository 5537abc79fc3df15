"""Networks that join copies of one machine: one switch (`cluster`), a fat-tree, a rail-optimised fabric.

Every generator here copies the node machine (`machines.copy_machines`: each NIC stays behind its PCIe
switch, so GPUDirect RDMA shares that switch with the GPUs) and plugs NICs into ``network_switch`` nodes.
Parallel cables between two switches are one link bonding ``count`` ports.

Switch counts follow from the radix (ports per switch), the nodes and the oversubscription (down-link
to up-link ports at the leaf tier, >= 1; the tiers above are non-blocking):

- a leaf takes ``down`` NIC ports and ``up = ceil(down / oversubscription)`` up-links, ``down + up <= radix``;
- 2 tiers: every leaf spreads its up-links evenly over S spines, S the smallest divisor of ``up`` for which
  a spine's ports (leaves x up / S) fit in the radix; so at most ``radix`` leaves;
- 3 tiers: pods of ``radix / 2`` leaves (fewer when all fit in one); a pod has ``up`` aggregation switches
  (``spine<k>``) with one link from each of its leaves and as many up to the core; aggregation switch j of
  every pod spreads over core group j (G cores, G the smallest divisor of the pod's leaves that fits);
  so at most ``radix`` pods.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from trainsim.errors import TrainsimError
from trainsim.units import GBps, Microseconds

from .machines import MAX_MACHINES, Meta, copy_machines, make_spec, network_link
from .schema import TopologySpec


class ClusterParams(Meta):
    """N copies of one machine whose NICs all plug into one non-blocking network switch."""

    generator: Literal["cluster"] = "cluster"
    node: str | dict[str, Any] = Field(description="preset name, file, or topology mapping of one machine")
    nodes: int = Field(gt=0, le=MAX_MACHINES, description="number of machines")
    network: Literal["ib", "ethernet"] = "ib"
    generation: int | str | None = Field(default=None, description="default: each NIC's own generation")
    bandwidth_gbps: GBps | None = Field(default=None, gt=0, description="per port")
    latency_us: Microseconds | None = Field(default=None, ge=0)


class FatTreeParams(ClusterParams):
    """N machines on a fat-tree of ``tiers`` switch tiers; whole machines per leaf, in machine order."""

    generator: Literal["fat_tree"] = "fat_tree"  # type: ignore[assignment]
    tiers: Literal[2, 3] = 2
    radix: int = Field(gt=1, le=MAX_MACHINES, description="ports per switch")
    oversubscription: float = Field(default=1.0, description="leaf down-link to up-link ports, >= 1")
    nodes_per_leaf: int | None = Field(default=None, gt=0, le=MAX_MACHINES,
                                       description="default: as many as the leaf holds")


class RailParams(ClusterParams):
    """N machines on a rail-optimised fabric: NIC i of every machine on rail (leaf) switch i, rails joined
    by spine switches (2 tiers)."""

    generator: Literal["rail_optimised"] = "rail_optimised"  # type: ignore[assignment]
    radix: int = Field(gt=1, le=MAX_MACHINES, description="ports per switch")
    oversubscription: float = Field(default=1.0, description="rail down-link to up-link ports, >= 1")


def _check_oversubscription(p) -> None:
    if not p.oversubscription >= 1:
        raise TrainsimError(f"must be >= 1 (down-link to up-link ports), got {p.oversubscription:g}",
                            field="oversubscription")


def leaf_ports(radix: int, oversubscription: float) -> int:
    """The most down-link ports of a leaf whose ``ceil(down / oversubscription)`` up-links fit beside them."""
    down = radix
    while down > 0 and down + math.ceil(down / oversubscription) > radix:
        down -= 1
    return down


def _fits(total_ports: int, divisor_of: int, radix: int) -> int | None:
    """The smallest divisor S of ``divisor_of`` with ``total_ports / S`` ports per switch within the radix."""
    return next((s for s in range(1, divisor_of + 1) if divisor_of % s == 0 and total_ports // s <= radix),
                None)


def _switch(name: str, network: str) -> dict:
    return {"name": name, "kind": "network_switch", "network": network}


def _nic_generations(node_spec) -> dict[str, Any]:
    return {n.name: n.generation for n in node_spec.nodes if n.kind == "nic"}


def _spines(p, leaves: list[str], up: int, nodes: list[dict], links: list[dict], generation) -> int:
    """Add the spine tier of a 2-tier fabric over ``leaves`` with ``up`` up-links each; returns its size."""
    spines = _fits(len(leaves) * up, up, p.radix)
    if spines is None:
        raise TrainsimError(f"radix {p.radix} cannot join {len(leaves)} leaf switches in 2 tiers (at most "
                            f"{p.radix}); use a larger radix" + ("" if p.generator != "fat_tree"
                                                                 else " or tiers: 3"), field="radix")
    for s in range(spines):
        nodes.append(_switch(f"spine{s}", p.network))
        for leaf in leaves:
            links.append(network_link(p, leaf, f"spine{s}", generation, up // spines))
    return spines


def _three_tiers(p, leaves: list[str], up: int, nodes: list[dict], links: list[dict], generation) -> None:
    per_pod = min(len(leaves), p.radix // 2)
    pods = math.ceil(len(leaves) / per_pod)
    group = _fits(pods * per_pod, per_pod, p.radix)
    if group is None:
        raise TrainsimError(f"radix {p.radix} cannot join {pods} pods of {per_pod} leaf switches in 3 tiers "
                            f"(at most {p.radix} pods); use a larger radix", field="radix")
    for j in range(up):
        for g in range(group):
            nodes.append(_switch(f"core{j * group + g}", p.network))
    for pod in range(pods):
        for j in range(up):
            agg = f"spine{pod * up + j}"
            nodes.append(_switch(agg, p.network))
            for leaf in leaves[pod * per_pod:(pod + 1) * per_pod]:
                links.append(network_link(p, leaf, agg, generation))
            for g in range(group):
                links.append(network_link(p, agg, f"core{j * group + g}", generation, per_pod // group))


def build_fat_tree(p: FatTreeParams, *, load_node, base_dir: Path | None = None) -> TopologySpec:
    """Machines in order fill leaves ``nodes_per_leaf`` at a time; spines (and cores) per the module doc."""
    _check_oversubscription(p)
    node_spec, nodes, links, nics = copy_machines(p.node, p.nodes, load_node=load_node, base_dir=base_dir)
    per_node = len(nics[0])
    room = leaf_ports(p.radix, p.oversubscription)
    per_leaf = p.nodes_per_leaf or room // per_node
    if per_leaf < 1 or per_leaf * per_node > room:
        raise TrainsimError(f"radix {p.radix} at oversubscription {p.oversubscription:g} leaves {room} "
                            f"down-link ports per leaf, too few for {p.nodes_per_leaf or 1} machine(s) of "
                            f"{per_node} NICs", field="nodes_per_leaf" if p.nodes_per_leaf else "radix")
    per_leaf = min(per_leaf, p.nodes)
    generations = _nic_generations(node_spec)
    generation = generations[sorted(generations)[0]]
    leaves = [f"leaf{i}" for i in range(math.ceil(p.nodes / per_leaf))]
    for m, machine_nics in enumerate(nics):
        for nic in machine_nics:
            links.append(network_link(p, nic, leaves[m // per_leaf], generations[nic.split(".", 1)[1]]))
    nodes += [_switch(leaf, p.network) for leaf in leaves]
    up = math.ceil(per_leaf * per_node / p.oversubscription)
    if p.tiers == 2:
        _spines(p, leaves, up, nodes, links, generation)
    else:
        _three_tiers(p, leaves, up, nodes, links, generation)
    ratio = "non-blocking" if p.oversubscription == 1 else f"{p.oversubscription:g}:1 oversubscribed"
    return make_spec(p, nodes, links, f"{node_spec.name}-fattree-x{p.nodes}",
                     f"{p.nodes}x {node_spec.name} on a {p.tiers}-tier {ratio} {p.network} fat-tree of "
                     f"radix {p.radix}", node_spec.p2p)


def build_rail(p: RailParams, *, load_node, base_dir: Path | None = None) -> TopologySpec:
    """NIC i of machine m on leaf ``rail<i>`` (``rail<i>.<g>`` when a rail needs g > 1 leaves); spines join
    the rails."""
    _check_oversubscription(p)
    node_spec, nodes, links, nics = copy_machines(p.node, p.nodes, load_node=load_node, base_dir=base_dir)
    room = leaf_ports(p.radix, p.oversubscription)
    if room < 1:
        raise TrainsimError(f"radix {p.radix} leaves no down-link port at oversubscription "
                            f"{p.oversubscription:g}", field="radix")
    per_leaf = min(room, p.nodes)
    groups = math.ceil(p.nodes / per_leaf)
    generations = _nic_generations(node_spec)
    generation = generations[sorted(generations)[0]]
    leaves = []
    for rail in range(len(nics[0])):
        names = [f"rail{rail}" if groups == 1 else f"rail{rail}.{g}" for g in range(groups)]
        leaves += names
        for m, machine_nics in enumerate(nics):
            nic = machine_nics[rail]
            links.append(network_link(p, nic, names[m // per_leaf], generations[nic.split(".", 1)[1]]))
    nodes += [_switch(leaf, p.network) for leaf in leaves]
    _spines(p, leaves, math.ceil(per_leaf / p.oversubscription), nodes, links, generation)
    ratio = "non-blocking" if p.oversubscription == 1 else f"{p.oversubscription:g}:1 oversubscribed"
    return make_spec(p, nodes, links, f"{node_spec.name}-rail-x{p.nodes}",
                     f"{p.nodes}x {node_spec.name}, rail-optimised {ratio} {p.network} fabric of radix "
                     f"{p.radix} ({len(nics[0])} rails)", node_spec.p2p)


def build_cluster(p: ClusterParams, *, load_node, base_dir: Path | None = None) -> TopologySpec:
    """N copies of a machine (see `copy_machines`), every NIC on one non-blocking network switch."""
    node_spec, nodes, links, nics = copy_machines(p.node, p.nodes, load_node=load_node, base_dir=base_dir)
    switch = "netsw0"
    generations = _nic_generations(node_spec)
    for machine_nics in nics:
        for nic in machine_nics:
            links.append(network_link(p, nic, switch, generations[nic.split(".", 1)[1]]))
    nodes.append(_switch(switch, p.network))
    return make_spec(p, nodes, links, f"{node_spec.name}-x{p.nodes}",
                     f"{p.nodes}x {node_spec.name} on one non-blocking {p.network} switch", node_spec.p2p)
