"""Read a machine's GPU topology from ``nvidia-smi topo -m`` (and NVML when ``nvidia-ml-py`` is importable).

The matrix gives, for every pair of devices (GPUs and NICs), the most direct path between them:
``NV#`` a bonded set of # NVLinks; ``PIX`` at most one PCIe bridge; ``PXB`` several bridges, no host bridge;
``PHB`` through a host bridge; ``NODE`` across host bridges within a NUMA node; ``SYS`` across the
inter-socket link. Rows also give each GPU's CPU and NUMA affinity. From that we build a topology in the
``trainsim.topology/1`` schema:

- one ``cpu`` node per NUMA affinity group (the unit nvidia-smi separates with SYS; on an AMD box in NPS4
  mode that is a quarter socket), joined pairwise by ``upi`` links;
- devices joined by PIX/PXB (directly, or through a NIC both reach that way) share one ``pcie_switch`` with
  one x16 uplink to their CPU; a device with no such partner hangs off its CPU's root port;
- NVLink: a GPU whose NVLink counts to its peers add up to more links than any GPU has (18, on H100) cannot be
  wired directly to all of them, so the GPUs hang off an ``nvswitch`` with their bonded set; otherwise every
  ``NV#`` cell is a direct bonded link of # NVLinks.

``NV#`` hides the PCIe relation of a GPU pair, so where NVLink exists the switch grouping comes from the NICs.
PCIe generation and width, GPU names, memory and P2P status are not in the matrix: they come from NVML when it
is available, otherwise from the caller (``probe`` passes torch's device properties).

It stays one module: the ``nvidia-smi topo -m`` parser and the NVML reader produce the same probe
result.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field

from trainsim.errors import TrainsimError

RELATIONS = ("X", "PIX", "PXB", "PHB", "NODE", "SYS")
MAX_NVLINKS_PER_GPU = 18  # H100 SXM; no GPU so far has more
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NV = re.compile(r"^NV(\d+)$")
_DEVICE = re.compile(r"^(GPU\d+|NIC\d+|mlx\d+_\d+|[a-z]+\d+(_\d+)?)$")


@dataclass
class TopoMatrix:
    """The parsed ``nvidia-smi topo -m`` table."""

    devices: list[str]  # row/column labels in order, e.g. GPU0..GPU7, NIC0..NIC3 (or mlx5_0 ...)
    cells: dict[tuple[str, str], str]  # (row, column) -> "X" | "NV2" | "PIX" | ...
    cpu_affinity: dict[str, str] = field(default_factory=dict)  # GPU label -> "0-19,40-59"
    numa_affinity: dict[str, str] = field(default_factory=dict)  # GPU label -> "0"
    nic_names: dict[str, str] = field(default_factory=dict)  # NIC0 -> mlx5_0 (from the legend)

    @property
    def gpus(self) -> list[str]:
        return sorted((d for d in self.devices if d.startswith("GPU")), key=lambda d: int(d[3:]))

    @property
    def nics(self) -> list[str]:
        return [d for d in self.devices if not d.startswith("GPU")]

    def nvlinks(self, a: str, b: str) -> int:
        match = _NV.match(self.cells.get((a, b), ""))
        return int(match.group(1)) if match else 0


def parse_topo_matrix(text: str, *, source: str | None = None) -> TopoMatrix:
    """Parse the text of ``nvidia-smi topo -m``. Raises TrainsimError naming ``source`` if it is not one."""
    lines = [_ANSI.sub("", line).rstrip() for line in text.splitlines()]
    # The header is the first line listing GPU0 that is not GPU0's own row (whose next cell is "X").
    header_at = next(
        (i for i, line in enumerate(lines) if "GPU0" in line.split() and line.split()[1:2] != ["X"]), None
    )
    if header_at is None:
        raise TrainsimError(
            "no header row with GPU0 found; is this `nvidia-smi topo -m` output?", file=source
        )
    header = lines[header_at].split()
    devices = []
    for token in header:
        if token in ("CPU", "NUMA", "GPU") and devices:  # "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"
            break
        devices.append(token)
    extra_columns = " ".join(header[len(devices) :])
    has_numa = "NUMA Affinity" in extra_columns
    matrix = TopoMatrix(devices=devices, cells={})
    for lineno, line in enumerate(lines[header_at + 1 :], start=header_at + 2):
        tokens = line.split()
        if not tokens or tokens[0] not in devices:
            continue
        row, values = tokens[0], tokens[1:]
        if len(values) < len(devices):
            raise TrainsimError(
                f"line {lineno}: row {row} has {len(values)} cells, expected {len(devices)}", file=source
            )
        for col, value in zip(devices, values[: len(devices)], strict=True):
            if value not in RELATIONS and not _NV.match(value):
                raise TrainsimError(
                    f"line {lineno}: unknown relation {value!r} between {row} and {col}", file=source
                )
            matrix.cells[(row, col)] = value
        rest = values[len(devices) :]
        if row.startswith("GPU") and rest:
            matrix.cpu_affinity[row] = rest[0]
            if has_numa and len(rest) > 1 and rest[1] != "N/A":
                matrix.numa_affinity[row] = rest[1]
    for line in lines:
        legend = re.match(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$", line)
        if legend:
            matrix.nic_names[legend.group(1)] = legend.group(2)
    missing = [d for d in devices if (d, d) not in matrix.cells]
    if missing:
        raise TrainsimError(f"no row for {', '.join(missing)}", file=source)
    if not matrix.gpus:
        raise TrainsimError("the table lists no GPU", file=source)
    return matrix


def read_nvidia_smi(timeout_s: float = 30.0) -> str | None:
    """Run ``nvidia-smi topo -m``; None when it is not installed or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def count_cpus(affinity: str) -> int:
    """Number of CPUs in an affinity list such as ``0-19,40-59`` (0 when unreadable)."""
    total = 0
    for part in affinity.split(","):
        bounds = part.split("-")
        try:
            total += int(bounds[-1]) - int(bounds[0]) + 1
        except ValueError:
            return 0
    return total


class _UnionFind:
    def __init__(self, items):
        self.parent = {item: item for item in items}

    def find(self, item):
        while self.parent[item] != item:
            self.parent[item] = self.parent[self.parent[item]]
            item = self.parent[item]
        return item

    def union(self, a, b):
        self.parent[self.find(a)] = self.find(b)


NVLINK_GENERATION = {"P100": 1, "V100": 2, "A100": 3, "RTX3090": 3, "H100": 4, "H200": 4, "B200": 5}
# The PCIe generation of each GPU's host interface (NVIDIA datasheets), used when neither the caller nor
# NVML says; calibration then replaces the derived figures with measured H2D/D2H copies.
PCIE_GENERATION = {
    "K80": 3,
    "P100": 3,
    "V100": 3,
    "T4": 3,
    "A100": 4,
    "RTX3090": 4,
    "RTX4090": 4,
    "H100": 5,
    "H200": 5,
    "B200": 5,
    "RTX5090": 5,
}


def to_topology(
    matrix: TopoMatrix,
    *,
    name: str,
    gpu_specs: list[str] | None = None,
    gpu_memory_gib: list[float] | None = None,
    pcie_generation: int | None = None,
    pcie_lanes: int | None = 16,
    nvlink_generation: int | None = None,
    p2p: bool = True,
    nvml: dict | None = None,
    sources: list[str] | None = None,
    inter_socket: str | None = None,
    dram_bandwidth_gbps: float = 100.0,
) -> dict:
    """A ``trainsim.topology/1`` document (a dict ready for YAML) for the machine in ``matrix``.

    The matrix says nothing about the CPUs' make or memory: ``inter_socket`` is the upi generation of the
    topology schema (qpi/skl/spr/emr/amd) and ``dram_bandwidth_gbps`` a placeholder the probe replaces
    with its measurement.

    ``nvml`` (from ``nvml_probe``) overrides names, memory, PCIe generation/width and P2P where it has them.
    """
    gpus = matrix.gpus
    n = len(gpus)
    nvml_gpus = (nvml or {}).get("gpus", [])
    specs = [g.get("spec") for g in nvml_gpus] if len(nvml_gpus) == n else (gpu_specs or ["unknown"] * n)
    memory = (
        [g.get("memory_gib") for g in nvml_gpus] if len(nvml_gpus) == n else (gpu_memory_gib or [None] * n)
    )
    if nvml and nvml.get("p2p") is not None:
        p2p = bool(nvml["p2p"])
    gen = pcie_generation
    lanes = pcie_lanes
    if len(nvml_gpus) == n and n:
        gen = gen or nvml_gpus[0].get("pcie_generation")
        lanes = nvml_gpus[0].get("pcie_width") or lanes
    if not gen and n:  # a GPU we have no datasheet entry for: the commonest generation, until measured
        gen = PCIE_GENERATION.get(str(specs[0]).upper(), 4)
    gpu_node = {label: f"gpu{i}" for i, label in enumerate(gpus)}
    nic_node = {label: f"nic{i}" for i, label in enumerate(matrix.nics)}
    node_of = {**gpu_node, **nic_node}

    # CPU groups: by NUMA affinity, else by CPU affinity, else one.
    def group_key(gpu: str) -> str:
        return matrix.numa_affinity.get(gpu) or matrix.cpu_affinity.get(gpu) or "0"

    keys = []
    for gpu in gpus:
        if group_key(gpu) not in keys:
            keys.append(group_key(gpu))
    if matrix.numa_affinity and all(k.isdigit() for k in keys):
        keys.sort(key=int)
    cpu_of_key = {key: f"cpu{i}" for i, key in enumerate(keys)}
    cpu_of = {gpu: cpu_of_key[group_key(gpu)] for gpu in gpus}
    for nic in matrix.nics:  # a NIC belongs to the CPU of the GPU nearest to it
        nearest = min(gpus, key=lambda g: _rank(matrix.cells.get((g, nic), "SYS")))
        cpu_of[nic] = cpu_of[nearest]

    # PCIe switches: devices within PIX/PXB of each other.
    devices = gpus + matrix.nics
    groups = _UnionFind(devices)
    for a in devices:
        for b in devices:
            if a < b and matrix.cells.get((a, b)) in ("PIX", "PXB"):
                groups.union(a, b)
    members: dict[str, list[str]] = {}
    for dev in devices:
        members.setdefault(groups.find(dev), []).append(dev)

    nodes: list[dict] = []
    links: list[dict] = []
    cpu_cores = {}
    for key, cpu in cpu_of_key.items():
        first = next(g for g in gpus if group_key(g) == key)
        cpu_cores[cpu] = count_cpus(matrix.cpu_affinity.get(first, "")) or 1
    for cpu in cpu_of_key.values():
        nodes.append(
            {"name": cpu, "kind": "cpu", "cores": cpu_cores[cpu], "dram_bandwidth_gbps": dram_bandwidth_gbps}
        )
    cpus = list(cpu_of_key.values())
    for i, a in enumerate(cpus):
        for b in cpus[i + 1 :]:
            links.append(
                {"a": a, "b": b, "kind": "upi", **({"generation": inter_socket} if inter_socket else {})}
            )
    pcie = {"kind": "pcie"}
    if gen:
        pcie["generation"] = int(gen)
    if lanes:
        pcie["lanes"] = int(lanes)
    switch_count = 0
    for group in sorted(members.values(), key=lambda m: devices.index(m[0])):
        if len(group) > 1:
            switch = f"sw{switch_count}"
            switch_count += 1
            nodes.append({"name": switch, "kind": "pcie_switch"})
            links.append({"a": cpu_of[group[0]], "b": switch, **pcie})
            for dev in group:
                links.append({"a": switch, "b": node_of[dev], **pcie})
        else:
            links.append({"a": cpu_of[group[0]], "b": node_of[group[0]], **pcie})
    for i, gpu in enumerate(gpus):
        node = {"name": gpu_node[gpu], "kind": "gpu", "spec": specs[i] or "unknown"}
        if memory[i]:
            node["memory_gib"] = float(memory[i])
        nodes.append(node)
    for nic in matrix.nics:
        nodes.append({"name": nic_node[nic], "kind": "nic", "network": "ib"})

    # NVLink: direct bonded links, or an NVSwitch when no GPU could have that many links.
    nv_gen = nvlink_generation or NVLINK_GENERATION.get(str(specs[0]).upper()) if n else None
    per_gpu = {g: sum(matrix.nvlinks(g, h) for h in gpus if h != g) for g in gpus}
    if n and max(per_gpu.values()) > MAX_NVLINKS_PER_GPU:
        nodes.append({"name": "nvswitch0", "kind": "nvswitch", "nvlink_generation": int(nv_gen or 3)})
        for gpu in gpus:
            bonded = max(matrix.nvlinks(gpu, h) for h in gpus if h != gpu)
            links.append(
                {
                    "a": gpu_node[gpu],
                    "b": "nvswitch0",
                    "kind": "nvlink",
                    "count": bonded,
                    **({"generation": int(nv_gen)} if nv_gen else {}),
                }
            )
    else:
        for i, a in enumerate(gpus):
            for b in gpus[i + 1 :]:
                count = matrix.nvlinks(a, b)
                if count:
                    links.append(
                        {
                            "a": gpu_node[a],
                            "b": gpu_node[b],
                            "kind": "nvlink",
                            "count": count,
                            **({"generation": int(nv_gen)} if nv_gen else {}),
                        }
                    )
    return {
        "schema": "trainsim.topology/1",
        "name": name,
        "description": "probed with nvidia-smi topo -m" + (" and NVML" if nvml else ""),
        "sources": sources or ["nvidia-smi topo -m"],
        "p2p": p2p,
        "nodes": nodes,
        "links": links,
    }


def _rank(relation: str) -> int:
    """How near a relation is: NVLink and PIX nearest, SYS farthest."""
    if _NV.match(relation):
        return 0
    return {"X": 0, "PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5}.get(relation, 6)


def nvml_probe() -> dict | None:
    """What NVML says about every GPU, or None when ``pynvml`` (nvidia-ml-py) or the driver is missing.

    Per GPU: name, memory, PCIe max generation and width, bus id, NVLink state and remote bus id per link;
    per pair: the common PCIe ancestor level and the P2P read status. ``p2p`` is True when every pair can.
    """
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError: no driver / no GPU
        return None
    try:
        count = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        gpus = []
        for handle in handles:
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else name
            info = {
                "name": name,
                "spec": spec_from_name(name),
                "memory_gib": pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30,
                "bus_id": _text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
                "nvlinks": [],
            }
            for key, call in (
                ("pcie_generation", "nvmlDeviceGetMaxPcieLinkGeneration"),
                ("pcie_width", "nvmlDeviceGetMaxPcieLinkWidth"),
            ):
                try:
                    info[key] = int(getattr(pynvml, call)(handle))
                except Exception:
                    info[key] = None
            for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    active = pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED
                    remote = (
                        _text(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId) if active else None
                    )
                except Exception:
                    break
                info["nvlinks"].append({"link": link, "active": active, "remote_bus_id": remote})
            gpus.append(info)
        pairs, all_p2p = [], True
        for i in range(count):
            for j in range(i + 1, count):
                level = pynvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])
                try:
                    status = pynvml.nvmlDeviceGetP2PStatus(
                        handles[i], handles[j], pynvml.NVML_P2P_CAPS_INDEX_READ
                    )
                    ok = status == pynvml.NVML_P2P_STATUS_OK
                except Exception:
                    ok = False
                all_p2p &= ok
                pairs.append({"a": i, "b": j, "common_ancestor": int(level), "p2p": ok})
        return {"gpus": gpus, "pairs": pairs, "p2p": all_p2p if count > 1 else True}
    finally:
        pynvml.nvmlShutdown()


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def spec_from_name(name: str) -> str:
    """The device-spec name for a CUDA device name, e.g. "Tesla V100-SXM2-16GB" -> "V100"."""
    upper = name.upper().replace(" ", "")
    for spec in (
        "H200",
        "H100",
        "A100",
        "V100",
        "P100",
        "K80",
        "T4",
        "B200",
        "RTX5090",
        "RTX4090",
        "RTX3090",
    ):
        if spec in upper:
            return spec
    return name
