"""Replaying a traced step as it runs untraced, against the same step measured without the profiler.

    python benchmarks/replay_untraced.py [--cost-us 1,2,3,4] [--json]

The two H200 traces kept in `tests/data/traces-h200` are one step each of H200 run 3's `validate` (the
executor's last warm-up iteration, under torch.profiler). The same run measured 40 steps of each model
without the profiler (`benchmarks/data/h200-run3/<model>/report-0.json`, `measured_iterations_s`), so each
trace has its untraced ground truth: its median and interquartile range.

Per trace it prints the traced step and its replay, then the replay as untraced
(`trainsim replay --set untraced=true`): with the profiler's recorded stalls taken out (CUPTI buffer
requests a thread waited on), then also each per-event cost of ``--cost-us`` (the figure `trainsim calibrate
profiler` measures on a box), each with its error against the untraced median. Last, the per-event cost at
which the replay meets that median (bisection; "none" when no cost up to 20 us reaches it, as where the
GPU bounds the step). A cost measured on the H200 (`benchmarks/gpu_session.sh`, step profiler-cost) is the
test of the model: the costs implied by the two traces should agree with it.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

from trainsim.formats.kineto import load_traces
from trainsim.sim.replay.engine import replay
from trainsim.sim.replay.trace_graph import build_graph

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "tests" / "data" / "traces-h200"
REPORTS = ROOT / "benchmarks" / "data" / "h200-run3"
MODELS = ("resnet50", "gpt2-small")
MAX_COST_US = 20.0


def untraced_measured(model: str) -> tuple[float, float, float, int]:
    """(first quartile, median, third quartile, count) of the model's fp32 steps measured without the
    profiler in run 3."""
    report = json.loads((REPORTS / model / "report-0.json").read_text())
    row = next(r for r in report["rows"] if r["variant"] == model)
    steps = row["measured_iterations_s"]
    q1, q3 = np.percentile(steps, [25, 75])
    return float(q1), statistics.median(steps), float(q3), len(steps)


def implied_cost_us(graph, target_s: float) -> float | None:
    """The per-event cost (us) at which the untraced replay's step equals ``target_s``; None if none up to
    `MAX_COST_US` does (the step does not shorten that far)."""
    def step(cost_us: float) -> float:
        return replay([graph], untraced_event_s=cost_us * 1e-6).ranks[0].steps[0].replayed_s

    lo, hi = 0.0, MAX_COST_US
    if step(lo) <= target_s:
        return 0.0
    if step(hi) > target_s:
        return None
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if step(mid) > target_s else (lo, mid)
    return (lo + hi) / 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cost-us", default="1,2,3,4", help="per-event costs (us), comma list")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    costs = [float(c) for c in args.cost_us.split(",") if c.strip()]
    out = []
    for model in MODELS:
        graph = build_graph(load_traces([TRACES / f"{model}-fp32-step.json.gz"])[0])
        measured = graph.steps[0].measured_s
        q1, median, q3, count = untraced_measured(model)
        rows = [("traced step, replayed", None, replay([graph]).ranks[0].steps[0].replayed_s)]
        for cost in [0.0, *costs]:
            s = replay([graph], untraced_event_s=cost * 1e-6).ranks[0].steps[0].replayed_s
            rows.append(("untraced: stalls" + (f" + {cost:g} us/event" if cost else " only"), cost, s))
        at = {c: s for _, c, s in rows if c is not None}
        out.append({"model": model, "traced_s": measured, "untraced_median_s": median,
                    "untraced_iqr_s": q3 - q1, "untraced_steps": count,
                    # how much the step shortens per us of per-event cost: small where the GPU bounds it
                    "ms_per_us": (at[0.0] - at[max(costs)]) * 1e3 / max(costs) if costs else None,
                    "stalls_s": sum(p.profiler_stall for p in graph.points),
                    "events": sum(p.recorded for p in graph.points),
                    "rows": [{"what": w, "cost_us": c, "step_s": s, "error_pct": 100 * (s - median) / median}
                             for w, c, s in rows],
                    "implied_cost_us": implied_cost_us(graph, median),
                    # over the untraced steps' interquartile range: the slower quartile implies less
                    "implied_cost_iqr_us": [implied_cost_us(graph, q3), implied_cost_us(graph, q1)]})
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print("# H200 run 3, fp32 steps: traced (tests/data/traces-h200) against untraced "
          "(benchmarks/data/h200-run3)")
    for item in out:
        print(f"\n## {item['model']}: traced step {item['traced_s'] * 1e3:.2f} ms; untraced median "
              f"{item['untraced_median_s'] * 1e3:.2f} ms (IQR {item['untraced_iqr_s'] * 1e3:.2f}, "
              f"{item['untraced_steps']} steps)")
        print(f"   profiler stalls in the trace {item['stalls_s'] * 1e3:.2f} ms; host events recorded "
              f"{item['events']}")
        for row in item["rows"]:
            print(f"   {row['what']:<32} {row['step_s'] * 1e3:8.2f} ms  {row['error_pct']:+7.1f} %")
        def us(cost):
            return f"{cost:.2f} us" if cost is not None else f"none up to {MAX_COST_US:g} us"
        low, high = item["implied_cost_iqr_us"]
        print(f"   the step shortens {item['ms_per_us']:.2f} ms per us of per-event cost")
        print(f"   per-event cost that meets the untraced median: {us(item['implied_cost_us'])} "
              f"(its quartiles: {us(low)} to {us(high)})")


if __name__ == "__main__":
    main()
