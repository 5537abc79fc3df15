"""What a DDP communication hook (fp16, PowerSGD) costs a CPU rank beyond the all-reduce itself, measured.

The simulator's codec charges a hook's passes at roofline rates; on a CPU rank each of the hook's tensor ops
(per matrix: two matmuls, the Gram-Schmidt orthogonalisation, the error feedback, the copies) also costs its
Python-level dispatch, which only a measurement gives.

One pinned rank in a world of one (its all-reduces are local copies) runs the executor's own DDP strategy
twice, plain and with the hook, alternating a few steps of each so that the box's drift falls on both; the
hook's cost is the difference of the median steps. `trainsim validate` measures it per compressed variant and
gives it to the simulator (`Codec.fit_to`).
"""

from __future__ import annotations

import dataclasses
import statistics
import time

from trainsim.calibrate.launch import RankContext, launch


def hook_cost_rank(ctx: RankContext, cfg, rounds: int, steps: int) -> dict[str, list[float]]:
    """What the rank runs: ``rounds`` x ``steps`` steps of the plain and of the hooked DDP model, in turn."""
    import torch

    from trainsim.calibrate import zoo
    from trainsim.calibrate.execute.strategies import DDP, Clock

    device = torch.device("cpu")
    plain = dataclasses.replace(cfg, optimizations=dataclasses.replace(cfg.optimizations,
                                                                       param_compression="none"))
    nets = {}
    for name, config in (("plain", plain), ("hooked", cfg)):
        torch.manual_seed(cfg.seed)
        nets[name] = DDP(ctx, config, zoo.build_model(cfg.model, **cfg.model_cfg), device)
    batch = zoo.example_batch(cfg.model, cfg.local_batch, "cpu", **cfg.model_cfg)
    clock = Clock(device)

    def step(net) -> float:
        clock.start()
        start = time.perf_counter()
        net.step(batch, clock)
        return time.perf_counter() - start

    for net in nets.values():
        for _ in range(3):  # PowerSGD all-reduces plainly for its first 2 iterations
            step(net)
    times: dict[str, list[float]] = {name: [] for name in nets}
    for _ in range(rounds):
        for name, net in nets.items():
            times[name] += [step(net) for _ in range(steps)]
    return times


def measure_hook_cost(cfg, *, rounds: int = 20, steps: int = 3, timeout_s: float = 600.0) -> float | None:
    """Seconds per step the DDP comm hook of ``cfg`` adds on one of its CPU ranks (never under 0: under is
    noise); None when ``cfg`` has no hook or does not run on CPU ranks."""
    if cfg.device != "cpu" or cfg.strategy != "ddp" or cfg.optimizations.param_compression == "none":
        return None
    threads = cfg.cores_per_rank or 1
    times = launch(hook_cost_rank, 1, args=(cfg, rounds, steps), device="cpu", cores_per_rank=threads,
                   threads_per_rank=threads, timeout_s=timeout_s)[0]
    return max(0.0, statistics.median(times["hooked"]) - statistics.median(times["plain"]))
