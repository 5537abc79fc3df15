"""Sanity against the world: simulated ResNet-50 training on DGX A100 vs NVIDIA's published throughput.

Published (NVIDIA DeepLearningExamples, PyTorch ResNet50 v1.5 README, "Training performance: NVIDIA DGX A100
(8x A100 80GB)", pytorch-21.03 NGC container, batch 256 per GPU, DALI data loading): TF32 938 img/s on 1 GPU
and 7248 img/s on 8 GPUs (strong scaling 7.72x); mixed precision 2470 and 16621 img/s.

Simulated: the shipped scenarios single-gpu-resnet50 and ddp-resnet50-dgx-a100 (TF32, batch 256 per GPU,
SGD with momentum) with the *analytic* ResNet-50 workload, i.e. per-layer times from the roofline of the
A100's datasheet peaks (no measurement), and the same with bf16 mixed precision.

The factor we accept (TF32, the precision of the analytic workload), and why: **within 2x** on throughput.
The simulator's own part of this figure -- communication, its overlap with backward, host-device
copies -- is a few percent for ResNet-50 on NVSwitch;
the throughput is set by the per-layer compute times, and for a GPU never measured those come from a
roofline: datasheet peak x a default efficiency, compulsory memory traffic only, one kernel per layer.
Real cuDNN kernels reach very different fractions of peak per layer and per precision (NVIDIA's own table
shows TF32 -> AMP giving 2.63x on one GPU where the peak ratio is 2x), so an uncalibrated roofline cannot
be trusted closer than about 2x; calibrating on the box (`trainsim calibrate`) replaces it with measured
times. The part the simulator owns is checked separately: the 1 -> 8 GPU scaling efficiency, which must be
within 5 percentage points of the published one. Note also the preset is DGX A100 *40 GB* (1555 GB/s
HBM) while NVIDIA measured the 80 GB model (2039 GB/s), which favours the published figure on
memory-bound layers.

The mixed-precision row is printed for information, not checked: NVIDIA's 8-GPU AMP run scales only 6.72x
because at 16.6k img/s the host CPUs decoding and augmenting JPEGs (DALI on the CPU) become the bottleneck;
the analytic workload carries no data-preparation cost (``prep_s_per_sample`` unset), so the simulation
cannot show that loss -- a calibrated workload measures it. Run: python benchmarks/sanity_resnet50_a100.py
"""

from __future__ import annotations

from trainsim.api import simulate

PUBLISHED = {"tf32": (938.0, 7248.0), "bf16": (2470.0, 16621.0)}  # img/s at 1 and 8 GPUs
SOURCE = (
    "NVIDIA DeepLearningExamples PyTorch/Classification/ConvNets/resnet50v1.5 README, "
    "DGX A100 (8x A100 80GB), pytorch-21.03, batch 256/GPU"
)
ACCEPT_FACTOR = 2.0
ACCEPT_SCALING_POINTS = 5.0


def main() -> None:
    print(f"published: {SOURCE}")
    print(
        f"{'precision':<10} {'GPUs':>4} {'simulated img/s':>16} {'published':>10} {'ratio':>6} "
        f"{'scaling sim':>12} {'scaling pub':>12}"
    )
    ok = True
    for precision, (pub1, pub8) in PUBLISHED.items():
        overrides = [f"precision={precision}"]
        one = simulate("single-gpu-resnet50", overrides=overrides).samples_per_s
        eight = simulate("ddp-resnet50-dgx-a100", overrides=overrides).samples_per_s
        scaling_sim, scaling_pub = eight / one / 8 * 100, pub8 / pub1 / 8 * 100
        checked = precision == "tf32"
        for gpus, sim, pub in ((1, one, pub1), (8, eight, pub8)):
            ratio = sim / pub
            ok &= not checked or 1 / ACCEPT_FACTOR <= ratio <= ACCEPT_FACTOR
            scaling = f"{scaling_sim:>11.1f}% {scaling_pub:>11.1f}%" if gpus == 8 else ""
            print(f"{precision:<10} {gpus:>4} {sim:>16,.0f} {pub:>10,.0f} {ratio:>6.2f} {scaling}")
        ok &= not checked or abs(scaling_sim - scaling_pub) <= ACCEPT_SCALING_POINTS
    print(
        f"TF32 within {ACCEPT_FACTOR}x on throughput and {ACCEPT_SCALING_POINTS} points on scaling: "
        f"{'yes' if ok else 'NO'}"
    )


if __name__ == "__main__":
    main()
