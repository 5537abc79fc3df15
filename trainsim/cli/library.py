"""`trainsim workload` and `trainsim device`: the per-layer workloads and the GPU device specs."""

from __future__ import annotations

import typer

from trainsim.formats.scenario_options import DEFAULT_COMPUTE_MODEL

from .common import app, check_outputs, make_app, options_named, print_json

workload_app = make_app(help="Per-layer workloads: list the built-ins, show or generate one, time one.")
app.add_typer(workload_app, name="workload")
device_app = make_app(help="GPU device specs (peak FLOP/s, memory bandwidth and size) used by the roofline.")
app.add_typer(device_app, name="device")


@workload_app.command("list")
def workload_list(as_json: bool = typer.Option(False, "--json", help="Print JSON.")):
    """List the built-in workloads with their parameters and forward GFLOPs per sample."""
    from trainsim import api

    rows = api.workloads()
    if as_json:
        print_json([row["name"] for row in rows])
        return
    width = max((len(row["name"]) for row in rows), default=12)
    for row in rows:
        typer.echo(f"{row['name']:<{width}} {row['layers']:4d} layers {row['params'] / 1e6:9.2f} M params "
                   f"{row['gflops_forward_per_sample']:9.3f} GFLOP/sample fwd")


@workload_app.command("show")
def workload_show(
    workload: str = typer.Argument(..., help="A built-in name (`trainsim workload list`) or a JSON file."),
    layers: bool = typer.Option(False, "--layers", help="Also list every layer."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (the summary; with --layers the file)."),
):
    """Headline figures of a workload: parameters, FLOPs, saved activations, where its times come from."""
    from trainsim import api

    wl = api.workload(workload)
    if as_json:
        print_json(wl.to_json_dict() if layers else wl.summary())
        return
    for key, value in wl.summary().items():
        typer.echo(f"{key:<34} {value}")
    if layers:
        for layer in wl.layers:
            typer.echo(f"  {layer.name:<36} {layer.kind:<10} params {layer.param_bytes:>11d} B  "
                       f"fwd {layer.flops_forward_per_sample / 1e6:10.2f} MFLOP  "
                       f"saved {layer.saved_activation_bytes_per_sample:>10d} B/sample")


@workload_app.command("generate")
def workload_generate(
    model: str = typer.Argument(..., help="alexnet, vgg16, resnet18, resnet50, googlenet, tiny-cnn, gpt..."),
    options: list[str] = typer.Option([], "--set", metavar="KEY=VALUE",
                                      help="Model option, e.g. image_size=64, num_classes=10, "
                                           "input_dtype=float32, n_layer=24."),
    out: str | None = typer.Option(None, "--out", "-o", help="Write the workload JSON here."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """Generate an analytic workload (shapes, bytes, FLOPs; no torch) from a model's layer arithmetic."""
    from trainsim import api

    check_outputs(("--out", out))
    wl = api.generate_workload(model, options, out=out)
    if as_json:
        print_json(wl.summary() | ({"out": out} if out else {}))
        return
    typer.echo(f"{wl.name}: {wl.num_params:,} params, {wl.flops_forward_per_sample / 1e9:.3f} GFLOP/sample "
               f"forward, {len(wl.layers)} layers" + (f"; written to {out}" if out else ""))


@workload_app.command("times")
def workload_times(
    workload: str = typer.Argument(..., help="A built-in name or a workload JSON file."),
    device: str = typer.Option(..., "--device", "-d", help="Device spec (`trainsim device list`)."),
    batch: int = typer.Option(32, "--batch", "-b", help="Per-device batch size."),
    precision: str = typer.Option("fp32", "--precision", help="fp32, tf32, fp16 or bf16."),
    compute_model: str = typer.Option(DEFAULT_COMPUTE_MODEL, "--compute-model",
                                      help="kernels (the kernel model) or roofline: how times not "
                                           "measured here are estimated."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """Per-layer forward/backward time on a device: measured, retargeted from another device, or estimated
    (roofline or kernel model); per pass the kernel class, what bounds it, the rate it achieves and its
    low-high range."""
    from trainsim import api

    report = api.workload_times(workload, device, batch, precision, compute_model)
    if as_json:
        print_json(report)
        return
    typer.echo(f"  {'layer':<36} {'forward ms (low-high)':>24} {'backward ms (low-high)':>24}  "
               f"{'class':<9} {'bound':<8} {'achieved':>12}  source")
    for layer in report["layers"]:
        cells = [f"{_ms(layer[p]['s'])} ({_ms(layer[p]['low_s']).strip()}-{_ms(layer[p]['high_s']).strip()})"
                 for p in ("forward", "backward")]
        main = max(("forward", "backward"), key=lambda p: layer[p]["s"])
        typer.echo(f"  {layer['name']:<36} {cells[0]:>24} {cells[1]:>24}  {layer[main]['kernel_class']:<9} "
                   f"{layer[main]['bound']:<8} {_rate(layer[main]):>12}  {layer['source']}")
    typer.echo(f"{report['workload']} on {report['device']} ({precision}, batch {batch}, "
               f"{report['compute_model']}): forward {report['forward_s'] * 1e3:.2f} ms "
               f"({report['forward_low_s'] * 1e3:.2f}-{report['forward_high_s'] * 1e3:.2f}), backward "
               f"{report['backward_s'] * 1e3:.2f} ms ({report['backward_low_s'] * 1e3:.2f}-"
               f"{report['backward_high_s'] * 1e3:.2f})")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.3f}"


def _rate(detail: dict) -> str:
    if not detail["achieved"]:
        return "-"
    if detail["achieved_unit"] == "FLOP/s":
        return f"{detail['achieved'] / 1e12:.1f} TFLOP/s"
    return f"{detail['achieved'] / 1e9:.0f} GB/s"


@device_app.command("list")
def device_list(as_json: bool = typer.Option(False, "--json", help="Print JSON.")):
    """List the built-in device specs."""
    from trainsim import api

    specs = api.devices()
    if as_json:
        print_json([spec.to_json_dict() for spec in specs])
        return
    for spec in specs:
        peaks = ", ".join(f"{k} {v / 1e12:g}" for k, v in spec.peak_flops.items())
        typer.echo(f"{spec.name:<10} {spec.memory_bytes / 2**30:5.0f} GiB "
                   f"{spec.memory_bandwidth / 1e9:6.0f} GB/s  TFLOP/s: {peaks}")


@device_app.command("show")
def device_show(
    name: str = typer.Argument(..., metavar="DEVICE",
                               help="A device name or alias, e.g. v100, a100-80gb, h100."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """One device spec, with its source."""
    from trainsim import api

    with options_named({"device": "DEVICE"}):
        record = api.device(name).to_json_dict()
    if as_json:
        print_json(record)
        return
    for key, value in record.items():
        typer.echo(f"{key:<22} {value}")
