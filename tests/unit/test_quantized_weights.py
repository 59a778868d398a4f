"""A frozen integer weight (a quantized base under LoRA): ODC's flat units hold floating-point
parameters only, so it is refused in one line that says what to do, where the refusal told the
user to load the model in float32; as a buffer it trains on ODC as in one process."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tests.helpers.reference import one_rank_engine, trains_like_one_process


class _Quantized(nn.Module):
    """A linear layer of int8 weights and a trainable scale per row."""

    def __init__(self, as_buffer: bool) -> None:
        super().__init__()
        weight = torch.randint(-8, 8, (8, 4), dtype=torch.int8)
        if as_buffer:
            self.register_buffer("qweight", weight)
        else:
            self.qweight = nn.Parameter(weight, requires_grad=False)
        self.scale = nn.Parameter(torch.ones(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ (self.qweight.float() * self.scale[:, None]).t()


class _Model(nn.Module):
    def __init__(self, as_buffer: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.quantized, self.head = _Quantized(as_buffer), nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.quantized(x))).pow(2).mean()


def test_odc_refuses_a_frozen_integer_parameter_and_trains_it_as_a_buffer(one_rank_group):
    engine = one_rank_engine("odc", one_rank_group)
    try:
        model = _Model(as_buffer=False)
        with pytest.raises(ValueError, match=r"^parameter quantized\.qweight is torch\.int8 \(1 of the model's are not "
                                             r"float32\): engine odc's units hold real floating-point parameters only "
                                             r"\(a quantized integer weight is not sharded yet\); register it as a "
                                             r"buffer"):
            engine.wrap(model, [model.quantized, model.head])
    finally:
        engine.close()
    model = _Model(as_buffer=True)
    reference = copy.deepcopy(model)
    engine = one_rank_engine("odc", one_rank_group)
    try:
        engine.wrap(model, [model.quantized, model.head])
        engine.configure_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))
        torch.manual_seed(1)
        trains_like_one_process(engine, model, reference, [torch.randn(5, 4) for _ in range(3)])
    finally:
        engine.close()
