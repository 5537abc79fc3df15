"""What `trainsim topo show` reports about a topology: links, per-GPU injection and bisection bandwidth,
the kind of path between GPU pairs (in `nvidia-smi topo -m` words), and a drawing.
"""

from __future__ import annotations

import io
import itertools
import math
import os
from collections import Counter
from pathlib import Path

import networkx as nx

from trainsim.errors import TrainsimError, unknown_name
from trainsim.files import write_atomic

from .topology import Topology, natural_key

MAX_PAIRS_GPUS = 64  # beyond this, classify the pairs of machine 0 and from its first GPU only

LINK_COLOURS = {"nvlink": "tab:green", "pcie": "tab:blue", "upi": "tab:red", "ib": "tab:purple",
                "ethernet": "tab:orange", "dram": "tab:gray"}
NODE_COLOURS = {"gpu": "#76b900", "cpu": "#1f77b4", "dram": "#aaaaaa", "pcie_switch": "#9ecae1",
                "nvswitch": "#2ca02c", "nic": "#c5b0d5", "network_switch": "#9467bd"}
LAYERS = ["network_switch", "nic", "cpu", "dram", "pcie_switch", "gpu", "nvswitch"]


def physical_links(topo: Topology) -> list[dict]:
    """One record per physical link (the edge pair), in bytes/s and seconds."""
    seen = set()
    records = []
    for u, v, d in topo.graph.edges(data=True):
        if frozenset((u, v)) in seen:
            continue
        seen.add(frozenset((u, v)))
        records.append({"a": u, "b": v, "kind": d["kind"], "count": d["count"], "generation": d["generation"],
                        "lanes": d["lanes"], "bandwidth": d["bandwidth"], "raw_bandwidth": d["raw_bandwidth"],
                        "latency": d["latency"]})
    return records


def injection_bandwidth(topo: Topology) -> dict[str, float]:
    """Bytes/s each GPU can push out at once: the sum of its outgoing edges' bandwidth."""
    return {g: sum(d["bandwidth"] for _, _, d in topo.graph.out_edges(g, data=True)) for g in topo.gpus}


def bisection(topo: Topology) -> dict:
    """Max flow (= min cut, bytes/s per direction) from the first half of the GPUs to the second half."""
    half = len(topo.gpus) // 2
    first, second = topo.gpus[:half], topo.gpus[half:2 * half]
    if not first:
        return {"bandwidth": None, "from": first, "to": second}
    flow = nx.DiGraph()
    flow.add_edges_from((u, v, {"capacity": d["bandwidth"]}) for u, v, d in topo.graph.edges(data=True))
    flow.add_edges_from(("<source>", g) for g in first)  # no capacity attribute: unlimited
    flow.add_edges_from((g, "<sink>") for g in second)
    value = nx.maximum_flow_value(flow, "<source>", "<sink>")
    return {"bandwidth": value, "from": first, "to": second}


def network_tiers(topo: Topology) -> list[list[str]]:
    """Network switches by tier: tier 1 (``[0]``) holds those a NIC plugs into, tier k+1 those joined to
    tier k and not below it."""
    nodes = topo.graph.nodes
    tiers = [sorted({v for nic in topo.nics for v in topo.graph.successors(nic)
                     if nodes[v]["kind"] == "network_switch"}, key=natural_key)]
    seen = set(tiers[0])
    while tiers[-1]:
        above = {v for u in tiers[-1] for v in topo.graph.successors(u)
                 if nodes[v]["kind"] == "network_switch" and v not in seen}
        seen |= above
        tiers.append(sorted(above, key=natural_key))
    return tiers[:-1] if tiers[0] else []


def fabric(topo: Topology) -> dict | None:
    """The network of a cluster: per tier its switches and oversubscription (bandwidth of the links from
    below over that of the links up, one direction; none at the top tier), the NICs' injection (bytes/s
    into the network, all machines), and the bisection: the min cut (max flow, per direction) across the
    network from the NICs of the first half of the machines to those of the second half. ``None`` on a
    machine without a network switch.

    Halving by machine order is the worst cut for the generated fabrics, which fill leaves in machine
    order (a general minimum bisection is NP-hard)."""
    tiers = network_tiers(topo)
    if not tiers:
        return None
    nodes = topo.graph.nodes
    level = {n: i + 1 for i, tier in enumerate(tiers) for n in tier}
    level.update(dict.fromkeys(topo.nics, 0))
    records = []
    for i, tier in enumerate(tiers):
        down = sum(d["bandwidth"] for s in tier for u, _, d in topo.graph.in_edges(s, data=True)
                   if level.get(u, -1) == i)
        up = sum(d["bandwidth"] for s in tier for _, v, d in topo.graph.out_edges(s, data=True)
                 if level.get(v, -1) == i + 2)
        records.append({"tier": i + 1, "switches": len(tier), "down_bandwidth": down, "up_bandwidth": up,
                        "oversubscription": down / up if up else None})
    injection = {m: 0.0 for m in topo.machines}
    for nic in topo.nics:
        out = topo.graph.out_edges(nic, data=True)
        injection[nodes[nic]["machine"]] += sum(d["bandwidth"] for _, v, d in out if level.get(v) == 1)
    half = len(topo.machines) // 2
    first, second = topo.machines[:half], topo.machines[half:2 * half]
    cut = None
    if first:
        flow = nx.DiGraph()
        flow.add_edges_from((u, v, {"capacity": d["bandwidth"]}) for u, v, d in topo.graph.edges(data=True)
                            if u in level and v in level)
        flow.add_edges_from(("<source>", n) for n in topo.nics if nodes[n]["machine"] in first)
        flow.add_edges_from((n, "<sink>") for n in topo.nics if nodes[n]["machine"] in second)
        cut = nx.maximum_flow_value(flow, "<source>", "<sink>")
    return {"tiers": records, "injection": sum(injection.values()), "bisection": cut,
            "from_machines": first, "to_machines": second}


def path_class(topo: Topology, a: str, b: str) -> str:
    """The path between two GPUs in `nvidia-smi topo -m` words (HOST: staged through host memory)."""
    route = topo.route(a, b)
    kinds = [topo.edge(*e)["kind"] for e in route]
    via = [topo.graph.nodes[v]["kind"] for _, v in route[:-1]]
    if any(k in ("ib", "ethernet") for k in kinds):
        return "NET"
    if "dram" in kinds:
        return "HOST"
    if all(k == "nvlink" for k in kinds):
        return f"NV{topo.edge(*route[0])['count']}"
    if "upi" in kinds:
        return "SYS"
    if "cpu" in via:
        return "PHB"
    return "PIX" if via.count("pcie_switch") <= 1 else "PXB"


def gpu_pairs(topo: Topology) -> list[tuple[str, str]]:
    gpus = topo.gpus
    if len(gpus) <= MAX_PAIRS_GPUS:
        return list(itertools.combinations(gpus, 2))
    local = [g for g in gpus if topo.machine_of(g) == topo.machine_of(gpus[0])]
    pairs = list(itertools.combinations(local, 2))
    return pairs + [(gpus[0], g) for g in gpus if g not in local]


def path_summary(topo: Topology) -> dict[str, int]:
    """How many GPU pairs are joined by each class of path."""
    return dict(sorted(Counter(path_class(topo, a, b) for a, b in gpu_pairs(topo)).items()))


def _gbps(value: float | None) -> float | None:
    return None if value is None else round(value / 1e9, 3)


def _us(value: float) -> float:
    return round(value * 1e6, 3)


def describe(topo: Topology, progress=None) -> dict:
    """Everything `topo show --json` prints (units in the field names, as in the files). ``progress(step)``
    is told each step as it starts: on a cluster of 100k GPUs the two max flows (the bisections) take
    minutes, the rest seconds."""
    step = progress or (lambda _text: None)
    step(f"links and nodes of {len(topo.gpus):,} GPUs")
    injection = injection_bandwidth(topo)
    nodes = []
    for name, d in topo.graph.nodes(data=True):
        record = {"name": name, **{k: v for k, v in d.items() if v is not None and k not in
                                   ("memory", "dram_bandwidth", "pageable_rate", "nvls_bandwidth")}}
        if d.get("nvls_bandwidth") is not None:
            record["nvls_gbps"] = _gbps(d["nvls_bandwidth"])
        if "memory" in d:
            record["memory_gib"] = d["memory"] / 2**30
        if "dram_bandwidth" in d:
            record["dram_bandwidth_gbps"] = _gbps(d["dram_bandwidth"])
        if "pageable_rate" in d:
            record["pageable_gbps"] = _gbps(d["pageable_rate"])
        nodes.append(record)
    links = [{"a": x["a"], "b": x["b"], "kind": x["kind"], "count": x["count"], "generation": x["generation"],
              "lanes": x["lanes"], "bandwidth_gbps": _gbps(x["bandwidth"]),
              "raw_bandwidth_gbps": _gbps(x["raw_bandwidth"]), "latency_us": _us(x["latency"])}
             for x in physical_links(topo)]
    step(f"bisection: a max flow over {topo.graph.number_of_edges():,} links")
    cut = bisection(topo)
    step("network bisection: a max flow over the network's links")
    net = fabric(topo)
    step("the paths between GPUs")
    return {
        "schema": "trainsim.topo_show/1", "name": topo.name, "source": topo.source,
        "description": topo.description, "sources": topo.sources, "p2p": topo.p2p,
        "machines": len(topo.machines),
        "gpus": [{"name": g, "spec": topo.gpu_spec(g), "memory_gib": topo.gpu_memory(g) / 2**30,
                  "machine": topo.machine_of(g), "injection_gbps": _gbps(injection[g])} for g in topo.gpus],
        "nodes": nodes, "links": links,
        "bisection": {"bandwidth_gbps": _gbps(cut["bandwidth"]), "from": cut["from"], "to": cut["to"]},
        "network": None if net is None else {
            "tiers": [{"tier": t["tier"], "switches": t["switches"], "down_gbps": _gbps(t["down_bandwidth"]),
                       "up_gbps": _gbps(t["up_bandwidth"]),
                       "oversubscription": None if t["oversubscription"] is None
                       else round(t["oversubscription"], 3)} for t in net["tiers"]],
            "injection_gbps": _gbps(net["injection"]), "bisection_gbps": _gbps(net["bisection"]),
            "bisection_from_machines": net["from_machines"], "bisection_to_machines": net["to_machines"]},
        "nccl": None if topo.spec.nccl is None else topo.spec.nccl.model_dump(),
        "paths": path_summary(topo),
        "paths_over": "all GPU pairs" if len(topo.gpus) <= MAX_PAIRS_GPUS
        else "GPU pairs of the first machine and from its first GPU to every other GPU",
    }


def resolve_node(topo: Topology, text: str, field: str | None = None) -> str:
    """A node name, or a global GPU index (``3`` -> ``topo.gpus[3]``)."""
    if text.isdigit() and int(text) < len(topo.gpus):
        return topo.gpus[int(text)]
    if text in topo.graph:
        return text
    raise unknown_name("node", text, list(topo.graph.nodes), file=topo.source, field=field)


def route_report(topo: Topology, src: str, dst: str) -> dict:
    """The transfers from ``src`` to ``dst`` (a GPU copy may be staged through host memory), per edge."""
    src, dst = resolve_node(topo, src, "SRC"), resolve_node(topo, dst, "DST")
    if src == dst:
        raise TrainsimError(f"SRC and DST are the same node ({src}): there is no transfer to route",
                            field="DST")
    both_gpus = all(topo.graph.nodes[n]["kind"] == "gpu" for n in (src, dst))
    legs = topo.gpu_copy_legs(src, dst) if both_gpus else [topo.route(src, dst)]
    out = []
    for leg in legs:
        edges = [{"from": u, "to": v, "kind": topo.edge(u, v)["kind"], "count": topo.edge(u, v)["count"],
                  "bandwidth_gbps": _gbps(topo.edge(u, v)["bandwidth"]),
                  "latency_us": _us(topo.edge(u, v)["latency"])} for u, v in leg]
        out.append({"edges": edges, "latency_us": _us(topo.route_latency(leg)),
                    "bottleneck_gbps": _gbps(topo.bottleneck(leg)) if leg else None})
    return {"topology": topo.name, "src": src, "dst": dst, "staged_through_host": len(legs) > 1,
            "legs": out, "latency_us": round(sum(leg["latency_us"] for leg in out), 3),
            "bottleneck_gbps": min((leg["bottleneck_gbps"] for leg in out if leg["bottleneck_gbps"]),
                                   default=None)}


def preset_rows() -> list[dict]:
    """One row per built-in topology: name, GPU count, GPU spec(s), description."""
    from .loader import list_presets, load_topology

    rows = []
    for name in list_presets():
        topo = load_topology(name)
        specs = sorted({topo.gpu_spec(g) for g in topo.gpus})
        rows.append({"name": name, "gpus": len(topo.gpus), "gpu": ", ".join(specs),
                     "machines": len(topo.machines), "description": topo.description})
    return rows


def _positions(topo: Topology) -> dict[str, tuple[float, float]]:
    rows: dict[str, list[str]] = {}
    for name, kind in topo.graph.nodes(data="kind"):
        rows.setdefault(kind, []).append(name)
    pos = {}
    used = [k for k in LAYERS if k in rows]
    for depth, kind in enumerate(used):
        names = sorted(rows[kind], key=lambda n: (topo.machine_of(n), natural_key(n)))
        for i, name in enumerate(names):
            pos[name] = ((i + 0.5) / len(names), -depth)
    return pos


def draw_png(topo: Topology, path: str | os.PathLike) -> Path:
    """Draw the topology (nodes in rows by kind, links coloured by kind) to a PNG file, atomically."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    path = Path(path)
    pos = _positions(topo)
    width = max(8.0, 0.6 * max(Counter(k for _, k in topo.graph.nodes(data="kind")).values()))
    fig, ax = plt.subplots(figsize=(min(width, 40.0), 7))
    undirected = nx.Graph()
    undirected.add_nodes_from(topo.graph.nodes(data=True))
    undirected.add_edges_from(topo.graph.edges(data=True))
    for kind, colour in LINK_COLOURS.items():
        edges = [(u, v) for u, v, k in undirected.edges(data="kind") if k == kind]
        if not edges:
            continue
        widths = [0.5 + math.log10(max(undirected.edges[e]["bandwidth"] / 1e9, 1.0)) for e in edges]
        # NVLink joins GPUs of one row: curved arrows-without-heads keep those links apart
        curved = ({"arrows": True, "arrowstyle": "-", "connectionstyle": "arc3,rad=0.25"}
                  if kind == "nvlink" else {})
        nx.draw_networkx_edges(undirected, pos, edgelist=edges, edge_color=colour, width=widths, ax=ax,
                               **curved)
    colours = [NODE_COLOURS[k] for _, k in undirected.nodes(data="kind")]
    nx.draw_networkx_nodes(undirected, pos, node_color=colours, node_size=350, ax=ax)
    if undirected.number_of_nodes() <= 60:
        nx.draw_networkx_labels(undirected, pos, font_size=7, ax=ax)
    legend = [Line2D([0], [0], color=c, label=k) for k, c in LINK_COLOURS.items()
              if any(d == k for _, _, d in undirected.edges(data="kind"))]
    ax.legend(handles=legend, loc="upper right", fontsize=8)
    ax.set_title(f"{topo.name}: {topo.description}", fontsize=9)
    ax.axis("off")
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    finally:
        plt.close(fig)
    write_atomic(path, buffer.getvalue())  # a symbolic link is written through, as every output
    return path
