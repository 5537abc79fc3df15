"""Link physics: the raw signalling rate of each link kind and the share of it that transfers reach.

A topology file may give a link's ``bandwidth_gbps`` (a measurement, e.g. from ``trainsim calibrate``); that
figure is used as is. Otherwise the bandwidth is derived here from kind, generation, lanes and link count:
``raw`` is what the wires signal per direction after line encoding, ``bandwidth`` is ``raw x efficiency``,
where the efficiency is the protocol overhead explained below. All figures per direction, GB/s = 1e9 B/s.

| kind     | generation             | raw per direction (GB/s)         | share | why / source             |
|----------|------------------------|----------------------------------|-------|--------------------------|
| pcie     | 1, 2 (8b/10b)          | 0.25, 0.5 per lane               | 0.842 | TLP + DLLP overhead      |
| pcie     | 3, 4, 5, 6 (128b/130b) | 0.985/1.969/3.938/7.877 per lane | 0.842 | x16: 15.75/31.5/63/126   |
| nvlink   | 1 (P100)               | 20 per link                      | 0.90  | NCCL SM60: 18 GB/s/link  |
| nvlink   | 2 (V100)               | 25 per link                      | 0.80  | NCCL SM70: 20 GB/s/link  |
| nvlink   | 3 (A100)               | 25 per link                      | 0.80  | NCCL SM80: 20 GB/s/link  |
| nvlink   | 4 (H100)               | 25 per link                      | 0.824 | NCCL SM90: 20.6 GB/s/link|
| nvlink   | 5 (B200)               | 50 per link                      | 0.802 | NCCL SM100: 40.1 GB/s    |
| upi      | qpi/skl/spr/emr/amd    | 19.2/20.8/32/40/36 per link      | -     | NCCL: 6/10/22/40/16 GB/s |
| upi      | xbus (IBM POWER9)      | 32 (64 GB/s both ways)           | -     | NCCL P9_BW: 32 GB/s      |
| ib       | edr/hdr/ndr/xdr        | 12.5/25/50/100 per port          | 0.994 | 4096 B MTU vs 26 B hdrs  |
| ethernet | speed in Gb/s          | speed / 8                        | 0.980 | RoCEv2 4096 B vs 82 B    |
| dram     | channels x MT/s        | channels x MT/s x 8 B            | 0.78  | STREAM ~160 of 204.8     |

Sources: docs/hardware-figures.md (NVLink, PCIe, IB and DRAM figures, with where each comes from), NCCL
src/graph/topo.h (per-link NVLink and inter-socket figures), the PCI Express Base Specification (encodings,
TLP format), the InfiniBand Architecture Specification (packet headers).

PCIe: a DMA read of host memory (an H2D copy) returns as completion TLPs of at most 128 B of payload on
common root complexes. Each TLP carries ~20 B of overhead (Gen3+: 4 B framing token with the sequence
number, 12 B completion header, 4 B LCRC; Gen1/2: 1+2+12+4+1 B) and the Ack / flow-control DLLPs (8 B
each, about one per two TLPs) add ~4 B per TLP: 128 / (128 + 24) = 0.842. That gives Gen3 x16 13.3,
Gen4 x16 26.5 and Gen5 x16 53.0 GB/s against the pinned copies of docs/hardware-figures.md (Gen3 9.6-12.5
on cloud VMs, Gen4 25.8, Gen5 55); calibration replaces these with what the box really reaches.

NVLink: the figure is what NCCL's SM-driven kernels move per link (NCCL's per-architecture constants),
not the copy-engine peer-to-peer rate (A100 ~274 of 300 GB/s, H100 ~376-393 of 450). Nearly all
GPU-to-GPU traffic of training goes through NCCL (DDP's all-reduce, DataParallel's broadcast and
reduce, pipeline send/recv), and NCCL's kernels store through the SMs in protocol-sized chunks, which
reach less than the DMA engines do: all-reduce bus bandwidth tops out near 235 GB/s on A100 and
365-370 on H100 (docs/hardware-figures.md), in line with 12 x 20 and 18 x 20.6 GB/s. Plain
``.to(device)`` copies between GPUs are ~14 % faster than this model says.

Inter-socket links (QPI/UPI/Infinity Fabric) carry GPU peer traffic far below their signalling rate (the
coherence protocol and the host bridge limit it), so their bandwidth is NCCL's figure for the socket pair,
whatever the number of links; the raw rate is per link times ``count``.

Latencies are per hop of hardware (switch traversal, serialisation, DRAM access): PCIe ~0.5 us, NVLink
~0.5 us, UPI ~0.2 us, IB 0.3 us per hop (HDR port to port ~0.6 us, docs/hardware-figures.md), Ethernet
~1 us, DRAM 0.1 us. The end-to-end copy latencies there (NVLink P2P 2-3 us, through the host 13-19 us)
also include the copy-engine launch, which belongs to the device model, not to the links.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

GB = 1e9
US = 1e-6

LINK_KINDS = ("pcie", "nvlink", "upi", "ib", "ethernet")
EDGE_KINDS = (*LINK_KINDS, "dram")

# PCIe: GB/s per lane per direction after line encoding (8b/10b for Gen1-2, 128b/130b for Gen3-5;
# Gen6 uses FLIT mode at 64 GT/s, taken at the same per-lane overhead here).
#: the link widths PCIe defines (x1 ... x32); a link of any other lane count does not train
PcieLanes = Literal[1, 2, 4, 8, 12, 16, 32]
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 8 * 128 / 130 / 8, 4: 16 * 128 / 130 / 8, 5: 32 * 128 / 130 / 8,
                  6: 64 * 128 / 130 / 8}
PCIE_COMPLETION_PAYLOAD_BYTES = 128
PCIE_TLP_OVERHEAD_BYTES = 20   # framing + sequence number + 3DW header + LCRC
PCIE_DLLP_SHARE_BYTES = 4      # one 8 B Ack/UpdateFC DLLP per two TLPs
PCIE_EFFICIENCY = PCIE_COMPLETION_PAYLOAD_BYTES / (
    PCIE_COMPLETION_PAYLOAD_BYTES + PCIE_TLP_OVERHEAD_BYTES + PCIE_DLLP_SHARE_BYTES)

# NVLink generation -> (raw GB/s per link per direction, share NCCL's kernels reach: SM60 18, SM70 20,
# SM80 20, SM90 20.6, SM100 40.1 GB/s per link in NCCL src/graph/topo.h). NVLink 5 signals 50 GB/s per link
# each way: 18 links make B200's 1.8 TB/s both ways (NVIDIA Blackwell architecture technical brief).
NVLINK = {1: (20.0, 18.0 / 20.0), 2: (25.0, 20.0 / 25.0), 3: (25.0, 20.0 / 25.0),
          4: (25.0, 20.6 / 25.0), 5: (50.0, 40.1 / 50.0)}

# Inter-socket link -> (raw GB/s per link per direction, NCCL's figure for the socket pair). POWER9's X-Bus
# is 4 bytes x 16 GT/s = 64 GB/s both ways (WikiChip, Summit), which NCCL's P9_BW (32 GB/s) also takes.
INTER_SOCKET = {"qpi": (19.2, 6.0), "skl": (20.8, 10.0), "spr": (32.0, 22.0), "emr": (40.0, 40.0),
                "amd": (36.0, 16.0), "xbus": (32.0, 32.0)}

# InfiniBand port data rate per direction (after 64b/66b), GB/s.
IB_PORT_GBPS = {"sdr": 1.0, "ddr": 2.0, "qdr": 4.0, "fdr": 6.8, "edr": 12.5, "hdr": 25.0, "ndr": 50.0,
                "xdr": 100.0}
IB_EFFICIENCY = 4096 / (4096 + 26)
ETHERNET_EFFICIENCY = 4096 / (4096 + 82)

# Sustained share of DRAM's peak (refresh, read/write turnaround): STREAM ~160 of 204.8 GB/s.
DRAM_EFFICIENCY = 160.0 / 204.8

DEFAULT_LATENCY_US = {"pcie": 0.5, "nvlink": 0.5, "upi": 0.2, "ib": 0.3, "ethernet": 1.0, "dram": 0.1}
#: GB/s of a pageable copy between host memory and a GPU where the cpu node gives no ``pageable_gbps``: one
#: core stages it through a pinned bounce buffer, so the memcpy limits it, not the link
#: (docs/hardware-figures.md: PCIe Gen4 pageable ~10-11 GB/s against ~25.8 pinned)
PAGEABLE_GBPS = 10.5


@dataclass(frozen=True)
class LinkFigures:
    """Per-direction figures of one (possibly bonded) link, in bytes/s and seconds."""

    raw_bandwidth: float
    bandwidth: float
    latency: float


def valid_generations(kind: str) -> list[str]:
    """The generations the physics table knows for a link kind (for error messages)."""
    table = {"pcie": PCIE_LANE_GBPS, "nvlink": NVLINK, "upi": INTER_SOCKET, "ib": IB_PORT_GBPS}
    if kind == "ethernet":
        return ["any speed in Gb/s, e.g. 100"]
    return [str(g) for g in table[kind]]


def _int_generation(generation: int | str) -> int:
    try:
        return int(generation)
    except ValueError:
        raise KeyError(generation) from None


def derive_link(kind: str, generation: int | str | None, *, lanes: int | None = None,
                count: int = 1) -> LinkFigures:
    """Raw and achievable bandwidth of a link from the physics table.

    Raises KeyError for a generation the table does not know and ValueError when a needed figure is
    missing; the loader turns both into a TrainsimError naming the field.
    """
    if generation is None:
        raise ValueError("generation is needed to derive the bandwidth (or give bandwidth_gbps)")
    latency = DEFAULT_LATENCY_US[kind] * US
    if kind == "pcie":
        raw = PCIE_LANE_GBPS[_int_generation(generation)] * (lanes or 16) * count
        return LinkFigures(raw * GB, raw * PCIE_EFFICIENCY * GB, latency)
    if kind == "nvlink":
        per_link, share = NVLINK[_int_generation(generation)]
        return LinkFigures(per_link * count * GB, per_link * share * count * GB, latency)
    if kind == "upi":
        per_link, effective = INTER_SOCKET[str(generation).lower()]
        return LinkFigures(per_link * count * GB, effective * GB, latency)
    if kind == "ib":
        raw = IB_PORT_GBPS[str(generation).lower()] * count
        return LinkFigures(raw * GB, raw * IB_EFFICIENCY * GB, latency)
    if kind == "ethernet":
        try:
            speed = float(generation)
        except ValueError:
            raise KeyError(generation) from None
        if speed <= 0:
            raise ValueError("an Ethernet generation is its speed in Gb/s and must be > 0")
        raw = speed / 8 * count
        return LinkFigures(raw * GB, raw * ETHERNET_EFFICIENCY * GB, latency)
    raise KeyError(kind)


def dram_figures(channels: int, mt_s: float) -> LinkFigures:
    """Host memory of one socket: ``channels`` x ``mt_s`` MT/s x 8 B, STREAM's sustained share of it."""
    raw = channels * mt_s * 1e6 * 8
    return LinkFigures(raw, raw * DRAM_EFFICIENCY, DEFAULT_LATENCY_US["dram"] * US)
