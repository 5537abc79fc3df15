"""You, Buluç, Demmel, "Scaling deep learning on GPU and Knights Landing clusters" (SC17): EASGD co-design.

The claim: on one node of 8 K80 GPUs training AlexNet on CIFAR, communication is 87 % of original EASGD's
time and 14 % of Sync EASGD's with the co-design switches (weights on the GPU, one flat buffer, tree
reduction, overlap), which is 5.3x faster. ``scenarios/papers/easgd-alexnet-k80.yaml`` states the setting
and the free assumptions (tau, the cores updating the centre); its two variants are simulated and compared
over the physical parameters and those assumptions (`.ranges`). The paper's scale, Sync EASGD's weak scaling
on KNL nodes and the four variants compared there, is `.easgd_knl`'s: its figures join this reproduction's,
in one sweep over both scenario files (tau is one assumption of both).
"""

from __future__ import annotations

from importlib import resources

from . import easgd_knl
from .physics import communication_share, simulate
from .ranges import Evaluation, FigureSpec, Setting, build, overrides
from .reproduce import register_paper

SCENARIO = "easgd-alexnet-k80.yaml"
VARIANTS = ("original", "sync-codesign")
TITLE = ("EASGD co-design (You, Buluç, Demmel, SC17): original vs Sync EASGD on 8x K80; Sync EASGD weak "
         "scaling and the four variants on Cori KNL nodes")
PHYSICAL = ("pcie_bandwidth", "socket_bandwidth", "host_copy_rate", "gpu_flops", "gpu_memory_bandwidth",
            "link_latency", "network_bandwidth")
SHARE_O = "communication share, original EASGD"
SHARE_S = "communication share, Sync EASGD + co-design"
SPEEDUP = "speedup Sync EASGD over original"
SPECS = (
    FigureSpec(SHARE_O, 87.0, "%",
               "all non-compute time on the critical GPU: per-layer weights crossing PCIe every iteration, "
               "waiting for the round-robin centre, the master core's memory-bound updates; "
               "it falls as tau grows (sweep table)"),
    FigureSpec(SHARE_S, 14.0, "%",
               "the broadcast + reduce of 244 MB every tau iterations (tree ordered by topology, QPI "
               "crossed once each way) against tau iterations of roofline compute, partly overlapped; "
               "it falls as tau grows (sweep table)"),
    FigureSpec(SPEEDUP, 5.3, "x",
               "same 512 samples per iteration; the original waits for one master core serving 8 workers "
               "in turn (3 x 244 MB memory-bound per update) and copies its weights over PCIe every "
               "iteration"),
)


def scenario_path() -> str:
    return str(resources.files("trainsim.scenarios") / "papers" / SCENARIO)


def evaluate(setting: Setting, free) -> Evaluation:
    """One setting's figures: the K80 node's (`evaluate_k80`) and the KNL cluster's (`easgd_knl.evaluate`)."""
    k80, knl = evaluate_k80(setting, free), easgd_knl.evaluate(setting, free)
    return Evaluation(figures={**k80.figures, **knl.figures}, tables={**k80.tables, **knl.tables})


def evaluate_k80(setting: Setting, free) -> Evaluation:
    """Both variants on the K80 node in one setting: the communication shares and the speedup."""
    from trainsim.formats.scenario_loader import load_scenario

    results = {}
    for variant in VARIANTS:
        sets = overrides(setting, free, SCENARIO, variant)
        tau = load_scenario(scenario_path(), sets, variant=variant).strategy.easgd.tau
        # whole exchange periods, measured after one period of warm-up
        sets += [f"iterations={max(2, tau)}", f"warmup_iterations={tau}"]
        results[variant] = simulate(load_scenario(scenario_path(), sets, variant=variant), setting.physics)
    original, sync = results["original"], results["sync-codesign"]
    table = [{"variant": name, "iteration_s": round(r.iteration_time_s, 6),
              "communication_share_pct": round(100 * communication_share(r), 2),
              **{f"{k}_s": round(v, 6) for k, v in r.breakdown_s.items()},
              "staleness_mean": r.extra.get("staleness", {}).get("mean")} for name, r in results.items()]
    return Evaluation(
        figures={SHARE_O: round(100 * communication_share(original), 1),
                 SHARE_S: round(100 * communication_share(sync), 1),
                 SPEEDUP: round(original.iteration_time_s / sync.iteration_time_s, 2)},
        tables={"variants": table},
    )


@register_paper("easgd", TITLE)
def reproduce_easgd(**_options):
    files = [(SCENARIO, scenario_path()), (easgd_knl.SCENARIO, easgd_knl.scenario_path())]
    return build("easgd", TITLE, files, SPECS + easgd_knl.SPECS, evaluate, PHYSICAL)
