"""`describe`: per-layer bytes and FLOPs read off torch, checked by hand and against the built-ins."""

import functools
import json

import pytest

torch = pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from trainsim.calibrate.measure.describe import describe, describe_layers, parse_overrides  # noqa: E402
from trainsim.cli import app  # noqa: E402
from trainsim.errors import TrainsimError  # noqa: E402
from trainsim.formats.workload import load_workload  # noqa: E402
from trainsim.sim.compute.analytic_models import BUILTINS, build_analytic  # noqa: E402

F32, I64 = 4, 8
SMALL_GPT = dict(n_layer=2, n_head=2, n_embd=16, vocab_size=50, block_size=8)


@functools.cache
def _describe(name, **cfg):
    # describe() is deterministic; cache it so full-size models are described once per test session
    return describe(name, **cfg)


def _by_name(workload):
    return {layer.name: layer for layer in workload.layers}


def test_tiny_cnn_saved_bytes_by_hand():
    layers = _by_name(_describe("tiny-cnn"))
    assert layers["conv1"].saved_activation_bytes_per_sample == 3 * 32 * 32 * F32  # the image
    assert layers["relu1"].saved_activation_bytes_per_sample == 16 * 32 * 32 * F32  # its output
    # maxpool's input is relu1's output, already saved: only the int64 indices are new
    assert layers["pool1"].saved_activation_bytes_per_sample == 16 * 16 * 16 * I64
    assert layers["conv2"].saved_activation_bytes_per_sample == 16 * 16 * 16 * F32
    # flatten is a view; the loss keeps the log-softmax of the 10 logits and the int64 target
    assert layers["fc"].saved_activation_bytes_per_sample == 32 * 8 * 8 * F32 + 10 * F32 + 8
    assert layers["pool2"].output_bytes_per_sample == 32 * 8 * 8 * F32


def test_tiny_cnn_flops_by_hand():
    layers = _by_name(_describe("tiny-cnn"))
    conv1 = 2 * 16 * 3 * 3 * 3 * 32 * 32  # a multiply-add is 2 FLOPs
    assert layers["conv1"].flops_forward_per_sample == conv1
    assert layers["conv1"].flops_backward_per_sample == conv1  # the image needs no gradient
    conv2 = 2 * 32 * 16 * 3 * 3 * 16 * 16
    assert layers["conv2"].flops_backward_per_sample == 2 * conv2
    assert layers["relu1"].flops_forward_per_sample == 0
    assert layers["conv2"].spatial.in_h == 16 and layers["conv2"].spatial.out_c == 32


def test_resnet18_saved_bytes_by_hand():
    layers = _by_name(_describe("resnet18"))
    assert layers["conv1"].saved_activation_bytes_per_sample == 3 * 224 * 224 * F32
    bn1 = layers["bn1"]
    assert bn1.saved_activation_bytes_per_sample == 64 * 112 * 112 * F32
    # save_mean, save_invstd and the running mean/var buffers, once per batch
    assert bn1.saved_activation_bytes_fixed == 4 * 64 * F32
    assert layers["maxpool"].saved_activation_bytes_per_sample == 64 * 56 * 56 * I64
    # maxpool keeps its input and indices, not its output: the first block's conv saves that
    assert layers["layer1.0.conv1"].saved_activation_bytes_per_sample == 64 * 56 * 56 * F32
    # layer2.0's input is layer1.1.relu2's output, which that relu already saved
    assert layers["layer1.1.relu2"].saved_activation_bytes_per_sample == 64 * 56 * 56 * F32
    assert layers["layer2.0.conv1"].saved_activation_bytes_per_sample == 0
    assert layers["layer2.0.downsample.0"].saved_activation_bytes_per_sample == 0
    assert layers["avgpool"].saved_activation_bytes_per_sample == 0  # 1x1 output: the `mean` path
    assert layers["fc"].param_bytes == (512 * 1000 + 1000) * F32


def test_gpt_tied_head_attention_and_fixed_bytes():
    t, c, heads = SMALL_GPT["block_size"], SMALL_GPT["n_embd"], SMALL_GPT["n_head"]
    layers = _by_name(_describe("gpt2-small", **SMALL_GPT))
    assert layers["lm_head"].param_bytes == 0
    assert layers["lm_head"].shared_param_bytes == layers["wte"].param_bytes == 50 * c * F32
    core = layers["h.0.attn.core"]
    assert core.saved_activation_bytes_per_sample == (3 * t * c + heads * t * t) * F32  # q, k, v, softmax
    assert core.saved_activation_bytes_fixed == t * t  # the bool causal mask
    assert layers["wte"].saved_activation_bytes_per_sample == t * I64
    assert layers["wpe"].saved_activation_bytes_fixed == t * I64  # positions: once per batch
    assert layers["wpe"].output_bytes_per_sample == 0


def test_meta_and_cpu_agree():
    for name, cfg in (("tiny-cnn", {}), ("gpt2-small", SMALL_GPT)):
        assert describe_layers(name, "meta", **cfg) == describe_layers(name, "cpu", **cfg)


def _assert_same_layers(ours, theirs, label):
    assert [layer.name for layer in ours.layers] == [layer.name for layer in theirs.layers], label
    for a, b in zip(ours.layers, theirs.layers, strict=True):
        for field in ("kind", "param_bytes", "shared_param_bytes", "saved_activation_bytes_per_sample",
                      "saved_activation_bytes_fixed", "saved_packed_bytes_per_sample",
                      "saved_packed_bytes_fixed", "output_bytes_per_sample", "flops_forward_per_sample",
                      "flops_backward_per_sample", "memory_bytes_forward_per_sample",
                      "memory_bytes_backward_per_sample", "spatial"):
            assert getattr(a, field) == getattr(b, field), f"{label}: {a.name}.{field}"
    assert ours.input == theirs.input, label


SMALL = {"gpt2-small": SMALL_GPT, "tiny-cnn": {"image_size": 16, "num_classes": 7}}
#: the executor's data pipeline hands images over as normalised float32 (the built-ins default to uint8)
EXECUTOR_INPUT = {"input_dtype": "float32"}


def _analytic_as_executed(name, **cfg):
    return build_analytic(name, **cfg, **({} if name == "gpt2-small" else EXECUTOR_INPUT))


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_describe_matches_the_analytic_generator_at_a_small_size(name):
    cfg = SMALL.get(name, {"image_size": 64, "num_classes": 10})
    _assert_same_layers(_describe(name, **cfg), _analytic_as_executed(name, **cfg), f"{name} {cfg}")


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_describe_matches_the_shipped_builtin_workload(name):
    shipped = load_workload(name)
    # the shipped built-ins take images as uint8; the executor, as its pipeline hands them over
    executed = shipped.model_copy(update={"input": _analytic_as_executed(name).input})
    _assert_same_layers(_describe(name), executed, name)


def test_published_flops_totals():
    # forward GMACs at 224x224 (torchvision's model docs: 0.71 / 15.47 / 4.09 / 1.50)
    for name, gmacs in (("alexnet", 0.71), ("vgg16", 15.47), ("resnet50", 4.09), ("googlenet", 1.50)):
        flops = _describe(name).flops_forward_per_sample
        assert flops / 2e9 == pytest.approx(gmacs, rel=0.02), name


def test_too_small_image_is_one_clear_error():
    with pytest.raises(TrainsimError, match="image_size=8"):
        describe("alexnet", image_size=8)


def test_parse_overrides():
    assert parse_overrides(["image_size=32", "dropout=0.1"]) == {"image_size": 32, "dropout": 0.1}
    with pytest.raises(TrainsimError):
        parse_overrides(["image_size"])
    with pytest.raises(TrainsimError):
        parse_overrides(["image_size=big"])


runner = CliRunner()


def test_cli_describe_writes_a_loadable_workload(tmp_path):
    out = tmp_path / "tiny.json"
    result = runner.invoke(app, ["calibrate", "describe", "tiny-cnn", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["params"] == 25578 and len(summary["per_layer"]) == 7
    assert load_workload(str(out)) == _describe("tiny-cnn")


def test_cli_describe_table_and_options():
    result = runner.invoke(app, ["calibrate", "describe", "resnet18", "--set", "image_size=32"])
    assert result.exit_code == 0, result.output
    assert "layer4.1.relu2" in result.output and "11689512" in result.output


@pytest.mark.parametrize("args, message", [
    (["calibrate", "describe", "resnet51"], "unknown model 'resnet51'"),
    (["calibrate", "describe", "alexnet", "--set", "depth=3"], "depth"),
    (["calibrate", "describe", "alexnet", "--set", "image_size=8"], "image_size=8"),
])
def test_cli_describe_bad_input_is_one_line(args, message):
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_packed_bytes_count_every_save_and_the_weights():
    # what torch's save_on_cpu copies: each tensor each time it is packed, parameters too
    layers = {layer.name: layer for layer in describe_layers("tiny-cnn")}
    conv1, pool1, fc = layers["conv1"], layers["pool1"], layers["fc"]
    assert (conv1.saved_packed_bytes_per_sample, conv1.saved_packed_bytes_fixed) == (3 * 32 * 32 * F32,
                                                                                    16 * 3 * 3 * 3 * F32)
    # maxpool packs relu1's output again (distinct bytes count it once, at relu1) and its indices
    assert pool1.saved_packed_bytes_per_sample == 16 * 32 * 32 * F32 + 16 * 16 * 16 * I64
    assert pool1.saved_activation_bytes_per_sample == 16 * 16 * 16 * I64
    # the fc packs its input; the loss packs the log-softmax of the 10 logits twice (the log-softmax keeps
    # its output, the NLL its input) and the target
    assert fc.saved_packed_bytes_per_sample == 32 * 8 * 8 * F32 + 2 * 10 * F32 + 8
    assert all(layer.saved_packed_bytes_per_sample >= layer.saved_activation_bytes_per_sample
               for layer in layers.values())


BF16 = 2


@functools.cache
def _autocast(name, precision="bf16", **cfg):
    from trainsim.calibrate.measure.describe import autocast_bytes

    return autocast_bytes(name, "cpu", precision, **cfg)


def test_autocast_does_not_halve_what_it_keeps_in_fp32():
    # GPT-2 under CPU autocast: layer norms read the fp32 residual stream and save it whole, linears save a
    # 16-bit copy of their input, and the loss's log-softmax is fp32 (the executor's loss takes
    # output.float())
    t, c, vocab = SMALL_GPT["block_size"], SMALL_GPT["n_embd"], SMALL_GPT["vocab_size"]
    fp32 = describe_layers("gpt2-small", **SMALL_GPT)
    under = dict(zip([layer.name for layer in fp32], _autocast("gpt2-small", **SMALL_GPT), strict=True))
    layers = {layer.name: layer for layer in fp32}
    ln = layers["h.0.ln_1"]
    assert ln.saved_activation_bytes_per_sample == t * c * F32 + 2 * t * F32  # input, mean and 1/std
    assert under["h.0.ln_1"].saved_per_sample == ln.saved_activation_bytes_per_sample
    assert under["h.0.mlp.c_fc"].saved_per_sample == t * c * BF16
    assert under["h.0.mlp.c_fc"].output_per_sample == t * 4 * c * BF16
    head = under["lm_head"]
    assert head.saved_per_sample == t * c * BF16 + t * vocab * F32 + t * I64  # input, log-softmax, targets
    assert layers["lm_head"].saved_activation_bytes_per_sample == t * c * F32 + t * vocab * F32 + t * I64
    total = sum(a.saved_per_sample for a in under.values())
    assert 0.5 * sum(layer.saved_activation_bytes_per_sample for layer in fp32) < total


def test_autocast_weight_copies_are_packed_not_saved():
    # autocast's 16-bit copy of a weight is what the simulator calls 16-bit weights: not an activation, but
    # save_on_cpu copies it with the rest (once per call: fixed bytes)
    c = SMALL_GPT["n_embd"]
    fp32 = {layer.name: layer for layer in describe_layers("gpt2-small", **SMALL_GPT)}
    under = dict(zip(fp32, _autocast("gpt2-small", **SMALL_GPT), strict=True))
    fc = under["h.0.mlp.c_fc"]
    assert fc.saved_fixed == 0
    assert fc.packed_fixed == c * 4 * c * BF16
    assert fp32["h.0.mlp.c_fc"].saved_packed_bytes_fixed == c * 4 * c * F32
    # and counted apart, once: the tied head's copy of the token embedding belongs to the head
    assert fc.weight_copies == c * 4 * c * BF16
    assert under["lm_head"].weight_copies == SMALL_GPT["vocab_size"] * c * BF16
    assert under["wte"].weight_copies == under["h.0.ln_1"].weight_copies == 0


#: the big CNNs take seconds each at 64 px on the CPU; resnet18 and the others stay in the everyday tier
SLOW_AUTOCAST = {"alexnet", "googlenet", "resnet50", "vgg16"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_AUTOCAST else n
                                  for n in sorted(BUILTINS)])
def test_the_analytic_bytes_under_autocast_are_cuda_autocasts(name):
    # real steps on the CPU under autocast, with CUDA's fp32 ops (layer norm, softmax) emulated, keep exactly
    # what the analytic generator derives from CUDA autocast's op lists, layer by layer
    from trainsim.calibrate.measure.describe import autocast_bytes

    cfg = SMALL.get(name, {"image_size": 64, "num_classes": 10})
    measured = autocast_bytes(name, "cpu", "bf16", cuda_policy=True, **cfg)
    analytic = build_analytic(name, **cfg)
    for layer, under in zip(analytic.layers, measured, strict=True):
        assert layer.autocast == under, f"{name}: {layer.name}"


def test_cpu_and_cuda_autocast_differ_only_where_cuda_runs_fp32():
    # CPU autocast runs softmax in its input's type, CUDA's in fp32. Layer norms read GPT-2's fp32 residual
    # stream and the loss reads output.float(), so they are fp32 either way: only the attention cores differ
    cpu = dict(zip([layer.name for layer in describe_layers("gpt2-small", **SMALL_GPT)],
                   _autocast("gpt2-small", **SMALL_GPT), strict=True))
    from trainsim.calibrate.measure.describe import autocast_bytes

    cuda = dict(zip(cpu, autocast_bytes("gpt2-small", "cpu", "bf16", cuda_policy=True, **SMALL_GPT),
                    strict=True))
    t, heads = SMALL_GPT["block_size"], SMALL_GPT["n_head"]
    assert {name for name in cpu if cpu[name] != cuda[name]} == {"h.0.attn.core", "h.1.attn.core"}
    # the softmax output: 16-bit on the CPU, which the second matmul reuses; fp32 on CUDA, and the second
    # matmul keeps its own 16-bit copy of it
    scores = heads * t * t
    assert cuda["h.0.attn.core"].saved_per_sample - cpu["h.0.attn.core"].saved_per_sample == scores * F32


def test_autocast_bytes_need_a_real_device_and_a_16_bit_precision():
    from trainsim.calibrate.measure.describe import autocast_bytes

    with pytest.raises(TrainsimError, match="real device"):
        autocast_bytes("tiny-cnn", "meta", "bf16")
    with pytest.raises(TrainsimError, match="valid choices: bf16, fp16"):
        autocast_bytes("tiny-cnn", "cpu", "fp8")
