"""Plain-text renderings of `analysis.describe`, `analysis.route_report` and `analysis.preset_rows`."""

from __future__ import annotations


def _table(header: list[str], rows: list[list]) -> list[str]:
    cells = [header] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def preset_lines(rows: list[dict]) -> list[str]:
    return _table(["name", "GPUs", "GPU", "description"],
                  [[r["name"], r["gpus"], r["gpu"], r["description"]] for r in rows])


def show_lines(desc: dict, *, max_links: int = 80) -> list[str]:
    kinds: dict[str, int] = {}
    for node in desc["nodes"]:
        kinds[node["kind"]] = kinds.get(node["kind"], 0) + 1
    lines = [f"{desc['name']}: {desc['description']}",
             f"source: {desc['source'] or '(mapping)'}   machines: {desc['machines']}   "
             f"GPU peer-to-peer: {'yes' if desc['p2p'] else 'no (copies staged through host memory)'}",
             "nodes: " + ", ".join(f"{n} {k}" for k, n in kinds.items()), ""]
    links = desc["links"]
    lines.append(f"links ({len(links)}, bandwidth per direction):")
    rows = [[x["a"], x["b"], x["kind"], x["generation"], x["count"], x["lanes"], x["bandwidth_gbps"],
             x["raw_bandwidth_gbps"], x["latency_us"]] for x in links[:max_links]]
    lines += _table(["a", "b", "kind", "gen", "count", "lanes", "GB/s", "raw GB/s", "latency us"], rows)
    if len(links) > max_links:
        lines.append(f"... {len(links) - max_links} more (see --json)")
    engines = [f"{n['name']} {n['nvls_gbps']} GB/s" for n in desc["nodes"] if n.get("nvls_gbps") is not None]
    if engines:
        lines += ["", "NVLS engines (in-switch reduction and multicast, NVLS traffic in from all GPUs): "
                  + ", ".join(engines)]
    lines += ["", "GPUs:"]
    lines += _table(["gpu", "spec", "memory GiB", "machine", "injection GB/s"],
                    [[g["name"], g["spec"], f"{g['memory_gib']:g}", g["machine"], g["injection_gbps"]]
                     for g in desc["gpus"]])
    cut = desc["bisection"]
    if cut["bandwidth_gbps"] is not None:
        lines += ["", f"bisection: {cut['bandwidth_gbps']} GB/s per direction (max flow from "
                      f"{_span(cut['from'])} to {_span(cut['to'])})"]
    lines += network_lines(desc.get("network"))
    nccl = desc.get("nccl")
    if nccl:
        lines += ["", f"NCCL measured on this box ({nccl['ranks']} ranks; used over NCCL's tuning tables): "
                      + ", ".join(f"{f['collective']} {f['algo']}/{f['proto']} {f['latency_us']:.1f} us "
                                  f"{f['busbw_gbps']:.1f} GB/s" for f in nccl["figures"])]
    if desc["paths"]:
        lines.append(f"paths between GPUs ({desc['paths_over']}): "
                     + ", ".join(f"{k} x{n}" for k, n in desc["paths"].items()))
        lines.append("  (NV#: NVLink, # bonded links at the first hop; PIX/PXB: through one/several PCIe "
                     "switches; PHB: through the host bridge; SYS: across sockets; NET: network; "
                     "HOST: staged through host memory)")
    return lines


TIER_NAMES = {1: "leaf", 2: "spine", 3: "core"}


def network_lines(net: dict | None) -> list[str]:
    """The network of a cluster: bisection, injection and each tier's oversubscription."""
    if not net:
        return []
    lines = []
    if net["bisection_gbps"] is not None:
        machines = f"{_span(net['bisection_from_machines'])} to {_span(net['bisection_to_machines'])}"
        half = net["injection_gbps"] / 2
        lines.append(f"network bisection: {net['bisection_gbps']} GB/s per direction (min cut from the NICs "
                     f"of machines {machines}) = {net['bisection_gbps'] / half:.3g} x half the NICs' "
                     f"injection of {net['injection_gbps']} GB/s")
    rows = [[t["tier"], TIER_NAMES.get(t["tier"], "") if len(net["tiers"]) > 1 else "switch", t["switches"],
             t["down_gbps"], t["up_gbps"] or "",
             "" if t["oversubscription"] is None else f"{t['oversubscription']:g}:1"] for t in net["tiers"]]
    return ["", *lines, *_table(["tier", "role", "switches", "down GB/s", "up GB/s", "oversubscription"],
                                rows)]


def _span(names: list) -> str:
    return str(names[0]) if len(names) == 1 else f"{names[0]}..{names[-1]}"


def route_lines(report: dict) -> list[str]:
    lines = [f"{report['src']} -> {report['dst']} on {report['topology']}"
             + (" (staged through host memory)" if report["staged_through_host"] else "")]
    for i, leg in enumerate(report["legs"]):
        if len(report["legs"]) > 1:
            lines.append(f"leg {i + 1}:")
        lines += ["  " + line for line in _table(
            ["from", "to", "kind", "count", "GB/s", "latency us"],
            [[e["from"], e["to"], e["kind"], e["count"], e["bandwidth_gbps"], e["latency_us"]]
             for e in leg["edges"]])]
    lines.append(f"latency: {report['latency_us']} us   bottleneck: {report['bottleneck_gbps']} GB/s")
    return lines
