"""`trainsim calibrate`: measure this box into a calibration bundle, and its single steps (describe, layers,
profiler). They need torch (the calibrate extra)."""

from __future__ import annotations

import typer

from trainsim.errors import TrainsimError

from .common import app, check_not_input, check_outputs, make_app, print_json

calibrate_app = make_app(help="Measure this box (topology, links, collectives, a model's layers) into a "
                              "bundle: `trainsim calibrate --model NAME [OPTIONS]`. Ctrl-C leaves a usable "
                              "partial bundle; --resume continues it.", invoke_without_command=True)
app.add_typer(calibrate_app, name="calibrate")

_MODEL_SET_HELP = "Model option KEY=VALUE (repeatable): image_size, num_classes; GPT: n_layer, n_head, ..."


@calibrate_app.callback()
def calibrate_run(
    ctx: typer.Context,
    model: str = typer.Option(None, "--model", "-m", help="Model from the zoo, e.g. tiny-cnn, resnet18."),
    device: str = typer.Option("auto", "--device", help="cuda, cpu, or auto (cuda when a GPU is visible)."),
    batch_sizes: str = typer.Option("8,16,32", "--batch-sizes", help="Per-device batch sizes to profile."),
    precisions: str = typer.Option("fp32", "--precisions", help="Measure the layers in each of these too "
                                   "(fp32, bf16, fp16: autocast), e.g. fp32,bf16; a workload file each."),
    ranks: int = typer.Option(None, "--ranks", help="Ranks for collectives (default: GPUs, or CPU cores)."),
    out: str = typer.Option("calibration", "--out", "-o", help="Bundle folder to write."),
    quick: bool = typer.Option(False, "--quick", help="Short sweeps, few repeats (about a minute on CPU)."),
    resume: bool = typer.Option(False, "--resume", help="Skip the steps the bundle in --out already has."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary."),
):
    """Calibrate this machine: `trainsim calibrate --model NAME [...]` writes a calibration bundle
    (topology.yaml, links.json, collectives.json, workload-<model>.json, machine.json, meta.json).
    Ctrl-C leaves a usable partial bundle; --resume continues it."""
    from trainsim import api

    if ctx.invoked_subcommand is not None:
        return
    if model is None:
        raise TrainsimError("give --model NAME (or a subcommand; see --help)", field="--model")
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from trainsim.calibrate.measure.runner import CalibrationInterrupted

    columns = (TextColumn("{task.description}"), BarColumn(),
               TextColumn("{task.completed}/{task.total} steps"), TimeElapsedColumn())
    bar = Progress(*columns, console=Console(stderr=True), transient=as_json)
    task = bar.add_task("calibrate", total=None)

    started = []

    def progress(text: str, done: int, total: int) -> None:
        if not started:  # from the first step on: bad input is one line, with no bar before it
            bar.start()
            started.append(True)
        bar.update(task, description=text[:70], completed=done, total=total)

    try:
        summary = api.calibrate(model, out=out, device=device, ranks=ranks, quick=quick, resume=resume,
                                batch_sizes=batch_sizes, precisions=precisions, progress=progress)
    except CalibrationInterrupted as exc:
        bar.stop()
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(130) from None
    finally:
        if started:
            bar.stop()
    if as_json:
        print_json(summary)
        return
    typer.echo(f"bundle: {summary['path']} ({summary['status']})")
    for step, record in summary["steps"].items():
        typer.echo(f"  {step:<12} {record['seconds']:8.1f} s  {record['headline']}")
    for note in summary["notes"]:
        typer.echo(f"  note: {note}")


def _print_workload(workload, path, as_json: bool, extra: dict | None = None) -> None:
    from trainsim.calibrate.measure.describe import layer_rows

    summary = {**workload.summary(), **(extra or {}), "file": str(path) if path else None}
    if as_json:
        print_json({**summary, "per_layer": layer_rows(workload)})
        return
    for key, value in summary.items():
        typer.echo(f"{key:<34} {value}")
    batch = max(p[0] for p in workload.layers[0].forward.points) if workload.measured else None
    timed = f" {f'fwd ms@{batch}':>11} {f'bwd ms@{batch}':>11}" if batch else ""
    typer.echo(f"{'layer':<28} {'kind':<10} {'params':>11} {'saved KiB':>10} {'out KiB':>9} "
               f"{'GFLOP fwd':>10}{timed}")
    for row in layer_rows(workload):
        times = (f" {row['forward_s'][batch] * 1e3:>11.4f} {row['backward_s'][batch] * 1e3:>11.4f}"
                 if batch else "")
        typer.echo(f"{row['name']:<28} {row['kind']:<10} {row['params']:>11} "
                   f"{row['saved_kib_per_sample']:>10.1f} {row['output_kib_per_sample']:>9.1f} "
                   f"{row['gflops_forward_per_sample']:>10.4f}{times}")


@calibrate_app.command("describe")
def calibrate_describe(
    model: str = typer.Argument(..., help="Model from the zoo: tiny-cnn, alexnet, vgg16, resnet18, resnet50, "
                                          "googlenet, gpt2-small."),
    out: str = typer.Option(None, "--out", "-o", help="Write the trainsim.workload/2 JSON here."),
    settings: list[str] = typer.Option(None, "--set", help=_MODEL_SET_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (summary and one row per layer)."),
):
    """Per-layer shapes, bytes and FLOPs of a zoo model, read off torch (no timing).

    Parameter, saved-activation and output bytes and FLOPs per layer, as a trainsim.workload/2 file; runs
    on torch's meta device, so it takes seconds even for GPT-2."""
    from trainsim import api

    check_outputs(("--out", out))
    workload, path = api.describe_model(model, settings or [], out=out)
    _print_workload(workload, path, as_json)


@calibrate_app.command("layers")
def calibrate_layers(
    model: str = typer.Argument(..., help="Model from the zoo (see `calibrate describe --help`)."),
    device: str = typer.Option("auto", "--device", help="cuda, cuda:N, cpu, or auto."),
    batch_sizes: str = typer.Option("8,16,32", "--batch-sizes", help="Per-device batch sizes, e.g. 8,16,32."),
    repeats: int = typer.Option(10, "--repeats", help="Measured iterations per batch size."),
    warmup: int = typer.Option(3, "--warmup", help="Unmeasured iterations per batch size."),
    optimizer: str = typer.Option("sgd", "--optimizer", help="sgd (momentum 0.9), adam or adamw."),
    threads: int = typer.Option(None, "--threads", help="torch.set_num_threads (default: torch's choice)."),
    precision: str = typer.Option("fp32", "--precision", help="fp32, or bf16/fp16 under autocast."),
    layer_timing: str = typer.Option(
        "clock", "--layer-timing",
        help="clock: between CUDA events (CPU: perf_counter) at each layer's hooks; kernels: the time of the "
             "kernels launched inside them (torch.profiler), so a host-bound iteration's launch gaps are not "
             "counted as layer time."),
    settings: list[str] = typer.Option(None, "--set", help=_MODEL_SET_HELP),
    out: str = typer.Option(None, "--out", "-o", help="Write the measured trainsim.workload/2 JSON here."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (summary and one row per layer)."),
):
    """Measure a zoo model's per-layer forward/backward times at several batch sizes.

    Also the optimizer step, the whole iteration (and the time no layer accounts for) and the input
    preparation: the `layers` step of `trainsim calibrate`, alone."""
    from rich.console import Console

    from trainsim import api

    check_outputs(("--out", out))
    console = Console(stderr=True)
    with console.status("profiling") as status:
        workload, path = api.profile_layers(
            model, device=device, batch_sizes=batch_sizes, repeats=repeats, warmup=warmup,
            optimizer=optimizer, threads=threads, precision=precision, timing=layer_timing,
            settings=settings or [], out=out, progress=status.update)
    for item in workload.provenance.skipped or []:
        console.print(f"note: batch {item.batch} not measured: {item.reason}")
    iteration = workload.provenance.iteration
    extra = {"iteration_s": {p.batch: round(p.s, 6) for p in iteration.plain},
             "unattributed_s": {p.batch: round(p.s, 6) for p in iteration.unattributed},
             "host_dispatch_s": {p.batch: round(p.s, 6) for p in iteration.plain_host}}
    _print_workload(workload, path, as_json, extra)


@calibrate_app.command("kernels")
def calibrate_kernels(
    out: str = typer.Option(..., "--out", "-o", help="Folder to write kernels.csv and provenance.json into."),
    device: str = typer.Option("auto", "--device", help="cuda, cpu, or auto (cuda when a GPU is visible)."),
    dtypes: str = typer.Option("fp32,tf32,bf16,fp8", "--dtypes",
                               help="Precisions: fp32 (TF32 off), tf32, bf16, fp16, fp8 (matrix products "
                                    "only). The CPU times fp32 alone."),
    classes: str = typer.Option("matmul,conv,attention,memory", "--classes",
                                help="Kernel classes: matmul, conv, attention, memory."),
    budget: float = typer.Option(540.0, "--budget", help="Seconds to spend; cases not reached are left out."),
    quick: bool = typer.Option(False, "--quick", help="A few small cases of each class (seconds)."),
    gemm_samples: int = typer.Option(0, "--gemm-samples", help="GEMM shapes drawn log-uniform from 64 to "
                                     "16384 a side, timed beside the named ones (a grid to fit on)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the drawn GEMM shapes."),
    conv_batch: int = typer.Option(64, "--conv-batch", help="Batch of the ResNet-50 convolutions."),
    cudnn_benchmark: bool = typer.Option(False, "--cudnn-benchmark/--no-cudnn-benchmark",
                                         help="cuDNN times its algorithms and takes the fastest (as "
                                              "torch.backends.cudnn.benchmark = True); default: its "
                                              "heuristics' pick, PyTorch's default."),
    timing: str = typer.Option("graph", "--timing",
                               help="graph: calls replayed from a CUDA graph; stream: eager calls queued "
                                    "behind a sleeping kernel, back to back as in a GPU-bound eager step."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
):
    """Time single kernels of every class the kernel model knows on this GPU (or CPU).

    GEMMs from 256 to 16384 on a side and a transformer's linear layers, ResNet-50's convolutions in their
    three passes, fused and unfused attention forward and backward, elementwise, layer-norm and softmax
    kernels; each timed as a CUDA graph of back-to-back calls, with the kernels it launched. Writes a
    trainsim.kernels/1 table that `benchmarks/kernel_model.py --table` judges the kernel model on. Ctrl-C or
    the budget keeps the rows measured so far."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from trainsim import api

    check_not_input(out, "--out")
    bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                   TimeElapsedColumn(), console=Console(stderr=True), transient=as_json)
    task = bar.add_task("kernels", total=None)

    def progress(text: str, done: int, total: int) -> None:
        if not bar.live.is_started:
            bar.start()
        bar.update(task, description=text[:60], completed=done, total=total)

    try:
        summary = api.sweep_kernels(out, device=device, dtypes=dtypes, classes=classes, quick=quick,
                                    budget_s=budget, gemm_samples=gemm_samples, seed=seed,
                                    conv_batch=conv_batch, cudnn_benchmark=cudnn_benchmark,
                                    timing=timing, progress=progress)
    finally:
        bar.stop()
    if as_json:
        print_json(summary)
        return
    typer.echo(f"{summary['rows']} of {summary['cases']} cases timed in {summary['seconds']} s -> "
               f"{summary['table']}")
    if summary["not_reached"]:
        typer.echo(f"  {summary['not_reached']} cases not reached within --budget")
    for failure in summary["failed"]:
        typer.echo(f"  not timed: {failure['case']}: {failure['error']}")


@calibrate_app.command("profiler")
def calibrate_profiler(
    model: str = typer.Argument(..., help="Model from the zoo (see `calibrate describe --help`); one whose "
                                          "step the host's dispatch bounds (small batch) measures best."),
    device: str = typer.Option("auto", "--device", help="cuda, cuda:N, cpu, or auto."),
    batch: int = typer.Option(8, "--batch-size", help="Per-device batch size."),
    repeats: int = typer.Option(20, "--repeats", help="Measured steps without and under the profiler."),
    warmup: int = typer.Option(5, "--warmup", help="Unmeasured steps first."),
    precision: str = typer.Option("fp32", "--precision", help="fp32, or bf16/fp16 under autocast."),
    optimizer: str = typer.Option("sgd", "--optimizer", help="sgd (momentum 0.9), adam or adamw."),
    settings: list[str] = typer.Option(None, "--set", help=_MODEL_SET_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """Measure what torch.profiler costs this box's host per recorded event.

    The figure `trainsim replay --set untraced=true --set profiler_event_us=X` takes out of a trace
    recorded on such a box, so that its what-ifs are for the step as it trains untraced."""
    from rich.console import Console

    from trainsim import api

    with Console(stderr=True).status("measuring") as status:
        cost = api.measure_profiler(model, device=device, batch=batch, repeats=repeats, warmup=warmup,
                                    precision=precision, optimizer=optimizer, settings=settings or [],
                                    progress=status.update)
    if as_json:
        print_json(cost.to_dict())
        return
    typer.echo(f"torch.profiler on {cost.device}: {cost.model}, batch {cost.batch}, {cost.precision}, "
               f"median of {cost.repeats} steps each")
    typer.echo(f"  host per step without the profiler  {cost.untraced_host_s * 1e3:10.3f} ms "
               f"(IQR {cost.untraced_iqr_s * 1e3:.3f})")
    typer.echo(f"  host per step under the profiler    {cost.traced_host_s * 1e3:10.3f} ms "
               f"(IQR {cost.traced_iqr_s * 1e3:.3f})")
    typer.echo(f"  host events recorded per step       {cost.events_per_step:10.0f}")
    typer.echo(f"  cost per recorded event             {cost.per_event_s * 1e6:10.2f} us")
    typer.echo(f"replay a trace of this box as untraced: trainsim replay TRACE --set untraced=true "
               f"--set profiler_event_us={max(cost.per_event_s, 0.0) * 1e6:.2f}")
