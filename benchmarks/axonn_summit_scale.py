"""AxoNN at the paper's scale, once per GPU count (a benchmark, not a test; issue 20).

``scenarios/papers/axonn-gpt-summit.yaml`` at its stated setting: 12, 24, 50 and 100 B-parameter GPTs on 48,
96, 192 and 384 V100s of Summit nodes (weak scaling: the batch grows with the GPUs), optimizer-state offload
and per-stage activation recomputation. `trainsim reproduce axonn` sweeps only the GPU counts it can afford
in every setting of its range sweep (`axonn_summit.SWEPT`); this runs the others once. Printed per GPU
count: the model, the pipeline shape, the simulated iteration, the percent of the V100's fp16 peak (the
paper: 49.4-54.78 % over 48-384 GPUs), the peak GPU memory, the ranks simulated (fewer where data-parallel
replicas are exact copies and are mirrored, sim/symmetry.py), and the wall and CPU seconds the simulation
took here (its cost). A count whose simulation runs past ``--timeout`` seconds is reported as such and the
larger ones are skipped.

Run: python benchmarks/axonn_summit_scale.py                  # 48, 96, 192, 384 GPUs
     python benchmarks/axonn_summit_scale.py --max-gpus 96 --timeout 120
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time


def _one(variant, queue) -> None:
    from trainsim.formats.scenario_loader import load_scenario
    from trainsim.scenarios.papers import axonn_summit as summit
    from trainsim.scenarios.papers.physics import STATED, simulate

    sc = load_scenario(summit.scenario_path(), variant=variant)
    wall, cpu = time.perf_counter(), time.process_time()
    result = simulate(sc)
    row = summit._row(sc, result, STATED, gpus=summit.SCALES[variant])
    row |= {"simulated_ranks": result.stats["simulated_ranks"],
            "wall_s": round(time.perf_counter() - wall, 1), "cpu_s": round(time.process_time() - cpu, 1)}
    queue.put(row)


def main() -> None:
    from trainsim.scenarios.papers import axonn_summit as summit

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-gpus", type=int, default=384)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per GPU count")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    rows = []
    header = (f"{'GPUs':>5} {'params B':>8} {'stages':>6} {'dp':>3} {'micro':>6} {'iter s':>8} "
              f"{'% peak':>7} {'mem GiB':>8} {'fits':>5} {'ranks':>5} {'wall s':>7} {'cpu s':>7}")
    if not args.json:
        print(header)
    for variant, gpus in summit.SCALES.items():
        if gpus > args.max_gpus:
            break
        queue = mp.Queue()
        child = mp.Process(target=_one, args=(variant, queue))
        child.start()
        child.join(args.timeout)
        if child.is_alive():
            child.terminate()
            child.join()
            rows.append({"gpus": gpus, "timed_out_after_s": args.timeout})
            if not args.json:
                print(f"{gpus:>5} did not finish within {args.timeout:g} s; larger counts skipped")
            break
        row = queue.get()
        rows.append(row)
        if not args.json:
            cells = (f"{gpus:>5} {row['params_b']:>8} {row['stages']:>6} {row['data_parallel']:>3} "
                     f"{row['micro_batches']:>6} {row['iteration_s']:>8.2f} {row['percent_of_peak']:>7.2f} "
                     f"{row['memory_peak_gib']:>8.2f} {str(row['fits']):>5}")
            print(f"{cells} {row['simulated_ranks']:>5} {row['wall_s']:>7} {row['cpu_s']:>7}", flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
