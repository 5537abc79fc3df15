"""Dryden et al., "Improving Strong-Scaling of CNN Training by Exploiting Finer-Grained Parallelism"
(IPDPS 2019).

The claim (abstract): spatial and hybrid (sample x spatial) decomposition scale CNN training strongly past
the point where data parallelism runs out of samples (one sample per GPU), for ResNet-50 and for a
large-sample mesh-tangling CNN (2048x2048 samples). The paper's own figures are not in the material here, so
the published column is the abstract's qualitative claim; the numbers are ours.

Two strong-scaling sets, each a scenario of ``scenarios/papers/`` (assumptions written there): a fixed global
mini-batch on 8, 16, ... GPUs; at each count `trainsim plan`'s model chooses every layer's grid and the
simulator times that plan and pure data parallelism (on the most GPUs the batch divides over). The mesh
model is defined below (an assumption: the paper's exact network is not given here) and shipped as
``scenarios/papers/dryden-meshcnn.json`` (regenerate with ``python -m trainsim.scenarios.papers.dryden``).
"""

from __future__ import annotations

import argparse
import math
from importlib import resources
from pathlib import Path

from trainsim.formats.workload import InputSpec, Provenance, Workload

from .ranges import Evaluation, FigureSpec, build
from .reproduce import register_paper

MESH_CHANNELS = 18  # assumed: mesh quantities per zone, float32
MESH_SIZE = 2048


def mesh_cnn(image_size: int = MESH_SIZE, channels: int = MESH_CHANNELS) -> Workload:
    """A mesh-tangling-like fully convolutional network (assumed): four stages of two 3x3 convs (32, 64, 128,
    256 channels; the first conv 5x5), each stage after the first halving the resolution with a stride-2
    conv, batchnorm + relu after every conv, and a 1x1 conv predicting tangling per 8x8 block of zones."""
    from trainsim.sim.compute.analytic_models import _Builder  # the analytic generator's layer arithmetic

    b = _Builder("float32")
    x = b.tensor((channels, image_size, image_size), requires_grad=False)
    width = 32
    for stage in range(4):
        first = f"stage{stage}.conv1"
        if stage == 0:
            x = b.conv2d(first, x, width, 5, padding=2)
        else:
            x = b.conv2d(first, x, width, 3, stride=2, padding=1)
        x = b.relu(f"stage{stage}.relu1", b.batchnorm(f"stage{stage}.bn1", x))
        x = b.conv2d(f"stage{stage}.conv2", x, width, 3, padding=1)
        x = b.relu(f"stage{stage}.relu2", b.batchnorm(f"stage{stage}.bn2", x))
        width *= 2
    b.conv2d("predict", x, 2, 1)
    input_spec = InputSpec(
        shape=[channels, image_size, image_size],
        dtype="float32",
        bytes_per_sample=channels * image_size * image_size * 4,
    )
    return Workload(
        name="dryden-meshcnn",
        dtype="float32",
        input=input_spec,
        layers=b.layers,
        provenance=Provenance(
            device="analytic",
            device_spec=None,
            tool="trainsim",
            generator="trainsim.scenarios.papers.dryden.mesh_cnn",
            config={"image_size": image_size, "channels": channels},
        ),
    )


def papers_dir() -> Path:
    return Path(str(resources.files("trainsim.scenarios") / "papers"))


SETS = (
    ("resnet50", "dryden-resnet50.yaml", "ResNet-50 (224x224)"),
    ("meshcnn", "dryden-meshcnn.yaml", "mesh-tangling-like CNN (2048x2048)"),
)


def strong_scaling(scenario_file: str | Path) -> list[dict]:
    """One row per variant (GPU count) of a scenario: data parallel vs the planned hybrid decomposition."""
    from trainsim.formats.scenario_loader import read_scenario_data
    from trainsim.resolve import resolve
    from trainsim.sim.planning.spatial_plan import data_parallel_gpus, plan_scenario

    data, _, _ = read_scenario_data(str(scenario_file))
    rows: list[dict] = []
    dp_runs: dict[int, tuple[float, float]] = {}  # data parallel on N GPUs: (seconds, memory peak)
    for variant in sorted(data.get("variants") or {}, key=lambda v: data["variants"][v]["gpus"]):
        run = resolve(str(scenario_file), variant=variant)
        sc = run.scenario
        dp_gpus = data_parallel_gpus(sc.batch_size, sc.gpus)
        p = plan_scenario(
            run, symmetric=sc.strategy.collectives == "analytic", simulate_dp=dp_gpus not in dp_runs
        )
        if (
            dp_gpus in dp_runs
        ):  # the same run as an earlier row's (symmetric ranks: node count does not matter)
            p.simulated_dp_s, p.memory_dp_peak_bytes = dp_runs[dp_gpus]
        dp_runs[dp_gpus] = (p.simulated_dp_s, p.memory_dp_peak_bytes)
        rows.append(
            {
                "gpus": p.gpus,
                "batch": p.batch,
                "dp_gpus": p.dp_gpus,
                "dp_ms": p.simulated_dp_s * 1e3,
                "hybrid_ms": p.simulated_s * 1e3,
                "speedup": p.simulated_dp_s / p.simulated_s,
                "model_ms": p.model_s * 1e3,
                "dp_gib": p.memory_dp_peak_bytes / 2**30,
                "hybrid_gib": p.memory_peak_bytes / 2**30,
                # grid SxHxW : number of consecutive layers
                "plan": " ".join(f"{'x'.join(map(str, r['grid']))}:{r['layers']}" for r in p.runs()),
            }
        )
    return rows


TITLE = "Spatial/hybrid decomposition (Dryden et al., IPDPS 2019)"


def evaluate(_setting, _free) -> Evaluation:
    """Both strong-scaling sets at the stated setting (the planner builds its own simulations, so this
    reproduction is not swept: its claims are qualitative and each point costs a plan)."""
    figures, tables = {}, {}
    for key, file, label in SETS:
        path = papers_dir() / file
        rows = strong_scaling(path)
        tables[f"{key}_strong_scaling"] = rows
        first, last = rows[0], rows[-1]
        best_dp = min(rows, key=lambda r: r["dp_ms"])
        figures[f"{label}: best hybrid at the most GPUs vs best data parallel"] = round(
            best_dp["dp_ms"] / last["hybrid_ms"], 3)
        efficiency = (f"{label}: strong-scaling efficiency over the GPU counts (best of hybrid and data "
                      "parallel)")
        figures[efficiency] = (
            round(min(first["dp_ms"], first["hybrid_ms"]) / min(last["dp_ms"], last["hybrid_ms"])
                  / (last["gpus"] / first["gpus"]), 3))
        figures[f"{label}: GPU memory at the data-parallel limit vs hybrid at the most GPUs"] = (
            f"{best_dp['dp_gib']:.2f} -> {last['hybrid_gib']:.2f}")
    return Evaluation(figures, tables)


def _specs() -> list[FigureSpec]:
    out = []
    for _key, _file, label in SETS:
        out += [
            FigureSpec(f"{label}: best hybrid at the most GPUs vs best data parallel",
                       "strong scaling past 1 sample/GPU (abstract)", "x",
                       "speedup of the planned decomposition over the fastest data-parallel run",
                       qualitative=True),
            FigureSpec(f"{label}: strong-scaling efficiency over the GPU counts (best of hybrid and data "
                       "parallel)", "excellent (abstract)", "",
                       "limits: every GPU holds every weight, so each iteration all-reduces all gradients; "
                       "per-kernel launch costs do not shrink with the slab", qualitative=True),
            FigureSpec(f"{label}: GPU memory at the data-parallel limit vs hybrid at the most GPUs",
                       "samples too large for one GPU become trainable (abstract)", "GiB",
                       "activations split with the slabs; weights are replicated", qualitative=True),
        ]
    return out


@register_paper("dryden", TITLE)
def reproduce_dryden(**_options):
    files = [(file, str(papers_dir() / file)) for _key, file, _label in SETS]
    return build("dryden", TITLE, files, _specs(), evaluate, physical=())


def _allreduce_floor(scenario_file, gpus: int) -> float:
    """Seconds of one all-reduce of all the model's gradients over ``gpus`` GPUs (analytic)."""
    from trainsim.resolve import resolve
    from trainsim.sim.collectives.ops import collective_time
    from trainsim.sim.compute.costs import WEIGHT_BYTES

    run = resolve(str(scenario_file))
    sc, topology, workload = run.scenario, run.topology, run.workload
    grad_bytes = workload.num_params * WEIGHT_BYTES[sc.precision]
    return collective_time(topology, "allreduce", topology.gpus[:gpus], grad_bytes)


def main(argv: list[str] | None = None) -> None:
    """Regenerate the shipped mesh workload: ``python -m trainsim.scenarios.papers.dryden [--out FILE]``."""
    from trainsim.formats.workload import save_workload

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--out", default=str(papers_dir() / "dryden-meshcnn.json"))
    args = parser.parse_args(argv)
    print(save_workload(mesh_cnn(), args.out))


def _per_sample_gib(workload: Workload) -> float:
    return workload.saved_activation_bytes_per_sample / 2**30


if __name__ == "__main__":
    main()
    wl = mesh_cnn()
    print(
        f"{len(wl.layers)} layers, {wl.num_params} params, {_per_sample_gib(wl):.2f} GiB saved per sample, "
        f"{wl.flops_forward_per_sample / 1e12:.3f} TFLOP forward per sample; "
        f"{math.prod(wl.input.shape) * 4 / 1e6:.0f} MB input"
    )
