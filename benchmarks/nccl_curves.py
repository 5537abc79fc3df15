"""The collective model against published nccl-tests figures (a benchmark, not a test).

Run: python benchmarks/nccl_curves.py [--data FILE] [--flow] [--json]

For every published figure in the data file (benchmarks/data/nccl_published.yaml: rows of nccl-tests
output and figures stated by NVIDIA engineers, each with its source and setup), the model's time and busbw
for the same machine, collective, GPU count, size and algorithm (NCCL's own choice where the run did not
force one), and the error of the model's busbw against the published one. Then:

- the issue's aims: within 10 % at 256 MiB and above, within 25 % at every size with a published figure,
  NVLS all-reduce busbw on dgx-h100 within 10 % of ~480 GB/s, a 1 KiB all-reduce on dgx-a100 under 25 us;
- the sizes of the wanted grid (all-reduce, all-gather, reduce-scatter on dgx-a100, dgx-h100 ring and NVLS,
  dgx1-v100; 1 KiB .. 1 GiB) that have no published figure, so no figure is taken for more than it is;
- the physical bound of each row (sim/collectives/limits.py), which no model figure may pass;
- the bytes per port of the published NVLS runs by group size, which say whether the NVSwitch's ports or an
  engine shared by them binds NVLS (see `nvls_ports`).

Nothing is fitted here: the model is NCCL's tuning figures (sim/collectives/nccl_tuning.py) on the
topology library's links. Machines map to presets: dgx-a100, dgx-h100, dgx1-v100, and for several DGX H100
machines the first N machines of dgx-h100-rail-32node (8 x 400 Gb/s NDR per machine, rail-optimised).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from trainsim.sim.collectives import limits
from trainsim.sim.collectives.ops import bus_factor, choose, collective_time, simulate_collective
from trainsim.topologies import load_topology
from trainsim.yamlio import parse_yaml_mapping

DATA = Path(__file__).parent / "data" / "nccl_published.yaml"
PRESETS = {"dgx-a100": "dgx-a100", "dgx-h100": "dgx-h100", "dgx1-v100": "dgx1-v100",
           "dgx-a100-multinode": "dgx-a100-2node", "dgx-h100-multinode": "dgx-h100-rail-32node"}
GPUS_PER_MACHINE = 8
WANTED_SIZES = (2**10, 2**16, 2**20, 2**24, 2**28, 2**30)
WANTED = [("dgx-a100", "auto"), ("dgx-h100", "ring"), ("dgx-h100", "nvls"), ("dgx1-v100", "auto")]
COLLECTIVES = ("allreduce", "allgather", "reduce_scatter")
GB = 1e9


def load(path: Path) -> dict:
    data = parse_yaml_mapping(path.read_text(), str(path), "data file")
    ids = {s["id"] for s in data.get("sources", [])}
    for fig in data.get("figures", []):
        if fig["source"] not in ids:
            raise SystemExit(f"{path}: figure of {fig['machine']} names unknown source {fig['source']!r}")
        if fig["machine"] not in PRESETS:
            raise SystemExit(f"{path}: machine {fig['machine']!r} has no preset; valid: {', '.join(PRESETS)}")
    return data


_topologies: dict = {}


def _topology(machine: str):
    name = PRESETS[machine]
    if name not in _topologies:
        _topologies[name] = load_topology(name)
    return _topologies[name]


def model(machine: str, op: str, gpus: int, algo: str, size: int, flow: bool) -> dict:
    """The model's figures for one published row: time (s), busbw (GB/s), what ran, the wires' bound."""
    topo = _topology(machine)
    group = topo.gpus[:gpus]
    used, proto = choose(topo, op, group, size, algo=algo)
    if flow:
        seconds = simulate_collective(topo, op, group, size, algo=used, proto=proto)["time_s"]
    else:
        seconds = collective_time(topo, op, group, size, algo=used, proto=proto)
    factor = bus_factor(op, gpus)
    return {"time_us": seconds * 1e6, "busbw": size / seconds / GB * factor, "algo": used, "proto": proto,
            "limit": limits.busbw_limit(topo, op, group, used) / GB}


def compare(data: dict, flow: bool) -> list[dict]:
    rows = []
    for fig in data["figures"]:
        gpus = fig.get("gpus", GPUS_PER_MACHINE * fig.get("nodes", 1))
        base = {"machine": fig["machine"], "collective": fig["collective"], "algo": fig.get("algo", "auto"),
                "gpus": gpus, "source": fig["source"], "kind": fig["kind"]}
        base["judged"] = fig.get("network_matches_brief", True) is not False
        if fig["kind"] in ("table", "busbw_only"):
            points = (fig["rows"] if fig["kind"] == "table"
                      else {s: (None, None, b) for s, b in fig["busbw"].items()})
            for size, (t_us, _algbw, busbw) in sorted(points.items()):
                m = model(fig["machine"], fig["collective"], gpus, base["algo"], int(size), flow)
                rows.append({**base, "size": int(size), "published_us": t_us, "published_busbw": busbw,
                             **_model_fields(m, busbw)})
        else:  # a stated peak busbw: compared at the size it names (the sweep's top, 1 GiB if none)
            size = int(fig.get("size", 2**30))
            m = model(fig["machine"], fig["collective"], gpus, base["algo"], size, flow)
            rows.append({**base, "size": size, "published_us": None, "published_busbw": fig["peak_busbw"],
                         **_model_fields(m, fig["peak_busbw"]), "note": fig.get("note", "")})
    return rows


def _model_fields(m: dict, published_busbw: float) -> dict:
    error = m["busbw"] / published_busbw - 1 if published_busbw > 0 else None
    return {"model_us": m["time_us"], "model_busbw": m["busbw"], "ran": f"{m['algo']}/{m['proto']}",
            "error": error, "limit_busbw": m["limit"]}


def missing(rows: list[dict]) -> list[str]:
    # a run left to NCCL's choice counts for the algorithm NCCL (and the model) picked
    have = {(r["machine"], r["collective"], a, r["size"]) for r in rows if r["kind"] != "statement"
            and r["gpus"] == GPUS_PER_MACHINE for a in {r["algo"], r["ran"].split("/")[0]}}
    gaps = []
    for machine, algo in WANTED:
        for op in COLLECTIVES:
            absent = [s for s in WANTED_SIZES if (machine, op, algo, s) not in have]
            if absent:
                gaps.append(f"{machine} {op} ({algo}): {', '.join(_size(s) for s in absent)}")
    return gaps


def _size(n: int) -> str:
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def aims(rows: list[dict]) -> list[tuple[str, bool, str]]:
    table = [r for r in rows if r["error"] is not None and r["judged"]]
    big = [r for r in table if r["size"] >= 2**28]
    out = []
    worst_big = max((abs(r["error"]) for r in big), default=None)
    out.append(("within 10 % at 256 MiB and above", worst_big is not None and worst_big <= 0.10,
                f"worst {_pct(worst_big)} over {len(big)} figures"))
    worst = max((abs(r["error"]) for r in table), default=None)
    out.append(("within 25 % at every published size", worst is not None and worst <= 0.25,
                f"worst {_pct(worst)} over {len(table)} figures, median "
                f"{_pct(statistics.median(abs(r['error']) for r in table)) if table else '-'}"))
    nvls = _topology("dgx-h100")
    t = collective_time(nvls, "allreduce", None, 2**30, algo="nvls")
    busbw = 2**30 / t / GB * bus_factor("allreduce", 8)
    out.append(("NVLS all-reduce busbw on dgx-h100 within 10 % of 480 GB/s", abs(busbw / 480 - 1) <= 0.10,
                f"{busbw:.1f} GB/s at 1 GiB"))
    t_small = collective_time(_topology("dgx-a100"), "allreduce", None, 2**10) * 1e6
    out.append(("1 KiB all-reduce on dgx-a100 under 25 us", t_small < 25, f"{t_small:.1f} us"))
    pod = [r for r in table if r["machine"] == "dgx-h100-multinode" and r["size"] == 2**30]
    worst_pod = max((abs(r["error"]) for r in pod), default=None)
    out.append(("rail-optimised H100 machines vs published InfiniBand runs within 15 % at 1 GiB",
                worst_pod is not None and worst_pod <= 0.15,
                ", ".join(f"{r['gpus'] // GPUS_PER_MACHINE} machines {_pct(r['error'])}" for r in pod)))
    over = [r for r in rows if r["model_busbw"] > r["limit_busbw"] * (1 + 1e-9)]
    out.append(("no model figure above the wires' bound", not over, f"{len(over)} over"))
    return out


def fabrics() -> list[str]:
    """Rail pod against the 2:1 fat-tree at 1 GiB: what crosses the oversubscribed tier slows down."""
    rail, fat = load_topology("dgx-h100-rail-32node"), load_topology("dgx-h100-fattree-2to1")
    lines = []
    for op, algo, n in (("alltoall", "auto", 128), ("allreduce", "ring", 256), ("allreduce", "tree", 256)):
        t_rail = collective_time(rail, op, rail.gpus[:n], 2**30, algo=algo)
        t_fat = collective_time(fat, op, fat.gpus[:n], 2**30, algo=algo)
        lines.append(f"{op:>10} {algo:>5} {n:>4} GPUs: rail {t_rail * 1e3:8.2f} ms, fat-tree 2:1 "
                     f"{t_fat * 1e3:8.2f} ms ({t_fat / t_rail:.2f}x)")
    return lines


def nvls_ports(rows: list[dict]) -> list[str]:
    """Which resource binds NVLS on DGX H100: the bytes per port of the published NVLS all-reduce runs of
    one machine at each group size. Each GPU moves S (n+1)/n each way through its port, so the port moves
    busbw x (n+1) / (2 (n-1)) bytes/s. If one engine shared by the switch's n ports bound instead (NVLS
    traffic (n+1) S through it), the per-port rate would scale as 1/n, 8/5 = 1.6x higher at 5 GPUs than at
    8. The same per-port rate at every n says the ports (and what NCCL's NVLS efficiency takes off them)
    bind, so the dgx-h100 preset gives its NVSwitch no NVLS engine figure (``nvls_gbps``)."""
    by_source: dict[str, dict[int, dict]] = {}  # one run series (one machine) compares group sizes
    for r in rows:
        if r["machine"] == "dgx-h100" and r["collective"] == "allreduce" and r["algo"] == "nvls" \
                and r["size"] >= 2**30:
            by_source.setdefault(r["source"], {})[r["gpus"]] = r
    if not by_source:
        return []
    best = max(by_source.values(), key=len)
    lines = []
    for n, r in sorted(best.items()):
        port = r["published_busbw"] * (n + 1) / (2 * (n - 1))
        lines.append(f"{n} GPUs: busbw {r['published_busbw']:6.1f} GB/s at {_size(r['size'])} "
                     f"[{r['source']}] -> {port:6.1f} GB/s per port each way")
    if len(best) > 1:
        low, high = min(best), max(best)
        rate = {n: best[n]["published_busbw"] * (n + 1) / (2 * (n - 1)) for n in (low, high)}
        lines.append(f"per-port rate at {low} GPUs / at {high}: {rate[low] / rate[high]:.3f} "
                     f"(an engine shared by all ports would give {high / low:.3f})")
    return lines


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def print_report(data: dict, rows: list[dict]) -> None:
    sources = {s["id"]: s for s in data["sources"]}
    print("# The collective model against published nccl-tests figures (busbw error = model / published - 1)")
    key, shown = None, set()
    for r in rows:
        k = (r["machine"], r["collective"], r["algo"], r["gpus"], r["source"])
        if k != key:
            key = k
            s = sources[r["source"]]
            judged = "" if r["judged"] else "  (another fabric: shown, not judged)"
            print(f"\n## {r['machine']} {r['collective']} algo={r['algo']} {r['gpus']} GPUs  "
                  f"[{r['source']}]{judged}")
            if r["source"] not in shown:
                shown.add(r["source"])
                print(f"#  {s['url']}\n#  {s['setup']}")
            print(f"#{'size':>12} {'pub us':>10} {'pub busbw':>10} | {'model us':>10} {'busbw':>8} "
                  f"{'ran':>12} | {'error':>8} {'bound':>8}")
        pub_us = f"{r['published_us']:.2f}" if r["published_us"] is not None else (
            "(stated)" if r["kind"] == "statement" else "-")
        print(f"{_size(r['size']):>13} {pub_us:>10} {r['published_busbw']:>10.2f} | {r['model_us']:>10.2f} "
              f"{r['model_busbw']:>8.2f} {r['ran']:>12} | {_pct(r['error']):>8} {r['limit_busbw']:>8.1f}")
    print("\n# sizes of the wanted grid with no published figure (8 GPUs, one machine):")
    for line in missing(rows):
        print(f"  {line}")
    print("\n# NVLS on DGX H100: bytes per port of the published runs by group size (what binds)")
    for line in nvls_ports(rows):
        print(f"  {line}")
    print("\n# the same 1 GiB collectives on the rail-optimised pod and on the 2:1 fat-tree (32 DGX H100)")
    for line in fabrics():
        print(f"  {line}")
    print("\n# aims")
    for name, ok, detail in aims(rows):
        print(f"  [{'met' if ok else 'NOT met'}] {name}: {detail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA, help="published figures (YAML)")
    parser.add_argument("--flow", action="store_true", help="time with the flow simulation, not analytic")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    data = load(args.data)
    rows = compare(data, args.flow)
    if args.json:
        print(json.dumps({"rows": rows, "missing": missing(rows), "nvls_ports": nvls_ports(rows),
                          "aims": [{"aim": a, "met": ok, "detail": d} for a, ok, d in aims(rows)]}, indent=1))
    else:
        print_report(data, rows)


if __name__ == "__main__":
    main()
