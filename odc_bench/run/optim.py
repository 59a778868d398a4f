"""The optimizer the harness trains with: AdamW from the config, the same for every engine."""

from __future__ import annotations

import torch
from torch import nn

from odc_bench.config.run import OptimConfig
from odc_core.engine.base import OptimizerFactory


def adamw(o: OptimConfig) -> OptimizerFactory:
    """AdamW over whatever a rank steps. Fused: one kernel over all of a rank's shards, the
    fastest torch offers on CPU and CUDA, so that neither engine's speed is its optimizer's
    (docs/odc_engine.md, "The optimizer step")."""

    def build(params: list[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay, fused=True)

    return build
