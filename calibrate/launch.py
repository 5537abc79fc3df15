"""Run a function on N local ranks the way ``torchrun`` does, and bring their results back.

Each rank is a fresh interpreter (as torchrun starts them: no forked CUDA or OpenMP state, and the caller's
``__main__`` is never re-imported) with the environment torchrun would
give it — MASTER_ADDR=127.0.0.1, a free MASTER_PORT, RANK, LOCAL_RANK, WORLD_SIZE — and an initialised
``torch.distributed`` process group: NCCL with one GPU per rank on CUDA, gloo on CPU ranks. CPU ranks are
pinned to their own cores (``os.sched_setaffinity``) with ``torch.set_num_threads`` of their share, so N
ranks on an N-core box are N independent devices rather than N thread pools fighting for the same cores.

glibc's allocator is told to keep freed memory (`ALLOCATOR_ENV`, unless the caller's environment sets it),
so a warmed-up training step takes no page faults whatever ran before it, and the calibration's rank step
and the runs it predicts see the same step (docs/gloo-on-a-small-vm.md).

``fn(ctx, *args)`` must be importable at module level (it is pickled by name) and returns something
picklable. A rank that raises, dies or overruns the timeout fails the whole run with one line naming the
rank; the other ranks are terminated. Results come back as pickles in a private temporary folder. The
executor reuses this launcher, so nothing here is specific to benchmarks.
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainsim.errors import TrainsimError


@dataclass(frozen=True)
class RankContext:
    """What a rank knows about itself; passed as the first argument of the launched function."""

    rank: int
    world_size: int
    local_rank: int
    backend: str  # "gloo" or "nccl"
    device: str  # "cpu" or "cuda:<i>"
    threads: int  # torch intra-op threads of this rank
    cores: tuple[int, ...]  # CPU cores this rank is pinned to (empty: not pinned)


def free_port() -> int:
    """A TCP port that is free on the loopback interface right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


#: glibc malloc: large blocks from the heap, not a fresh mapping each (its maximum threshold: 32 MiB on
#: 64-bit), and the heap's top kept rather than trimmed back to the system after every step
ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 * 2**20), "MALLOC_TRIM_THRESHOLD_": str(2**30)}


def plan_cores(nranks: int, available: list[int] | None = None, *,
               per_rank: int | None = None) -> list[tuple[int, ...]]:
    """Split this process's cores into ``nranks`` disjoint sets (round-robin when oversubscribed);
    ``per_rank`` cores each when given and they fit (the rest stay free), else an equal share of all."""
    cores = sorted(available if available is not None else os.sched_getaffinity(0))
    if nranks <= len(cores):
        share = len(cores) // nranks
        if per_rank is not None and 1 <= per_rank <= share:
            share = per_rank
        return [tuple(cores[r * share : (r + 1) * share]) for r in range(nranks)]
    return [(cores[r % len(cores)],) for r in range(nranks)]


def _rank_main() -> None:
    """Body of one rank process (``python -c``): read the payload, set up like torchrun, run, report."""
    workdir = os.environ["TRAINSIM_LAUNCH_DIR"]
    rank = int(os.environ["RANK"])
    out_path = os.path.join(workdir, f"rank{rank}.result")
    try:
        with open(os.path.join(workdir, "payload.pkl"), "rb") as fh:
            fn, args, contexts, timeout_s = pickle.load(fh)
        ctx = contexts[rank]
        if ctx.cores:
            os.sched_setaffinity(0, ctx.cores)
        import datetime

        import torch
        import torch.distributed as dist

        torch.set_num_threads(ctx.threads)
        if ctx.device.startswith("cuda"):
            torch.cuda.set_device(ctx.local_rank)
        dist.init_process_group(
            ctx.backend,
            rank=ctx.rank,
            world_size=ctx.world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        try:
            outcome = (True, fn(ctx, *args))
        finally:
            dist.destroy_process_group()
    except BaseException as exc:  # report anything, including KeyboardInterrupt, then exit non-zero
        last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
        where = f" (at {os.path.basename(last[0].filename)}:{last[0].lineno})" if last else ""
        text = str(exc).strip()
        outcome = (False, f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}{where}")
    tmp = out_path + ".tmp"
    with open(tmp, "wb") as fh:
        pickle.dump(outcome, fh)
    os.replace(tmp, out_path)
    if not outcome[0]:
        sys.exit(1)


def launch(
    fn: Callable[..., Any],
    nranks: int,
    *,
    args: tuple = (),
    device: str = "cpu",
    timeout_s: float = 600.0,
    threads_per_rank: int | None = None,
    pin: bool = True,
    cores_per_rank: int | None = None,
    env: dict[str, str] | None = None,
) -> list[Any]:
    """Run ``fn(ctx, *args)`` on ``nranks`` ranks; return the per-rank results ordered by rank.

    device: "cpu" (gloo, ranks pinned to cores) or "cuda" (NCCL, rank i on GPU i). ``env``: extra
    environment for every rank (e.g. NCCL_ALGO / NCCL_PROTO, read when NCCL starts).
    Raises TrainsimError (one line) when a rank fails, dies or the run exceeds ``timeout_s``.
    """
    if nranks < 1:
        raise TrainsimError(f"need at least 1 rank, got {nranks}", field="ranks")
    if device not in ("cpu", "cuda"):
        raise TrainsimError(f"unknown device {device!r}; valid choices: cpu, cuda", field="device")
    backend = "nccl" if device == "cuda" else "gloo"
    core_sets = plan_cores(nranks, per_rank=cores_per_rank) if pin else [()] * nranks
    if threads_per_rank is None:
        cores = len(core_sets[0]) if pin else len(os.sched_getaffinity(0)) // nranks
        threads_per_rank = max(1, cores)
    contexts = [
        RankContext(
            rank=r,
            world_size=nranks,
            local_rank=r,
            backend=backend,
            device=f"cuda:{r}" if device == "cuda" else "cpu",
            threads=threads_per_rank,
            cores=tuple(core_sets[r]),
        )
        for r in range(nranks)
    ]
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="trainsim-launch-") as workdir:
        try:
            payload = pickle.dumps((fn, args, contexts, timeout_s))
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            raise TrainsimError(f"cannot send {fn!r} to the ranks: {exc}") from None
        with open(os.path.join(workdir, "payload.pkl"), "wb") as fh:
            fh.write(payload)
        procs = []
        extra_env = dict(env or {})
        try:
            for ctx in contexts:
                env = dict(
                    {**ALLOCATOR_ENV, **os.environ},
                    MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(port),
                    RANK=str(ctx.rank),
                    LOCAL_RANK=str(ctx.local_rank),
                    WORLD_SIZE=str(nranks),
                    OMP_NUM_THREADS=str(ctx.threads),
                    TRAINSIM_LAUNCH_DIR=workdir,
                    **extra_env,
                )
                if device == "cpu":
                    # CPU ranks see no GPU: torch's PowerSGD hook synchronizes "the" CUDA device whenever
                    # one is visible, and fails on the CPU tensors of a gloo rank
                    env["CUDA_VISIBLE_DEVICES"] = ""
                with open(os.path.join(workdir, f"rank{ctx.rank}.stderr"), "wb") as log:
                    procs.append(
                        subprocess.Popen(
                            [sys.executable, "-c", _CHILD],
                            env=env,
                            stdin=subprocess.DEVNULL,
                            stdout=log,
                            stderr=log,
                        )
                    )
            _wait(procs, workdir, timeout_s)
            return [_read_result(workdir, r)[1] for r in range(nranks)]
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)


_CHILD = "from trainsim.calibrate.launch import _rank_main; _rank_main()"


def _read_result(workdir: str, rank: int):
    path = os.path.join(workdir, f"rank{rank}.result")
    if not os.path.exists(path):
        return None
    with open(path, "rb") as fh:
        return pickle.load(fh)


def _last_line(workdir: str, rank: int) -> str:
    try:
        with open(os.path.join(workdir, f"rank{rank}.stderr"), errors="replace") as fh:
            lines = [line.strip() for line in fh if line.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def _wait(procs, workdir: str, timeout_s: float) -> None:
    """Wait for every rank; fail fast with one line on the first rank that fails or dies."""
    deadline = time.monotonic() + timeout_s
    while True:
        running = 0
        for rank, proc in enumerate(procs):
            code = proc.poll()
            if code is None:
                running += 1
                continue
            result = _read_result(workdir, rank)
            if result is not None and not result[0]:
                raise TrainsimError(f"rank {rank} failed: {result[1]}")
            if result is None:
                detail = _last_line(workdir, rank)
                suffix = f": {detail}" if detail else ""
                raise TrainsimError(f"rank {rank} died (exit code {code}){suffix}")
        if running == 0:
            return
        if time.monotonic() > deadline:
            raise TrainsimError(f"{running} of {len(procs)} ranks did not finish within {timeout_s:g} s")
        time.sleep(0.02)


def all_reduce_check(ctx: RankContext) -> float:
    """A health check of a launch: all-reduce each rank's id; every rank returns sum(range(world))."""
    import torch
    import torch.distributed as dist

    tensor = torch.tensor([float(ctx.rank)], device=ctx.device)
    dist.all_reduce(tensor)
    return float(tensor.item())
