"""Strategy mesh predicted vs executed on this box: `trainsim validate`'s rows for the llama-tiny mesh
variants (FSDP2, TP, TP with sequence parallelism), with the parts of each prediction beside the measured
phases, and the size of what the simulator's mesh strategy carries for CPU ranks.

    python benchmarks/mesh_validate.py --calibration DIR   # a bundle that calibrated llama-tiny here
    python benchmarks/mesh_validate.py --calibrate DIR     # calibrate it first (quick, ~4 min on CPU)
    python benchmarks/mesh_validate.py --calibrate DIR --scenario validate-gpu   # on a GPU box

Per row: predicted and measured mean iteration (ms) and error; the prediction's compute and exposed
communication; the executor's forward, backward and optimizer phases; peak memory per rank predicted and
measured (cpu.allocator_peak or cuda.max_memory_allocated) and its error. On CPU ranks also what the mesh
strategy's prediction carries for them: the factor on a calibrated CPU rank's layer times
(`sim.hosts.rank_step.measured_scale`: the whole step alone over the in-process profile, and the slowdown
with every rank of the host computing), the tensor-parallel collectives per iteration and gloo's measured
per-call cost of them (the bundle's collectives.json), and FSDP's collectives' whole time beside the part
left exposed (a CPU rank moves gloo's bytes with its own core). And the
single row's peak memory measured as the mesh rows measure theirs (one process, `mesh.AllocatorPeak`), beside
what strategy single's memory model predicts for it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "validate-cpu": ["single-llama-tiny", "fsdp-2-llama-tiny", "fsdp-2-recompute-llama-tiny",
                     "tp2-llama-tiny", "tp2-sp-llama-tiny"],
    "validate-gpu": ["single-llama-tiny", "fsdp-1-llama-tiny", "fsdp-1-recompute-llama-tiny",
                     "fsdp-2-llama-tiny", "tp2-sp-llama-tiny", "cp2-llama-tiny"],
}


def calibrate(out: str, device: str) -> None:
    cmd = ["trainsim", "calibrate", "--model", "llama-tiny", "--device", device, "--quick", "--batch-sizes",
           "1,2,4" if device == "cpu" else "4,8,16", "-o", out]
    if device == "cpu":
        cmd += ["--ranks", "2"]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def left_out(scenario: str, variant: str, calibration: str, cfg) -> dict:
    """What the mesh strategy's prediction of ``variant`` carries for CPU ranks (see the module)."""
    from trainsim.calibrate.validate.run import predict
    from trainsim.resolve import bundle_call_latencies, load_bundle
    from trainsim.sim.hosts.call_latency import cost
    from trainsim.sim.hosts.rank_step import measured_scale
    from trainsim.sim.output.records import records

    bundle = load_bundle(calibration)
    result = predict(scenario, variant, calibration)
    first = sorted(result.machine.gpus)[0]
    last = result.iterations - 1
    ops = [r for r in records(result) if r["resource"] == first and r["iteration"] == last]
    calls = [r for r in ops if r["op"].startswith("tp_")]
    fsdp = [r for r in ops if r["stream"] == "comm" and r["op"] in ("allgather", "reduce_scatter")]
    latency = bundle_call_latencies(bundle)
    gloo_s = sum(cost(latency.get(r["op"].removeprefix("tp_"), 0.0), r["bytes"]) for r in calls)
    device = result.machine.gpus[first].device
    scale = measured_scale(bundle.workload, device, cfg.mesh.micro_batch, sharing=cfg.ranks)
    return {"tp_calls": len(calls), "tp_gloo_s": gloo_s, "host_scale": scale, "fsdp_calls": len(fsdp),
            "fsdp_s": sum(r["duration_s"] for r in fsdp)}


def single_allocator_peak(cfg) -> float:
    """MiB: one process training ``cfg``'s model at its batch, the CPU allocator peak of its third step
    (`mesh.AllocatorPeak`, as the mesh rows measure it), on one thread: the single row's memory in the
    mesh rows' measure."""
    import torch

    from trainsim.calibrate import zoo
    from trainsim.calibrate.execute.mesh import AllocatorPeak, persistent_bytes
    from trainsim.calibrate.execute.strategies import make_optimizer

    torch.set_num_threads(1)
    torch.manual_seed(cfg.seed)
    model = zoo.build_model(cfg.model, **cfg.model_cfg)
    optimizer = make_optimizer(cfg.optimizer, model.parameters(), cfg.lr)
    x, y = zoo.example_batch(cfg.model, cfg.batch_size, **cfg.model_cfg)

    def step():
        zoo.loss_fn(cfg.model, model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    step()
    probe = AllocatorPeak()
    persistent = persistent_bytes(model, optimizer)
    probe.start()
    step()
    probe.stop(persistent)
    return probe.peak / 2**20


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calibration", help="a bundle that calibrated llama-tiny on this box")
    parser.add_argument("--calibrate", metavar="DIR", help="calibrate llama-tiny into DIR first")
    parser.add_argument("--scenario", default="validate-cpu", choices=sorted(VARIANTS))
    parser.add_argument("--variants", help="comma-separated (default: the scenario's llama-tiny rows)")
    args = parser.parse_args(argv)
    from trainsim.calibrate.execute.config import exec_config_from_scenario
    from trainsim.calibrate.validate.run import predict, validate

    scenario = str(ROOT / "scenarios" / f"{args.scenario}.yaml")
    device = "cpu" if args.scenario == "validate-cpu" else "cuda"
    calibration = args.calibration
    if args.calibrate:
        calibrate(args.calibrate, device)
        calibration = args.calibrate
    if not calibration:
        sys.exit("give --calibration DIR or --calibrate DIR")
    names = args.variants.split(",") if args.variants else VARIANTS[args.scenario]
    result = validate(scenario, calibration, names, progress=lambda text: print(text, flush=True))
    print(f"\n{'variant':28s} {'pred ms':>8s} {'meas ms':>8s} {'err %':>7s}  {'pred compute/comm ms':>20s}  "
          f"{'meas fwd/bwd/opt ms':>20s}  {'pred MiB':>8s} {'meas MiB':>8s} {'err %':>6s}")
    for row in result.rows:
        if row.predicted_s is None or row.measured_s is None:
            print(f"{row.variant:28s} {row.status}: {row.reason}")
            continue
        p, m = row.predicted_breakdown_s, row.measured_breakdown_s
        pred = f"{p.get('compute', 0) * 1e3:.0f}/{p.get('exposed_communication', 0) * 1e3:.0f}"
        meas = "/".join(f"{m.get(k, 0) * 1e3:.0f}" for k in ("forward", "backward", "optimizer"))
        mem = ""
        if row.memory_error_pct is not None:
            mib = (row.predicted_peak_memory_bytes / 2**20, row.measured_peak_memory_bytes / 2**20)
            mem = f"{mib[0]:8.1f} {mib[1]:8.1f} {row.memory_error_pct:+6.1f}"
        times = f"{row.predicted_s * 1e3:8.1f} {row.measured_s * 1e3:8.1f} {row.error_pct:+7.1f}"
        print(f"{row.variant:28s} {times}  {pred:>20s}  {meas:>20s}  {mem}")
    if device != "cpu":
        return
    single = next((row for row in result.rows if row.strategy == "single"), None)
    if single is not None and single.predicted_peak_memory_bytes:
        mib = single_allocator_peak(exec_config_from_scenario(scenario, single.variant))
        predicted = single.predicted_peak_memory_bytes / 2**20
        error = (predicted / mib - 1) * 100
        at_peak = predict(scenario, single.variant, calibration).gpus[0].memory_at_peak
        transient = {k: at_peak.get(k, 0.0) / 2**20 for k in ("output", "activation_grads")}
        print(f"\n{single.variant}: peak memory predicted {predicted:.1f} MiB (strategy single's memory "
              f"model, with the logits {transient['output']:.1f} MiB and the activation gradients "
              f"{transient['activation_grads']:.1f} MiB in flight at the start of backward; the mesh "
              f"strategy holds the gradients, not the logits), cpu.allocator_peak of one process {mib:.1f} MiB ({error:+.1f} %)")
    print("\nwhat the mesh strategy's prediction carries for CPU ranks:")
    for row in result.rows:
        cfg = exec_config_from_scenario(scenario, row.variant)
        if cfg.strategy != "mesh" or row.predicted_s is None:
            continue
        out = left_out(scenario, row.variant, calibration, cfg)
        compute = row.predicted_breakdown_s.get("compute", 0.0)
        line = (f"{row.variant:28s} host scale on layer times x{out['host_scale']:.2f} (in the compute, "
                f"{compute * 1e3:.0f} ms)")
        if out["tp_calls"]:
            gloo_ms = out["tp_gloo_s"] * 1e3
            line += f"; {out['tp_calls']} TP collectives, gloo's per-call cost of them {gloo_ms:.0f} ms"
        if out["fsdp_calls"]:
            exposed = row.predicted_breakdown_s.get("exposed_communication", 0.0)
            line += (f"; {out['fsdp_calls']} FSDP collectives take {out['fsdp_s'] * 1e3:.0f} ms, "
                     f"{exposed * 1e3:.0f} ms exposed")
        print(line)


if __name__ == "__main__":
    main()
