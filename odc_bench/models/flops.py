"""Floating-point operations of the decoder (any family of config/model.py) on packed microbatches.

Shared by the `flops` cost model and the simulator so both count the same work. Counts are
multiply-adds x 2. Attention is causal and per document: a document of length s costs
2 * s^2 * (heads * head_dim) for QK^T and the same for AV, halved by the causal mask.
Backward is counted as twice forward.
"""

from __future__ import annotations

from collections.abc import Sequence

from odc_bench.config.model import ModelConfig
from odc_bench.sums import left_sum


def layer_linear_params(cfg: ModelConfig) -> int:
    """Weights of one decoder layer's matrix multiplies (biases and norms are negligible)."""
    d, q, kv = cfg.hidden_size, cfg.attention_width, cfg.num_kv_heads * cfg.head_size
    attn = d * q + 2 * d * kv + q * d
    mlp = (3 if cfg.arch.gated_mlp else 2) * d * cfg.intermediate_size
    return attn + mlp


def layer_forward_flops(cfg: ModelConfig, doc_lens: Sequence[int]) -> float:
    tokens = sum(doc_lens)
    linear = 2.0 * layer_linear_params(cfg) * tokens
    attention = left_sum(2.0 * s * s * cfg.attention_width for s in doc_lens)  # (QK + AV) x causal half
    return linear + attention


def head_forward_flops(cfg: ModelConfig, doc_lens: Sequence[int]) -> float:
    return 2.0 * cfg.hidden_size * cfg.vocab_size * sum(doc_lens)


def train_flops(cfg: ModelConfig, doc_lens: Sequence[int]) -> float:
    """Forward plus backward of the whole model on one packed microbatch."""
    forward = cfg.num_layers * layer_forward_flops(cfg, doc_lens) + head_forward_flops(cfg, doc_lens)
    return 3.0 * forward
