"""Today's decoder-only transformers as per-layer workloads: Llama-style, GPT-style and mixture-of-experts.

`transformer_models` registers every preset of :mod:`trainsim.sim.compute.transformer_configs` (and the
generic ``transformer``) with the analytic generator, so ``trainsim workload generate llama3-8b --set
seq_len=4096``, a scenario's ``workload: {name: mixtral-8x7b, seq_len: 4096}`` and the shipped
``scenarios/workloads/<preset>.json`` (`workload show`, `workload times`) all come from here. The layers are
recorded by the analytic generator's builder (:mod:`trainsim.sim.compute.analytic_models`), so its
conventions hold: one sample is one sequence of ``seq_len`` tokens; FLOPs count matrix products only, a
multiply-add is 2 FLOPs, a linear layer's backward is twice its forward; traffic is compulsory (each tensor
read and written once), parameters excluded; saved activations are de-duplicated by storage; an fp32
workload carries its bytes under CUDA's 16-bit autocast too.

One layer per kernel group that a parallel layout splits in its own way (`LAYER_ROLES` says how), named as
Hugging Face's modules with the fused projections Megatron-LM and vLLM use::

    model.embed_tokens                       embedding (+ model.embed_positions: learned positions)
    model.layers.{i}.input_layernorm         rmsnorm | layernorm
                    .self_attn.qkv_proj      linear: hidden -> (heads + 2 x kv_heads) x head_dim
                    .self_attn.rotary        rope (elementwise on queries and keys)
                    .self_attn.core          flash_attention | attention (unfused)
                    .self_attn.o_proj        linear: heads x head_dim -> hidden
                    .post_attention_layernorm
                    .mlp.gate_up_proj        linear: hidden -> 2 x intermediate (SwiGLU's gate and up)
                    .mlp.act                 swiglu: silu(gate) x up | gelu (then .mlp.up_proj before it)
                    .mlp.down_proj           linear: intermediate -> hidden
    model.norm, lm_head                      final norm; linear to the vocabulary (tied: the embedding's)

A mixture-of-experts layer's MLP is ``mlp.gate`` (router), ``mlp.dispatch`` (tokens permuted to their
experts: where expert parallelism's all-to-all goes), ``mlp.experts.gate_up_proj|act|down_proj`` (every
expert's SwiGLU, as grouped GEMMs: kind ``expert_linear``), ``mlp.combine`` (back to token order, weighted
by the router) and ``mlp.shared_experts.*`` (dense). Multi-head latent attention (DeepSeek-V3) replaces
``qkv_proj`` by ``q_a_proj``, ``q_a_layernorm``, ``q_b_proj``, ``kv_a_proj_with_mqa``, ``kv_a_layernorm``
and ``kv_b_proj``.

How each kernel group is counted (S tokens per sample, H query heads, KV key/value heads, d_qk and d_v the
per-head dimensions, I the MLP's intermediate size, E experts, k experts per token):

- attention, flash (the default): FLOPs are 2 x (d_qk + d_v) per query-key pair and head forward; backward
  recomputes the scores and makes dV, dP, dQ, dK: 2 x (3 d_qk + 2 d_v) per pair (2.5x forward when d_qk =
  d_v, as PyTorch's FLOP counter has it). A causal mask keeps the pairs (i, j) with j <= i, S(S+1)/2 per
  head, and only those are counted (the kernels skip fully masked blocks); without it S^2. No S x S
  matrix is kept: it saves Q, K and V (K and V with KV heads only: grouped-query attention shrinks them),
  its output and the fp32 log-sum-exp per head and token;
- attention, unfused (``attention: unfused``, the math path ``softmax(mask(Q K^T / sqrt d)) V``): the full
  S^2 scores of each head are computed, masked or not (2 x (d_qk + d_v) per pair forward, twice that
  backward); K and V are repeated to H heads (repeat_interleave's copies, which it saves), and the softmax
  output (fp32 under autocast, with the second matmul's 16-bit copy) and the causal bool mask are kept;
- RoPE: elementwise on Q and K, no FLOPs; backward needs only cos and sin (kept once per batch);
- RMSNorm: as layer norm (its input and one fp32 statistic per token; fp32 under autocast), one weight;
- SwiGLU: one fused kernel ``silu(gate) * up`` that keeps gate and up (2I per token), no FLOPs;
- router: the hidden -> E GEMM, then softmax (or sigmoid) and top-k, which keep the fp32 scores and the
  int64 expert indices; dispatch and combine move ``slots`` token rows, where slots = k x S dropless, or
  capacity_factor x k x S when the experts are padded to their capacity; combine keeps the experts' outputs
  and the k fp32 weights per token. The experts compute ``slots`` token rows: their FLOPs count top-k
  experts' work per token (times the capacity factor), their parameters all E experts';
- cross-entropy: as every analytic workload, on the fp32 log-softmax of the logits (S x vocab per sample).

Not modelled: the dropout-free attention's RNG state, fused cross-entropy kernels (which keep no logits),
sliding-window attention, and the load imbalance of top-k routing (the experts' work here is the balanced
average; expert parallelism carries the imbalance as its own parameter).
"""

from __future__ import annotations

from trainsim.formats.workload import InputSpec

from .transformer_configs import PRESETS, TransformerConfig

INT64 = 8
FP32 = 4

#: how a parallel layout splits each layer, by the end of its name (`layer_role`):
#: vocab: by vocabulary rows (embedding, LM head); column: by output features (heads, intermediate);
#: heads: by attention heads (elementwise or attention work on column-split tensors); row: by input
#: features, its partial sums reduced (tensor parallelism's all-reduce, or reduce-scatter under sequence
#: parallelism); sequence: replicated under tensor parallelism, split by tokens under sequence parallelism;
#: replicated: the same work on every rank of a tensor-parallel group (the router, latent projections);
#: tokens: token permutations (expert parallelism's all-to-all sits after dispatch and before combine);
#: expert: split by experts under expert parallelism
LAYER_ROLES = {
    "embed_tokens": "vocab", "lm_head": "vocab", "embed_positions": "sequence",
    "input_layernorm": "sequence", "post_attention_layernorm": "sequence", "model.norm": "sequence",
    "embed_dropout": "sequence", "attn_dropout": "sequence", "mlp_dropout": "sequence",
    "qkv_proj": "column", "q_proj": "column", "q_b_proj": "column", "kv_b_proj": "column",
    "q_a_proj": "replicated", "q_a_layernorm": "replicated", "kv_a_proj_with_mqa": "replicated",
    "kv_a_layernorm": "replicated",
    "rotary": "heads", "core": "heads", "o_proj": "row",
    "up_proj": "column", "gate_up_proj": "column", "act": "column", "down_proj": "row",
    "gate": "replicated", "dispatch": "tokens", "combine": "tokens",
    "experts.gate_up_proj": "expert", "experts.act": "expert", "experts.down_proj": "expert",
}


def layer_role(name: str) -> str:
    """How a parallel layout splits the layer called ``name`` (see `LAYER_ROLES`)."""
    for suffix in sorted(LAYER_ROLES, key=len, reverse=True):  # experts.act before act
        if name == suffix or name.endswith("." + suffix):
            return LAYER_ROLES[suffix]
    raise KeyError(name)


# --- layers (on the analytic generator's builder) -----------------------------------------------------------

def rmsnorm(b, name, x):
    """RMSNorm: its input and one fp32 reciprocal RMS per token kept; one weight vector. Under autocast it
    runs in fp32 like layer norm (HF's LlamaRMSNorm computes in fp32; the residual stream is fp32 anyway)."""
    *lead, dim = x.shape
    rows = 1
    for size in lead:
        rows *= size
    stats = rows * FP32
    x = b._cast(x, b.fp32)
    out = b.tensor(x.shape, itemsize=b.fp32)
    b._record(name, "rmsnorm", params=dim, saved=b._save(x) + stats, packed=x.nbytes + stats,
              packed_fixed=dim * b.itemsize, out=out, mem_f=2 * x.nbytes + stats, mem_b=3 * x.nbytes + stats)
    return out


def norm(b, cfg: TransformerConfig, name, x):
    return rmsnorm(b, name, x) if cfg.norm == "rmsnorm" else b.layernorm(name, x)


def linear(b, name, x, out_features: int, cfg: TransformerConfig, tied: bool = False):
    return b.linear(name, x, out_features, bias=cfg.bias, tied=tied)


class _Rope:
    """cos and sin of every position: computed once per forward and shared by every layer's rotary."""

    def __init__(self):
        self.kept = False


def rope(b, name, cache: _Rope, cfg: TransformerConfig, *parts):
    """Rotary embeddings of query/key ``parts`` (each (S, heads x rope_dim)): new rotated tensors of the same
    type; backward needs only cos and sin, (S, rope_dim) fp32 each, kept once per batch."""
    seq = parts[0].shape[0]
    tables = 2 * seq * cfg.rope_dim * FP32
    outs = [b.tensor(p.shape, itemsize=p.itemsize) for p in parts]
    moved = sum(p.nbytes for p in parts)
    b._record(name, "rope", saved_fixed=0 if cache.kept else tables, packed_fixed=tables,
              out=_Sized(sum(o.nbytes for o in outs)), mem_f=2 * moved, mem_b=2 * moved)
    cache.kept = True
    return outs


class _Sized:
    """A layer output made of several tensors: only its bytes are recorded."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes


def attention_pairs(cfg: TransformerConfig) -> float:
    """Query-key pairs per head that the attention computes: S(S+1)/2 under a causal mask with the flash
    kernel (the kept pairs j <= i), S^2 otherwise (the unfused path computes the masked scores too)."""
    seq = cfg.seq_len
    if cfg.causal and cfg.attention == "flash":
        return seq * (seq + 1) / 2
    return float(seq * seq)


def attention_core(b, name, cfg: TransformerConfig, q, k, v):
    """Scaled dot-product attention of ``q`` (S, H x d_qk) over ``k`` (S, KV x d_qk) and ``v``
    (S, KV x d_v); returns (S, H x d_v). See the module docstring for what each path counts."""
    seq, heads = cfg.seq_len, cfg.num_attention_heads
    d_qk, d_v = cfg.qk_head_dim, cfg.v_dim
    pairs = heads * attention_pairs(cfg)
    flops_f = 2.0 * pairs * (d_qk + d_v)
    q, k, v = (b._cast(t, b.low) for t in (q, k, v))  # matmuls / SDPA: 16 bit under autocast
    out = b.tensor((seq, heads * d_v), itemsize=b.low)
    if cfg.attention == "flash":
        lse = heads * seq * FP32
        saved = b._save(q) + b._save(k) + b._save(v) + b._save(out) + lse
        tensors = q.nbytes + k.nbytes + v.nbytes + out.nbytes
        b._record(name, "flash_attention", saved=saved, packed=tensors + lse, out=out, flops_f=flops_f,
                  flops_b=2.0 * pairs * (3 * d_qk + 2 * d_v), mem_f=tensors + lse,
                  mem_b=2 * tensors + lse)
        return out
    # the math path: K and V repeated to every query head, full score matrices
    group = heads // cfg.kv_heads
    s = b.low
    k_rep, v_rep = k.nbytes * group, v.nbytes * group
    scores = heads * seq * seq
    probs = scores * b.fp32 + (scores * 2 if b.autocast else 0)  # fp32 softmax + the bmm's 16-bit copy
    saved = b._save(q) + k_rep + v_rep + probs
    inputs = q.nbytes + k_rep + v_rep
    b._record(name, "attention", saved=saved, saved_fixed=seq * seq if cfg.causal else 0,
              packed=inputs + scores * b.fp32 + scores * s, out=out, flops_f=flops_f, flops_b=2 * flops_f,
              mem_f=3 * (inputs + out.nbytes) + 8 * scores * s,
              mem_b=4 * (inputs + out.nbytes) + 11 * scores * s)
    return out


def swiglu(b, name, gate_up):
    """``silu(gate) * up`` as one fused kernel over the (rows, 2I) gate/up projection: keeps its input."""
    *lead, double = gate_up.shape
    out = b.tensor((*lead, double // 2), itemsize=gate_up.itemsize)
    b._record(name, "swiglu", saved=b._save(gate_up), packed=gate_up.nbytes, out=out,
              mem_f=gate_up.nbytes + out.nbytes, mem_b=out.nbytes + 2 * gate_up.nbytes)
    return out


def mlp(b, prefix, x, cfg: TransformerConfig, intermediate: int):
    """A dense MLP: SwiGLU (gate_up_proj, act, down_proj) or GELU (up_proj, act, down_proj)."""
    if cfg.mlp == "swiglu":
        y = linear(b, f"{prefix}.gate_up_proj", x, 2 * intermediate, cfg)
        y = swiglu(b, f"{prefix}.act", y)
    else:
        y = linear(b, f"{prefix}.up_proj", x, intermediate, cfg)
        y = b.gelu(f"{prefix}.act", y)
    return linear(b, f"{prefix}.down_proj", y, cfg.hidden_size, cfg)


def router(b, name, x, cfg: TransformerConfig):
    """The gate: hidden -> E logits (a GEMM, 16 bit under autocast), softmax/sigmoid scores (fp32), top-k.
    Keeps its input, the scores and the int64 indices; returns the k fp32 routing weights per token."""
    seq, dim = x.shape
    experts, top = cfg.num_local_experts, cfg.num_experts_per_tok
    x = b._cast(x, b.low)
    logits = seq * experts * b.low
    scores = seq * experts * FP32
    indices = seq * top * INT64
    out = b.tensor((seq, top), itemsize=FP32)
    flops = 2.0 * seq * dim * experts
    b._record(name, "router", params=dim * experts, saved=b._save(x) + scores + indices,
              packed=x.nbytes + scores + indices, packed_fixed=b._weight(name, dim * experts), out=out,
              flops_f=flops, flops_b=2 * flops,
              mem_f=x.nbytes + 2 * logits + 2 * scores + indices + out.nbytes,
              mem_b=2 * x.nbytes + 2 * logits + 3 * scores + out.nbytes)
    return out


def slots(cfg: TransformerConfig) -> int:
    """Token rows the experts compute per sample (see `TransformerConfig.routed_slots`)."""
    return round(cfg.seq_len * cfg.routed_slots)


def dispatch(b, name, x, cfg: TransformerConfig):
    """Tokens copied to their experts' slots (a gather by the sorted expert indices); backward scatters the
    gradients back, adding a token's k copies. Keeps the permutation (int64 per slot)."""
    rows = slots(cfg)
    out = b.tensor((rows, x.shape[1]), itemsize=x.itemsize)
    index = rows * INT64
    b._record(name, "moe_dispatch", saved=index, packed=index, out=out,
              mem_f=x.nbytes + out.nbytes + index, mem_b=out.nbytes + x.nbytes + index)
    return out


def expert_linear(b, name, x, out_features: int, cfg: TransformerConfig):
    """Every expert's linear as one grouped GEMM over the routed token rows; parameters of all experts."""
    rows, in_features = x.shape
    experts = cfg.num_local_experts
    x = b._cast(x, b.low)
    out = b.tensor((rows, out_features), itemsize=b.low)
    flops = 2.0 * rows * in_features * out_features
    weights = experts * in_features * out_features
    b._record(name, "expert_linear", params=weights, saved=b._save(x), packed=x.nbytes,
              packed_fixed=b._weight(name, weights), out=out, flops_f=flops, flops_b=2 * flops,
              mem_f=x.nbytes + out.nbytes, mem_b=2 * out.nbytes + 2 * x.nbytes)
    return out


def combine(b, name, y, weights, cfg: TransformerConfig):
    """The experts' rows back to token order, each token's k rows summed with its routing weights; keeps
    the rows and the weights (backward needs both)."""
    seq, dim = cfg.seq_len, cfg.hidden_size
    out = b.tensor((seq, dim), itemsize=y.itemsize)
    kept = b._save(y) + b._save(weights)
    b._record(name, "moe_combine", saved=kept, packed=y.nbytes + weights.nbytes, out=out,
              mem_f=y.nbytes + weights.nbytes + out.nbytes,
              mem_b=out.nbytes + 2 * y.nbytes + weights.nbytes + weights.nbytes)
    return out


def moe(b, prefix, x, cfg: TransformerConfig):
    """Router, dispatch, the routed experts' SwiGLU, combine, then the shared experts (dense)."""
    weights = router(b, f"{prefix}.gate", x, cfg)
    routed = dispatch(b, f"{prefix}.dispatch", x, cfg)
    y = expert_linear(b, f"{prefix}.experts.gate_up_proj", routed, 2 * cfg.expert_size, cfg)
    y = swiglu(b, f"{prefix}.experts.act", y)
    y = expert_linear(b, f"{prefix}.experts.down_proj", y, cfg.hidden_size, cfg)
    out = combine(b, f"{prefix}.combine", y, weights, cfg)
    if cfg.n_shared_experts:
        shared = mlp(b, f"{prefix}.shared_experts", x, cfg, cfg.n_shared_experts * cfg.expert_size)
        out = b.add(out, shared)
    return out


def _split(b, x, *widths):
    """Views of ``x``'s columns as separate tensors (the fused projection's q, k, v): each its own storage,
    as separate projections would make them."""
    seq = x.shape[0]
    return [b.tensor((seq, width), itemsize=x.itemsize) for width in widths]


def self_attention(b, prefix, x, cfg: TransformerConfig, rope_cache: _Rope):
    heads, kv, d_qk, d_v = cfg.num_attention_heads, cfg.kv_heads, cfg.qk_head_dim, cfg.v_dim
    if cfg.mla:
        if cfg.q_lora_rank:  # queries through their own low-rank latent
            q = linear(b, f"{prefix}.q_a_proj", x, cfg.q_lora_rank, cfg)
            q = rmsnorm(b, f"{prefix}.q_a_layernorm", q)
            q = linear(b, f"{prefix}.q_b_proj", q, heads * d_qk, cfg)
        else:
            q = linear(b, f"{prefix}.q_proj", x, heads * d_qk, cfg)
        q_nope, q_rot = _split(b, q, heads * cfg.qk_nope_head_dim, heads * cfg.qk_rope_head_dim)
        latent = linear(b, f"{prefix}.kv_a_proj_with_mqa", x, cfg.kv_lora_rank + cfg.qk_rope_head_dim, cfg)
        c_kv, k_rot = _split(b, latent, cfg.kv_lora_rank, cfg.qk_rope_head_dim)
        c_kv = rmsnorm(b, f"{prefix}.kv_a_layernorm", c_kv)
        kv_up = linear(b, f"{prefix}.kv_b_proj", c_kv, heads * (cfg.qk_nope_head_dim + d_v), cfg)
        k_nope, v = _split(b, kv_up, heads * cfg.qk_nope_head_dim, heads * d_v)
        q_rot, k_rot = rope(b, f"{prefix}.rotary", rope_cache, cfg, q_rot, k_rot)
        q = b.cat([q_nope, q_rot], dim=1)
        k_shared = b.tensor((cfg.seq_len, heads * cfg.qk_rope_head_dim), itemsize=k_rot.itemsize)
        k = b.cat([k_nope, k_shared], dim=1)  # the one rotated key part broadcast to every head
    else:
        qkv = linear(b, f"{prefix}.qkv_proj", x, (heads + 2 * kv) * d_qk, cfg)
        q, k, v = _split(b, qkv, heads * d_qk, kv * d_qk, kv * d_v)
        if cfg.position == "rope":
            q, k = rope(b, f"{prefix}.rotary", rope_cache, cfg, q, k)
    y = attention_core(b, f"{prefix}.core", cfg, q, k, v)
    return linear(b, f"{prefix}.o_proj", y, cfg.hidden_size, cfg)


def decoder(b, cfg: TransformerConfig) -> InputSpec:
    """The model's forward, layer by layer, on the analytic generator's builder ``b``."""
    seq, dim = cfg.seq_len, cfg.hidden_size
    idx = b.tensor((seq,), itemsize=INT64, requires_grad=False)
    x = b.embedding("model.embed_tokens", idx, cfg.vocab_size, dim)
    if cfg.position == "learned":
        pos = b.tensor((seq,), itemsize=INT64, requires_grad=False)
        b.embedding("model.embed_positions", pos, cfg.positions, dim, per_batch=True)
        x = b.add(x, x)
    if cfg.dropout:
        x = b.dropout("model.embed_dropout", x, cfg.dropout)
    rope_cache = _Rope()
    for i in range(cfg.num_hidden_layers):
        prefix = f"model.layers.{i}"
        y = norm(b, cfg, f"{prefix}.input_layernorm", x)
        y = self_attention(b, f"{prefix}.self_attn", y, cfg, rope_cache)
        if cfg.dropout:
            y = b.dropout(f"{prefix}.attn_dropout", y, cfg.dropout)
        x = b.add(x, y)
        y = norm(b, cfg, f"{prefix}.post_attention_layernorm", x)
        if cfg.moe_layer(i):
            y = moe(b, f"{prefix}.mlp", y, cfg)
        else:
            y = mlp(b, f"{prefix}.mlp", y, cfg, cfg.intermediate_size)
        if cfg.dropout:
            y = b.dropout(f"{prefix}.mlp_dropout", y, cfg.dropout)
        x = b.add(x, y)
    x = norm(b, cfg, "model.norm", x)
    b.linear("lm_head", x, cfg.vocab_size, bias=False, tied=cfg.tie_word_embeddings)
    return InputSpec(shape=[seq], dtype="int64", bytes_per_sample=seq * INT64)


def transformer_models() -> dict:
    """name -> (config factory, builder) for the analytic generator's registry: every preset."""
    return {name: (preset, decoder) for name, preset in PRESETS.items()}
