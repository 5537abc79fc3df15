"""The calibration model zoo: plain ``torch.nn`` versions of the models trainsim ships workloads for.

torchvision is not installable everywhere we calibrate, so the models are written out here, with the
structure (and so the parameter counts) of torchvision's, and with the layer granularity the workload
format uses: one layer per leaf ``nn.Module`` invocation, named by its qualified module name, in forward
order. Functional glue between modules (residual add, flatten, concat) is not a layer.

Deliberate differences from torchvision (parameter counts are unaffected):
- every ReLU is its own module and none is ``inplace``: a module used twice would be two layers with one
  name, and an in-place op on the output of a module that carries a full backward hook raises in autograd;
- ``Dropout`` always runs ``torch.native_dropout`` in training, which keeps a 1-byte bool mask on every
  device (``nn.Dropout`` keeps a 4-byte float mask on the CPU and a bool mask on CUDA), so the saved bytes
  of a workload do not depend on where it was described;
- GPT attention is one leaf module (``attn.core``): nanoGPT's math ("slow") path, so that c_attn, core and
  c_proj are three layers.

It stays one module: a catalogue of short model classes that share their building blocks; a file per
model would add imports and nothing else.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from trainsim.errors import TrainsimError, unknown_name
from trainsim.sim.compute import analytic_models


class Dropout(nn.Dropout):
    """nn.Dropout that keeps a bool mask for backward on every device (see the module docstring)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        return torch.native_dropout(x, self.p, True)[0]


# ---------------------------------------------------------------- image models


class TinyCNN(nn.Module):
    """A two-conv CNN on 3x32x32 inputs, for fast tests."""

    def __init__(self, num_classes: int = 10, image_size: int = 32):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.relu1 = nn.ReLU()
        self.pool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.relu2 = nn.ReLU()
        self.pool2 = nn.MaxPool2d(2)
        self.fc = nn.Linear(32 * (image_size // 4) ** 2, num_classes)

    def forward(self, x):
        x = self.pool1(self.relu1(self.conv1(x)))
        x = self.pool2(self.relu2(self.conv2(x)))
        return self.fc(torch.flatten(x, 1))


class AlexNet(nn.Module):
    """torchvision's AlexNet (61,100,840 parameters at 1000 classes, whatever the image size)."""

    def __init__(self, num_classes: int = 1000, dropout: float = 0.5):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, kernel_size=11, stride=4, padding=2), nn.ReLU(),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(64, 192, kernel_size=5, padding=2), nn.ReLU(),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(192, 384, kernel_size=3, padding=1), nn.ReLU(),
            nn.Conv2d(384, 256, kernel_size=3, padding=1), nn.ReLU(),
            nn.Conv2d(256, 256, kernel_size=3, padding=1), nn.ReLU(),
            nn.MaxPool2d(kernel_size=3, stride=2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            Dropout(p=dropout), nn.Linear(256 * 6 * 6, 4096), nn.ReLU(),
            Dropout(p=dropout), nn.Linear(4096, 4096), nn.ReLU(),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x):
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


_VGG16_CFG = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]


class VGG16(nn.Module):
    """torchvision's vgg16 without batch norm (138,357,544 parameters at 1000 classes)."""

    def __init__(self, num_classes: int = 1000, dropout: float = 0.5):
        super().__init__()
        layers: list[nn.Module] = []
        in_c = 3
        for v in _VGG16_CFG:
            if v == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            else:
                layers += [nn.Conv2d(in_c, v, kernel_size=3, padding=1), nn.ReLU()]
                in_c = v
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096), nn.ReLU(), Dropout(p=dropout),
            nn.Linear(4096, 4096), nn.ReLU(), Dropout(p=dropout),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x):
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


def _conv3x3(in_c: int, out_c: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_c, out_c, kernel_size=3, stride=stride, padding=1, bias=False)


def _conv1x1(in_c: int, out_c: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_c, out_c, kernel_size=1, stride=stride, bias=False)


def _downsample(in_c: int, out_c: int, stride: int) -> nn.Module | None:
    if stride == 1 and in_c == out_c:
        return None
    return nn.Sequential(_conv1x1(in_c, out_c, stride), nn.BatchNorm2d(out_c))


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_c: int, width: int, stride: int = 1):
        super().__init__()
        self.conv1 = _conv3x3(in_c, width, stride)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu1 = nn.ReLU()
        self.conv2 = _conv3x3(width, width)
        self.bn2 = nn.BatchNorm2d(width)
        self.downsample = _downsample(in_c, width, stride)
        self.relu2 = nn.ReLU()

    def forward(self, x):
        out = self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x)))))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu2(out + identity)


class Bottleneck(nn.Module):
    """torchvision's v1.5 bottleneck (stride on the 3x3 conv)."""

    expansion = 4

    def __init__(self, in_c: int, width: int, stride: int = 1):
        super().__init__()
        out_c = width * self.expansion
        self.conv1 = _conv1x1(in_c, width)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu1 = nn.ReLU()
        self.conv2 = _conv3x3(width, width, stride)
        self.bn2 = nn.BatchNorm2d(width)
        self.relu2 = nn.ReLU()
        self.conv3 = _conv1x1(width, out_c)
        self.bn3 = nn.BatchNorm2d(out_c)
        self.downsample = _downsample(in_c, out_c, stride)
        self.relu3 = nn.ReLU()

    def forward(self, x):
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.relu2(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu3(out + identity)


class ResNet(nn.Module):
    """torchvision's ResNet, with one ReLU module per use (see the module docstring)."""

    def __init__(self, block: type[BasicBlock | Bottleneck], blocks: list[int], num_classes: int = 1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        in_c = 64
        for i, (width, n) in enumerate(zip((64, 128, 256, 512), blocks, strict=True)):
            stage = []
            for j in range(n):
                stage.append(block(in_c, width, stride=2 if (j == 0 and i > 0) else 1))
                in_c = width * block.expansion
            setattr(self, f"layer{i + 1}", nn.Sequential(*stage))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(in_c, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class BasicConv2d(nn.Module):
    """GoogLeNet's conv (no bias) + batch norm (eps 0.001) + ReLU, each its own layer."""

    def __init__(self, in_c: int, out_c: int, **conv_kwargs):
        super().__init__()
        self.conv = nn.Conv2d(in_c, out_c, bias=False, **conv_kwargs)
        self.bn = nn.BatchNorm2d(out_c, eps=0.001)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.bn(self.conv(x)))


class Inception(nn.Module):
    def __init__(self, in_c, ch1x1, ch3x3red, ch3x3, ch5x5red, ch5x5, pool_proj):
        super().__init__()
        self.branch1 = BasicConv2d(in_c, ch1x1, kernel_size=1)
        self.branch2 = nn.Sequential(BasicConv2d(in_c, ch3x3red, kernel_size=1),
                                     BasicConv2d(ch3x3red, ch3x3, kernel_size=3, padding=1))
        # torchvision's "5x5" branch really uses a 3x3 kernel (a known quirk kept for weight compatibility).
        self.branch3 = nn.Sequential(BasicConv2d(in_c, ch5x5red, kernel_size=1),
                                     BasicConv2d(ch5x5red, ch5x5, kernel_size=3, padding=1))
        self.branch4 = nn.Sequential(nn.MaxPool2d(kernel_size=3, stride=1, padding=1, ceil_mode=True),
                                     BasicConv2d(in_c, pool_proj, kernel_size=1))

    def forward(self, x):
        return torch.cat([self.branch1(x), self.branch2(x), self.branch3(x), self.branch4(x)], 1)


class GoogLeNet(nn.Module):
    """torchvision's GoogLeNet without aux classifiers or transform_input (6,624,904 parameters)."""

    def __init__(self, num_classes: int = 1000, dropout: float = 0.2):
        super().__init__()
        self.conv1 = BasicConv2d(3, 64, kernel_size=7, stride=2, padding=3)
        self.maxpool1 = nn.MaxPool2d(3, stride=2, ceil_mode=True)
        self.conv2 = BasicConv2d(64, 64, kernel_size=1)
        self.conv3 = BasicConv2d(64, 192, kernel_size=3, padding=1)
        self.maxpool2 = nn.MaxPool2d(3, stride=2, ceil_mode=True)
        self.inception3a = Inception(192, 64, 96, 128, 16, 32, 32)
        self.inception3b = Inception(256, 128, 128, 192, 32, 96, 64)
        self.maxpool3 = nn.MaxPool2d(3, stride=2, ceil_mode=True)
        self.inception4a = Inception(480, 192, 96, 208, 16, 48, 64)
        self.inception4b = Inception(512, 160, 112, 224, 24, 64, 64)
        self.inception4c = Inception(512, 128, 128, 256, 24, 64, 64)
        self.inception4d = Inception(512, 112, 144, 288, 32, 64, 64)
        self.inception4e = Inception(528, 256, 160, 320, 32, 128, 128)
        self.maxpool4 = nn.MaxPool2d(2, stride=2, ceil_mode=True)
        self.inception5a = Inception(832, 256, 160, 320, 32, 128, 128)
        self.inception5b = Inception(832, 384, 192, 384, 48, 128, 128)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.dropout = Dropout(p=dropout)
        self.fc = nn.Linear(1024, num_classes)

    def forward(self, x):
        x = self.maxpool1(self.conv1(x))
        x = self.maxpool2(self.conv3(self.conv2(x)))
        x = self.maxpool3(self.inception3b(self.inception3a(x)))
        for name in ("inception4a", "inception4b", "inception4c", "inception4d", "inception4e"):
            x = getattr(self, name)(x)
        x = self.inception5b(self.inception5a(self.maxpool4(x)))
        return self.fc(self.dropout(torch.flatten(self.avgpool(x), 1)))


# ---------------------------------------------------------------- GPT


@dataclass
class GPTConfig(analytic_models.GPTConfig):
    """nanoGPT's configuration: the analytic model's shape (defaults GPT-2 small, 124,439,808 parameters
    with a tied lm_head), plus the dropout that only a built module has."""

    dropout: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        if not 0.0 <= self.dropout < 1.0:
            raise TrainsimError("must be in [0, 1)", field="dropout")


class CausalAttentionCore(nn.Module):
    """nanoGPT's "slow" attention on a (B, T, 3C) qkv tensor, returning (B, T, C):
    softmax(mask(q k^T / sqrt(d))) v, written exactly as nanoGPT writes it (no dropout).

    What autograd keeps (torch is the judge; the analytic generator follows it): contiguous copies of q, k
    and v (``matmul`` must copy the strided head views into batches), the softmax output, and the bool
    causal mask ``bias == 0`` (once per batch).
    """

    def __init__(self, n_head: int, block_size: int):
        super().__init__()
        self.n_head = n_head
        tril = torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size)
        self.register_buffer("bias", tril, persistent=False)

    def forward(self, qkv: torch.Tensor) -> torch.Tensor:
        b, t, c3 = qkv.shape
        c = c3 // 3
        hs = c // self.n_head
        q, k, v = qkv.split(c, dim=2)
        q = q.view(b, t, self.n_head, hs).transpose(1, 2)
        k = k.view(b, t, self.n_head, hs).transpose(1, 2)
        v = v.view(b, t, self.n_head, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
        att = torch.softmax(att, dim=-1)
        y = att @ v
        return y.transpose(1, 2).contiguous().view(b, t, c)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.core = CausalAttentionCore(cfg.n_head, cfg.block_size)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        return self.c_proj(self.core(self.c_attn(x)))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT's GPT with nanoGPT's module names; lm_head shares wte's weight.

    Only the embedding dropout (``drop``) is a module: nanoGPT's residual dropouts are 0 in GPT-2 training
    and the workload format's layer list for GPT has no slot for them.
    """

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = Dropout(cfg.dropout)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight
        for m in self.modules():
            if isinstance(m, nn.Linear | nn.Embedding):
                nn.init.normal_(m.weight, std=0.02)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, idx):
        t = idx.shape[1]
        if t > self.config.block_size:
            raise TrainsimError(f"sequence length {t} exceeds block_size {self.config.block_size}",
                                field="block_size")
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


# ---------------------------------------------------------------- Llama


class Rotary(nn.Module):
    """RoPE on queries and keys (B, S, heads, head_dim), Hugging Face's rotate-half convention; cos and sin
    of every position are buffers (not parameters), so a context-parallel run can shard them with the
    sequence."""

    def __init__(self, head_dim: int, seq_len: int, theta: float = 500000.0):
        super().__init__()
        inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv)
        angles = torch.cat([angles, angles], dim=-1)  # (S, head_dim)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    @staticmethod
    def _rotate_half(x):
        a, b = x.chunk(2, dim=-1)
        return torch.cat([-b, a], dim=-1)

    def forward(self, q, k):
        s = q.shape[1]
        cos, sin = self.cos[:s, None, :], self.sin[:s, None, :]
        return q * cos + self._rotate_half(q) * sin, k * cos + self._rotate_half(k) * sin


class SdpaCore(nn.Module):
    """Causal scaled-dot-product attention (PyTorch's fused SDPA: flash on CPU and CUDA) of queries (B, S, H,
    d) over grouped keys and values (B, S, KV, d); returns (B, S, H x d). ``repeat_kv``: keys and values
    repeated to every query head first (context parallelism's ring shards only the plain kernels)."""

    repeat_kv = False

    def forward(self, q, k, v):
        b, s = q.shape[:2]
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if self.repeat_kv:
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=not self.repeat_kv)
        return y.transpose(1, 2).reshape(b, s, -1)


class SwiGLU(nn.Module):
    """``silu(gate) * up`` of the fused gate/up projection, whose features interleave gate and up (pairs):
    a contiguous split of the 2 x intermediate features over tensor-parallel ranks keeps pairs together."""

    def forward(self, gate_up):
        pairs = gate_up.unflatten(-1, (-1, 2))
        return nn.functional.silu(pairs[..., 0]) * pairs[..., 1]


class LlamaAttention(nn.Module):
    """Grouped-query attention with one fused projection whose output features are ordered by key/value
    group, [the group's H/KV query heads, its key, its value] per group (Megatron-LM's layout), so a
    contiguous split over tensor-parallel ranks gives each rank whole groups; head counts are read from the
    tensor, so the same forward runs on a rank's shard."""

    def __init__(self, cfg):
        super().__init__()
        self.head_dim = cfg.hidden_size // cfg.num_attention_heads
        self.group = cfg.num_attention_heads // cfg.kv_heads  # query heads per key/value head
        width = (cfg.num_attention_heads + 2 * cfg.kv_heads) * self.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, width, bias=False)
        self.rotary = Rotary(self.head_dim, cfg.seq_len)
        self.core = SdpaCore()
        self.o_proj = nn.Linear(cfg.num_attention_heads * self.head_dim, cfg.hidden_size, bias=False)

    def forward(self, x):
        qkv = self.qkv_proj(x)
        b, s = qkv.shape[:2]
        grouped = qkv.view(b, s, -1, self.group + 2, self.head_dim)
        q = grouped[:, :, :, :self.group].reshape(b, s, -1, self.head_dim)
        k, v = grouped[:, :, :, self.group], grouped[:, :, :, self.group + 1]
        q, k = self.rotary(q, k)
        return self.o_proj(self.core(q, k, v))


class LlamaMLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.act = SwiGLU()
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(self.act(self.gate_up_proj(x)))


class LlamaBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=1e-5)
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, eps=1e-5)
        self.mlp = LlamaMLP(cfg)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaBlock(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=1e-5)

    def forward(self, idx):
        x = self.embed_tokens(idx)
        for block in self.layers:
            x = block(x)
        return self.norm(x)


class Llama(nn.Module):
    """A Llama-style decoder (RMSNorm, SwiGLU, RoPE, grouped-query attention, untied LM head) of the shape a
    `TransformerConfig` gives, with the leaf modules the simulator's transformer workload names its layers by
    (sim/compute/transformers.py: ``model.embed_tokens``, ``model.layers.{i}.input_layernorm``,
    ``.self_attn.qkv_proj|rotary|core|o_proj``, ``.post_attention_layernorm``,
    ``.mlp.gate_up_proj|act|down_proj``, ``model.norm``, ``lm_head``), so a calibration's measured layers,
    the simulated workload and the executed model are the same layers."""

    def __init__(self, cfg):
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        for m in self.modules():
            if isinstance(m, nn.Linear | nn.Embedding):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx):
        return self.lm_head(self.model(idx))


#: llama-tiny: a Llama 3-style block small enough for CPU ranks (and for a GPU's quick checks)
LLAMA_TINY = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
              "intermediate_size": 688, "vocab_size": 4096, "seq_len": 128}


def llama_config(**options):
    """The `TransformerConfig` of a zoo Llama (its options are Hugging Face config keys); a config the zoo
    model cannot build is one line naming the field."""
    from trainsim.sim.compute.transformer_configs import TransformerConfig

    if options.get("dropout"):
        raise TrainsimError("the zoo's Llama has no dropout; give 0", field="dropout")
    cfg = TransformerConfig.from_options({}, **{k: v for k, v in options.items() if k != "dropout"})
    if cfg.hidden_size % cfg.num_attention_heads:
        raise TrainsimError(f"hidden_size {cfg.hidden_size} does not split into {cfg.num_attention_heads} "
                            "heads", field="hidden_size")
    if cfg.num_attention_heads % cfg.kv_heads:
        raise TrainsimError(f"{cfg.kv_heads} key/value heads do not divide {cfg.num_attention_heads} query "
                            "heads", field="num_key_value_heads")
    if (cfg.hidden_size // cfg.num_attention_heads) % 2:
        raise TrainsimError("RoPE needs an even head dimension", field="hidden_size")
    return cfg


def _llama(**options) -> Llama:
    return Llama(llama_config(**options))


# ---------------------------------------------------------------- registry


@dataclass(frozen=True)
class ModelSpec:
    """How to build one zoo model and what its input looks like."""

    build: Callable[..., nn.Module]
    kind: str  # "image" or "tokens"
    defaults: dict
    published_params: int  # at the defaults (torchvision / nanoGPT figures)


def _gpt(**cfg) -> GPT:
    return GPT(GPTConfig(**cfg))


def _image_only(fn):
    def build(image_size: int = 224, num_classes: int = 1000, **kw):
        return fn(num_classes=num_classes, **kw)
    return build


_MODELS: dict[str, ModelSpec] = {
    "tiny-cnn": ModelSpec(lambda image_size=32, num_classes=10: TinyCNN(num_classes, image_size), "image",
                          {"image_size": 32, "num_classes": 10}, 10 * 2048 + 10 + 448 + 4640),
    "alexnet": ModelSpec(_image_only(AlexNet), "image", {"image_size": 224, "num_classes": 1000}, 61_100_840),
    "vgg16": ModelSpec(_image_only(VGG16), "image", {"image_size": 224, "num_classes": 1000}, 138_357_544),
    "resnet18": ModelSpec(_image_only(lambda num_classes: ResNet(BasicBlock, [2, 2, 2, 2], num_classes)),
                          "image", {"image_size": 224, "num_classes": 1000}, 11_689_512),
    "resnet50": ModelSpec(_image_only(lambda num_classes: ResNet(Bottleneck, [3, 4, 6, 3], num_classes)),
                          "image", {"image_size": 224, "num_classes": 1000}, 25_557_032),
    "googlenet": ModelSpec(_image_only(GoogLeNet), "image", {"image_size": 224, "num_classes": 1000},
                           6_624_904),
    "gpt2-small": ModelSpec(_gpt, "tokens", {f: getattr(GPTConfig(), f) for f in
                                             ("n_layer", "n_head", "n_embd", "vocab_size", "block_size")},
                            124_439_808),
    # its own shape (no published model): the parameter count of these defaults, checked by the tests
    "llama-tiny": ModelSpec(_llama, "tokens", dict(LLAMA_TINY), 4_999_424),
}
_ALIASES = {"gpt": "gpt2-small", "gpt2": "gpt2-small", "tinycnn": "tiny-cnn"}


def list_models() -> list[str]:
    """The zoo's model names."""
    return list(_MODELS)


def canonical_name(name: str) -> str:
    """The zoo name for ``name`` (case-insensitive, a few aliases); unknown -> TrainsimError listing valid."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in _MODELS:
        raise unknown_name("model", name, _MODELS, field="model")
    return key


def model_spec(name: str) -> ModelSpec:
    return _MODELS[canonical_name(name)]


def model_config(name: str, **cfg) -> dict:
    """The defaults of ``name`` updated with ``cfg``; unknown keys -> TrainsimError naming the field."""
    spec = model_spec(name)
    extra = set(cfg) - set(spec.defaults) - ({"dropout"} if spec.kind == "tokens" else set())
    if extra:
        bad = sorted(extra)[0]
        raise TrainsimError(f"unknown option for model {canonical_name(name)!r}; valid: "
                            f"{', '.join(sorted(spec.defaults))}", field=bad)
    merged = {**spec.defaults, **{k: v for k, v in cfg.items() if v is not None}}
    if spec.kind == "image" and merged["image_size"] < 1:
        raise TrainsimError("must be a positive integer", field="image_size")
    if merged.get("num_classes", 1) < 1:
        raise TrainsimError("must be a positive integer", field="num_classes")
    return merged


def build_model(name: str, **cfg) -> nn.Module:
    """Build zoo model ``name`` (fp32, on the CPU, train mode) with options overriding its defaults.

    Image models take ``image_size`` and ``num_classes``; ``gpt2-small`` takes nanoGPT's ``n_layer``,
    ``n_head``, ``n_embd``, ``vocab_size``, ``block_size`` (and ``dropout``); ``llama-tiny`` Hugging Face
    config keys (``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``,
    ``intermediate_size``, ``vocab_size``, ``seq_len``).
    """
    spec = model_spec(name)
    model = spec.build(**model_config(name, **cfg))
    return model.train()


def sequence_length(config: dict) -> int:
    """Tokens per sample of a token model's merged config: nanoGPT's ``block_size`` or a Llama's
    ``seq_len``."""
    return config["block_size"] if "block_size" in config else config["seq_len"]


def input_shape(name: str, **cfg) -> list[int]:
    """Per-sample input shape: [3, H, W] for images, [tokens] for token models."""
    merged = model_config(name, **cfg)
    if model_spec(name).kind == "tokens":
        return [sequence_length(merged)]
    return [3, merged["image_size"], merged["image_size"]]


def example_batch(name: str, batch: int, device: str | torch.device = "cpu", *,
                  generator: torch.Generator | None = None, **cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """A synthetic (inputs, targets) batch for ``name``: normalised float images and class labels, or
    int64 tokens and next-token targets."""
    if batch < 1:
        raise TrainsimError(f"batch size must be >= 1, got {batch}", field="batch_sizes")
    spec = model_spec(name)
    merged = model_config(name, **cfg)
    device = torch.device(device)
    if device.type == "meta":  # shapes only: nothing to draw
        if spec.kind == "tokens":
            shape = (batch, sequence_length(merged))
            return (torch.zeros(shape, dtype=torch.long, device=device),
                    torch.zeros(shape, dtype=torch.long, device=device))
        s = merged["image_size"]
        return (torch.empty(batch, 3, s, s, device=device),
                torch.zeros(batch, dtype=torch.long, device=device))
    if spec.kind == "tokens":
        t, v = sequence_length(merged), merged["vocab_size"]
        tokens = torch.randint(0, v, (batch, t + 1), generator=generator)
        inputs, targets = tokens[:, :-1].clone(), tokens[:, 1:].clone()  # own storages
    else:
        s, c = merged["image_size"], merged["num_classes"]
        inputs = torch.randn(batch, 3, s, s, generator=generator)
        targets = torch.randint(0, c, (batch,), generator=generator)
    return inputs.to(device), targets.to(device)


def loss_fn(name: str, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over classes (images) or over every token position (GPT)."""
    return nn.functional.cross_entropy(output.reshape(-1, output.shape[-1]), targets.reshape(-1))


def count_params(model: nn.Module) -> int:
    """Distinct parameters (a tied weight counts once)."""
    return sum(p.numel() for p in model.parameters())
