"""The calibration model zoo: structure, parameter counts, inputs, bad input."""

import pytest

torch = pytest.importorskip("torch")

from trainsim.calibrate import zoo  # noqa: E402
from trainsim.calibrate.measure.layer_hooks import leaf_modules  # noqa: E402
from trainsim.errors import TrainsimError  # noqa: E402

# Published parameter counts: torchvision's model docs (alexnet, vgg16, resnet18, resnet50, googlenet without
# aux heads), nanoGPT's GPT-2 small with the tied lm_head; tiny-cnn by hand: 448 + 4640 + 20490.
PUBLISHED = {
    "alexnet": 61_100_840,
    "vgg16": 138_357_544,
    "resnet18": 11_689_512,
    "resnet50": 25_557_032,
    "googlenet": 6_624_904,
    "gpt2-small": 124_439_808,
    "tiny-cnn": 3 * 16 * 9 + 16 + 16 * 32 * 9 + 32 + 32 * 8 * 8 * 10 + 10,
    # llama-tiny by hand: embedding and untied head 4096 x 256 each; per block qkv 256 x (8 + 2 x 4) x 32,
    # o_proj 256 x 256, gate_up 256 x 2 x 688, down 688 x 256, two norms of 256; the final norm
    "llama-tiny": 2 * 4096 * 256 + 4 * (256 * 16 * 32 + 256 * 256 + 256 * 2 * 688 + 688 * 256 + 2 * 256) + 256,
}


def _meta(name, **cfg):
    with torch.device("meta"):
        return zoo.build_model(name, **cfg)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_match_published(name):
    assert zoo.count_params(_meta(name)) == PUBLISHED[name]


def test_every_model_listed():
    assert sorted(zoo.list_models()) == sorted(PUBLISHED)


def test_alexnet_keeps_its_parameters_on_cifar_images():
    # the adaptive average pool makes the classifier independent of the image size
    assert zoo.count_params(_meta("alexnet", image_size=32)) == PUBLISHED["alexnet"]


def test_resnet_layer_names_follow_the_workload_convention():
    names = [name for name, _ in leaf_modules(_meta("resnet50"))]
    assert names[:4] == ["conv1", "bn1", "relu", "maxpool"]
    block = [n.removeprefix("layer1.0.") for n in names if n.startswith("layer1.0.")]
    assert block == ["conv1", "bn1", "relu1", "conv2", "bn2", "relu2", "conv3", "bn3",
                     "downsample.0", "downsample.1", "relu3"]
    assert names[-2:] == ["avgpool", "fc"]
    relus = [m for _, m in leaf_modules(_meta("resnet18")) if isinstance(m, torch.nn.ReLU)]
    assert relus and not any(m.inplace for m in relus)


def test_gpt_layer_names_and_tied_head():
    model = _meta("gpt2-small", n_layer=1)
    names = [name for name, _ in leaf_modules(model)]
    assert names == ["wte", "wpe", "drop", "h.0.ln_1", "h.0.attn.c_attn", "h.0.attn.core", "h.0.attn.c_proj",
                     "h.0.ln_2", "h.0.mlp.c_fc", "h.0.mlp.gelu", "h.0.mlp.c_proj", "ln_f", "lm_head"]
    assert model.lm_head.weight is model.wte.weight


def test_googlenet_inception_branches():
    names = {name for name, _ in leaf_modules(_meta("googlenet"))}
    assert {"inception3a.branch2.1.conv", "inception3a.branch4.0", "inception5b.branch4.1.relu",
            "maxpool4", "dropout", "fc"} <= names
    assert not any("aux" in n for n in names)


def test_image_batch_runs_forward():
    x, y = zoo.example_batch("tiny-cnn", 3)
    assert x.shape == (3, 3, 32, 32) and x.dtype == torch.float32
    assert y.shape == (3,) and y.dtype == torch.int64
    out = zoo.build_model("tiny-cnn")(x)
    assert out.shape == (3, 10)


def test_token_batch_targets_are_next_tokens():
    cfg = dict(n_layer=1, n_head=2, n_embd=8, vocab_size=17, block_size=6)
    x, y = zoo.example_batch("gpt2-small", 2, generator=torch.Generator().manual_seed(1), **cfg)
    assert x.shape == y.shape == (2, 6) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    out = zoo.build_model("gpt2-small", **cfg)(x)
    assert out.shape == (2, 6, 17)
    assert zoo.loss_fn("gpt2-small", out, y).ndim == 0


def test_attention_core_is_causal():
    core = zoo.CausalAttentionCore(n_head=2, block_size=5)
    qkv = torch.randn(1, 5, 12)
    changed = qkv.clone()
    changed[:, -1] += 1.0  # the last token must not influence earlier positions
    assert torch.allclose(core(qkv)[:, :-1], core(changed)[:, :-1])
    assert not torch.allclose(core(qkv)[:, -1], core(changed)[:, -1])


def test_dropout_keeps_a_bool_mask_and_is_identity_in_eval():
    drop = zoo.Dropout(0.5)
    x = torch.ones(1000, requires_grad=True)
    y = drop(x)
    assert y.grad_fn._saved_result1.dtype == torch.bool
    assert set(torch.unique(y.detach()).tolist()) <= {0.0, 2.0}
    assert drop.eval()(x) is x


def test_unknown_model_lists_valid_names():
    with pytest.raises(TrainsimError, match="unknown model 'resnet51'.*resnet50"):
        zoo.build_model("resnet51")


def test_aliases_and_case():
    assert zoo.canonical_name("GPT2") == "gpt2-small"
    assert zoo.canonical_name("ResNet18") == "resnet18"


def test_bad_options_name_the_field():
    with pytest.raises(TrainsimError) as exc:
        zoo.build_model("alexnet", depth=3)
    assert exc.value.field == "depth"
    with pytest.raises(TrainsimError) as exc:
        zoo.build_model("gpt2-small", n_head=5)
    assert exc.value.field == "n_embd"
    with pytest.raises(TrainsimError):
        zoo.example_batch("tiny-cnn", 0)
