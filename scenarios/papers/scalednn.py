"""Xu et al., ScaleDNN (ICCAD 2021): data-movement-aware data-parallel training.

The claim (abstract): the three techniques together (CPU-centric batch splitting, mini-batch pre-loading,
parameter compression) save on average 17.96 % (up to 39.38 %) of the execution time on a PCIe multi-GPU
system and 10.26 % (up to 19.20 %) on an NVLink system. ``scenarios/papers/scalednn-pcie.yaml`` and
``scalednn-nvlink.yaml`` state every assumption the material does not; each is simulated for every model
with its ``dp-gpu0`` and ``scalednn`` variants.
"""

from __future__ import annotations

from importlib import resources

from .physics import STATED, simulate
from .ranges import Evaluation, FigureSpec, Setting, build, overrides
from .reproduce import register_paper

SYSTEMS = {"pcie": "scalednn-pcie.yaml", "nvlink": "scalednn-nvlink.yaml"}
MODELS = ("alexnet", "vgg16", "resnet50", "googlenet")
TECHNIQUES = ("split", "preload", "compress")  # variants switching one technique alone
PUBLISHED = {"pcie": (17.96, 39.38), "nvlink": (10.26, 19.20)}  # average, best saving (%)
TITLE = "ScaleDNN (Xu et al., ICCAD 2021): the three techniques vs GPU0-centric data parallelism"
PHYSICAL = ("pcie_bandwidth", "nvlink_bandwidth", "gpu_flops", "gpu_memory_bandwidth")
_WHY = ("data preparation on the host cores is not modelled, so batch splitting and pre-loading save only "
        "the input copies; most of our saving is the assumed parameter compression")
SPECS = tuple(
    spec
    for system, (average, top) in PUBLISHED.items()
    for spec in (
        FigureSpec(f"average execution-time saving, {system}", average, "%",
                   f"mean over {', '.join(MODELS)}; the GPU0-centric parameter broadcast and gradient gather "
                   "shrunk by the compression plus the input scatter and copy taken off the critical path",
                   _WHY),
        FigureSpec(f"best execution-time saving, {system}", top, "%",
                   "the model whose parameter traffic is largest against its compute", _WHY),
    )
)


def scenario_path(system: str) -> str:
    return str(resources.files("trainsim.scenarios") / "papers" / SYSTEMS[system])


def savings(system: str, models=MODELS, setting: Setting | None = None, free=(),
            variant: str = "scalednn") -> list[dict]:
    """One row per model: baseline and ``variant`` iteration times, the saving, and where the time went."""
    from trainsim.formats.scenario_loader import load_scenario

    setting = setting or Setting()
    rows = []
    for model in models:
        runs = {}
        for v in ("dp-gpu0", variant):
            sets = [f"workload={model}", *overrides(setting, free, SYSTEMS[system], v)]
            runs[v] = simulate(load_scenario(scenario_path(system), sets, variant=v), setting.physics)
        base, opt = runs["dp-gpu0"], runs[variant]
        rows.append({
            "system": system,
            "model": model,
            "variant": variant,
            "dp_gpu0_s": round(base.iteration_time_s, 6),
            "optimised_s": round(opt.iteration_time_s, 6),
            "saving_pct": round(100 * (1 - opt.iteration_time_s / base.iteration_time_s), 2),
            "dp_gpu0_exposed_comm_s": round(base.breakdown_s["exposed_communication"], 6),
            "dp_gpu0_exposed_transfer_s": round(base.breakdown_s["exposed_transfer"], 6),
            "optimised_exposed_comm_s": round(opt.breakdown_s["exposed_communication"], 6),
            "optimised_exposed_transfer_s": round(opt.breakdown_s["exposed_transfer"], 6),
        })
    return rows


def evaluate(setting: Setting, free) -> Evaluation:
    """The average and best saving per system; at the stated setting also each technique alone."""
    figures, table, alone = {}, [], []
    for system in SYSTEMS:
        rows = savings(system, setting=setting, free=free)
        table += rows
        pct = [r["saving_pct"] for r in rows]
        figures[f"average execution-time saving, {system}"] = round(sum(pct) / len(pct), 2)
        figures[f"best execution-time saving, {system}"] = max(pct)
        if setting == Setting(physics=STATED):
            for technique in TECHNIQUES:
                each = savings(system, setting=setting, free=free, variant=technique)
                alone.append({"system": system, "technique": technique,
                              **{r["model"]: r["saving_pct"] for r in each},
                              "average_pct": round(sum(r["saving_pct"] for r in each) / len(each), 2)})
    tables = {"savings": table, "techniques_alone": alone} if alone else {"savings": table}
    return Evaluation(figures=figures, tables=tables)


@register_paper("scalednn", TITLE)
def reproduce_scalednn(**_options):
    files = [(name, scenario_path(system)) for system, name in SYSTEMS.items()]
    return build("scalednn", TITLE, files, SPECS, evaluate, PHYSICAL)
