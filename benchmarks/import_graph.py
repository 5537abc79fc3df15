"""The architecture as the imports draw it: cycles, forbidden edges, the largest modules, and a picture.

    python benchmarks/import_graph.py [--png import_graph.png] [--json]

Reads every module of the five top-level folders with ``ast`` (nothing is imported), counts an import
wherever it stands (module level or inside a function), and checks the layering the design asks for:

- no import cycles between packages (a package is a folder: ``trainsim.sim.core``, ``trainsim.formats``...);
- ``sim/`` imports nothing of ``calibrate/``, no scenario loader, not ``trainsim.resolve`` and no reader of
  a user's files (it receives a resolved `Run`, loaded traces and topologies);
- ``trainsim/formats/`` imports neither ``sim/`` nor ``calibrate/``.

Exit status 1 when a rule is broken, so CI-style runs can use it.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import Counter
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"trainsim": "trainsim", "sim": "trainsim.sim", "calibrate": "trainsim.calibrate",
           "topologies": "trainsim.topologies", "scenarios": "trainsim.scenarios"}
#: modules sim/ may not import: measurement, and anything that reads scenario files
SIM_FORBIDDEN = ("trainsim.calibrate", "trainsim.scenarios", "trainsim.api", "trainsim.cli",
                 "trainsim.resolve")
SCENARIO_LOADERS = ("trainsim.formats.scenario.load_scenario", "trainsim.formats.scenario.read_scenario_data")
#: what reads a user's input files (topologies, workloads, bundles, traces): trainsim.resolve and
#: trainsim.traces call them, so that sim/ reads no file of the user's
FILE_READERS = ("trainsim.topologies.load_topology", "trainsim.topologies.loader.load_topology",
                "trainsim.formats.workload.load_workload", "trainsim.formats.bundle.load_bundle",
                "trainsim.formats.kineto.load_trace", "trainsim.formats.kineto.load_traces",
                "trainsim.formats.chakra.read_et", "trainsim.formats.pytorch_et.link_files",
                "trainsim.files.read_text")


def modules() -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package's __init__)."""
    out = {}
    for folder, dotted in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rest = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            is_pkg = rest[-1] == "__init__"
            if is_pkg:
                rest = rest[:-1]
            out[".".join([dotted, *rest])] = (path, is_pkg)
    return out


def imports(mods: dict[str, tuple[Path, bool]]) -> list[tuple[str, str, str]]:
    """(importer, imported module, imported name or '') for every project import."""
    edges = []
    for name, (path, is_pkg) in mods.items():
        package = name if is_pkg else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges += [(name, a.name, "") for a in node.names if a.name in mods]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in mods:
                        edges.append((name, sub, ""))
                    elif base in mods:
                        edges.append((name, base, alias.name))
    return [e for e in edges if e[0] != e[1]]


def package_of(module: str, mods: dict) -> str:
    """The node a module belongs to: its package, except the modules at the top of ``trainsim`` (cli, api,
    errors, ...), each a node of its own since everything stands on some of them."""
    if not mods[module][1] and module.count(".") == 1 and module.startswith("trainsim."):
        return module
    return module if mods[module][1] else module.rpartition(".")[0]


def report(mods, edges) -> dict:
    graph = nx.DiGraph()
    graph.add_nodes_from({package_of(m, mods) for m in mods})
    for a, b, _ in edges:
        pa, pb = package_of(a, mods), package_of(b, mods)
        if pa != pb and not pa.startswith(pb + "."):  # a package's own parent __init__ is not a layer edge
            graph.add_edge(pa, pb)
    cycles = sorted((c for c in nx.simple_cycles(graph)), key=len)
    module_graph = nx.DiGraph([(a, b) for a, b, _ in edges])
    module_cycles = sorted((c for c in nx.simple_cycles(module_graph)), key=len)
    forbidden = sorted({f"{a} -> {b}{'.' + n if n else ''}" for a, b, n in edges
                        if (a.startswith("trainsim.sim") and (b.startswith(SIM_FORBIDDEN)
                                                              or f"{b}.{n}" in SCENARIO_LOADERS
                                                              or f"{b}.{n}" in FILE_READERS))
                        or (a.startswith("trainsim.formats") and b.startswith(("trainsim.sim",
                                                                                "trainsim.calibrate")))})
    sizes = Counter({m: len(p.read_text().splitlines()) for m, (p, _) in mods.items()})
    return {"modules": len(mods), "packages": graph.number_of_nodes(),
            "package_edges": graph.number_of_edges(),
            "package_cycles": cycles, "module_cycles": module_cycles, "forbidden_imports": forbidden,
            "largest_modules": sizes.most_common(12), "graph": graph}


def draw(graph: nx.DiGraph, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = {n: n.removeprefix("trainsim.") for n in graph}
    if nx.is_directed_acyclic_graph(graph):  # rows by depth: a package sits above what it imports
        layers: dict[str, int] = {}
        for node in reversed(list(nx.topological_sort(graph))):
            layers[node] = 1 + max((layers[d] for d in graph.successors(node)), default=-1)
        nx.set_node_attributes(graph, layers, "layer")
        pos = nx.multipartite_layout(graph, subset_key="layer", align="horizontal")
    else:
        pos = nx.spring_layout(graph, seed=0)
    fig, ax = plt.subplots(figsize=(16, 10))
    colours = ["#9ecae1" if n.startswith("trainsim.sim") else "#fdae6b" if n.startswith("trainsim.calibrate")
               else "#a1d99b" if n.startswith("trainsim.formats") else "#dadaeb" for n in graph]
    nx.draw_networkx(graph, pos, ax=ax, labels=labels, node_color=colours, node_size=2600, font_size=8,
                     arrowsize=10, edge_color="#888888", width=0.7)
    ax.set_title("trainsim package imports (arrow: imports; bottom rows import nothing above them)")
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--png", type=Path, help="draw the package graph into this PNG")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    mods = modules()
    result = report(mods, imports(mods))
    graph = result.pop("graph")
    if args.png:
        draw(graph, args.png)
    broken = bool(result["package_cycles"] or result["module_cycles"] or result["forbidden_imports"])
    if args.json:
        print(json.dumps(result, indent=1))
        return int(broken)
    print(f"{result['modules']} modules in {result['packages']} packages, {result['package_edges']} package "
          "imports")
    print(f"package cycles: {len(result['package_cycles'])}")
    for cycle in result["package_cycles"][:10]:
        print("   " + " -> ".join(cycle + cycle[:1]))
    print(f"module cycles (function-level imports included): {len(result['module_cycles'])}")
    for cycle in result["module_cycles"][:10]:
        print("   " + " -> ".join(cycle + cycle[:1]))
    print(f"forbidden imports: {len(result['forbidden_imports'])}")
    for edge in result["forbidden_imports"]:
        print(f"   {edge}")
    print("largest modules (lines):")
    for name, lines in result["largest_modules"]:
        print(f"   {lines:5d}  {name}")
    return int(broken)


if __name__ == "__main__":
    sys.exit(main())
