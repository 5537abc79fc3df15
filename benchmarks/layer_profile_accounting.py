"""How well per-layer times add up to a measured training iteration, and what the hooks cost.

For each model and batch size, prints the plain iteration (no hooks), the sum of the per-layer forward and
backward medians, the optimizer step, the unattributed rest (loss, functional glue, autograd engine), the
hooked iteration, and how long `describe` takes; then the host's side of the plain iteration and of the
layers (``perf_counter``: on a GPU the dispatch, which bounds the step where it exceeds the GPU's time). Run
on an idle machine; timings are medians of --repeats.

    python benchmarks/layer_profile_accounting.py --model tiny-cnn --model resnet18:image_size=64 \
        --batch-sizes 8,32 --repeats 10 --threads 1
"""

from __future__ import annotations

import argparse
import time

from trainsim.calibrate.measure.describe import describe, parse_overrides
from trainsim.calibrate.measure.layer_profile import profile_layers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", default=None,
                        help="NAME or NAME:key=value,key=value (repeatable); default tiny-cnn")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-sizes", default="8,32")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    batches = [int(b) for b in args.batch_sizes.split(",")]
    for spec in args.model or ["tiny-cnn"]:
        name, _, options = spec.partition(":")
        cfg = parse_overrides([o for o in options.split(",") if o])
        start = time.perf_counter()
        describe(name, **cfg)
        describe_s = time.perf_counter() - start
        start = time.perf_counter()
        wl = profile_layers(name, args.device, batches, repeats=args.repeats, warmup=args.warmup,
                            threads=args.threads, prep_samples=32, **cfg)
        profile_s = time.perf_counter() - start
        prov = wl.provenance.model_extra
        it = wl.provenance.iteration
        print(f"{name} {cfg} on {wl.provenance.device} ({prov['torch_device']}, {prov['threads']} threads): "
              f"describe {describe_s:.2f} s, profile {profile_s:.1f} s, "
              f"prep {wl.input.prep_s_per_sample * 1e6:.1f} us/sample")
        print(f"  {'batch':>5} {'plain ms':>9} {'layers ms':>10} {'optim ms':>9} {'unattr ms':>10} "
              f"{'unattr %':>9} {'hooked ms':>10} {'hook cost %':>11} {'median IQR/median %':>20} "
              f"{'host ms':>8} {'layers host ms':>15}")
        rows = zip(it.plain, it.layers_sum, it.optimizer, it.unattributed, it.hooked, it.plain_host,
                   it.layers_host_sum, strict=True)
        for point, layer_sum, opt_step, rest_of, hooked_point, host, layers_host in rows:
            b, plain, layers, opt, rest, hooked = (point.batch, point.s, layer_sum.s, opt_step.s, rest_of.s,
                                                   hooked_point.s)
            spreads = [p[2] / p[1] for layer in wl.layers for tm in (layer.forward, layer.backward)
                       for p in tm.points if p[0] == b]
            spreads.sort()
            print(f"  {b:>5} {plain * 1e3:>9.3f} {layers * 1e3:>10.3f} {opt * 1e3:>9.3f} {rest * 1e3:>10.3f} "
                  f"{100 * rest / plain:>9.1f} {hooked * 1e3:>10.3f} {100 * (hooked - plain) / plain:>11.1f} "
                  f"{100 * spreads[len(spreads) // 2]:>20.1f} {host.s * 1e3:>8.3f} "
                  f"{layers_host.s * 1e3:>15.3f}")


if __name__ == "__main__":
    main()
