"""The decoder the ranks train, on packed variable-length microbatches: one pre-norm, rotary
decoder whose layers follow the model's family (config/model.py: q/k/v biases for Qwen2, a GELU
MLP for MPT).

Packed microbatches are one flat token stream holding several documents; positions restart
per document and attention never crosses a document boundary. Attention runs per document
(one causal SDPA call each), so its cost grows with the sum of squared document lengths,
like flash-attention's varlen kernel, instead of the square of the packed length.

The sharding units (`named_units`) are the embeddings, each decoder layer and the head (final
norm, LM head and the loss, so the loss's compute belongs to a unit). Engines and the
per-rank trace attach to the units from outside, through module hooks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from odc_bench.config.model import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_tables(position_ids: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32,
                                             device=position_ids.device) / head_dim))
    angles = position_ids.float()[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [T, H, D]; cos/sin: [T, D]
    return x * cos[:, None, :] + _rotate_half(x) * sin[:, None, :]


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, h, kv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
        bias = cfg.arch.qkv_bias
        self.q_proj = nn.Linear(cfg.hidden_size, h * d, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv * d, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv * d, bias=bias)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=False)

    def forward(self, x, cos, sin, doc_lens: list[int]) -> torch.Tensor:
        t, d = x.shape[0], self.cfg.head_dim
        q = apply_rope(self.q_proj(x).view(t, self.cfg.num_heads, d), cos, sin)
        k = apply_rope(self.k_proj(x).view(t, self.cfg.num_kv_heads, d), cos, sin)
        v = self.v_proj(x).view(t, self.cfg.num_kv_heads, d)
        outs = []
        for qd, kd, vd in zip(q.split(doc_lens), k.split(doc_lens), v.split(doc_lens), strict=True):
            o = F.scaled_dot_product_attention(
                qd.transpose(0, 1), kd.transpose(0, 1), vd.transpose(0, 1), is_causal=True, enable_gqa=True
            )
            outs.append(o.transpose(0, 1))
        return self.o_proj(torch.cat(outs).reshape(t, -1))


class GatedMLP(nn.Module):
    """SwiGLU (Qwen2, Llama)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class PlainMLP(nn.Module):
    """Up, GELU, down (MPT)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.mlp = GatedMLP(cfg) if cfg.arch.gated_mlp else PlainMLP(cfg)

    def forward(self, x, cos, sin, doc_lens: list[int]) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, doc_lens)
        return x + self.mlp(self.post_attention_layernorm(x))


class Embedding(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)


class Head(nn.Module):
    """Final norm, LM head and the summed token loss, so the loss's compute is timed too."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(self.norm(x)).float()
        return F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")


class DecoderModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = Embedding(cfg)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.head = Head(cfg)
        if cfg.tie_embeddings:
            self.head.lm_head.weight = self.embed.embed_tokens.weight

    def named_units(self) -> list[tuple[str, nn.Module]]:
        """The sharding units, in execution order, as the config lists them (ModelConfig.units)."""
        layers = iter(self.layers)
        return [(name, self.embed if kind == "embed" else self.head if kind == "head" else next(layers))
                for name, kind in self.cfg.units]

    def units(self) -> list[nn.Module]:
        return [module for _, module in self.named_units()]

    def forward(self, input_ids, position_ids, labels, doc_lens: list[int]) -> torch.Tensor:
        """Summed cross-entropy over the labelled tokens of a packed microbatch."""
        x = self.embed(input_ids)
        cos, sin = rope_tables(position_ids, self.cfg.head_dim, self.cfg.rope_theta, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, doc_lens)
        return self.head(x, labels)


def init_weights(model: DecoderModel, seed: int) -> None:
    """Deterministic initialisation, independent of construction order and device layout."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)


def build_model(cfg: ModelConfig, seed: int, device: torch.device) -> DecoderModel:
    """The model every rank starts from: the same weights for one seed on every rank."""
    model = DecoderModel(cfg)
    init_weights(model, seed)
    return model.to(device)


def count_parameters(cfg: ModelConfig) -> int:
    """Parameter count without allocating memory (the model is built on the meta device)."""
    with torch.device("meta"):
        model = DecoderModel(cfg)
    return sum(p.numel() for p in model.parameters())
