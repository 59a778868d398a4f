"""Gradient hooks on parameters: ODC runs them as one process does; FSDP2 runs none of those on a
parameter fully_shard replaces, nor `register_hook` on its sharded ones (it sets their .grad after
its reduce-scatter), so the collective engine refuses them in one line, where a hook halving a
weight's gradient trained as without it."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tests.helpers.reference import one_rank_engine, trains_like_one_process


class _Squared(nn.Sequential):
    """Its output's mean square: a scalar to take backward from."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(x).pow(2).mean()


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return _Squared(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def _halved(p: nn.Parameter) -> None:
    p.register_hook(lambda grad: grad * 0.5)


@pytest.mark.parametrize("after_wrap", [False, True])
def test_odc_runs_a_parameters_gradient_hook_as_one_process(one_rank_group, after_wrap):
    model = _model()
    reference = copy.deepcopy(model)
    _halved(reference[0].weight)
    engine = one_rank_engine("odc", one_rank_group)
    try:
        if not after_wrap:
            _halved(model[0].weight)
        engine.wrap(model, [model[0], model[2]])
        if after_wrap:
            _halved(model[0].weight)
        engine.configure_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))
        torch.manual_seed(1)
        trains_like_one_process(engine, model, reference, [torch.randn(5, 4) for _ in range(3)])
    finally:
        engine.close()


def test_the_collective_engine_refuses_the_gradient_hooks_fsdp2_never_runs(one_rank_group):
    model = _model()
    _halved(model[0].weight)
    engine = one_rank_engine("collective", one_rank_group)
    try:
        with pytest.raises(ValueError, match=r"^parameter 0\.weight has a gradient hook \(register_hook\), which FSDP2 "
                                             r"never runs on a parameter fully_shard replaces"):
            engine.wrap(model, [model[0], model[2]])
    finally:
        engine.close()
    model, calls = _model(), []
    engine = one_rank_engine("collective", one_rank_group)
    try:
        engine.wrap(model, [model[0], model[2]])
        model[2].weight.register_post_accumulate_grad_hook(lambda p: calls.append(p.grad is not None))
        engine.configure_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))
        engine.begin_minibatch()
        model(torch.randn(3, 4)).sum().backward()
        engine.finish_minibatch()
        assert calls == [True], "FSDP2 runs a post-accumulate hook on its sharded parameter"
        _halved(model[0].weight)
        with pytest.raises(RuntimeError, match=r"^parameter 0\.weight has a gradient hook \(register_hook\), which "
                                               r"FSDP2 never runs on its sharded parameter"):
            engine.begin_minibatch()
    finally:
        engine.close()


MODULE_HOOKS = {
    "full backward": lambda m: m[2].register_full_backward_hook(lambda _m, grad_in, _out: (grad_in[0] * 2,)),
    "full backward pre": lambda m: m[2].register_full_backward_pre_hook(lambda _m, grad_out: (grad_out[0] * 0.5,)),
    "forward pre": lambda m: m[2].register_forward_pre_hook(lambda _m, args: (args[0] * 2,)),
    "forward": lambda m: m[0].register_forward_hook(lambda _m, _args, out: out * 3),
}


@pytest.mark.parametrize("engine_name", ["odc", "collective"])
@pytest.mark.parametrize("hook", MODULE_HOOKS)
def test_module_hooks_run_on_both_engines_as_in_one_process(one_rank_group, hook, engine_name):
    model = _model()
    reference = copy.deepcopy(model)
    for m in (model, reference):
        MODULE_HOOKS[hook](m)
    engine = one_rank_engine(engine_name, one_rank_group)
    try:
        engine.wrap(model, [model[0], model[2]])
        engine.configure_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))
        torch.manual_seed(1)
        trains_like_one_process(engine, model, reference, [torch.randn(5, 4) for _ in range(3)])
    finally:
        engine.close()
