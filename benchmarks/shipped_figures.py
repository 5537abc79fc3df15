"""What `trainsim simulate --json` gives for every shipped scenario and each of its variants, as one JSON
file, and a comparison of two such files: the check that a refactor leaves every figure where it was.

    python benchmarks/shipped_figures.py --write before.json      # on the old code
    python benchmarks/shipped_figures.py --check before.json      # on the new code: prints every difference

Wall-clock figures (``stats.wall_s``) and provenance are left out: they differ between two runs of the same
code. A scenario that needs a calibration bundle (topology ``calibrated``) is recorded with its error line,
which must stay the same too, and again on a bundle kept in the repository (`BUNDLES`).
``--only SUBSTRING`` limits the run to scenario names containing it; ``--skip SUBSTRING`` leaves those out
(the 384-GPU AxoNN Summit run alone takes minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from importlib import resources
from pathlib import Path


def shipped() -> list[str]:
    """Every YAML scenario under trainsim's scenarios folder (papers/ included, sweeps/ excluded)."""
    root = resources.files("trainsim.scenarios")
    names = []
    for entry in sorted(root.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            names.append(entry.name.removesuffix(".yaml"))
    papers = root / "papers"
    for entry in sorted(papers.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            names.append(f"papers/{entry.name}")
    return names


ROOT = Path(__file__).resolve().parent.parent
#: scenarios whose topology is a calibration bundle's, run again on a bundle kept in the repository
BUNDLES = {"validate-cpu": ROOT / "tests" / "data" / "bundle-cpu-2rank",
           "validate-gpu": ROOT / "benchmarks" / "data" / "h200-run3" / "validate-gpu" / "calibration-0"}


def figures(name: str, variant: str | None, calibration: Path | None = None) -> dict:
    from trainsim import api
    from trainsim.errors import TrainsimError

    try:
        result = api.simulate(name, variant=variant, record=False, calibration=calibration)
    except TrainsimError as exc:
        return {"error": str(exc)}
    doc = json.loads(json.dumps(result.to_dict(), default=str))  # as the file has it (keys as text)
    doc.get("stats", {}).pop("wall_s", None)
    return doc


def collect(only: str | None, skip: str | None = None) -> dict:
    from trainsim.formats.scenario_loader import check_variants

    out = {}
    for name in shipped():
        if (only and only not in name) or (skip and skip in name):
            continue
        variants = check_variants(name) or [None]
        for variant in variants:
            key = name if variant is None else f"{name}[{variant}]"
            start = time.perf_counter()
            out[key] = figures(name, variant)
            if name in BUNDLES:
                out[f"{key} on {BUNDLES[name].relative_to(ROOT)}"] = figures(name, variant, BUNDLES[name])
            print(f"{key}: {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return out


def differences(old, new, path: str = "") -> list[str]:
    """Every place where two JSON documents differ, as 'path: old -> new'."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new), key=str):
            if key not in new:
                out.append(f"{path}.{key}: only before")
            elif key not in old:
                out.append(f"{path}.{key}: only after")
            else:
                out += differences(old[key], new[key], f"{path}.{key}")
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        pairs = enumerate(zip(old, new, strict=True))
        return [d for i, (a, b) in pairs for d in differences(a, b, f"{path}[{i}]")]
    return [] if old == new else [f"{path}: {old!r} -> {new!r}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", metavar="FILE.json")
    group.add_argument("--check", metavar="FILE.json")
    parser.add_argument("--only", metavar="SUBSTRING", help="only scenarios whose name contains it")
    parser.add_argument("--skip", metavar="SUBSTRING", help="leave out scenarios whose name contains it")
    args = parser.parse_args()
    start = time.perf_counter()
    now = collect(args.only, args.skip)
    print(f"{len(now)} runs in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    if args.write:
        Path(args.write).write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
        print(f"wrote {args.write}")
        return 0
    before = json.loads(Path(args.check).read_text())
    before = {k: v for k, v in before.items()
              if (not args.only or args.only in k) and not (args.skip and args.skip in k)}
    diffs = differences(before, now)
    for line in diffs[:200]:
        print(line)
    print(f"{len(now)} runs compared, {len(diffs)} differences")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
