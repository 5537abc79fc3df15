"""Speed and memory of `trainsim simulate` at cluster scale (a benchmark, not a test; issue 19).

DDP ResNet-50, batch 256 per GPU, TF32, on DGX-A100 nodes (8 GPUs, 8 HDR NICs each): one node alone (the
shipped ``ddp-resnet50-dgx-a100``), then N/8 nodes on a rail-optimised HDR fabric of radix-64 switches
where two tiers hold it, else on a 3-tier radix-64 fat-tree. Each point runs `trainsim simulate ... --json`
as a user would, in a fresh process: with its table output for one iteration (no warm-up) and for two,
then with ``--json`` for one iteration to read its figures. Printed per GPU count:

- whole process: wall seconds of the one-iteration run (imports, loading, planning, simulating, printing);
- per further iteration: the two-iteration run's wall time minus the one-iteration run's;
- events: the SimPy events of the one iteration (stats.events of the JSON run);
- peak RSS of the one-iteration process (VmHWM of its own address space, Linux), and its CPU seconds
  (from wait4; steadier than wall time on a shared machine);
- the ranks simulated (fewer where machines are mirrored, sim/symmetry.py) and the simulated iteration
  time (so results can be compared before and after a change, and between the two paths).

Each GPU count runs with the scenario's flow-level collectives and with ``strategy.collectives=analytic``
(where DDP mirrors identical machines).

Also the start-up line of the issue: `trainsim simulate ddp-resnet50-dgx-a100` against
``python -c "import numpy, simpy"`` (best of 3 each, after one untimed run of each).

The processes run as an installed package does: with Python's bytecode caches (``PYTHONDONTWRITEBYTECODE``
is dropped from their environment where a machine sets it; with it, every run compiles trainsim's modules
afresh, about 0.1 s that no installed copy pays).

Run: python benchmarks/scale_bench.py                 # 8, 64, 256, 1024 GPUs
     python benchmarks/scale_bench.py --set compute_model=roofline   # another override on every run
     python benchmarks/scale_bench.py --max-gpus 16384 --timeout 300 --collectives analytic
A point that runs past ``--timeout`` seconds is printed as such and the larger ones are skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

GPUS = [8, 64, 256, 1024, 4096, 16384]
PER_NODE = 8
RADIX = 64
RAIL_MAX_NODES = 256  # rail_optimised is 2 tiers: 8 rails x (nodes / 32 per leaf) leaves <= radix 64


def topology(gpus: int) -> str | None:
    """The ``--set topology=...`` value for ``gpus`` GPUs (None: the shipped single node)."""
    nodes = gpus // PER_NODE
    if nodes == 1:
        return None
    common = f"node: dgx-a100, nodes: {nodes}, radix: {RADIX}, network: ib, generation: hdr"
    if nodes <= RAIL_MAX_NODES:
        return f"{{generator: rail_optimised, {common}}}"
    return f"{{generator: fat_tree, tiers: 3, {common}}}"


# Runs `python -m trainsim.cli ARGS` and, at exit, writes the process's peak resident memory (VmHWM of its own
# address space: ru_maxrss would also count the benchmark's memory that the child had before exec) to stderr.
PEAK = ("import atexit, runpy, sys\n"
        "def peak():\n"
        "    line = next(x for x in open('/proc/self/status') if x.startswith('VmHWM'))\n"
        "    sys.stderr.write('PEAK_KB ' + line.split()[1] + '\\n')\n"
        "atexit.register(peak)\n"
        "sys.argv = ['trainsim', *sys.argv[1:]]\n"
        "runpy.run_module('trainsim.cli', run_name='__main__')\n")


# the children's environment: bytecode cached as in any installed copy (see the module docstring)
ENV = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}


def command(gpus: int, iterations: int, collectives: str, as_json: bool = False,
            extra: tuple[str, ...] = ()) -> list[str]:
    args = [sys.executable, "-c", PEAK, "simulate", "ddp-resnet50-dgx-a100",
            *(["--json"] if as_json else []), "--set", f"iterations={iterations}",
            "--set", "warmup_iterations=0",
            "--set", f"batch_size={256 * gpus}", "--set", f"strategy.collectives={collectives}",
            *(a for kv in extra for a in ("--set", kv))]
    topo = topology(gpus)
    if topo:
        args += ["--set", f"topology={topo}"]
    return args


def run(args: list[str], timeout: float) -> dict | None:
    """Wall and CPU seconds, peak RSS bytes and the output (parsed if JSON) of one process; None past
    ``timeout``."""
    t0 = time.perf_counter()
    errors = tempfile.TemporaryFile()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=errors, env=ENV)
    out = bytearray()
    deadline = t0 + timeout
    os.set_blocking(proc.stdout.fileno(), False)
    while True:  # read as it comes (a large JSON would fill the pipe) and watch the clock
        chunk = proc.stdout.read()
        if chunk:
            out += chunk
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            proc.kill()
            os.wait4(proc.pid, 0)
            return None
        time.sleep(0.005)
    wall = time.perf_counter() - t0
    out += proc.stdout.read() or b""
    proc.stdout.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(args)}")
    text = out.decode()
    errors.seek(0)
    lines = errors.read().decode().splitlines()
    peak = [int(line.split()[1]) for line in lines if line.startswith("PEAK_KB")]
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "rss": peak[-1] * 1024 if peak else 0,
            "result": json.loads(text) if "--json" in args else text}


def startup(repeats: int = 3) -> tuple[float, float]:
    """Best-of wall seconds of importing numpy and simpy, and of simulating the shipped 8-GPU scenario."""
    base = [sys.executable, "-c", "import numpy, simpy"]
    sim = [sys.executable, "-m", "trainsim.cli", "simulate", "ddp-resnet50-dgx-a100"]
    run_plain(base), run_plain(sim)  # untimed: the bytecode caches are written
    return (min(run_plain(base) for _ in range(repeats)), min(run_plain(sim) for _ in range(repeats)))


def run_plain(args: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-gpus", type=int, default=1024, help="largest GPU count (of " +
                        ", ".join(map(str, GPUS)) + ")")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per process")
    parser.add_argument("--no-startup", action="store_true", help="skip the start-up comparison")
    parser.add_argument("--collectives", default="flow,analytic",
                        help="collective paths to run, comma-separated (flow: the default of the scenario)")
    parser.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                        help="one more scenario override for every run (e.g. compute_model=roofline)")
    opts = parser.parse_args()
    extra = tuple(opts.extra)

    if not opts.no_startup:
        base, sim = startup()
        print(f"start-up: import numpy, simpy {base:.3f} s; trainsim simulate ddp-resnet50-dgx-a100 "
              f"{sim:.3f} s (+{sim - base:.3f} s)")
    print(f"{'GPUs':>6} {'fabric':<16} {'collectives':<11} {'whole process':>14} {'(CPU)':>8} "
          f"{'per further iter':>17} {'events':>12} {'ranks run':>9} {'peak RSS':>10} "
          f"{'simulated iter':>15}")
    for collectives in opts.collectives.split(","):
        for gpus in (g for g in GPUS if g <= opts.max_gpus):
            fabric = "one node" if gpus == PER_NODE else (
                "rail-optimised" if gpus // PER_NODE <= RAIL_MAX_NODES else "3-tier fat-tree")
            one = run(command(gpus, 1, collectives, extra=extra), opts.timeout)
            two = run(command(gpus, 2, collectives, extra=extra), opts.timeout) if one else None
            figures = (run(command(gpus, 1, collectives, as_json=True, extra=extra), opts.timeout)
                       if two else None)
            if figures is None:
                print(f"{gpus:>6} {fabric:<16} {collectives:<11} past the {opts.timeout:g} s limit; larger "
                      "counts skipped", flush=True)
                break
            stats = figures["result"]["stats"]
            events = stats["events"]
            ranks = stats.get("simulated_ranks", gpus)
            further = two["wall_s"] - one["wall_s"]
            print(f"{gpus:>6} {fabric:<16} {collectives:<11} {one['wall_s']:>12.2f} s {one['cpu_s']:>6.2f} s "
                  f"{further:>15.2f} s {events:>12,} {ranks:>9} {one['rss'] / 2**20:>6.0f} MiB "
                  f"{figures['result']['iteration_time_s'] * 1e3:>12.3f} ms", flush=True)


if __name__ == "__main__":
    main()
