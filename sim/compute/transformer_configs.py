"""Decoder-only transformer configurations in a Hugging Face model config's terms, and the published presets.

`TransformerConfig` holds what decides a decoder's per-layer cost: its field names are those of a Hugging Face
``config.json`` (``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``,
``intermediate_size``, ``vocab_size``, ``tie_word_embeddings``, and for mixture-of-experts models
``num_local_experts``, ``num_experts_per_tok``, ``n_shared_experts``, ``moe_intermediate_size``,
``first_k_dense_replace``; DeepSeek's multi-head latent attention ``q_lora_rank``, ``kv_lora_rank``,
``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``), plus what a config file does not say but a
training run does: ``seq_len`` (tokens per sample), the attention kernel (``attention: flash|unfused``),
``causal``, ``capacity_factor`` and residual ``dropout``. The block's style is three switches: ``norm``
(rmsnorm|layernorm), ``mlp`` (swiglu|gelu) and ``position`` (rope|learned), with ``bias`` on every linear.

Values may come as a scenario's YAML gives them or as ``--set`` text (``tie_word_embeddings=true``,
``capacity_factor=none``); keys other spellings of the same figure in Hugging Face configs are accepted too
(`ALIASES`: ``n_routed_experts`` and ``num_experts`` are ``num_local_experts``). Anything wrong is one
`TrainsimError` naming the field. `from_hf_config` reads a whole ``config.json`` mapping (other keys, which
do not change the cost, are ignored; the ones it leaves out are listed in its docstring).

`PRESETS` are the published models, each with its source; `transformer_models` registers them (and the
generic ``transformer``, whose defaults are Llama 3 8B's) for the analytic generator.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from trainsim.errors import TrainsimError, unknown_name
from trainsim.formats.workload import DTYPE_BYTES

#: the block's norm, MLP, position encoding and attention kernel choices
NORMS = ("rmsnorm", "layernorm")
MLPS = ("swiglu", "gelu")
POSITIONS = ("rope", "learned")
ATTENTIONS = ("flash", "unfused")

#: other spellings of a field in Hugging Face configs (DeepSeek: n_routed_experts; Qwen-MoE: num_experts)
ALIASES = {"n_routed_experts": "num_local_experts", "num_experts": "num_local_experts",
           "max_seq_len": "seq_len", "seq_length": "seq_len"}

_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")
_NONE = ("none", "null", "")


@dataclass(frozen=True)
class TransformerConfig:
    """A decoder-only transformer. Defaults: Llama 3 8B (see `PRESETS`), trained at 8,192 tokens.

    ``num_key_value_heads`` None: as many as the query heads (multi-head attention); ``head_dim`` None:
    ``hidden_size / num_attention_heads``. ``num_local_experts`` 0: dense. ``moe_intermediate_size`` None:
    ``intermediate_size``. ``capacity_factor`` None: dropless routing (every token reaches its top-k
    experts); a number: each expert is padded to ``capacity_factor x tokens x top-k / experts`` slots, so the
    experts compute that many token slots whatever the routing (tokens beyond an expert's capacity are
    dropped). ``first_k_dense_replace``: layers before the first MoE layer that keep a dense MLP of
    ``intermediate_size``. ``kv_lora_rank`` set: multi-head latent attention (DeepSeek-V2/V3). ``dropout``:
    the residual dropouts (after the embedding, the attention and the MLP), whose masks are kept for backward.
    """

    hidden_size: int = 4096
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = 8
    head_dim: int | None = None
    intermediate_size: int = 14336
    vocab_size: int = 128256
    seq_len: int = 8192
    max_position_embeddings: int | None = 8192
    tie_word_embeddings: bool = False
    norm: str = "rmsnorm"
    mlp: str = "swiglu"
    position: str = "rope"
    bias: bool = False
    attention: str = "flash"
    causal: bool = True
    dropout: float = 0.0
    # mixture of experts
    num_local_experts: int = 0
    num_experts_per_tok: int = 0
    n_shared_experts: int = 0
    moe_intermediate_size: int | None = None
    capacity_factor: float | None = None
    first_k_dense_replace: int = 0
    # multi-head latent attention
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    dtype: str = "float32"
    dropout_mask_bytes: int = 1

    def __post_init__(self):
        _positive(self, "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                  "vocab_size", "seq_len")
        _positive(self, "num_key_value_heads", "head_dim", "max_position_embeddings", "moe_intermediate_size",
                  "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                  optional=True)
        _counts(self, "num_local_experts", "num_experts_per_tok", "n_shared_experts", "first_k_dense_replace")
        for name, valid in (("norm", NORMS), ("mlp", MLPS), ("position", POSITIONS),
                            ("attention", ATTENTIONS), ("dtype", tuple(DTYPE_BYTES))):
            if getattr(self, name) not in valid:
                raise unknown_name(name, getattr(self, name), valid, field=name)
        heads, kv = self.num_attention_heads, self.kv_heads
        if self.head_dim is None and not self.mla and self.hidden_size % heads:
            raise TrainsimError(f"{heads} heads do not divide hidden_size {self.hidden_size}; give a "
                                f"head count that does, or head_dim", field="num_attention_heads")
        if heads % kv:
            raise TrainsimError(f"{kv} key/value heads do not divide the {heads} query heads (grouped-query "
                                f"attention shares each key/value head among a whole group)",
                                field="num_key_value_heads")
        if self.mla:
            for name in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
                if getattr(self, name) is None:
                    raise TrainsimError("missing (required with kv_lora_rank: multi-head latent attention)",
                                        field=name)
        elif self.q_lora_rank is not None:
            raise TrainsimError("needs kv_lora_rank (it is a part of multi-head latent attention)",
                                field="q_lora_rank")
        if self.position == "rope" and self.rope_dim % 2:
            raise TrainsimError(f"rotary embeddings rotate pairs of values: the rotated head dimension "
                                f"({self.rope_dim}) must be even", field="qk_rope_head_dim" if self.mla
                                else "head_dim")
        if self.position == "learned" and self.seq_len > self.positions:
            raise TrainsimError(f"{self.seq_len} tokens do not fit a learned position table of "
                                f"{self.positions} (max_position_embeddings)", field="seq_len")
        if self.num_local_experts:
            if not self.num_experts_per_tok:
                raise TrainsimError("missing: how many experts each token goes to (top-k) in a model with "
                                    f"{self.num_local_experts} experts", field="num_experts_per_tok")
            if self.num_experts_per_tok > self.num_local_experts:
                raise TrainsimError(f"top-{self.num_experts_per_tok} routing needs at least that many "
                                    f"experts; there are {self.num_local_experts} (num_local_experts)",
                                    field="num_experts_per_tok")
            if self.first_k_dense_replace > self.num_hidden_layers:
                raise TrainsimError(f"{self.first_k_dense_replace} dense layers do not fit in "
                                    f"{self.num_hidden_layers} (num_hidden_layers)",
                                    field="first_k_dense_replace")
        else:
            for name in ("num_experts_per_tok", "n_shared_experts", "first_k_dense_replace"):
                if getattr(self, name):
                    raise TrainsimError("needs experts (num_local_experts) to apply to", field=name)
            if self.capacity_factor is not None:
                raise TrainsimError("needs experts (num_local_experts) to apply to", field="capacity_factor")
        if self.capacity_factor is not None and not (0 < self.capacity_factor <= 64):
            raise TrainsimError(f"must be > 0 and at most 64 (None: dropless), got {self.capacity_factor}",
                                field="capacity_factor")
        if not 0 <= self.dropout < 1:
            raise TrainsimError(f"must be >= 0 and < 1, got {self.dropout}", field="dropout")
        if self.dropout_mask_bytes not in (1, 2, 4):
            raise TrainsimError("must be 1, 2 or 4", field="dropout_mask_bytes")

    # --- derived figures ----------------------------------------------------------------------------------
    @property
    def mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2/V3)."""
        return self.kv_lora_rank is not None

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def qk_head_dim(self) -> int:
        """The dimension queries and keys meet in, per head."""
        if self.mla:
            return self.qk_nope_head_dim + self.qk_rope_head_dim
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def v_dim(self) -> int:
        """The dimension of values (and of the attention's output), per head."""
        return self.v_head_dim if self.mla else self.qk_head_dim

    @property
    def rope_dim(self) -> int:
        """The part of each query/key head that rotary embeddings rotate."""
        return self.qk_rope_head_dim if self.mla else self.qk_head_dim

    @property
    def positions(self) -> int:
        return self.max_position_embeddings or self.seq_len

    @property
    def moe(self) -> bool:
        return self.num_local_experts > 0

    @property
    def expert_size(self) -> int:
        """The intermediate size of one routed (or shared) expert."""
        return self.moe_intermediate_size or self.intermediate_size

    def moe_layer(self, index: int) -> bool:
        return self.moe and index >= self.first_k_dense_replace

    @property
    def routed_slots(self) -> float:
        """Token slots the experts compute per token: top-k (dropless), or capacity x top-k (padded)."""
        return self.num_experts_per_tok * (self.capacity_factor or 1.0)

    # --- construction -------------------------------------------------------------------------------------
    @classmethod
    def from_options(cls, defaults: dict[str, Any] | None = None, **options) -> TransformerConfig:
        """A config from ``defaults`` overridden by ``options`` (a scenario's YAML values or ``--set``
        text); aliases resolved, unknown keys listed, values converted to the field's type."""
        values = dict(defaults or {})
        for key, value in canonical(options).items():
            values[key] = _convert(key, value)
        return cls(**values)


#: every field's name and type, as converted from text
_FIELDS = {f.name: f.type for f in fields(TransformerConfig)}


def canonical(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with aliases under their field's name; an unknown key (or a field given twice) is one
    error naming it."""
    out: dict[str, Any] = {}
    for key, value in options.items():
        name = ALIASES.get(key, key)
        if name not in _FIELDS:
            raise unknown_name("transformer option", key, [*_FIELDS, *ALIASES], field=key)
        if name in out:
            raise TrainsimError(f"given twice (as {name} and as one of its aliases)", field=key)
        out[name] = value
    return out


def _convert(name: str, value: Any) -> Any:
    """A value for field ``name`` from YAML or ``--set`` text."""
    kind = _FIELDS[name]
    optional = "None" in kind
    if isinstance(value, str) and optional and value.strip().lower() in _NONE:
        return None
    if value is None:
        if optional:
            return None
        raise TrainsimError("must be given a value (it cannot be none)", field=name)
    if kind.startswith("bool"):
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise TrainsimError(f"must be true or false, got {value!r}", field=name)
    if kind.startswith("int"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TrainsimError(f"must be a whole number, got {value!r}", field=name)
        return value
    if kind.startswith("float"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TrainsimError(f"must be a number, got {value!r}", field=name)
        return float(value)
    if not isinstance(value, str):
        raise TrainsimError(f"must be a name, got {value!r}", field=name)
    return value.strip().lower()


def _positive(cfg, *names, optional: bool = False) -> None:
    for name in names:
        value = getattr(cfg, name)
        if value is None and optional:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise TrainsimError(f"must be a positive whole number, got {value!r}", field=name)


def _counts(cfg, *names) -> None:
    for name in names:
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise TrainsimError(f"must be a whole number >= 0, got {value!r}", field=name)


# --- Hugging Face configs ---------------------------------------------------------------------------------

#: GPT-2's own key names -> ours (GPT-2 config.json)
_GPT2_KEYS = {"n_embd": "hidden_size", "n_layer": "num_hidden_layers", "n_head": "num_attention_heads",
              "n_inner": "intermediate_size", "n_positions": "max_position_embeddings"}


def from_hf_config(config: dict[str, Any], **overrides) -> TransformerConfig:
    """A `TransformerConfig` from a Hugging Face ``config.json`` mapping, then ``overrides``.

    ``model_type`` "gpt2" (and any config without ``num_hidden_layers`` that has GPT-2's ``n_layer``) is a
    GPT-style block: layer norm, GELU MLP of ``n_inner`` (4 x hidden when null), learned positions, biases,
    tied embeddings unless the config says otherwise. Every other type is Llama-style (RMSNorm, SwiGLU, RoPE;
    ``attention_bias``/``mlp_bias`` put biases on the linears). ``seq_len`` defaults to
    ``max_position_embeddings``: give the training sequence length as an override.

    Keys that change the cost and are not modelled, and so ignored: ``sliding_window`` (every token attends
    to all earlier ones), DeepSeek's group-limited routing (``n_group``, ``topk_group``: where tokens go, not
    how much work they make) and multi-token prediction modules (``num_nextn_predict_layers``), Qwen-MoE's
    ``shared_expert_intermediate_size`` and ``decoder_sparse_step``. Others (``rope_theta``, ``rms_norm_eps``,
    token ids, ``torch_dtype``...) do not change it.
    """
    if not isinstance(config, dict):
        raise TrainsimError("a model config must be a mapping of its keys", field="config")
    gpt2 = config.get("model_type") == "gpt2" or ("n_layer" in config and "num_hidden_layers" not in config)
    values: dict[str, Any] = {}
    for key, value in config.items():
        name = _GPT2_KEYS.get(key, key) if gpt2 else key
        name = ALIASES.get(name, name)
        if name in _FIELDS and name not in ("norm", "mlp", "position", "attention", "dtype"):
            values[name] = value
    if gpt2:
        values.setdefault("intermediate_size", None)
        if values["intermediate_size"] is None:
            values["intermediate_size"] = 4 * values.get("hidden_size", TransformerConfig.hidden_size)
        values.update(norm="layernorm", mlp="gelu", position="learned", bias=True, num_key_value_heads=None)
        values.setdefault("tie_word_embeddings", True)
    else:
        values.update(norm="rmsnorm", mlp="swiglu", position="rope")
        values["bias"] = bool(config.get("attention_bias") or config.get("mlp_bias"))
        values.setdefault("num_key_value_heads", None)
        values.setdefault("tie_word_embeddings", False)
    values.setdefault("seq_len", values.get("max_position_embeddings") or TransformerConfig.seq_len)
    if values.get("num_local_experts") is None:
        values["num_local_experts"] = 0
    for key in ("num_experts_per_tok", "n_shared_experts", "first_k_dense_replace"):
        if values.get(key) is None or not values["num_local_experts"]:
            values[key] = 0
    return TransformerConfig.from_options(**{**values, **overrides})


# --- presets ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Preset:
    """A published model: its config values (over `TransformerConfig`'s defaults), published parameter count
    and where both come from."""

    name: str
    values: dict[str, Any]
    params: float  # the published total
    source: str

    def from_options(self, **options) -> TransformerConfig:
        return TransformerConfig.from_options(self.values, **options)


_LLAMA3 = ("Llama 3 paper (Grattafiori et al. 2024, 'The Llama 3 Herd of Models'), table 3 (layers, model "
           "and FFN dimension, heads, 8 key/value heads, vocabulary 128K) and section 3.4 (pre-trained on "
           "8K-token sequences); the model card's config.json (vocab_size 128256, untied embeddings, "
           "max_position_embeddings 8192; 131072 for Llama 3.1 405B)")

PRESETS = {p.name: p for p in (
    Preset("transformer", {}, 8.03e9,
           "a Llama-style decoder, every figure settable with --set (HF config.json keys); defaults: "
           "Llama 3 8B"),
    Preset("llama3-8b", {}, 8.03e9,
           f"{_LLAMA3}; 8.03 B parameters: the model card's safetensors count (8,030,261,248)"),
    Preset("llama3-70b", dict(hidden_size=8192, num_hidden_layers=80, num_attention_heads=64,
                              intermediate_size=28672), 70.6e9,
           f"{_LLAMA3}; 70.6 B parameters: the model card's safetensors count"),
    Preset("llama3-405b", dict(hidden_size=16384, num_hidden_layers=126, num_attention_heads=128,
                               intermediate_size=53248, max_position_embeddings=131072), 405e9,
           f"{_LLAMA3}; 405 B parameters (paper, table 3; Llama 3.1 405B's config.json)"),
    Preset("mixtral-8x7b", dict(vocab_size=32000, seq_len=32768, max_position_embeddings=32768,
                                num_local_experts=8, num_experts_per_tok=2),
           46.7e9,
           "Mixtral of Experts (Jiang et al. 2024), table 1 (dim 4096, 32 layers, head_dim 128, 32 heads, 8 "
           "kv heads, hidden_dim 14336, vocab 32000, 8 experts, top-2) and section 2 (32K-token context); "
           "47 B total, 13 B active parameters (section 1); the model card's config.json and safetensors "
           "count (46.7 B); dropless routing (MegaBlocks), as trained"),
    Preset("deepseek-v3-moe", dict(
        hidden_size=7168, num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=None,
        intermediate_size=18432, vocab_size=129280, seq_len=4096, max_position_embeddings=163840,
        num_local_experts=256, num_experts_per_tok=8,
        n_shared_experts=1, moe_intermediate_size=2048, first_k_dense_replace=3, q_lora_rank=1536,
        kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128), 671e9,
           "DeepSeek-V3 technical report (DeepSeek-AI 2024), section 4.2 (61 layers, hidden 7168, 128 heads, "
           "MLA with d_c 512, d'_c 1536, d_h 128 and d_h^R 64; first 3 layers dense; 1 shared + 256 routed "
           "experts of intermediate 2048, 8 per token; 4K-token pre-training sequences; 671 B total, 37 B "
           "active) and the model card's config.json (intermediate_size 18432, vocab_size 129280); no token "
           "dropping (section 2.1.2); 163,840 positions (config.json). Simplified: the router's "
           "group-limited top-k (n_group 8, topk_group 4) costs as a plain top-8 and the 14 B "
           "multi-token-prediction module is left out, as in the 671 B"),
    Preset("gpt3-175b", dict(hidden_size=12288, num_hidden_layers=96, num_attention_heads=96,
                             num_key_value_heads=None, intermediate_size=4 * 12288, vocab_size=50257,
                             seq_len=2048, max_position_embeddings=2048, tie_word_embeddings=True,
                             norm="layernorm", mlp="gelu", position="learned", bias=True), 175.0e9,
           "GPT-3 paper (Brown et al. 2020, 'Language Models are Few-Shot Learners'), table 2.1 (175.0 B "
           "parameters, 96 layers, d_model 12288, 96 heads of 128, n_ctx 2048) and section 2.1 (GPT-2's "
           "architecture: learned positions, pre-LayerNorm, 4 x d_model feed-forward, GPT-2's 50257-token "
           "vocabulary with tied input/output embeddings). Simplified: every layer is dense (the paper "
           "alternates dense and locally banded sparse attention)"),
)}
