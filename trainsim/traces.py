"""Replay's inputs, read at the boundary: the one place that opens a run's trace files and loads the machines
a replay compares against, so that `trainsim.sim.replay` works on what they hold and reads no file.

    from trainsim.traces import replay_traces
    report = replay_traces(["rank-0.json.gz", "rank-1.json.gz"], whatif=WhatIf(compression="fp16"))

`load_graphs` reads per-rank Kineto traces, Chakra execution traces (ET) or PyTorch execution traces linked to
their Kineto traces, into replay graphs; `replay_topologies` loads the machine the trace ran on (``ran_on``,
else the preset its GPU implies) and the what-if's machine; `replay_traces` does both and replays
(`trainsim.sim.replay.engine.replay_graphs`). `write_simulation_et` turns a simulated run into Chakra ETs by
way of the Kineto traces `simulate --trace` writes, read back as a replay.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from trainsim.errors import TrainsimError
from trainsim.formats import chakra, pytorch_et
from trainsim.formats.kineto import load_traces
from trainsim.sim.replay.chakra_graph import graph_from_et, graph_from_nodes, rank_of_file
from trainsim.sim.replay.engine import ReplayReport, replay_graphs
from trainsim.sim.replay.trace_graph import TraceGraph, build_graph
from trainsim.sim.replay.whatif import WhatIf, WhatIfModel, home_topology

__all__ = ["load_checked_topology", "load_graphs", "replay_topologies", "replay_traces", "whatif_model",
           "write_simulation_et"]


def replay_traces(paths: Iterable[str | Path], *, whatif: WhatIf | None = None, checks: bool = True,
                  progress: Callable[[str], None] | None = None) -> ReplayReport:
    """Read per-rank trace files of one run (`load_graphs`), replay them with the measured durations and,
    when ``whatif`` changes something, again under the what-if; with ``checks`` also compare every
    collective and memcpy with its simulation on the topology the trace ran on. The what-if's machines are
    loaded first, so a bad one is reported before any trace is read."""
    named = replay_topologies(whatif)
    graphs = load_graphs(list(paths), progress=progress)
    home, topology = replay_topologies(whatif, graphs, named=named)
    return replay_graphs(graphs, whatif=whatif, home=home, topology=topology, checks=checks,
                         progress=progress)


def replay_topologies(whatif: WhatIf | None, graphs: list[TraceGraph] | None = None, *, named=None):
    """(home, topology): the machine the trace ran on (``whatif.ran_on``, else, given the ``graphs``, the
    preset their GPU implies; None when unknown) and the what-if's machine (``whatif.topology``; None),
    loaded and their GPUs checked. ``named``: a previous call's answer, to load the named ones once."""
    if named is None:
        ran_on = whatif.ran_on if whatif is not None else None
        topology = whatif.topology if whatif is not None else None
        named = (load_checked_topology(ran_on, "--set ran_on") if ran_on else None,
                 load_checked_topology(topology, "--topology") if topology else None)
    home, topology = named
    if home is None and graphs is not None:
        preset = home_topology(graphs)
        home = load_checked_topology(preset, "--set ran_on") if preset else None
    return home, topology


def whatif_model(graphs: list[TraceGraph], whatif: WhatIf, *, size_bound: str | None = None) -> WhatIfModel:
    """The what-if model of ``graphs`` under ``whatif``, its machines loaded (`replay_topologies`)."""
    home, topology = replay_topologies(whatif, graphs)
    return WhatIfModel(graphs, whatif, home=home, topology=topology, size_bound=size_bound)


def load_checked_topology(source: str, option: str):
    """The topology ``source`` names, its GPUs' specs known (`check_topology_devices`); an error that names
    no field is the CLI ``option``'s (``--topology``, ``--set ran_on``)."""
    from trainsim.sim.core.devices import check_topology_devices
    from trainsim.topologies import load_topology

    try:
        topology = load_topology(source)
        check_topology_devices(topology)
    except TrainsimError as exc:
        raise TrainsimError(exc.reason, file=exc.file, field=exc.field or option) from None
    return topology


def load_et_graphs(paths: list[Path]) -> list[TraceGraph]:
    """The graphs of a run's Chakra ET files, one per rank, sorted by rank."""
    files = [chakra.read_et(p) for p in paths]
    ranks = [rank_of_file(str(p), f) for p, f in zip(paths, files, strict=True)]
    if None in ranks:
        if len(files) > 1:
            bad = paths[ranks.index(None)]
            raise TrainsimError("cannot tell which rank this Chakra trace is: its name is not "
                                "<prefix>.<rank>.et and its metadata names no rank", file=str(bad))
        ranks = [0]
    seen: dict[int, str] = {}
    for p, r in zip(paths, ranks, strict=True):
        if r in seen:
            raise TrainsimError(f"rank {r} appears twice ({seen[r]} and {p}): traces of different runs mixed "
                                "together?", file=str(p))
        seen[r] = str(p)
    world = max(len(files), max(ranks) + 1)
    graphs = [graph_from_et(f, rank=r, world_size=world) for f, r in zip(files, ranks, strict=True)]
    return sorted(graphs, key=lambda g: g.rank)


def expand(paths) -> list[Path]:
    """Files of a run: a folder stands for the trace files in it (Kineto or Chakra)."""
    out = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(f for f in p.iterdir() if f.is_file() and not f.name.startswith(".")
                              and (chakra.is_chakra_file(f.name) or f.name.endswith((".json", ".json.gz")))))
        else:
            out.append(p)
    return out


def load_graphs(paths, progress=None) -> list[TraceGraph]:
    """The replay graphs of a run's files: Kineto traces (`kineto.load_traces`, `trace_graph.build_graph`),
    Chakra ETs (`load_et_graphs`), or PyTorch execution traces with their Kineto traces
    (`trainsim.formats.pytorch_et`)."""
    paths = list(paths)
    files = expand(paths)
    ets = [f for f in files if chakra.is_chakra_file(f)]
    if ets:
        if len(ets) != len(files):
            other = next(f for f in files if not chakra.is_chakra_file(f))
            raise TrainsimError("Chakra execution traces and other trace files given together: give one "
                                "run's .et files, or its Kineto traces", file=str(other))
        if progress:
            progress(f"reading {len(ets)} Chakra execution trace(s)")
        return load_et_graphs(ets)
    host = [f for f in files if pytorch_et.is_pytorch_et(f)]
    if host:
        if progress:
            progress("linking the PyTorch execution trace(s) to their Kineto trace(s)")
        kineto = [f for f in files if f not in host]
        linked = pytorch_et.link_files(host, kineto)
        return [graph_from_nodes(r.nodes, path=r.path, rank=r.rank, world_size=r.world_size,
                                 devices=r.devices) for r in linked]
    if progress:
        progress(f"reading {len(files)} trace file(s)")
    traces = load_traces(paths)
    graphs = []
    for t in traces:
        if progress:
            progress(f"building the dependency graph of rank {t.rank}")
        graphs.append(build_graph(t))
    return graphs


def write_simulation_et(result, folder: str | os.PathLike, *, provenance: dict | None = None) -> None:
    """``folder/trainsim.<rank>.et`` for every GPU of the simulated run ``result`` (recorded): the run as
    the per-rank Kineto traces `simulate --trace` writes, replayed as the measurement it is, each replayed
    rank one ET, so a simulated run and a real one reach ASTRA-sim the same way."""
    from trainsim.sim.output.kineto_ranks import write_rank_traces
    from trainsim.sim.replay.chakra_graph import write_replay_et

    with tempfile.TemporaryDirectory() as tmp:
        write_rank_traces(result, Path(tmp) / "trace", provenance=provenance)
        report = replay_traces([Path(tmp) / "trace"], checks=False)
    write_replay_et(report, folder, provenance=provenance)
