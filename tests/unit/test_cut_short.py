"""A backward cut short by an exception (an out-of-memory a loop catches to skip its microbatch):
ODC keeps the gradients it computed, as one process keeps its .grad, where before the next forward
took its unfinished units for a recomputation and finish_minibatch() failed in "backward finished
without pushing its gradients"; the collective engine refuses to go on, in one line, where FSDP2
was left mid-backward (on one rank the next call failed in "parameter 0.weight was replaced after
wrap()", on several its peers timed out in a reduce-scatter while it blamed a peer's close)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.helpers.reference import one_rank_engine


class _Fails(torch.autograd.Function):
    """The identity, whose backward raises while `armed`, as an allocation there would."""

    armed = False

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        if _Fails.armed:
            raise RuntimeError("CUDA out of memory (a stand-in)")
        return grad


class _Middle(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(_Fails.apply(self.lin(x)))


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), _Middle(), nn.Linear(4, 1))


def _train(model: nn.Module, begin, finish) -> None:  # type: ignore[no-untyped-def]
    """Three minibatches of two microbatches; the first microbatch of the second minibatch fails
    in its backward after the last unit's, and is skipped."""
    torch.manual_seed(5)
    for step in range(3):
        begin()
        for micro in range(2):
            loss = model(torch.randn(3, 4)).sum()
            _Fails.armed = (step, micro) == (1, 0)
            try:
                loss.backward()
            except RuntimeError as e:
                assert "a stand-in" in str(e)
            finally:
                _Fails.armed = False
        finish()


def test_odc_keeps_what_a_backward_cut_short_computed_as_one_process_does(one_rank_group):
    model, reference = _model(), _model()
    engine = one_rank_engine("odc", one_rank_group)
    try:
        engine.wrap(model, list(model))
        engine.configure_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))
        _train(model, engine.begin_minibatch, engine.finish_minibatch)
        engine.drain()
        got = engine.full_parameters()
    finally:
        engine.close()
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)

    def step() -> None:
        opt.step()
        opt.zero_grad()

    _train(reference, lambda: None, step)
    assert not torch.equal(got["2.weight"], _model()[2].weight.detach()), "it trained"
    for name, p in reference.named_parameters():
        torch.testing.assert_close(got[name], p.detach(), rtol=1e-6, atol=1e-6, msg=name)


def test_the_collective_engine_refuses_to_go_on_from_a_backward_cut_short(one_rank_group):
    model = _model()
    engine = one_rank_engine("collective", one_rank_group)
    try:
        engine.wrap(model, list(model))
        engine.configure_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))
        with pytest.raises(RuntimeError, match=r"^this rank's backward in minibatch 1 was cut short by an exception, "
                                               r"and FSDP2 cannot go on from it \(") as refused:
            _train(model, engine.begin_minibatch, engine.finish_minibatch)
        assert "use engine odc, which keeps the gradients such a backward computed" in str(refused.value)
        assert "\n" not in str(refused.value)
    finally:
        engine.close()
