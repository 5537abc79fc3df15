"""Where the points run: local processes (the default) or a Ray cluster. Each backend takes
``(key, scenario)`` tasks and yields ``(key, outcome)`` as points finish, in whatever order they finish;
an outcome is `trainsim.sweeps.worker.run_point`'s dict. A point that its worker could not even return
(a worker process killed, a Ray node lost) is yielded as that point's error.

Ray is an optional extra (``pip install 'trainsim[ray]'``). ``connect_ray`` is separate from running so
that a missing Ray or an unreachable address is reported before anything is written.
"""

from __future__ import annotations

import itertools
import os
import signal
import socket
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

from trainsim.errors import TrainsimError
from trainsim.formats.scenario import Scenario

from .worker import failure, run_point

Task = tuple[str, Scenario]

#: how long an address given to --ray may take to accept a connection before it counts as unreachable
CONNECT_TIMEOUT_S = 5.0
LOCAL_RAY = "local"


def default_workers() -> int:
    """The cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def run_local(tasks: Iterable[Task], workers: int) -> Iterator[tuple[str, dict]]:
    """The tasks on ``workers`` processes (in this process, one by one, for 1 or a single task). Tasks are
    taken from ``tasks`` as workers free up (a few ahead), so a lazy iterable is resolved as the run goes."""
    tasks = iter(tasks)
    first = list(itertools.islice(tasks, 2))
    if workers <= 1 or len(first) <= 1:
        for key, scenario in itertools.chain(first, tasks):
            yield key, run_point(scenario)
        return
    import trainsim.resolve  # noqa: F401 - the simulator, imported once here so that forked workers inherit it
    import trainsim.sim.simulation  # noqa: F401

    pool = ProcessPoolExecutor(max_workers=workers, initializer=_ignore_interrupt)
    queued = itertools.chain(first, tasks)
    pending: dict = {}
    try:
        while True:
            for key, scenario in itertools.islice(queued, max(0, 2 * workers - len(pending))):
                pending[pool.submit(run_point, scenario)] = key
            if not pending:
                return
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                key = pending.pop(future)
                try:
                    yield key, future.result()
                except Exception as exc:  # noqa: BLE001 - the worker process died (killed, out of memory)
                    yield key, failure(f"worker process failed: {type(exc).__name__}: {exc}")
    finally:
        pool.shutdown(wait=not pending, cancel_futures=True)
        if pending:  # stopped early (Ctrl-C): end the points still running rather than wait for them
            _terminate_workers(pool)


def _terminate_workers(pool: ProcessPoolExecutor) -> None:
    terminate = getattr(pool, "terminate_workers", None)  # Python 3.14
    if terminate is not None:
        terminate()
        return
    for process in list((pool._processes or {}).values()):  # before 3.14 only the private table has them
        process.terminate()


def _ignore_interrupt() -> None:
    # Ctrl-C reaches the whole process group; the parent stops the sweep, the workers just end with the pool
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def import_ray():
    """The ray module, or a one-line error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise TrainsimError("Ray is not installed; pip install 'trainsim[ray]'", field="--ray") from None
    return ray


def check_ray(address: str) -> None:
    """Refuse ``--ray`` early: Ray not installed, or an address that does not answer (`check_reachable`)."""
    import_ray()
    if address not in (LOCAL_RAY, "auto"):
        check_reachable(address)


def connect_ray(address: str, workers: int | None = None):
    """Ray, started (``local``: a new instance on this machine, ``workers`` CPUs, default all) or connected
    to ``address`` (``HOST:PORT``, ``ray://HOST:PORT``, or ``auto``: the cluster ``ray start`` left on this
    machine)."""
    check_ray(address)
    ray = import_ray()
    local = address == LOCAL_RAY
    try:
        ray.init(address=None if local else address, num_cpus=workers if local else None,
                 include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    except Exception as exc:  # noqa: BLE001 - Ray raises many kinds; each is one line for the user
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise TrainsimError(f"cannot connect to Ray at {address}: {reason[:200]}", field="--ray") from None
    return ray


def check_reachable(address: str) -> None:
    """Refuse an address that does not accept a TCP connection within CONNECT_TIMEOUT_S (ray.init would wait
    minutes for it)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise TrainsimError(f"a Ray address is HOST:PORT, ray://HOST:PORT, auto or local; got {address!r}",
                            field="--ray")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise TrainsimError(f"cannot reach a Ray cluster at {address}: {reason}", field="--ray") from None


def run_ray(ray, tasks: list[Task]) -> Iterator[tuple[str, dict]]:
    """The tasks as Ray tasks (one CPU each) on the cluster ``ray`` is connected to (`connect_ray`); shuts
    Ray down at the end."""
    remote = ray.remote(num_cpus=1, max_retries=1)(run_point)
    pending = {remote.remote(scenario): key for key, scenario in tasks}
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            if len(pending) > 1:  # and whatever else has finished meanwhile
                more, _ = ray.wait([r for r in pending if r != ready[0]], num_returns=len(pending) - 1,
                                   timeout=0)
                ready += more
            for ref in ready:
                key = pending.pop(ref)
                try:
                    yield key, ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - a worker or node lost
                    yield key, failure(f"Ray task failed: {type(exc).__name__}: {exc}")
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
        ray.shutdown()
