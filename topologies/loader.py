"""Loading topologies: preset names, YAML files and mappings -> a validated `Topology`.

The graph is a `networkx.DiGraph` with two directed edges per physical link (full duplex). Every cpu
socket ``X`` also gets a node ``X.dram`` (kind ``dram``) joined to it by a duplex edge pair carrying the
socket's DRAM bandwidth, so host-memory traffic contends there.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

import networkx as nx
import yaml
from pydantic import ValidationError

from trainsim.errors import TrainsimError, unknown_name
from trainsim.files import read_text
from trainsim.yamlio import parse_yaml_mapping

from . import links as phys
from .schema import DEFAULT_GPU_MEMORY_GIB, TopologySpec
from .topology import Topology
from .validation import check_pcie_trees, validation_error

GIB = 2**30


def _preset_dir():
    return resources.files("trainsim.topologies")


def list_presets() -> list[str]:
    """Names of the built-in topologies (the YAML files shipped in this package)."""
    return sorted(p.name.removesuffix(".yaml") for p in _preset_dir().iterdir() if p.name.endswith(".yaml"))


def read_yaml(path: Path, label: str) -> dict:
    """Parse a YAML mapping; a syntax error becomes one line with the file and position."""
    return parse_yaml_mapping(read_text(path, label, "topology file"), label, "topology file")


#: the real paths of the topology files being read, outermost first (a cluster's node file is read inside
#: the cluster's): one named again would recurse without end
_reading: list[str] = []


def load_spec(source, *, base_dir: Path | None = None) -> tuple[TopologySpec, str | None]:
    """A preset name, YAML path, mapping or TopologySpec -> (explicit spec, label for error messages)."""
    if isinstance(source, TopologySpec):
        return source, None
    if isinstance(source, dict):
        return spec_from_dict(source, file=None, base_dir=base_dir), None
    if isinstance(source, str | os.PathLike):
        text = os.fspath(source)
        if text in list_presets():
            label = f"{text}.yaml"
            return spec_from_dict(read_yaml(Path(str(_preset_dir() / label)), label), file=label), label
        path = Path(text)
        if base_dir is not None and not path.is_absolute():  # a file named inside another file
            path = base_dir / path
            text = str(path)
        if os.path.lexists(path):  # a file, a folder given by mistake or a link loop (read_yaml says which)
            real = os.path.realpath(path)
            if real in _reading:  # a cluster's node that names a file being read: it would contain itself
                raise TrainsimError(f"names {text}, which is being read already: a topology cannot contain "
                                    "itself (a cluster's node is one machine)")
            _reading.append(real)
            try:
                return spec_from_dict(read_yaml(path, text), file=text, base_dir=path.parent), text
            finally:
                _reading.pop()
        if text.endswith((".yaml", ".yml")) or os.sep in text:
            raise TrainsimError("file not found", file=text)
        raise unknown_name("topology", text, list_presets())
    raise TrainsimError(f"cannot load a topology from a {type(source).__name__}")


def spec_from_dict(data: dict, *, file: str | None, base_dir: Path | None = None) -> TopologySpec:
    """Validate a parsed file: explicit nodes/links, or a generator call expanded to them."""
    if "generator" in data:
        from .generators import expand  # the generators' models are built only when a file calls one

        rest = {k: v for k, v in data.items() if k != "nccl"}  # measured figures are not the generator's
        spec = expand(rest, file=file, base_dir=base_dir, load_node=load_spec)
        if "nccl" not in data:
            return spec
        data = {**spec.model_dump(by_alias=True), "nccl": data["nccl"]}
    try:
        return TopologySpec.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, file=file) from None


def load_topology(source) -> Topology:
    """A `Topology` from a preset name, a path to a YAML file, a mapping (parsed YAML) or a TopologySpec."""
    spec, label = load_spec(source)
    topo = Topology(spec, build_graph(spec, file=label), source=label)
    topo.check_routes()
    return topo


def _gpu_attrs(node, field: str, file) -> dict:
    memory = node.memory_gib if node.memory_gib is not None else DEFAULT_GPU_MEMORY_GIB.get(node.spec)
    if memory is None:
        raise TrainsimError(f"GPU spec {node.spec!r} has no default memory; give memory_gib",
                            file=file, field=f"{field}.memory_gib")
    return {"spec": node.spec, "memory": int(memory * GIB)}


def _dram(node) -> phys.LinkFigures:
    derived = (phys.dram_figures(node.dram_channels, node.dram_mt_s)
               if node.dram_channels and node.dram_mt_s else None)
    if node.dram_bandwidth_gbps is None:
        return derived
    bandwidth = node.dram_bandwidth_gbps * phys.GB
    raw = derived.raw_bandwidth if derived else bandwidth
    return phys.LinkFigures(raw, bandwidth, phys.DEFAULT_LATENCY_US["dram"] * phys.US)


def _link_figures(link, field: str, file) -> phys.LinkFigures:
    derived = None
    if link.generation is not None:
        try:
            derived = phys.derive_link(link.kind, link.generation, lanes=link.lanes, count=link.count)
        except KeyError:
            valid = phys.valid_generations(link.kind)
            raise unknown_name(f"{link.kind} generation", str(link.generation), valid, file=file,
                               field=f"{field}.generation") from None
        except ValueError as exc:
            raise TrainsimError(str(exc), file=file, field=f"{field}.generation") from None
    elif link.bandwidth_gbps is None:
        raise TrainsimError("give generation (or bandwidth_gbps) to set the bandwidth", file=file,
                            field=f"{field}.generation")
    bandwidth = link.bandwidth_gbps * phys.GB if link.bandwidth_gbps else derived.bandwidth
    raw = (link.raw_bandwidth_gbps * phys.GB if link.raw_bandwidth_gbps
           else derived.raw_bandwidth if derived else bandwidth)
    latency = (link.latency_us * phys.US if link.latency_us is not None
               else phys.DEFAULT_LATENCY_US[link.kind] * phys.US)
    return phys.LinkFigures(raw, bandwidth, latency)


def build_graph(spec: TopologySpec, *, file: str | None = None) -> nx.DiGraph:
    """The directed graph of a spec, checking names, endpoints and bandwidths."""
    names = {node.name for node in spec.nodes}
    node_attrs: dict[str, dict] = {}  # name -> attributes, in the spec's order (a cluster has 50k nodes)
    dram_edges = []
    for i, node in enumerate(spec.nodes):
        field = f"nodes[{i}]"
        if node.name in node_attrs:
            raise TrainsimError(f"duplicate node {node.name!r}", file=file, field=f"{field}.name")
        machine = node.machine if node.machine is not None else (-1 if node.kind == "network_switch" else 0)
        attrs = {"kind": node.kind, "machine": machine}
        if node.kind == "gpu":
            attrs |= _gpu_attrs(node, field, file)
        elif node.kind == "cpu":
            dram = _dram(node)
            pageable = node.pageable_gbps if node.pageable_gbps is not None else phys.PAGEABLE_GBPS
            attrs |= {"cores": node.cores, "dram_bandwidth": dram.bandwidth, "model": node.model,
                      "dram": f"{node.name}.dram", "pageable_rate": pageable * phys.GB}
        elif node.kind == "nvswitch":
            reduce = node.reduce if node.reduce is not None else node.nvlink_generation >= 4
            if node.nvls_gbps is not None and not reduce:
                raise TrainsimError("nvls_gbps needs a switch that reduces in the network (reduce: true, "
                                    "the default from nvlink_generation 4)", file=file,
                                    field=f"{field}.nvls_gbps")
            attrs |= {"reduce": reduce, "chips": node.chips, "nvlink_generation": node.nvlink_generation,
                      "nvls_bandwidth": None if node.nvls_gbps is None else node.nvls_gbps * phys.GB}
        elif node.kind in ("nic", "network_switch"):
            attrs |= {"network": node.network}
            if node.kind == "nic":
                attrs["generation"] = node.generation
        elif node.kind == "pcie_switch":
            attrs["model"] = node.model
        node_attrs[node.name] = attrs
        if node.kind == "cpu":
            dram_node = attrs["dram"]
            if dram_node in names:
                raise TrainsimError(f"node name {dram_node!r} is reserved for the DRAM of {node.name!r}",
                                    file=file, field=f"{field}.name")
            node_attrs[dram_node] = {"kind": "dram", "machine": machine, "cpu": node.name}
            edge = {"kind": "dram", "bandwidth": dram.bandwidth, "raw_bandwidth": dram.raw_bandwidth,
                    "latency": dram.latency, "count": 1, "generation": None, "lanes": None}
            dram_edges += [(node.name, dram_node, edge), (dram_node, node.name, edge)]
    if not any(node.kind == "gpu" for node in spec.nodes):
        raise TrainsimError("a topology needs at least one node of kind gpu", file=file, field="nodes")
    kind_of = {n: attrs["kind"] for n, attrs in node_attrs.items()}  # plain dicts: 100k links to check
    machine_of = {n: attrs["machine"] for n, attrs in node_attrs.items()}
    edges: dict[tuple[str, str], dict] = {}
    figures_of: dict[tuple, dict] = {}  # a cluster's links are copies of a few: their figures made once
    for i, link in enumerate(spec.links):
        a, b = link.a, link.b
        if kind_of.get(a, "dram") == "dram" or kind_of.get(b, "dram") == "dram":
            end = "a" if kind_of.get(a, "dram") == "dram" else "b"
            valid = [n for n, k in kind_of.items() if k != "dram"]
            raise unknown_name("node", getattr(link, end), valid, file=file, field=f"links[{i}].{end}")
        if a == b:
            raise TrainsimError(f"a link from {a!r} to itself", file=file, field=f"links[{i}].b")
        if (a, b) in edges:
            raise TrainsimError(f"a second link between {a!r} and {b!r}; give one link with count: N",
                                file=file, field=f"links[{i}]")
        if machine_of[a] != machine_of[b] and link.kind not in ("ib", "ethernet"):
            machines = sorted({machine_of[a], machine_of[b]})
            raise TrainsimError(f"a {link.kind} link cannot join machines {machines}; use ib or ethernet",
                                file=file, field=f"links[{i}].kind")
        key = (link.kind, link.generation, link.lanes, link.count, link.bandwidth_gbps,
               link.raw_bandwidth_gbps, link.latency_us)
        figures = figures_of.get(key)
        if figures is None:
            made = _link_figures(link, f"links[{i}]", file)
            lanes = link.lanes if link.lanes is not None else (16 if link.kind == "pcie" else None)
            figures = figures_of[key] = {"kind": link.kind, "bandwidth": made.bandwidth,
                                         "raw_bandwidth": made.raw_bandwidth, "latency": made.latency,
                                         "count": link.count, "generation": link.generation, "lanes": lanes}
        edges[a, b] = edges[b, a] = figures
    check_pcie_trees(spec, file=file)  # after the links' ends are known nodes
    graph = nx.DiGraph(name=spec.name)
    graph.add_nodes_from(node_attrs.items())  # in one call each: per-node and per-edge calls cost more
    # each direction gets its own attribute dict: add_edges_from copies the one it is given
    graph.add_edges_from(dram_edges)
    graph.add_edges_from((a, b, attrs) for (a, b), attrs in edges.items())
    return graph


def save_topology(spec: TopologySpec, path: str | os.PathLike) -> Path:
    """Write a spec as a topology YAML file, atomically (temp file + rename)."""
    from trainsim.files import write_atomic  # a symbolic link is written through, as every output

    path = Path(path)
    write_atomic(path, yaml.safe_dump(spec.to_yaml_dict(), sort_keys=False, default_flow_style=None,
                                      width=110))
    return path


# ---- generators as functions (they live here so that a cluster can load its node topology)


def pcie_tree(**params) -> TopologySpec:
    """A PCIe tree machine (see `PcieTreeParams` for the parameters)."""
    from .generators import expand

    return expand({"generator": "pcie_tree", **params})


def nvlink_mesh(links: list[list[int]], **params) -> TopologySpec:
    """A machine with direct NVLink sets from a link-count matrix (see `NvlinkMeshParams`)."""
    from .generators import expand

    return expand({"generator": "nvlink_mesh", "links": links, **params})


def nvswitch_system(**params) -> TopologySpec:
    """A machine whose GPUs meet in NVSwitch fabrics (see `NvswitchParams`)."""
    from .generators import expand

    return expand({"generator": "nvswitch", **params})


def cluster(node: str | dict, nodes: int, **params) -> TopologySpec:
    """``nodes`` machines like ``node`` on one network switch (see `ClusterParams`)."""
    from .generators import expand

    return expand({"generator": "cluster", "node": node, "nodes": nodes, **params}, load_node=load_spec)
