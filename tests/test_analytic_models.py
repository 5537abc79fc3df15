"""The built-in analytic workloads: parameter counts, FLOPs, saved activations, shipped files."""

import math

import pytest

from trainsim.errors import TrainsimError
from trainsim.formats.workload import builtin_dir
from trainsim.sim.compute import analytic_models as am
from trainsim.sim.compute.analytic_models import (
    BUILTINS,
    build_analytic,
    builtin_text,
    generate_builtins,
    parse_options,
)


@pytest.fixture(scope="module")
def workloads():
    return {name: build_analytic(name) for name in BUILTINS}


# Published parameter counts: torchvision's model docs (weights tables, "num_params") and nanoGPT's GPT-2
# small (124M with the lm_head tied to wte); tiny-cnn by hand: 448 + 4640 + 20490.
@pytest.mark.parametrize("name, params", [
    ("alexnet", 61_100_840), ("vgg16", 138_357_544), ("resnet18", 11_689_512), ("resnet50", 25_557_032),
    ("googlenet", 6_624_904), ("gpt2-small", 124_439_808), ("tiny-cnn", 25_578),
])
def test_parameter_counts_are_exact(workloads, name, params):
    assert workloads[name].num_params == params


# Forward multiply-adds per 224x224 image from torchvision's model docs ("GFLOPS" column, which counts
# MACs): AlexNet 0.71, VGG-16 15.47, ResNet-18 1.81, ResNet-50 4.09, GoogLeNet 1.50. FLOPs = 2 x MACs.
@pytest.mark.parametrize("name, gmacs", [
    ("alexnet", 0.71), ("vgg16", 15.47), ("resnet18", 1.81), ("resnet50", 4.09), ("googlenet", 1.50),
])
def test_cnn_forward_flops_match_published(workloads, name, gmacs):
    assert workloads[name].flops_forward_per_sample / 2e9 == pytest.approx(gmacs, rel=0.02)


def test_gpt_flops_follow_the_transformer_formula(workloads):
    # Kaplan et al. 2020 (Scaling Laws, Table 1): forward ~ 2 x (matmul weights) per token plus attention;
    # torch's counter does the full T x T score matrix (QK^T and AV: 2 x 2 x T x C per token per layer).
    wl = workloads["gpt2-small"]
    layers, dim, vocab, seq = 12, 768, 50257, 1024
    matmul_weights = layers * 12 * dim * dim + vocab * dim  # qkv, proj, 2 x MLP (no biases), lm_head
    expected = 2 * matmul_weights * seq + layers * 4 * seq * seq * dim
    assert wl.flops_forward_per_sample == pytest.approx(expected, rel=1e-9)
    assert wl.flops_backward_per_sample == pytest.approx(2 * expected, rel=1e-9)


def test_first_conv_backward_computes_only_the_weight_grad(workloads):
    first = workloads["resnet50"].layers[0]
    second = workloads["resnet50"].layer("layer1.0.conv1")
    assert first.flops_backward_per_sample == first.flops_forward_per_sample
    assert second.flops_backward_per_sample == 2 * second.flops_forward_per_sample


def test_resnet50_naming_and_order(workloads):
    names = [layer.name for layer in workloads["resnet50"].layers]
    assert names[:15] == ["conv1", "bn1", "relu", "maxpool", "layer1.0.conv1", "layer1.0.bn1",
                          "layer1.0.relu1", "layer1.0.conv2", "layer1.0.bn2", "layer1.0.relu2",
                          "layer1.0.conv3", "layer1.0.bn3", "layer1.0.downsample.0", "layer1.0.downsample.1",
                          "layer1.0.relu3"]
    assert names[-2:] == ["avgpool", "fc"]
    assert len(names) == 4 + 16 * 9 + 4 * 2 + 2  # stem, 16 blocks of 9, 4 downsamples of 2, head
    assert sum(name.endswith("downsample.0") for name in names) == 4


def test_googlenet_naming(workloads):
    names = [layer.name for layer in workloads["googlenet"].layers]
    assert names[:4] == ["conv1.conv", "conv1.bn", "conv1.relu", "maxpool1"]
    block = [n.removeprefix("inception3a.") for n in names if n.startswith("inception3a.")]
    assert block[:6] == ["branch1.conv", "branch1.bn", "branch1.relu", "branch2.0.conv", "branch2.0.bn",
                         "branch2.0.relu"]
    assert block[12:14] == ["branch3.1.conv", "branch3.1.bn"]
    assert block[15:17] == ["branch4.0", "branch4.1.conv"]
    assert workloads["googlenet"].layer("inception3a.branch3.1.conv").spatial.kernel_h == 3  # as torchvision
    assert names[-3:] == ["avgpool", "dropout", "fc"]


def test_gpt_naming_and_tied_head(workloads):
    wl = workloads["gpt2-small"]
    names = [layer.name for layer in wl.layers]
    assert names[:3] == ["wte", "wpe", "drop"]
    assert names[3:11] == ["h.0.ln_1", "h.0.attn.c_attn", "h.0.attn.core", "h.0.attn.c_proj", "h.0.ln_2",
                           "h.0.mlp.c_fc", "h.0.mlp.gelu", "h.0.mlp.c_proj"]
    assert names[-2:] == ["ln_f", "lm_head"]
    head = wl.layer("lm_head")
    assert head.param_bytes == 0 and head.shared_param_bytes == 4 * 50257 * 768
    assert wl.input.dtype == "int64" and wl.input.bytes_per_sample == 8 * 1024


def test_tiny_cnn_saved_activations_by_hand(workloads):
    wl = workloads["tiny-cnn"]
    saved = {layer.name: layer.saved_activation_bytes_per_sample for layer in wl.layers}
    assert saved["conv1"] == 3 * 32 * 32 * 4  # the float image
    assert saved["relu1"] == 16 * 32 * 32 * 4  # its output
    assert saved["pool1"] == 16 * 16 * 16 * 8  # input already kept by relu1: only the int64 indices
    assert saved["conv2"] == 16 * 16 * 16 * 4
    assert saved["fc"] == 32 * 8 * 8 * 4 + 10 * 4 + 8  # its input; the loss's log-softmax and target
    assert wl.layer("conv2").output_bytes_per_sample == 32 * 16 * 16 * 4


def test_storage_shared_by_several_readers_is_counted_once(workloads):
    wl = workloads["resnet50"]
    assert wl.layer("layer1.0.conv2").saved_activation_bytes_per_sample == 0  # relu1's output
    assert wl.layer("layer1.0.downsample.0").saved_activation_bytes_per_sample == 0  # conv1 kept x
    assert wl.layer("layer1.1.conv1").saved_activation_bytes_per_sample == 0  # layer1.0.relu3's output
    assert wl.layer("layer1.0.conv1").saved_activation_bytes_per_sample == 64 * 56 * 56 * 4  # maxpool output
    bn = wl.layer("layer1.0.bn3")
    assert bn.saved_activation_bytes_per_sample == 256 * 56 * 56 * 4
    assert bn.saved_activation_bytes_fixed == 4 * 256 * 4  # batch stats + running stats, fp32 per channel
    g = workloads["googlenet"]
    assert g.layer("inception3a.branch2.0.conv").saved_activation_bytes_per_sample == 0
    assert g.layer("inception3a.branch4.0").saved_activation_bytes_per_sample == 192 * 28 * 28 * 8


def test_gpt_activations_match_the_megatron_formula_without_dropout(workloads):
    # Korthikanti et al. 2022 ("Reducing Activation Recomputation"): per layer s·b·h·(34 + 5·a·s/h) bytes at
    # 16-bit with dropout. Dropping the dropout masks/outputs (2 sbh + 3 a s^2 b bytes) leaves 16 elements
    # per token·channel and a·s^2 softmax elements: at fp32, 4·(16·s·h + a·s^2) per sample, plus the fp32
    # layernorm statistics (2 x 2 x s x 4 bytes) that the formula ignores.
    wl = workloads["gpt2-small"]
    s, h, a = 1024, 768, 12
    block = sum(la.saved_activation_bytes_per_sample for la in wl.layers if la.name.startswith("h.3."))
    assert block == 4 * (16 * s * h + a * s * s) + 2 * 2 * s * 4
    assert wl.layer("h.0.attn.core").saved_activation_bytes_fixed == s * s  # the bool causal mask


def test_gpt_block_under_autocast_by_hand(workloads):
    # CUDA autocast: the residual stream and layer norms stay fp32 (input and statistics: 2 x (4 s h + 8 s));
    # each linear keeps its 16-bit input (c_attn, c_proj, c_fc: s h each; mlp.c_proj: 4 s h), gelu its 16-bit
    # input (4 s h); the attention its q, k, v copies (3 s h), the fp32 softmax and the second matmul's 16-bit
    # copy of it (a s^2 x (4 + 2)); all in bytes per sample
    wl = workloads["gpt2-small"]
    s, h, a = 1024, 768, 12
    block = [la.autocast for la in wl.layers if la.name.startswith("h.3.")]
    assert sum(x.saved_per_sample for x in block) == \
        2 * (4 * s * h + 8 * s) + 2 * (3 * s * h + 4 * s * h + 4 * s * h + 3 * s * h) + 6 * a * s * s
    ac = {la.name: la.autocast for la in wl.layers}
    assert ac["h.3.ln_2"].output_per_sample == 4 * s * h
    assert ac["h.3.mlp.c_fc"].output_per_sample == 2 * 4 * s * h
    # the 16-bit weight copies backward keeps: the weights, not the biases; the tied head's copy of wte
    assert ac["h.3.mlp.c_fc"].weight_copies == 2 * h * 4 * h
    assert ac["lm_head"].weight_copies == 2 * 50257 * h and ac["wte"].weight_copies == 0
    # the loss reads the logits cast to fp32: its log-softmax (packed twice: log-softmax and NLL) is fp32
    assert ac["lm_head"].saved_per_sample == 2 * s * h + 4 * s * 50257 + 8 * s
    assert ac["lm_head"].packed_per_sample == 2 * s * h + 2 * 4 * s * 50257 + 8 * s
    assert ac["lm_head"].packed_fixed == 4 + ac["lm_head"].weight_copies


def test_packed_bytes_count_every_pack_and_the_parameters(workloads):
    wl = workloads["tiny-cnn"]
    pool1, conv2 = wl.layer("pool1"), wl.layer("conv2")
    # relu1's output is saved once, but packed by relu1, pool1 (with its indices) and nothing else
    assert pool1.saved_activation_bytes_per_sample == 16 * 16 * 16 * 8
    assert pool1.saved_packed_bytes_per_sample == 16 * 32 * 32 * 4 + 16 * 16 * 16 * 8
    assert conv2.saved_packed_bytes_per_sample == 16 * 16 * 16 * 4
    assert conv2.saved_packed_bytes_fixed == 32 * 16 * 9 * 4  # its weight, not its bias
    bn = workloads["resnet18"].layer("bn1")
    assert bn.saved_packed_bytes_fixed == bn.saved_activation_bytes_fixed + 64 * 4  # and its weight


def test_only_fp32_workloads_carry_bytes_under_autocast(workloads):
    assert all(la.autocast is None for la in build_analytic("tiny-cnn", dtype="float16").layers)
    assert build_analytic("tiny-cnn", dtype="float16").summary()["autocast_saved_mib_per_sample"] is None
    # GPT-2 keeps more under autocast than in fp32: its attention's fp32 softmax and 16-bit copy of it
    gpt = workloads["gpt2-small"].summary()
    assert gpt["autocast_saved_mib_per_sample"] > gpt["saved_activation_mib_per_sample"]


def test_dropout_mask_bytes_option():
    cuda = build_analytic("alexnet").layer("classifier.0")
    cpu = build_analytic("alexnet", dropout_mask_bytes=4).layer("classifier.0")
    cuda, cpu = cuda.saved_activation_bytes_per_sample, cpu.saved_activation_bytes_per_sample
    assert (cuda, cpu) == (9216, 4 * 9216)


def test_image_size_and_classes_are_configurable():
    small = build_analytic("alexnet", image_size=64, num_classes=10)
    # the adaptive pool keeps the classifier at 256x6x6 inputs: only the last layer shrinks
    assert small.num_params == 61_100_840 - 4096 * 990 - 990
    assert small.input.bytes_per_sample == 3 * 64 * 64
    cifar = build_analytic("resnet18", image_size=32, num_classes=10)
    assert cifar.layer("fc").param_bytes == 4 * (512 * 10 + 10)


def test_images_cross_as_uint8_or_as_the_cpu_pipeline_normalised_them():
    uint8 = build_analytic("resnet18", image_size=32)
    normalised = build_analytic("resnet18", image_size=32, input_dtype="float32")
    assert (uint8.input.dtype, uint8.input.bytes_per_sample) == ("uint8", 3 * 32 * 32)
    assert (normalised.input.dtype, normalised.input.bytes_per_sample) == ("float32", 4 * 3 * 32 * 32)
    assert normalised.layers == uint8.layers  # only what crosses to the device changes
    with pytest.raises(TrainsimError, match="input_dtype.*float32, uint8") as info:
        build_analytic("resnet18", input_dtype="int8")
    assert info.value.field == "input_dtype"


def test_too_small_images_are_refused_with_a_clear_error():
    with pytest.raises(TrainsimError, match="features.12") as info:
        build_analytic("alexnet", image_size=32)  # torchvision's AlexNet cannot take 32x32 either
    assert info.value.field == "image_size"


@pytest.mark.parametrize("kwargs, field", [
    ({"image_size": 0}, "image_size"), ({"dropout_mask_bytes": 3}, "dropout_mask_bytes"),
    ({"dtype": "float8"}, "dtype"), ({"colour": "red"}, "colour"),
])
def test_bad_config_names_the_field(kwargs, field):
    with pytest.raises(TrainsimError) as info:
        build_analytic("resnet18", **kwargs)
    assert info.value.field == field


def test_gpt_config_errors():
    with pytest.raises(TrainsimError, match="divisible"):
        build_analytic("gpt", n_embd=100, n_head=12)
    with pytest.raises(TrainsimError, match="unknown model 'bert'; valid choices: alexnet"):
        build_analytic("bert")


def test_fp16_halves_bytes_but_not_flops():
    fp32, fp16 = build_analytic("resnet18"), build_analytic("resnet18", dtype="float16")
    assert fp16.param_bytes * 2 == fp32.param_bytes
    assert fp16.flops_forward_per_sample == fp32.flops_forward_per_sample
    assert fp16.layer("layer1.0.bn1").saved_activation_bytes_per_sample * 2 == \
        fp32.layer("layer1.0.bn1").saved_activation_bytes_per_sample


def test_traffic_is_positive_where_there_is_work(workloads):
    for wl in workloads.values():
        for layer in wl.layers:
            if layer.kind == "dropout" and layer.memory_bytes_forward_per_sample == 0:
                continue  # p = 0: torch returns its input
            if layer.name == "wpe":
                continue  # once per batch: only its parameters move
            assert layer.memory_bytes_forward_per_sample > 0, (wl.name, layer.name)
            assert layer.memory_bytes_backward_per_sample > 0, (wl.name, layer.name)


def test_shipped_files_equal_a_fresh_generation():
    for name in BUILTINS:
        shipped = (builtin_dir() / f"{name}.json").read_text()
        assert shipped == builtin_text(name), f"scenarios/workloads/{name}.json is stale: regenerate it " \
                                              "with `python -m trainsim.sim.compute.analytic_models`"


def test_regeneration_script_writes_every_builtin(tmp_path):
    am.main(["--out", str(tmp_path)])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{name}.json" for name in BUILTINS)
    assert (tmp_path / "tiny-cnn.json").read_text() == builtin_text("tiny-cnn")
    assert len(generate_builtins(tmp_path)) == len(BUILTINS)


def test_parse_options():
    assert parse_options(["image_size=64", "dtype=float16", "x=0.5"]) == \
        {"image_size": 64, "dtype": "float16", "x": 0.5}
    with pytest.raises(TrainsimError, match="KEY=VALUE"):
        parse_options(["image_size"])


# --- cross-check with torch itself (skipped where torch is absent) -------------------------------------

def test_tiny_cnn_and_small_gpt_agree_with_torch_autograd():
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class TinyCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.relu1, self.pool1 = nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)
            self.conv2, self.relu2, self.pool2 = nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)
            self.fc = nn.Linear(32 * 8 * 8, 10)

        def forward(self, x):
            x = self.pool1(self.relu1(self.conv1(x)))
            return self.fc(torch.flatten(self.pool2(self.relu2(self.conv2(x))), 1))

    class Core(nn.Module):  # nanoGPT's slow attention path
        def __init__(self, n_head, seq):
            super().__init__()
            self.n_head = n_head
            self.register_buffer("bias", torch.tril(torch.ones(seq, seq)).view(1, 1, seq, seq))

        def forward(self, qkv):
            b, t, c3 = qkv.shape
            c = c3 // 3
            q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
                       for z in qkv.split(c, dim=2))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = torch.softmax(att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf")), dim=-1)
            return (att @ v).transpose(1, 2).contiguous().view(b, t, c)

    class Block(nn.Module):
        def __init__(self, dim, n_head, seq):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.attn = nn.Module()
            self.attn.c_attn, self.attn.core = nn.Linear(dim, 3 * dim), Core(n_head, seq)
            self.attn.c_proj = nn.Linear(dim, dim)
            self.mlp = nn.Module()
            self.mlp.c_fc, self.mlp.gelu = nn.Linear(dim, 4 * dim), nn.GELU()
            self.mlp.c_proj = nn.Linear(4 * dim, dim)

        def forward(self, x):
            x = x + self.attn.c_proj(self.attn.core(self.attn.c_attn(self.ln_1(x))))
            return x + self.mlp.c_proj(self.mlp.gelu(self.mlp.c_fc(self.ln_2(x))))

    class GPT(nn.Module):
        def __init__(self, n_layer=2, n_head=4, dim=32, vocab=50, seq=16):
            super().__init__()
            self.wte, self.wpe, self.drop = nn.Embedding(vocab, dim), nn.Embedding(seq, dim), nn.Dropout(0.0)
            self.h = nn.ModuleList(Block(dim, n_head, seq) for _ in range(n_layer))
            self.ln_f, self.lm_head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)
            self.lm_head.weight = self.wte.weight

        def forward(self, idx):
            x = self.drop(self.wte(idx) + self.wpe(torch.arange(idx.shape[1])))
            for block in self.h:
                x = block(x)
            return self.lm_head(self.ln_f(x))

    def saved_per_layer(model, x):
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        names = {m: n for n, m in model.named_modules()}
        stack, seen, saved, order = [], set(), {}, []
        handles = []

        def enter(module, args):
            stack.append(names[module])
            order.append(names[module])

        def leave(module, args, output):
            stack.pop()

        for module in model.modules():
            if not list(module.children()):
                handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]

        def pack(t):
            storage = t.untyped_storage()
            if storage.data_ptr() not in params and storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                layer = stack[-1] if stack else order[-1]  # the loss's count with the last layer
                saved[layer] = saved.get(layer, 0) + storage.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(x)
            targets = torch.zeros(out.shape[:-1], dtype=torch.long)
            torch.nn.functional.cross_entropy(out.flatten(0, -2), targets.flatten())
        for handle in handles:
            handle.remove()
        return order, saved

    cases = [("tiny-cnn", {}, TinyCNN(), lambda b: torch.randn(b, 3, 32, 32)),
             ("gpt", dict(n_layer=2, n_head=4, n_embd=32, vocab_size=50, block_size=16), GPT(),
              lambda b: torch.randint(0, 50, (b, 16)))]
    for name, cfg, model, make in cases:
        wl = build_analytic(name, **cfg)
        assert wl.num_params == sum(p.numel() for p in model.parameters())
        order, one = saved_per_layer(model, make(1))
        _, two = saved_per_layer(model, make(2))
        assert order == [layer.name for layer in wl.layers]
        for layer in wl.layers:
            per_sample = two.get(layer.name, 0) - one.get(layer.name, 0)
            fixed = one.get(layer.name, 0) - per_sample
            assert (per_sample, fixed) == (layer.saved_activation_bytes_per_sample,
                                           layer.saved_activation_bytes_fixed), (name, layer.name)
        from torch.utils.flop_counter import FlopCounterMode

        counter = FlopCounterMode(display=False)
        with counter:
            model(make(3)).sum().backward()
        expected = 3 * (wl.flops_forward_per_sample + wl.flops_backward_per_sample)
        assert counter.get_total_flops() == expected
