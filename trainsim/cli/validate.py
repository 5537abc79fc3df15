"""`trainsim execute`, `validate` and `quickstart`: scenarios run for real with PyTorch on this box, and set
beside what the simulator predicts for them."""

from __future__ import annotations

import sys

import typer

from .common import (
    app,
    check_outputs,
    distinct_outputs,
    inputs_of_command,
    print_json,
    progress_bar,
    split_variants,
)


@app.command("execute")
def execute_cmd(
    scenario: str = typer.Argument(..., metavar="SCENARIO",
                                   help="A shipped scenario (e.g. validate-cpu) or a YAML file."),
    variants: list[str] = typer.Option([], "--variant", help="Run only this variant (repeatable; "
                                       "default: every variant, or the scenario itself when it has none)."),
    iterations: int | None = typer.Option(None, "--iterations", min=1,
                                          help="Override the measured iterations."),
    warmup: int | None = typer.Option(None, "--warmup", min=0, help="Override the warm-up iterations."),
    out: str | None = typer.Option(None, "--out", metavar="FILE.json", help="Also write the measurements."),
    profile: str | None = typer.Option(None, "--profile", metavar="DIR",
                                       help="Also record a torch.profiler trace of each variant's last "
                                       "warm-up iteration: DIR/VARIANT.rankR.json."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """Run a scenario's variants for real with PyTorch on this box and print what was measured.

    Variants this box cannot run (no CUDA, too few cores or GPUs, ...) are listed as skipped, with why.
    """
    from rich.console import Console

    from trainsim import api
    from trainsim.calibrate.execute.executor import outcome_lines, outcomes_table
    from trainsim.provenance import provenance

    distinct_outputs(("--out", out), ("--profile", profile))
    check_outputs(("--out", out))
    if profile:
        from trainsim.files import check_output_folder

        check_output_folder(profile, "--profile", inputs_of_command())
    overrides = {k: v for k, v in (("iterations", iterations), ("warmup", warmup)) if v is not None}
    with Console(stderr=True).status(f"executing {scenario}") as status:
        done = api.execute(scenario, variants=variants, out=out, profile=profile, progress=status.update,
                           provenance=provenance(scenario=scenario, variants=list(variants), **overrides),
                           **overrides)
    if as_json:
        print_json(done.doc)
        raise typer.Exit(1 if done.failed else 0)
    console = Console()
    console.print(outcomes_table(done.outcomes))
    for line in outcome_lines(done.outcomes):
        console.print(line, soft_wrap=True, markup=False)
    if out:
        console.print(f"measurements written to {out}")
    if done.failed:
        raise typer.Exit(1)


def _print_validation(done, as_json: bool) -> None:
    from rich.console import Console

    from trainsim.calibrate.validate import report
    from trainsim.provenance import provenance

    result, files = done.result, done.files
    if as_json:
        print_json({**result.to_dict(provenance=provenance()), **done.extra,
                    "files": {k: str(v) for k, v in files.items()}})
        return
    console = Console(width=None if sys.stdout.isatty() else 150)  # piped: keep the 11 columns readable
    console.print(report.rich_table(result))
    for line in (report.headline_lines(result) + report.memory_lines(result) + report.reason_lines(result)
                 + result.notes):
        console.print(line, soft_wrap=True, markup=False)
    for what, path in files.items():
        console.print(f"{what} written to {path}", soft_wrap=True, markup=False)


def _with_progress(call, total: int):
    """Run ``call(progress)`` under one rich progress bar on stderr (``progress(text)`` names the variant
    before a colon; each new name advances the bar). Ctrl-C: say where the partial rows are, exit 130."""
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn

    from trainsim.calibrate.measure.runner import CalibrationInterrupted
    from trainsim.calibrate.validate.results import ValidationInterrupted

    bar = progress_bar(TextColumn("{task.description}"), BarColumn(),
                       TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn())
    task = bar.add_task("validate", total=total)
    seen: list[str] = []

    def progress(text: str, advance: bool = True) -> None:
        name = text.split(":", 1)[0]
        if advance and name not in seen:
            if seen:
                bar.advance(task)
            seen.append(name)
        bar.update(task, description=text[:72])

    try:
        with bar:
            return call(progress)
    except (ValidationInterrupted, CalibrationInterrupted) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(130) from None


@app.command("validate")
def validate_cmd(
    scenario: str = typer.Argument(..., metavar="SCENARIO",
                                   help="A shipped scenario (validate-cpu, validate-gpu) or a YAML file."),
    calibration: str = typer.Option(..., "--calibration", metavar="DIR",
                                    help="The calibration bundle of this box (`trainsim calibrate`)."),
    variants: str | None = typer.Option(None, "--variants", metavar="A,B,C",
                                        help="Only these variants (default: all)."),
    baseline: str | None = typer.Option(None, "--baseline", help="Speedups are over this variant "
                                        "(default: the first one run)."),
    iterations: int | None = typer.Option(None, "--iterations", min=1,
                                          help="Override the measured iterations."),
    warmup: int | None = typer.Option(None, "--warmup", min=0, help="Override the warm-up iterations."),
    report_dir: str | None = typer.Option(None, "--report", metavar="DIR",
                                          help="Write report.md, a predicted-vs-measured chart, "
                                               "validation.json and both traces of each variant here."),
    rounds: int = typer.Option(1, "--rounds", min=1,
                               help="Execute every variant this many times, round-robin, and pool the "
                                    "iterations (steadier figures on a shared box)."),
    force: bool = typer.Option(False, "--force", help="Compare even with a bundle from another machine."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """Simulate each variant from the calibration bundle and execute it for real with PyTorch: predicted vs
    measured iteration time, error %, and speedups over the baseline variant (difference in points).

    Variants this box cannot run are listed as skipped, with why; a bundle from another machine is refused
    unless --force."""
    from trainsim import api

    if report_dir:
        from trainsim.files import check_output_folder

        check_output_folder(report_dir, "--report", inputs_of_command())
    names = split_variants(variants)
    runs = len(names) if names else api.variant_count(scenario)
    done = _with_progress(
        lambda progress: api.validate(scenario, calibration, variants=names, baseline=baseline,
                                      iterations=iterations, warmup=warmup, report=report_dir, rounds=rounds,
                                      force=force, progress=progress),
        rounds * runs + rounds - 1)
    _print_validation(done, as_json)


@app.command("quickstart")
def quickstart_cmd(
    out: str = typer.Option("trainsim-quickstart", "--out", "-o", metavar="DIR",
                            help="Folder for the calibration bundle and the report."),
    device: str = typer.Option("auto", "--device", help="cuda, cpu, or auto (cuda when a GPU is visible)."),
    variants: str | None = typer.Option(None, "--variants", metavar="A,B,C",
                                        help="Only these variants of the validation scenario "
                                             "(default: all)."),
    iterations: int | None = typer.Option(None, "--iterations", min=1,
                                          help="Override the measured iterations."),
    warmup: int | None = typer.Option(None, "--warmup", min=0, help="Override the warm-up iterations."),
    resume: bool = typer.Option(False, "--resume", help="Continue the calibration bundle already in --out."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """The main job in one command: calibrate this box quickly, simulate the validation scenario from that
    bundle, execute it for real, print predicted vs measured and write the report (OUT/report/report.md).

    Picks CUDA when present (validate-gpu), else the CPU (validate-cpu: a few minutes on 2 cores)."""
    from trainsim import api

    names = split_variants(variants)
    done = _with_progress(
        lambda progress: api.quickstart(out, device=device, variants=names, iterations=iterations,
                                        warmup=warmup, resume=resume, progress=progress),
        api.quickstart_variant_count(device, names))
    _print_validation(done, as_json)
