"""NCCL's cost per algorithm and protocol on this box (CUDA only), for the topology's ``nccl`` block.

NCCL picks an algorithm (ring, tree, NVLS) and a protocol (LL, LL128, Simple) per call; the collective
sweep of `collbench` measures whatever it picked. Here the sweep runs once per forced pair (NCCL_ALGO and
NCCL_PROTO in the ranks' environment, read when NCCL starts) and each collective gets an alpha-beta fit,
t = latency + S / algbw. The figures go into the calibrated topology (`topologies.schema.NcclMeasured`),
where the simulator uses them over NCCL's tuning tables (`trainsim.sim.collectives.measured`).

A pair this box cannot run (NVLS without an NVSwitch that reduces, LL128 where NCCL refuses it) fails in
NCCL; it is noted and left out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from trainsim.calibrate.measure import collbench
from trainsim.errors import TrainsimError

# (algorithm, protocol) -> the collectives NCCL runs with it (tree: all-reduce only)
RUNS = {("ring", "ll"): ("allreduce", "allgather", "reduce_scatter"),
        ("ring", "ll128"): ("allreduce", "allgather", "reduce_scatter"),
        ("ring", "simple"): ("allreduce", "allgather", "reduce_scatter"),
        ("tree", "ll"): ("allreduce",),
        ("tree", "ll128"): ("allreduce",),
        ("tree", "simple"): ("allreduce",),
        ("nvls", "simple"): ("allreduce", "allgather", "reduce_scatter")}
NCCL_ALGO = {"ring": "Ring", "tree": "Tree", "nvls": "NVLS"}
NCCL_PROTO = {"ll": "LL", "ll128": "LL128", "simple": "Simple"}
BENCH_NAME = {"allreduce": "all_reduce", "allgather": "all_gather", "reduce_scatter": "reduce_scatter"}
OUR_NAME = {v: k for k, v in BENCH_NAME.items()}


def nccl_env(algo: str, proto: str) -> dict[str, str]:
    """The ranks' environment that forces ``algo`` / ``proto`` on NCCL."""
    return {"NCCL_ALGO": NCCL_ALGO[algo], "NCCL_PROTO": NCCL_PROTO[proto]}


def figures_from(results: Sequence[collbench.CollectiveResult], algo: str, proto: str) -> list[dict]:
    """One ``nccl`` figure per fitted collective of a forced run."""
    figures = []
    for r in results:
        if r.fit is None or r.collective not in OUR_NAME:
            continue
        figures.append({"collective": OUR_NAME[r.collective], "algo": algo, "proto": proto,
                        "latency_us": r.fit.latency_us,
                        "busbw_gbps": r.fit.bandwidth_gbps * collbench.bus_factor(r.collective, r.ranks),
                        "rel_rms": r.fit.rel_rms})
    return figures


def measure(ranks: int, sizes: list[int], *, repeats: int = 3, target_s: float = 0.005,
            progress: Callable[[str], None] | None = None,
            bench: Callable[..., list] = collbench.measure_collectives) -> tuple[dict | None, list[str]]:
    """(the ``nccl`` block, notes): every pair of `RUNS` swept on ``ranks`` GPUs; None when none ran.
    ``bench`` runs one sweep (`collbench.measure_collectives`; replaceable for tests)."""
    figures, notes = [], []
    for (algo, proto), ops in RUNS.items():
        if progress is not None:
            progress(f"NCCL {algo}/{proto}")
        try:
            results = bench("cuda", ranks, sizes, repeats=repeats, target_s=target_s,
                            collectives=tuple(BENCH_NAME[op] for op in ops), env=nccl_env(algo, proto))
        except TrainsimError as exc:
            notes.append(f"NCCL {algo}/{proto} not measured: {exc}")
            continue
        figures += figures_from(results, algo, proto)
    if not figures:
        return None, notes
    return {"ranks": ranks, "source": "trainsim calibrate: NCCL_ALGO / NCCL_PROTO forced sweeps",
            "figures": figures}, notes
