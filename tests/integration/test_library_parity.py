"""odc_core in a user's own loop does what an FSDP2 loop does, on 2 CPU ranks against one
process: optimizer parameter groups (no weight decay on norms and biases, a scaled learning
rate), mixed-precision policies, and model and optimizer state dicts, full and sharded, that
move between the engines."""

from __future__ import annotations

import copy
from datetime import timedelta
from functools import partial
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from odc_bench.run.ranks import run_ranks
from odc_core import engine_context, make_engine

pytestmark = pytest.mark.slow

STEPS, LR, EPS, DECAY = 3, 0.05, 1e-4, 0.1


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(self.norm(x)))


class Net(nn.Module):
    """Two blocks and a head: 2 ranks' flat shards cut a unit between a weight and the norm and
    bias after it, so one rank's shard holds parameters of two groups."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x).square().sum()


def groups(name: str, p: nn.Parameter) -> dict[str, Any]:
    """The usual recipe: no weight decay on norms and biases; here also half the head's rate."""
    if p.dim() < 2:
        return {"weight_decay": 0.0}
    return {"lr_scale": 0.5} if name.startswith("head") else {}


def _inputs(step: int, rank: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    return [torch.randn(3, 8, generator=g) for _ in range(2)]


def _loop(rank: int, world: int, store: dist.Store, engine_name: str, grouped: bool) -> dict:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank, world_size=world,
                            timeout=timedelta(seconds=30))
    torch.manual_seed(0)
    model = Net()
    engine = make_engine(engine_name, engine_context(timeout_s=20.0))
    try:
        engine.wrap(model, [*model.blocks, model.head])
        engine.configure_optimizer(partial(torch.optim.AdamW, lr=LR, eps=EPS, weight_decay=DECAY),
                                   param_groups=groups if grouped else None)
        for step in range(STEPS):
            engine.begin_minibatch()
            for x in _inputs(step, rank):
                (model(x) * engine.loss_scale).backward()
            engine.finish_minibatch()
        return {"params": engine.full_parameters(),
                "groups": [{k: v for k, v in g.items() if k != "params"} for g in engine.optimizer.param_groups]}
    finally:
        engine.close()
        dist.destroy_process_group()


def _reference(grouped: bool) -> dict[str, torch.Tensor]:
    """One process over every rank's microbatches, torch-style groups built by hand."""
    torch.manual_seed(0)
    model = copy.deepcopy(Net())
    named = list(model.named_parameters())
    if grouped:
        params: list[Any] = [
            {"params": [p for n, p in named if p.dim() >= 2 and not n.startswith("head")]},
            {"params": [p for _, p in named if p.dim() < 2], "weight_decay": 0.0},
            {"params": [p for n, p in named if p.dim() >= 2 and n.startswith("head")], "lr": LR * 0.5},
        ]
    else:
        params = [p for _, p in named]
    opt = torch.optim.AdamW(params, lr=LR, eps=EPS, weight_decay=DECAY)
    for step in range(STEPS):
        for rank in range(2):
            for x in _inputs(step, rank):
                model(x).backward()
        opt.step()
        opt.zero_grad()
    return {n: p.detach().clone() for n, p in named}


def test_parameter_groups_train_alike_on_odc_fsdp2_and_one_process():
    reference, ungrouped = _reference(grouped=True), _reference(grouped=False)
    # The groups change the result, so agreeing with the grouped reference shows they were applied.
    assert max((reference[n] - ungrouped[n]).abs().max().item() for n in reference) > 1e-3
    for name in ("odc", "collective"):
        ranks = run_ranks(_loop, 2, name, True, timeout_s=90)
        for n, p in reference.items():
            torch.testing.assert_close(ranks[0]["params"][n], p, rtol=1e-5, atol=1e-6, msg=f"{name}: {n}")
        # Groups in the order of their first parameter (a norm's first); lr_scale applied to the learning rate.
        lrs = [g["lr"] for g in ranks[0]["groups"]]
        decays = [g["weight_decay"] for g in ranks[0]["groups"]]
        assert lrs == pytest.approx([LR, LR, LR * 0.5]) and decays == [0.0, DECAY, DECAY], name
