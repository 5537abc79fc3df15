"""Transformer workloads from Hugging Face-style configs: the presets against their published sizes, FLOPs by
hand and by torch's FLOP counter, what grouped-query attention, causal masks and experts change, and bad
configs."""

import json
import math

import pytest

from trainsim.errors import TrainsimError
from trainsim.formats.workload import builtin_dir
from trainsim.sim.compute.analytic_models import TRANSFORMER_BUILTINS, build_analytic, builtin_text
from trainsim.sim.compute.transformer_configs import PRESETS, TransformerConfig, from_hf_config
from trainsim.sim.compute.transformers import layer_role

#: a small Llama-style config for the checks by hand (8 query heads of 16 over 2 key/value heads)
SMALL = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
             intermediate_size=192, vocab_size=300, seq_len=32)
#: and a small mixture of experts: 8 experts of 64, top-2, one shared expert, the first layer dense
SMALL_MOE = dict(SMALL, num_hidden_layers=3, num_local_experts=8, num_experts_per_tok=2, n_shared_experts=1,
                 moe_intermediate_size=64, first_k_dense_replace=1)


@pytest.fixture(scope="module")
def presets():
    return {name: build_analytic(name) for name in TRANSFORMER_BUILTINS}


def _matmul_params(cfg: TransformerConfig) -> int:
    """Parameters of the matrix products a token goes through (the LM head's too, none of the embedding's)."""
    h, heads, kv, d = cfg.hidden_size, cfg.num_attention_heads, cfg.kv_heads, cfg.qk_head_dim
    attention = h * (heads + 2 * kv) * d + heads * d * h
    dense = 3 * h * cfg.intermediate_size
    per_token_moe = (h * cfg.num_local_experts + cfg.num_experts_per_tok * 3 * h * cfg.expert_size
                     + cfg.n_shared_experts * 3 * h * cfg.expert_size)
    layers = sum(attention + (per_token_moe if cfg.moe_layer(i) else dense)
                 for i in range(cfg.num_hidden_layers))
    return layers + h * cfg.vocab_size


# --- the presets --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(TRANSFORMER_BUILTINS))
def test_preset_parameters_are_within_one_percent_of_the_published_totals(presets, name):
    assert presets[name].num_params == pytest.approx(PRESETS[name].params, rel=0.01)
    assert PRESETS[name].source


def test_presets_are_exact_where_the_model_card_counts_them(presets):
    # the model cards' safetensors parameter counts
    assert presets["llama3-8b"].num_params == 8_030_261_248
    assert presets["mixtral-8x7b"].num_params == 46_702_792_704


def test_moe_presets_activate_their_published_parameters(presets):
    # Mixtral paper: 13 B active per token; DeepSeek-V3 report: 37 B. Forward matrix FLOPs per token / 2
    # are the active parameters (the embedding is a lookup: its rows are not multiplied)
    for name, active in (("mixtral-8x7b", 13e9), ("deepseek-v3-moe", 37e9)):
        wl = presets[name]
        seq = wl.input.shape[0]
        matmul = sum(layer.flops_forward_per_sample for layer in wl.layers
                     if layer.kind in ("linear", "expert_linear", "router"))
        assert matmul / seq / 2 == pytest.approx(active, rel=0.04), name


def test_presets_train_at_their_published_sequence_lengths(presets):
    seqs = {name: wl.input.shape[0] for name, wl in presets.items()}
    assert seqs == {"llama3-8b": 8192, "llama3-70b": 8192, "llama3-405b": 8192, "mixtral-8x7b": 32768,
                    "deepseek-v3-moe": 4096, "gpt3-175b": 2048}
    assert build_analytic("llama3-8b", seq_len=4096).input.shape == [4096]


def test_training_flops_per_token_are_6n_plus_attention(presets):
    # dense models: within a few % of 6 x parameters per token; the rest is the attention term
    for name in ("llama3-8b", "llama3-70b", "llama3-405b", "gpt3-175b"):
        wl = presets[name]
        seq = wl.input.shape[0]
        per_token = (wl.flops_forward_per_sample + wl.flops_backward_per_sample) / seq
        assert 1.0 < per_token / (6 * wl.num_params) < 1.1, name


def test_shipped_preset_files_equal_a_fresh_generation():
    for name in TRANSFORMER_BUILTINS:
        shipped = (builtin_dir() / f"{name}.json").read_text()
        assert shipped == builtin_text(name), (
            f"scenarios/workloads/{name}.json is stale: regenerate it with "
            "`python -m trainsim.sim.compute.analytic_models --transformers`")


def test_every_layer_says_how_a_parallel_layout_splits_it(presets):
    for wl in (*presets.values(), build_analytic("transformer", **SMALL_MOE, q_lora_rank=None,
                                                 kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
                                                 v_head_dim=16, dropout=0.1)):
        for layer in wl.layers:
            assert layer_role(layer.name) in ("vocab", "column", "row", "heads", "sequence", "replicated",
                                              "tokens", "expert"), layer.name
    assert layer_role("model.layers.3.mlp.experts.act") == "expert"
    assert layer_role("model.layers.3.mlp.act") == "column"
    assert layer_role("model.layers.3.self_attn.o_proj") == "row"


def test_llama_layer_names_and_kinds():
    wl = build_analytic("transformer", **SMALL)
    names = [layer.name for layer in wl.layers]
    block = [(n.removeprefix("model.layers.0."), wl.layer(n).kind)
             for n in names if n.startswith("model.layers.0.")]
    assert block == [("input_layernorm", "rmsnorm"), ("self_attn.qkv_proj", "linear"),
                     ("self_attn.rotary", "rope"), ("self_attn.core", "flash_attention"),
                     ("self_attn.o_proj", "linear"), ("post_attention_layernorm", "rmsnorm"),
                     ("mlp.gate_up_proj", "linear"), ("mlp.act", "swiglu"), ("mlp.down_proj", "linear")]
    assert names[0] == "model.embed_tokens" and names[-2:] == ["model.norm", "lm_head"]
    assert len(names) == 3 + 9 * SMALL["num_hidden_layers"]


# --- FLOPs by hand ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("config", [SMALL, SMALL_MOE], ids=["dense", "moe"])
def test_flops_per_token_are_6n_plus_the_causal_attention_by_hand(config):
    cfg = TransformerConfig(**config)
    wl = build_analytic("transformer", **config)
    seq, heads, d, layers = cfg.seq_len, cfg.num_attention_heads, cfg.qk_head_dim, cfg.num_hidden_layers
    pairs = seq * (seq + 1) / 2  # causal: the pairs (i, j) with j <= i of each head
    attention_fwd = layers * heads * pairs * 2 * (d + d)  # Q K^T and P V
    attention_bwd = layers * heads * pairs * 2 * (3 * d + 2 * d)  # scores again, dV, dP, dQ, dK
    n = _matmul_params(cfg)
    assert wl.flops_forward_per_sample == pytest.approx(2 * n * seq + attention_fwd, rel=1e-12)
    assert wl.flops_backward_per_sample == pytest.approx(4 * n * seq + attention_bwd, rel=1e-12)
    per_token = (wl.flops_forward_per_sample + wl.flops_backward_per_sample) / seq
    assert per_token == pytest.approx(6 * n + (attention_fwd + attention_bwd) / seq, rel=1e-12)


@pytest.mark.slow  # imports torch
def test_flash_attention_flops_are_torchs_sdpa_formulas():
    flop_counter = pytest.importorskip("torch.utils.flop_counter")
    cfg = dict(SMALL, causal=False)
    core = build_analytic("transformer", **cfg).layer("model.layers.0.self_attn.core")
    b, s, d = 1, cfg["seq_len"], cfg["hidden_size"] // cfg["num_attention_heads"]
    q, kv = (b, cfg["num_attention_heads"], s, d), (b, cfg["num_key_value_heads"], s, d)
    assert core.flops_forward_per_sample == flop_counter.sdpa_flop_count(q, kv, kv)
    assert core.flops_backward_per_sample == flop_counter.sdpa_backward_flop_count(q, q, kv, kv)


def test_a_causal_mask_halves_the_flash_attention_core():
    seq = SMALL["seq_len"]
    causal = build_analytic("transformer", **SMALL).layer("model.layers.0.self_attn.core")
    full = build_analytic("transformer", **SMALL, causal=False).layer("model.layers.0.self_attn.core")
    ratio = (seq + 1) / (2 * seq)  # S(S+1)/2 pairs of S^2
    assert causal.flops_forward_per_sample == pytest.approx(ratio * full.flops_forward_per_sample, rel=1e-12)
    assert causal.flops_backward_per_sample == \
        pytest.approx(ratio * full.flops_backward_per_sample, rel=1e-12)
    assert causal.saved_activation_bytes_per_sample == full.saved_activation_bytes_per_sample
    # the unfused path computes every score, masked or not, and keeps them
    unfused = build_analytic("transformer", **SMALL, attention="unfused")
    unfused = unfused.layer("model.layers.0.self_attn.core")
    assert unfused.kind == "attention"
    assert unfused.flops_forward_per_sample == full.flops_forward_per_sample
    scores = SMALL["num_attention_heads"] * seq * seq * 4  # fp32
    assert unfused.saved_activation_bytes_per_sample > full.saved_activation_bytes_per_sample + scores


def test_grouped_query_attention_shrinks_the_key_value_projections_and_bytes():
    h, heads, d, seq = SMALL["hidden_size"], SMALL["num_attention_heads"], 16, SMALL["seq_len"]
    mha = build_analytic("transformer", **{**SMALL, "num_key_value_heads": heads}, dtype="bfloat16")
    gqa = build_analytic("transformer", **SMALL, dtype="bfloat16")  # 2 key/value heads
    name = "model.layers.0.self_attn."
    assert mha.layer(name + "qkv_proj").param_bytes == 2 * h * 3 * heads * d
    assert gqa.layer(name + "qkv_proj").param_bytes == 2 * h * (heads + 2 * 2) * d
    # the core keeps Q, K, V, its output (2 bytes each) and the fp32 log-sum-exp; K and V have 2 heads, not 8
    for wl, kv in ((mha, heads), (gqa, 2)):
        core = wl.layer(name + "core")
        kept = 2 * seq * d * (heads + 2 * kv + heads) + 4 * heads * seq
        assert core.saved_activation_bytes_per_sample == kept
    # the attention's FLOPs do not change: every query head still meets every key
    assert gqa.layer(name + "core").flops_forward_per_sample == \
        mha.layer(name + "core").flops_forward_per_sample


def test_gpt_style_saved_activations_are_korthikantis_34_sbh_with_flash_attention():
    # Korthikanti et al. 2022 (Reducing Activation Recomputation in Large Transformer Models), eq. 1: a
    # layer keeps s*b*h*(34 + 5*a*s/h) bytes in 16 bit; flash attention keeps none of the 5*a*s^2*b score
    # terms. Here b = 1, plus the two layer norms' fp32 mean and rstd per token and the fp32 log-sum-exp per
    # head and token
    h, heads, seq = 256, 4, 64
    wl = build_analytic("gpt3-175b", hidden_size=h, num_attention_heads=heads, intermediate_size=4 * h,
                        num_hidden_layers=2, seq_len=seq, vocab_size=500, dropout=0.1, dtype="bfloat16")
    layer = [x for x in wl.layers if x.name.startswith("model.layers.1.")]
    kept = sum(x.saved_activation_bytes_per_sample for x in layer)
    assert kept == 34 * seq * h + 2 * 2 * 4 * seq + 4 * heads * seq


# --- mixture of experts -------------------------------------------------------------------------------------

def test_moe_flops_count_top_k_experts_and_parameters_count_all():
    cfg = TransformerConfig(**SMALL_MOE)
    h, i, seq = cfg.hidden_size, cfg.expert_size, cfg.seq_len
    wl = build_analytic("transformer", **SMALL_MOE)
    up = wl.layer("model.layers.1.mlp.experts.gate_up_proj")
    assert up.kind == "expert_linear"
    assert up.param_bytes == 4 * 8 * h * 2 * i  # all 8 experts, fp32
    assert up.flops_forward_per_sample == 2 * seq * 2 * h * 2 * i  # top-2 per token
    more = build_analytic("transformer", **dict(SMALL_MOE, num_local_experts=32))
    assert more.layer("model.layers.1.mlp.experts.gate_up_proj").param_bytes == 4 * up.param_bytes
    assert more.layer("model.layers.1.mlp.experts.gate_up_proj").flops_forward_per_sample == \
        up.flops_forward_per_sample
    # the first layer is dense (first_k_dense_replace), the others route; a shared expert beside the routed
    names = [layer.name for layer in wl.layers]
    assert "model.layers.0.mlp.gate_up_proj" in names and "model.layers.0.mlp.gate" not in names
    assert [n.removeprefix("model.layers.2.mlp.") for n in names if n.startswith("model.layers.2.mlp.")] == [
        "gate", "dispatch", "experts.gate_up_proj", "experts.act", "experts.down_proj", "combine",
        "shared_experts.gate_up_proj", "shared_experts.act", "shared_experts.down_proj"]
    assert wl.layer("model.layers.2.mlp.gate").param_bytes == 4 * h * 8


def test_a_capacity_factor_pads_the_experts_work():
    dropless = build_analytic("transformer", **SMALL_MOE)
    padded = build_analytic("transformer", **SMALL_MOE, capacity_factor=1.25)
    for name in ("experts.gate_up_proj", "experts.down_proj", "dispatch", "combine"):
        name = f"model.layers.1.mlp.{name}"
        if dropless.layer(name).flops_forward_per_sample:
            assert padded.layer(name).flops_forward_per_sample == \
                pytest.approx(1.25 * dropless.layer(name).flops_forward_per_sample)
        assert padded.layer(name).output_bytes_per_sample >= dropless.layer(name).output_bytes_per_sample
    assert padded.num_params == dropless.num_params


# --- Hugging Face configs -----------------------------------------------------------------------------------

MIXTRAL_CONFIG = {  # the model card's config.json
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32,
    "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
    "output_router_logits": False, "rms_norm_eps": 1e-05, "rope_theta": 1e6, "router_aux_loss_coef": 0.02,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 32000}


def test_a_hugging_face_config_gives_the_preset():
    assert from_hf_config(MIXTRAL_CONFIG) == PRESETS["mixtral-8x7b"].from_options()
    deepseek = {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
                "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
                "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256, "n_group": 8,
                "topk_group": 4, "num_experts_per_tok": 8, "first_k_dense_replace": 3, "q_lora_rank": 1536,
                "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
                "vocab_size": 129280, "max_position_embeddings": 163840, "tie_word_embeddings": False}
    ours = from_hf_config(deepseek, seq_len=4096)
    assert ours.num_local_experts == 256 and ours.seq_len == 4096
    assert ours.__class__(**{**ours.__dict__, "num_key_value_heads": None}) == \
        PRESETS["deepseek-v3-moe"].from_options()


def test_gpt2s_config_gives_gpt2_small():
    gpt2 = {"activation_function": "gelu_new", "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768,
            "n_head": 12, "n_inner": None, "n_layer": 12, "n_positions": 1024, "vocab_size": 50257}
    cfg = from_hf_config(gpt2, attention="unfused")
    assert (cfg.norm, cfg.mlp, cfg.position, cfg.bias, cfg.tie_word_embeddings) == \
        ("layernorm", "gelu", "learned", True, True)
    ours = build_analytic("transformer", **{k: v for k, v in cfg.__dict__.items()})
    theirs = build_analytic("gpt2-small")
    assert ours.num_params == theirs.num_params == 124_439_808
    assert ours.flops_forward_per_sample == theirs.flops_forward_per_sample
    assert ours.flops_backward_per_sample == theirs.flops_backward_per_sample


def test_set_text_and_aliases_are_converted():
    wl = build_analytic("mixtral-8x7b", seq_len=128, num_hidden_layers=1, n_routed_experts=4,
                        tie_word_embeddings="true", capacity_factor="none", causal="0")
    config = wl.provenance.config
    assert (config["num_local_experts"], config["tie_word_embeddings"], config["capacity_factor"],
            config["causal"]) == (4, True, None, False)
    assert wl.layer("lm_head").param_bytes == 0 and wl.layer("lm_head").shared_param_bytes > 0


# --- bad configs --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("options, field, words", [
    ({"num_attention_heads": 30}, "num_attention_heads", "do not divide hidden_size 4096"),
    ({"num_key_value_heads": 5}, "num_key_value_heads", "5 key/value heads do not divide the 32 query heads"),
    ({"num_experts_per_tok": 9}, "num_experts_per_tok", "there are 8"),
    ({"hiden_size": 4096}, "hiden_size", "did you mean hidden_size"),
    ({"n_routed_experts": 4, "num_local_experts": 4}, "num_local_experts", "given twice"),
    ({"seq_len": 0}, "seq_len", "positive whole number"),
    ({"seq_len": "long"}, "seq_len", "whole number, got 'long'"),
    ({"attention": "sparse"}, "attention", "valid choices: flash, unfused"),
    ({"capacity_factor": -1}, "capacity_factor", "must be > 0"),
    ({"tie_word_embeddings": "maybe"}, "tie_word_embeddings", "true or false"),
])
def test_bad_configs_are_one_line_naming_the_field(options, field, words):
    with pytest.raises(TrainsimError) as info:
        build_analytic("mixtral-8x7b", **options)
    assert info.value.field == field
    assert words in str(info.value) and "\n" not in str(info.value)


def test_bad_configs_without_experts_or_latent_attention():
    with pytest.raises(TrainsimError, match="num_experts_per_tok: needs experts"):
        build_analytic("llama3-8b", num_experts_per_tok=2)
    with pytest.raises(TrainsimError, match="qk_rope_head_dim: missing"):
        build_analytic("llama3-8b", kv_lora_rank=64, qk_nope_head_dim=32, v_head_dim=32)
    with pytest.raises(TrainsimError, match="seq_len: 4096 tokens do not fit a learned position table of"):
        build_analytic("gpt3-175b", seq_len=4096)


# --- through the CLI and a scenario -------------------------------------------------------------------------

def test_cli_generates_a_preset_as_json():
    from typer.testing import CliRunner

    from trainsim.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["workload", "generate", "llama3-8b", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["params"] == 8_030_261_248 and summary["name"] == "llama3-8b"
    result = runner.invoke(app, ["workload", "generate", "llama3-8b", "--set", "num_key_value_heads=5"])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "error: num_key_value_heads: 5 key/value heads do not divide the 32 query heads (grouped-query "
        "attention shares each key/value head among a whole group)"]
    result = runner.invoke(app, ["workload", "show", "mixtral-8x7b", "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["params"] == 46_702_792_704


def test_a_scenario_names_a_preset_with_overrides():
    from trainsim.formats.scenario import WorkloadRef
    from trainsim.resolve import load_workload_ref

    wl = load_workload_ref(WorkloadRef.model_validate({"name": "llama3-8b", "seq_len": 4096}))
    assert wl.input.shape == [4096] and wl.num_params == 8_030_261_248
    assert load_workload_ref("llama3-70b").input.shape == [8192]


# --- against torch -----------------------------------------------------------------------------------------

@pytest.mark.slow  # imports torch
def test_a_tiny_llama_agrees_with_torch():
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    nn, F = torch.nn, torch.nn.functional
    cfg = TransformerConfig(**SMALL, attention="unfused")  # torch's counter sees the math path's matmuls
    h, heads, kv, d = cfg.hidden_size, cfg.num_attention_heads, cfg.kv_heads, cfg.qk_head_dim
    seq = cfg.seq_len

    def rotate(x, cos, sin):
        half = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm, self.post_attention_layernorm = nn.RMSNorm(h), nn.RMSNorm(h)
            self.q_proj, self.k_proj = nn.Linear(h, heads * d, bias=False), nn.Linear(h, kv * d, bias=False)
            self.v_proj, self.o_proj = nn.Linear(h, kv * d, bias=False), nn.Linear(heads * d, h, bias=False)
            self.gate_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
            self.up_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
            self.down_proj = nn.Linear(cfg.intermediate_size, h, bias=False)

        def forward(self, x, cos, sin, mask):
            b = x.shape[0]
            y = self.input_layernorm(x)
            q = self.q_proj(y).view(b, seq, heads, d).transpose(1, 2)
            k = self.k_proj(y).view(b, seq, kv, d).transpose(1, 2)
            v = self.v_proj(y).view(b, seq, kv, d).transpose(1, 2)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            k, v = k.repeat_interleave(heads // kv, dim=1), v.repeat_interleave(heads // kv, dim=1)
            scores = (q @ k.transpose(-2, -1) / math.sqrt(d)).masked_fill(mask, float("-inf"))
            o = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, seq, heads * d)
            x = x + self.o_proj(o)
            y = self.post_attention_layernorm(x)
            return x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(cfg.vocab_size, h)
            self.layers = nn.ModuleList(Block() for _ in range(cfg.num_hidden_layers))
            self.norm, self.lm_head = nn.RMSNorm(h), nn.Linear(h, cfg.vocab_size, bias=False)

        def forward(self, idx):
            angles = torch.arange(seq)[:, None] * 10000 ** (-torch.arange(0, d, 2) / d)
            angles = torch.cat([angles, angles], dim=-1)
            cos, sin = angles.cos(), angles.sin()
            mask = torch.ones(seq, seq, dtype=torch.bool).triu(1)
            x = self.embed_tokens(idx)
            for layer in self.layers:
                x = layer(x, cos, sin, mask)
            return self.lm_head(self.norm(x))

    torch.manual_seed(0)
    model = Llama()
    wl = build_analytic("transformer", **{k: v for k, v in cfg.__dict__.items()})
    assert wl.num_params == sum(p.numel() for p in model.parameters())
    batch = 2
    idx = torch.randint(0, cfg.vocab_size, (batch, seq))
    with FlopCounterMode(display=False) as forward:
        loss = F.cross_entropy(model(idx).flatten(0, 1), idx.flatten())
    with FlopCounterMode(display=False) as backward:
        loss.backward()
    assert forward.get_total_flops() == batch * wl.flops_forward_per_sample
    assert backward.get_total_flops() == batch * wl.flops_backward_per_sample
