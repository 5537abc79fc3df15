"""Xu et al., ScaleDNN (ICCAD 2021): data-movement-aware data-parallel training.

The claim (abstract): the three techniques together (CPU-centric batch splitting, mini-batch pre-loading,
parameter compression) save on average 17.96 % (up to 39.38 %) of the execution time on a PCIe multi-GPU
system and 10.26 % (up to 19.20 %) on an NVLink system. ``scenarios/papers/scalednn-pcie.yaml`` and
``scalednn-nvlink.yaml`` state every assumption the material does not; each is simulated for every model
with its ``dp-gpu0`` and ``scalednn`` variants.
"""

from __future__ import annotations

from importlib import resources

from .reproduce import Figure, Reproduction, register_paper

SYSTEMS = {"pcie": "scalednn-pcie.yaml", "nvlink": "scalednn-nvlink.yaml"}
MODELS = ("alexnet", "vgg16", "resnet50", "googlenet")
PUBLISHED = {"pcie": (17.96, 39.38), "nvlink": (10.26, 19.20)}  # average, best saving (%)
TITLE = "ScaleDNN (Xu et al., ICCAD 2021): the three techniques vs GPU0-centric data parallelism"


def scenario_path(system: str) -> str:
    return str(resources.files("trainsim.scenarios") / "papers" / SYSTEMS[system])


def savings(system: str, models=MODELS) -> list[dict]:
    """One row per model: baseline and ScaleDNN iteration times, the saving, and where the time went."""
    from trainsim.formats.scenario_loader import load_scenario
    from trainsim.sim.simulation import Simulation

    rows = []
    for model in models:
        runs = {}
        for v in ("dp-gpu0", "scalednn"):
            sc = load_scenario(scenario_path(system), [f"workload={model}"], variant=v)
            runs[v] = Simulation(sc, record=False).run()
        base, opt = runs["dp-gpu0"], runs["scalednn"]
        rows.append({
            "system": system,
            "model": model,
            "dp_gpu0_s": round(base.iteration_time_s, 6),
            "scalednn_s": round(opt.iteration_time_s, 6),
            "saving_pct": round(100 * (1 - opt.iteration_time_s / base.iteration_time_s), 2),
            "dp_gpu0_exposed_comm_s": round(base.breakdown_s["exposed_communication"], 6),
            "dp_gpu0_exposed_transfer_s": round(base.breakdown_s["exposed_transfer"], 6),
            "scalednn_exposed_comm_s": round(opt.breakdown_s["exposed_communication"], 6),
            "scalednn_exposed_transfer_s": round(opt.breakdown_s["exposed_transfer"], 6),
        })
    return rows


@register_paper("scalednn", TITLE)
def reproduce_scalednn(**_options) -> Reproduction:
    from trainsim.formats.scenario_loader import load_scenario

    figures, table = [], []
    for system in SYSTEMS:
        rows = savings(system)
        table += rows
        pct = [r["saving_pct"] for r in rows]
        best = max(rows, key=lambda r: r["saving_pct"])
        average, top = PUBLISHED[system]
        figures.append(Figure(
            f"average execution-time saving, {system}",
            round(sum(pct) / len(pct), 2),
            average,
            "%",
            f"mean over {', '.join(MODELS)} at 64 samples/GPU; the saving is the GPU0-centric parameter "
            "broadcast and gradient gather halved by fp16 (bytes over GPU0's link) plus the input scatter "
            "and copy taken off the critical path",
        ))
        figures.append(Figure(
            f"best execution-time saving, {system}",
            best["saving_pct"],
            top,
            "%",
            f"{best['model']}: the model whose parameter traffic is largest against its compute",
        ))
    assumptions = []
    for system in SYSTEMS:
        assumptions += [f"{system}: {a}" for a in load_scenario(scenario_path(system)).assumptions]
    return Reproduction(paper="scalednn", title=TITLE, figures=figures, assumptions=assumptions,
                        tables={"savings": table})
