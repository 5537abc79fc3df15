"""The topology of this box: probed (skeleton) and then calibrated with the fitted link figures.

On NVIDIA machines the skeleton comes from ``nvidia-smi topo -m`` and NVML (see nvsmi.py); without
nvidia-smi, every GPU hangs off one socket. On a CPU-only machine the "devices" are CPU ranks and the
topology says so in the schema's own terms:

- one ``cpu`` node per socket (``cores``; ``dram_bandwidth_gbps`` from the all-core copy benchmark);
- one ``gpu``-kind node per rank, ``spec: cpu`` (the CPU device spec recorded in the bundle's device.json:
  cores and measured GEMM FLOP/s per core), memory = the host memory shared out between the ranks;
- a ``pcie``-kind link from each rank to its socket carrying the measured rank-to-rank copy figures (one
  thread, host buffer to host buffer): the path one rank's bytes take to reach another rank's buffer
  through shared memory is two such hops (rank -> socket -> rank), as the copy is a read and a write on the
  socket's memory. The schema has no "memory copy" link kind, so ``pcie`` stands in; the calibrated
  ``bandwidth_gbps``/``latency_us`` are what the simulator uses, never PCIe figures.

Calibration then writes the fitted ``bandwidth_gbps`` and ``latency_us`` into the links they measure:
GPU <-> parent PCIe link from the pinned H2D/D2H fits (their mean: the schema has one figure per link);
NVLink links (direct or to the NVSwitch) from the P2P fits; CPU-rank links from ``rank_copy``.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from trainsim.calibrate.measure import nvsmi
from trainsim.calibrate.measure.linkbench import LinkClass
from trainsim.errors import TrainsimError


def host_probe() -> dict:
    """Sockets, cores, memory and NUMA nodes of this host (sysfs / procfs; portable fallbacks)."""
    cores = sorted(os.sched_getaffinity(0))
    sockets: dict[int, list[int]] = {}
    for cpu in cores:
        path = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id")
        try:
            socket_id = int(path.read_text().strip())
        except (OSError, ValueError):
            socket_id = 0
        sockets.setdefault(socket_id, []).append(cpu)
    memory = 0
    model, vendor = platform.processor() or None, None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = int(line.split()[1]) * 1024
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and ":" in line:
                model = line.split(":", 1)[1].strip()
            if line.startswith("vendor_id") and ":" in line:
                vendor = line.split(":", 1)[1].strip()
    except OSError:
        pass
    numa = sorted(p.name for p in Path("/sys/devices/system/node").glob("node[0-9]*")) or ["node0"]
    return {
        "cores": len(cores),
        "sockets": [{"id": s, "cpus": c} for s, c in sorted(sockets.items())],
        "memory_bytes": memory,
        "numa_nodes": len(numa),
        "cpu_model": model,
        "cpu_vendor": vendor,
        "hostname": platform.node(),
    }


def cpu_topology(
    host: dict,
    nranks: int,
    *,
    dram_bandwidth_gbps: float,
    rank_link: LinkClass | None = None,
    name: str = "calibrated-cpu",
) -> dict:
    """A ``trainsim.topology/1`` document for ``nranks`` CPU ranks on this host (see the module docstring)."""
    sockets = host["sockets"] or [{"id": 0, "cpus": list(range(host["cores"]))}]
    nodes: list[dict] = []
    links: list[dict] = []
    for i, sock in enumerate(sockets):
        nodes.append(
            {
                "name": f"cpu{i}",
                "kind": "cpu",
                "cores": len(sock["cpus"]),
                **({"model": host["cpu_model"]} if host.get("cpu_model") else {}),
                "dram_bandwidth_gbps": dram_bandwidth_gbps,
            }
        )
    memory_gib = host["memory_bytes"] / 2**30 / nranks if host.get("memory_bytes") else 1.0
    for rank in range(nranks):
        socket_index = rank * len(sockets) // nranks
        nodes.append({"name": f"gpu{rank}", "kind": "gpu", "spec": "cpu", "memory_gib": round(memory_gib, 3)})
        link = {"a": f"cpu{socket_index}", "b": f"gpu{rank}", "kind": "pcie"}
        if rank_link is not None and rank_link.fit is not None:
            link["bandwidth_gbps"] = rank_link.fit.bandwidth_gbps
            link["latency_us"] = rank_link.fit.latency_us / 2  # a rank-to-rank copy crosses two such links
        else:  # before the links step: the socket's memory bandwidth is the only figure there is
            link["bandwidth_gbps"] = dram_bandwidth_gbps
        links.append(link)
    for i in range(len(sockets)):
        for j in range(i + 1, len(sockets)):
            links.append(
                {
                    "a": f"cpu{i}",
                    "b": f"cpu{j}",
                    "kind": "upi",
                    "generation": "amd" if host.get("cpu_vendor") == "AuthenticAMD" else "skl",
                }
            )
    return {
        "schema": "trainsim.topology/1",
        "name": name,
        "description": f"{nranks} CPU ranks on {host.get('cpu_model') or 'this host'} (calibrated by "
        "trainsim; gpu-kind nodes are CPU ranks, their pcie-kind links are measured memory copies)",
        "sources": ["trainsim calibrate: /proc/cpuinfo, sysfs and copy benchmarks"],
        "p2p": True,
        "nodes": nodes,
        "links": links,
    }


def cuda_topology(
    host: dict,
    *,
    gpu_names: list[str],
    gpu_memory_gib: list[float],
    dram_bandwidth_gbps: float,
    name: str = "calibrated-cuda",
    nvml: dict | None = None,
) -> dict:
    """The skeleton of this GPU box from nvidia-smi + NVML, else all GPUs on one socket's root ports."""
    specs = [nvsmi.spec_from_name(n) for n in gpu_names]
    inter_socket = "amd" if host.get("cpu_vendor") == "AuthenticAMD" else "skl"
    text = nvsmi.read_nvidia_smi()
    try:
        matrix = nvsmi.parse_topo_matrix(text, source="nvidia-smi topo -m") if text else None
    except TrainsimError:  # a table layout this parser does not know: fall back rather than stop
        matrix = None
    if matrix is not None and len(matrix.gpus) != len(gpu_names):
        matrix = None  # CUDA_VISIBLE_DEVICES hides some GPUs: the table's indices are not torch's
    if matrix is not None:
        doc = nvsmi.to_topology(
            matrix,
            name=name,
            gpu_specs=specs,
            gpu_memory_gib=gpu_memory_gib,
            nvml=nvml,
            inter_socket=inter_socket,
            dram_bandwidth_gbps=dram_bandwidth_gbps,
        )
    else:
        nodes = [
            {
                "name": "cpu0",
                "kind": "cpu",
                "cores": host["cores"],
                "dram_bandwidth_gbps": dram_bandwidth_gbps,
            }
        ]
        links = []
        for i, (spec, mem) in enumerate(zip(specs, gpu_memory_gib, strict=True)):
            nodes.append({"name": f"gpu{i}", "kind": "gpu", "spec": spec, "memory_gib": mem})
            # Generation 4 only until the links step writes the measured H2D/D2H figures over it.
            links.append({"a": "cpu0", "b": f"gpu{i}", "kind": "pcie", "generation": 4, "lanes": 16})
        doc = {
            "schema": "trainsim.topology/1",
            "name": name,
            "description": "no nvidia-smi: GPUs on one socket",
            "sources": ["torch.cuda device properties"],
            "p2p": True,
            "nodes": nodes,
            "links": links,
        }
    for node in doc["nodes"]:
        if node["kind"] == "cpu" and host.get("cpu_model"):
            node.setdefault("model", host["cpu_model"])
    return doc


def apply_link_fits(doc: dict, links: list[LinkClass], *, p2p: bool | None = None) -> dict:
    """Write the fitted figures into the topology document ``doc`` (modified in place and returned): each
    GPU's PCIe link gets its pinned H2D/D2H figures, NVLink its peer copies', and every cpu node the
    ``pageable_gbps`` of the loader-batch copies (``h2d_batch``, mean over the GPUs): the pageable copy a
    training loop makes. The warm ``h2d_pageable`` sweep stays in the links file only; it never pays the
    page faults of a batch's fresh pages."""
    fits = {link.name: link.fit for link in links if link.fit is not None}
    batch = [f.bandwidth_gbps for name, f in fits.items() if name.startswith("h2d_batch/")]
    if batch:
        for node in doc["nodes"]:
            if node["kind"] == "cpu":
                node["pageable_gbps"] = sum(batch) / len(batch)
    rank_copy = fits.get("rank_copy")
    gpu_names = [n["name"] for n in doc["nodes"] if n["kind"] == "gpu"]

    def set_fit(link: dict, bandwidth_gbps: float, latency_us: float) -> None:
        link["bandwidth_gbps"] = bandwidth_gbps
        link["latency_us"] = latency_us

    for link in doc["links"]:
        ends = {link["a"], link["b"]}
        gpus = [g for g in gpu_names if g in ends]
        if link["kind"] == "pcie" and len(gpus) == 1:
            gpu = gpus[0]
            if rank_copy is not None:  # CPU ranks: a rank-to-rank copy crosses two such links
                set_fit(link, rank_copy.bandwidth_gbps, rank_copy.latency_us / 2)
            pair = [fits.get(f"h2d_pinned/{gpu}"), fits.get(f"d2h_pinned/{gpu}")]
            pair = [f for f in pair if f is not None]
            if pair:
                set_fit(
                    link,
                    sum(f.bandwidth_gbps for f in pair) / len(pair),
                    sum(f.latency_us for f in pair) / len(pair),
                )
        elif link["kind"] == "nvlink":
            if len(gpus) == 2:
                i, j = sorted(int(g[3:]) for g in gpus)
                fit = fits.get(f"p2p/gpu{i}-gpu{j}")
                if fit is not None:
                    set_fit(link, fit.bandwidth_gbps, fit.latency_us)
            elif len(gpus) == 1:  # GPU <-> NVSwitch: what this GPU reaches to its peers through the switch
                gpu = gpus[0]
                mine = [
                    f
                    for name, f in fits.items()
                    if name.startswith("p2p/") and gpu in name.split("/", 1)[1].split("-")
                ]
                if mine:
                    set_fit(
                        link,
                        sum(f.bandwidth_gbps for f in mine) / len(mine),
                        sum(f.latency_us for f in mine) / len(mine) / 2,
                    )  # two hops per GPU-GPU copy
    if p2p is not None:
        doc["p2p"] = p2p
    return doc


def apply_gloo_transport(doc: dict, busbw_gbps: float) -> dict:
    """CPU ranks: carry gloo's measured all-reduce bus bandwidth on the rank links (``doc`` modified and
    returned).

    Ranks never exchange bytes by a bare memory copy: every collective and send/recv goes through gloo's
    transport (TCP over loopback: syscalls, socket buffers), so the rank links get the bus bandwidth gloo
    really delivers (busbw = algbw x 2(n-1)/n, the per-step rate), never above the memory-copy figure already
    there. Their latency is 0: what a gloo call costs whatever its size (the hand-off to gloo's thread, the
    peers' wake-ups) is charged once per call by the simulator, from each collective's own measured alpha
    (`trainsim.sim.simulation.bundle_call_latencies`), not per link crossed."""
    gpu_names = {n["name"] for n in doc["nodes"] if n["kind"] == "gpu"}
    for link in doc["links"]:
        if link["kind"] == "pcie" and len({link["a"], link["b"]} & gpu_names) == 1:
            link["latency_us"] = 0.0
            link["bandwidth_gbps"] = min(busbw_gbps, link.get("bandwidth_gbps") or busbw_gbps)
    note = ("rank links carry gloo's measured all-reduce bus bandwidth; each gloo call's latency is charged "
            "per call (collectives step)")
    if note not in doc.get("sources", []):
        doc.setdefault("sources", []).append(note)
    return doc
