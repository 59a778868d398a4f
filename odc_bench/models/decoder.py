"""The decoder the ranks train, on packed variable-length microbatches: one pre-norm, rotary
decoder whose layers follow the model's family (config/model.py: q/k/v biases for Qwen2, a GELU
MLP for MPT).

Packed microbatches are one flat token stream holding several documents; positions restart
per document and attention never crosses a document boundary (models/attention.py: one varlen
flash call per microbatch on CUDA, one SDPA call per document elsewhere), so its cost grows
with the sum of squared document lengths, not the square of the packed length.

The sharding units (`named_units`) are the embeddings, each decoder layer and the head (final
norm, LM head and the loss, so the loss's compute belongs to a unit). Engines and the
per-rank trace attach to the units from outside, through module hooks; activation
checkpointing (checkpointing.py) calls the layers it names through torch.utils.checkpoint, so
those hooks run again when backward recomputes a layer. Inside a layer, the
work before attention (norm, q/k/v, rotary) and after it (output projection, MLP, residuals)
are methods of their own: on CUDA `compile_dense` compiles them, leaving the attention call,
whose documents change every microbatch, outside the compiled code.

On CUDA (`build_model`'s `fused`) q/k/v are one projection and so are the gate and up
projections of a gated MLP, as Megatron-style trainers lay them out: one GEMM where there were
three (or two), forward and backward, which matters where the decoder is bound by kernel
launches. The fused weights start as the separate ones' rows stacked (the same values for a
seed), and parameters are then named `qkv_proj` and `gate_up_proj`; elsewhere the model keeps
the separate projections (and Hugging Face's names), so CPU runs and their numbers are unchanged.
Fusing by stacking the weights at every forward instead would keep the names, but hold a copy
of the stacked weights per layer until its backward. On CUDA the head's loss also runs a chunk
of tokens at a time (models/loss.py), as long-context trainers run it; on CPU it takes the
whole microbatch's logits, as it always has.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from odc_bench.config.model import ModelConfig
from odc_bench.models.attention import Documents, attend, kernel_for
from odc_bench.models.checkpointing import ContextFn, run_layer
from odc_bench.models.loss import IGNORE, LossAndGrad, chunked_cross_entropy, loss_and_grad
from odc_bench.models.memory import LOSS_CHUNK_TOKENS


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


def rope_tables(position_ids: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos and sin of every token's rotary angles, (tokens, head_dim); sin carries the sign of
    the rotation's first half, so that rotating is one flip of the halves (apply_rope)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32,
                                             device=position_ids.device) / head_dim))
    angles = position_ids.float()[:, None] * inv_freq[None, :]
    cos, sin = _cos_sin(angles)
    return torch.cat([cos, cos], dim=-1).to(dtype), torch.cat([-sin, sin], dim=-1).to(dtype)


def _cos_sin(angles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of `angles`, through numpy on the host: torch's CPU cos and sin go to MKL's
    vector math, whose first call in a process, split across threads, can be less accurate
    than every later call (docs/reliability.md, "One seed, one run"): a model's first forward
    would then differ from its others."""
    if angles.device.type != "cpu":
        return angles.cos(), angles.sin()
    a = angles.numpy()
    return torch.from_numpy(np.cos(a)), torch.from_numpy(np.sin(a))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (tokens, heads, head_dim); each half of a head rotated into the other: x cos + (x2, x1) sin."""
    t, h, d = x.shape
    swapped = x.view(t, h, 2, d // 2).flip(2).view(t, h, d)
    return x * cos[:, None, :] + swapped * sin[:, None, :]


class FusedLinear(nn.Linear):
    """Several projections of one input as one: their weights' rows stacked in `rows` order."""

    def __init__(self, in_features: int, rows: list[int], bias: bool) -> None:
        super().__init__(in_features, sum(rows), bias=bias)
        self.rows = rows

    def parts(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self(x).split(self.rows, dim=-1)


class Attention(nn.Module):
    """The projections around attention; the attention call itself is the layer's (attention.py)."""

    def __init__(self, cfg: ModelConfig, fused: bool = False) -> None:
        super().__init__()
        self.cfg = cfg
        d, h, kv = cfg.head_size, cfg.num_heads, cfg.num_kv_heads
        bias = cfg.arch.qkv_bias
        self.qkv_proj = FusedLinear(cfg.hidden_size, [h * d, kv * d, kv * d], bias) if fused else None
        if not fused:
            self.q_proj = nn.Linear(cfg.hidden_size, h * d, bias=bias)
            self.k_proj = nn.Linear(cfg.hidden_size, kv * d, bias=bias)
            self.v_proj = nn.Linear(cfg.hidden_size, kv * d, bias=bias)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=False)
        # One weight per head channel, shared by the heads (Qwen3).
        self.q_norm = RMSNorm(d, cfg.rms_eps) if cfg.arch.qk_norm else None
        self.k_norm = RMSNorm(d, cfg.rms_eps) if cfg.arch.qk_norm else None

    def project(self, x: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        t, d, h, kv = x.shape[0], self.cfg.head_size, self.cfg.num_heads, self.cfg.num_kv_heads
        if self.qkv_proj is not None:
            q, k, v = self.qkv_proj.parts(x)
            v = v.contiguous()  # a column slice of the fused output: the attention kernels get dense rows
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q, k = q.view(t, h, d), k.view(t, kv, d)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v.view(t, kv, d)


class GatedMLP(nn.Module):
    """SwiGLU (Qwen2, Llama)."""

    def __init__(self, cfg: ModelConfig, fused: bool = False) -> None:
        super().__init__()
        size = cfg.intermediate_size
        self.gate_up_proj = FusedLinear(cfg.hidden_size, [size, size], False) if fused else None
        if not fused:
            self.gate_proj = nn.Linear(cfg.hidden_size, size, bias=False)
            self.up_proj = nn.Linear(cfg.hidden_size, size, bias=False)
        self.down_proj = nn.Linear(size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is not None:
            gate, up = self.gate_up_proj.parts(x)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(F.silu(gate) * up)


class PlainMLP(nn.Module):
    """Up, GELU, down (MPT)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, fused: bool = False) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.self_attn = Attention(cfg, fused)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.mlp = GatedMLP(cfg, fused) if cfg.arch.gated_mlp else PlainMLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, docs: Documents) -> torch.Tensor:
        q, k, v = self.before_attention(x, cos, sin)
        return self.after_attention(x, attend(q, k, v, docs))

    def before_attention(self, x: torch.Tensor, cos: torch.Tensor,
                         sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.self_attn.project(self.input_layernorm(x), cos, sin)

    def after_attention(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn.o_proj(attended.flatten(1))
        return x + self.mlp(self.post_attention_layernorm(x))


class Embedding(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)


class Head(nn.Module):
    """Final norm, LM head and the summed token loss, so the loss's compute is timed too. With
    `loss_chunk` (on CUDA) the loss runs that many tokens at a time (loss.py); without it, as
    on CPU, over the whole microbatch's logits in fp32."""

    def __init__(self, cfg: ModelConfig, loss_chunk: int | None = None) -> None:
        super().__init__()
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.loss_chunk = loss_chunk
        self.chunk_math: LossAndGrad = loss_and_grad  # compile_dense compiles it on CUDA

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.loss_chunk is not None:
            return chunked_cross_entropy(self.norm(x), self.lm_head.weight, labels, self.loss_chunk, self.chunk_math)
        # Log-softmax in fp32: bf16 logits would round the loss to three digits.
        logits = self.lm_head(self.norm(x)).float()
        return F.cross_entropy(logits, labels, ignore_index=IGNORE, reduction="sum")


class DecoderModel(nn.Module):
    def __init__(self, cfg: ModelConfig, fused: bool = False, loss_chunk: int | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = Embedding(cfg)
        self.layers = nn.ModuleList(DecoderLayer(cfg, fused) for _ in range(cfg.num_layers))
        self.head = Head(cfg, loss_chunk)
        if cfg.tie_embeddings:
            self.head.lm_head.weight = self.embed.embed_tokens.weight
        # The attention kernels its forwards ran (attention.py), for the run's row.
        self.attention_kernels: set[str] = set()
        # Activation checkpointing: the layers (by index) called through checkpoint, each with
        # its context_fn (checkpointing.layer_contexts); none by default.
        self.checkpointed: dict[int, ContextFn] = {}

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
        cos, sin = rope_tables(position_ids, self.cfg.head_size, self.cfg.rope_theta, x.dtype)
        kernel = kernel_for(x, self.cfg.head_size)
        docs = Documents.of(doc_lens, x.device, kernel)
        self.attention_kernels.add(kernel)
        for i, layer in enumerate(self.layers):
            x = run_layer(layer, self.checkpointed.get(i), x, cos, sin, docs)
        return self.head(x, labels)


def compile_dense(model: DecoderModel) -> None:
    """torch.compile each layer's work before and after attention, and the loss's math on a
    chunk of logits: on CUDA the decoder is launch-bound without it (docs/gpu.md), and the loss
    would write fp32 copies of the logits. The units stay eager modules, so every engine's and
    the trace's hooks run as before; shapes are dynamic (every microbatch has its own token
    count), and a part that fails to compile runs eagerly.

    Inductor's mix-order reduction (an RMSNorm's backward: the row sums and the weight's column
    sums in one kernel) is fused only above a token count, a check that guards the compiled code
    on that count: each part compiled anew once per process when the microbatches cross it (the
    H200's logs, results/gpu/h200-2026-11-27). Its non-strict mode fuses at any size, with no
    guard: below the count the device's kernel may be slower, but there a layer is bound by the
    host, not the device (docs/gpu.md). Where this torch lacks the switch, its default stays."""
    torch._dynamo.config.suppress_errors = True
    triton_config = torch._inductor.config.triton
    options: dict[str, str | int | bool | Callable[..., Any]] = (
        {"triton.mix_order_reduction_non_strict_mode": True}
        if hasattr(triton_config, "mix_order_reduction_non_strict_mode") else {})
    for layer in cast(list[DecoderLayer], list(model.layers)):
        layer.before_attention = torch.compile(  # type: ignore[method-assign]
            layer.before_attention, dynamic=True, options=options)
        layer.after_attention = torch.compile(  # type: ignore[method-assign]
            layer.after_attention, dynamic=True, options=options)
    model.head.chunk_math = torch.compile(loss_and_grad, dynamic=True, options=options)


def init_weights(model: DecoderModel, seed: int) -> None:
    """Deterministic initialisation, independent of construction order and device layout; a
    fused projection's weight is drawn part by part, so it holds the separate projections' values.
    Drawn where the model lives, by that device's generator: a GPU model's weights are the same on
    every GPU rank and other values than a CPU model's. On the host, a 1.5B model's draw took
    most of a run's start on the GPU machine (docs/gpu.md)."""
    device = next(model.parameters()).device
    gen = torch.Generator(device).manual_seed(seed)
    rows = {f"{name}.weight": m.rows for name, m in model.named_modules() if isinstance(m, FusedLinear)}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                parts = [torch.randn((r, *p.shape[1:]), generator=gen, device=device)
                         for r in rows.get(name, [p.shape[0]])]
                p.copy_(torch.cat(parts) * 0.02)


def build_model(cfg: ModelConfig, seed: int, device: torch.device, fused: bool | None = None) -> DecoderModel:
    """The model every rank starts from: the same weights for one seed on every rank, built and
    drawn on `device`; its projections fused (see above) where `fused` says, by default on CUDA,
    and there its loss taken LOSS_CHUNK_TOKENS tokens at a time (loss.py: what the memory
    estimate counts)."""
    on_cuda = device.type == "cuda"
    with torch.device(device):
        model = DecoderModel(cfg, fused=on_cuda if fused is None else fused,
                             loss_chunk=LOSS_CHUNK_TOKENS if on_cuda else None)
    init_weights(model, seed)
    return model


def count_parameters(cfg: ModelConfig) -> int:
    """Parameter count without allocating memory (the model is built on the meta device)."""
    with torch.device("meta"):
        model = DecoderModel(cfg)
    return sum(p.numel() for p in model.parameters())
