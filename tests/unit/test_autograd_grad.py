"""Backward passes other than loss.backward() through wrapped units: torch.autograd.grad of an
input (adversarial training's perturbation), backward(inputs=...), torch.autograd.grad of the
parameters, and create_graph=True."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from torch import nn

from tests.helpers.reference import one_rank_engine, trains_like_one_process


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Linear(8, 8)
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
        self.head = nn.Linear(8, 2)
        self.seen: Callable[[torch.Tensor], None] | None = None  # a hook on the first layer's input

    def forward(self, x: torch.Tensor, delta: torch.Tensor | None = None,
                hidden: torch.Tensor | None = None) -> torch.Tensor:
        h = hidden if hidden is not None else self.emb(x) if delta is None else self.emb(x) + delta
        if self.seen is not None and h.requires_grad:
            h.register_hook(self.seen)
        for layer in self.layers:
            h = torch.tanh(layer(h))
        return self.head(h).pow(2).sum()


def _perturbed_by_a_leaf(m: nn.Module, x: torch.Tensor) -> None:
    """A gradient of the loss at the first layer's input, given as a leaf."""
    h = x.clone().requires_grad_(True)
    g, = torch.autograd.grad(m(x, hidden=h), h)
    m(x, 0.1 * g.sign()).backward()


def _perturbed_by_autograd_grad(m: nn.Module, x: torch.Tensor) -> None:
    xi = x.clone().requires_grad_(True)
    g, = torch.autograd.grad(m(xi), xi)
    m(x + 0.1 * g.sign()).backward()


def _perturbed_by_backward_inputs(m: nn.Module, x: torch.Tensor) -> None:
    xi = x.clone().requires_grad_(True)
    m(xi).backward(inputs=[xi])
    m(x + 0.1 * xi.grad.sign()).backward()


def _input_gradient_then_backward_through_the_same_forward(m: nn.Module, x: torch.Tensor) -> None:
    xi = x.clone().requires_grad_(True)
    loss = m(xi)
    torch.autograd.grad(loss, xi, retain_graph=True)
    loss.backward()


def _trained(engine_name: str | None, store, step: Callable[[nn.Module, torch.Tensor], None]) -> dict:
    torch.manual_seed(0)
    model, xs = _Net(), [torch.randn(4, 8) for _ in range(3)]
    if engine_name is None:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in xs:
            opt.zero_grad()
            step(model, x)
            opt.step()
        return {n: p.detach() for n, p in model.named_parameters()}
    engine = one_rank_engine(engine_name, store)
    try:
        engine.wrap(model, list(model.layers))
        engine.configure_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))
        for x in xs:
            engine.begin_minibatch()
            step(model, x)
            engine.finish_minibatch()
        engine.drain()
        return engine.full_parameters()
    finally:
        engine.close()


@pytest.mark.parametrize("engine_name", ["odc", "collective"])
@pytest.mark.parametrize("step", [_perturbed_by_a_leaf, _perturbed_by_autograd_grad, _perturbed_by_backward_inputs,
                                  _input_gradient_then_backward_through_the_same_forward])
def test_a_gradient_of_an_input_alone_leaves_the_parameters_gradients_as_in_one_process(one_rank_group, engine_name,
                                                                                         step):
    # ODC failed the first two in torch's "A leaf node was passed to _will_engine_execute_node".
    got, want = _trained(engine_name, one_rank_group, step), _trained(None, None, step)
    for name, p in want.items():
        torch.testing.assert_close(got[name], p, rtol=1e-6, atol=1e-6, msg=name)


def test_odc_frees_each_unit_as_a_gradient_of_the_input_passes_it(one_rank_group):
    # Before, every unit stayed gathered, its gradient buffer with it, to the pass's end.
    torch.manual_seed(0)
    model = _Net()
    engine = one_rank_engine("odc", one_rank_group)
    gathered: list[list[str]] = []
    model.seen = lambda _g: gathered.append([u.storage.name for u in engine.units])
    try:
        engine.wrap(model, list(model.layers))
        engine.configure_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))
        engine.begin_minibatch()
        x, delta = torch.randn(4, 8), torch.zeros(4, 8, requires_grad=True)
        torch.autograd.grad(model(x, delta), delta)
        model.seen = None
        model(x).backward()
        engine.finish_minibatch()
    finally:
        engine.close()
    # When the gradient reaches the first layer's input, the other two layers' backward is over.
    assert gathered[0][1:3] == ["SHARDED", "SHARDED"]


def test_odc_gives_torch_autograd_grad_the_parameters_gradients_and_refuses_one_set_by_hand(one_rank_group):
    torch.manual_seed(0)
    model, x = _Net(), torch.randn(4, 8)
    reference = copy.deepcopy(model)
    want = torch.autograd.grad(reference(x), list(reference.parameters()))
    engine = one_rank_engine("odc", one_rank_group)
    try:
        engine.wrap(model, list(model.layers))
        engine.configure_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))
        engine.begin_minibatch()
        params = list(model.parameters())
        got = torch.autograd.grad(model(x), params)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w)
        for p, g in zip(params, got, strict=True):
            p.grad = g  # as a loop that steps torch's optimizer from them would
        # Before, the step went on without them: the model did not train, without a word.
        with pytest.raises(RuntimeError, match=r"^parameter layers\.0\.weight holds a \.grad that no backward\(\) "
                                               r"gave it .*compute them with loss\.backward\(\)$"):
            engine.finish_minibatch()
    finally:
        engine.close()


def _backward_into_the_parameters(m: nn.Module, x: torch.Tensor) -> None:
    m(x).backward(inputs=list(m.parameters()))


def test_a_backward_into_model_parameters_trains_on_odc_and_is_refused_on_fsdp2(one_rank_group):
    got, want = _trained("odc", one_rank_group, _backward_into_the_parameters), _trained(None, None,
                                                                                         _backward_into_the_parameters)
    for name, p in want.items():
        torch.testing.assert_close(got[name], p, rtol=1e-6, atol=1e-6, msg=name)
    # FSDP2's model.parameters() are its shards, which the graph does not use: before, the step
    # found no gradient and the model did not train, without a word.
    with pytest.raises(RuntimeError, match=_NO_GRADIENT.format(1, "")):
        _trained("collective", one_rank_group, _backward_into_the_parameters)


_NO_GRADIENT = (r"^minibatch 0 ran {} microbatch{} but gave no parameter of the model a gradient, so its step "
                r"would change nothing: no backward\(\) reached the model's parameters \(call loss\.backward\(\) "
                r"for each microbatch; .*\), or FSDP2's set_requires_gradient_sync\(False\) was left on through the "
                r"last microbatch \(turn it back on before the minibatch's last backward\), or .*call backward\(\) "
                r"without inputs; engine odc takes them\)$")


@pytest.mark.parametrize("last", [True, False], ids=["back on for the last microbatch", "left off"])
def test_fsdp2_gradient_sync_off_trains_once_back_on_and_left_off_is_refused(one_rank_group, last):
    """set_requires_gradient_sync(False) on the wrapped model, as a ported FSDP2 loop sets it for
    all but a minibatch's last microbatch, accumulates as FSDP2 does; left off through the last
    one, no gradient was reduced and the step changed nothing, told as a backward(inputs=...)."""
    def with_sync(m: nn.Module, xs: list[torch.Tensor]) -> None:
        for i, x in enumerate(xs):
            if hasattr(m, "set_requires_gradient_sync"):  # the collective engine's model; one process has none
                m.set_requires_gradient_sync(last and i == len(xs) - 1)
            m(x).backward()

    torch.manual_seed(0)
    model, xs = _Net(), [[torch.randn(2, 8) for _ in range(3)] for _ in range(2)]
    reference = copy.deepcopy(model)
    engine = one_rank_engine("collective", one_rank_group)
    try:
        engine.wrap(model, [model.emb, *model.layers, model.head])
        engine.configure_optimizer(lambda params: torch.optim.SGD(params, lr=0.1))
        if not last:
            engine.begin_minibatch()
            with_sync(model, xs[0])
            with pytest.raises(RuntimeError, match=_NO_GRADIENT.format(3, "es")):
                engine.finish_minibatch()
            return
        for minibatch in xs:
            engine.begin_minibatch()
            with_sync(model, minibatch)
            engine.finish_minibatch()
        got = engine.full_parameters()
    finally:
        engine.close()
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for minibatch in xs:
        opt.zero_grad()
        with_sync(reference, minibatch)
        opt.step()
    for name, p in reference.named_parameters():
        torch.testing.assert_close(got[name], p.detach(), rtol=1e-6, atol=1e-6, msg=name)


@pytest.mark.parametrize("engine_name", ["odc", "collective"])
@pytest.mark.parametrize("how", ["penalty", "hessian"])
def test_a_backward_with_create_graph_is_refused_in_one_line(one_rank_group, engine_name, how):
    # Before, a gradient penalty failed in a storage error of the freed parameters on both, and
    # after backward(create_graph=True) ODC stepped without the gradients, without a word.
    torch.manual_seed(0)
    model = _Net()
    engine = one_rank_engine(engine_name, one_rank_group)
    try:
        engine.wrap(model, list(model.layers))
        engine.configure_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))
        engine.begin_minibatch()
        x = torch.randn(4, 8, requires_grad=True)
        with pytest.raises(RuntimeError, match=r"^a backward with create_graph=True \(a gradient penalty, a Hessian-"
                                               r"vector product\) reached the model .*or leave create_graph off$"):
            if how == "penalty":
                torch.autograd.grad(model(x), x, create_graph=True)
            else:
                model(x).backward(create_graph=True)
    finally:
        engine.close()


class _Squared(nn.Sequential):
    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(x).pow(2).sum()


class _Checkpointed(nn.Module):
    """A unit that recomputes its inside in a backward of its own (a reentrant checkpoint)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def _inside(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.b(torch.tanh(self.a(x))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.utils.checkpoint.checkpoint(self._inside, x, use_reentrant=True)


def test_odc_pushes_the_gradients_a_reentrant_checkpoint_inside_a_unit_accumulates(one_rank_group):
    # The backward outside does not reach the unit's parameters, which a backward of the
    # checkpoint's own accumulates: the unit's push waits for its input's gradient.
    torch.manual_seed(0)
    model = _Squared(nn.Linear(8, 8), _Checkpointed(), _Checkpointed(), nn.Linear(8, 1))
    reference = copy.deepcopy(model)
    engine = one_rank_engine("odc", one_rank_group)
    try:
        engine.wrap(model, [model[1], model[2]])
        engine.configure_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))
        trains_like_one_process(engine, model, reference, [torch.randn(4, 8) for _ in range(2)])
    finally:
        engine.close()


def test_functional_call_on_odc_computes_with_the_weights_it_is_given(one_rank_group):
    """torch.func.functional_call(model, weights, x) on the wrapped model (an EMA's weights, a
    meta-learning inner step): the output and the weights' gradients are those of a model holding
    them, and the engine's own parameters and step are left alone (the next minibatch steps as one
    process does from the same weights)."""
    torch.manual_seed(0)
    model, other = _Net(), _Net()
    weights = {n: p.detach().clone().requires_grad_() for n, p in other.named_parameters()}
    x = torch.randn(3, 8)
    want = torch.func.functional_call(other, weights, (x,))
    want_grads = torch.autograd.grad(want, list(weights.values()))
    engine = one_rank_engine("odc", one_rank_group)
    try:
        engine.wrap(model, [model.emb, *model.layers, model.head])
        engine.configure_optimizer(lambda params: torch.optim.SGD(params, lr=0.1))
        with torch.no_grad():
            torch.testing.assert_close(torch.func.functional_call(model, weights, (x,)), want)
        got = torch.func.functional_call(model, weights, (x,))  # between minibatches, as an evaluation
        got_grads = torch.autograd.grad(got, list(weights.values()))
        engine.begin_minibatch()
        model(x).backward()
        engine.finish_minibatch()  # the pass above added nothing to this step
        after = engine.full_parameters()
    finally:
        engine.close()
    torch.testing.assert_close(got, want)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w)
    torch.manual_seed(0)
    reference = _Net()
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    reference(x).backward()
    opt.step()
    for name, p in reference.named_parameters():
        torch.testing.assert_close(after[name], p.detach(), rtol=1e-6, atol=1e-6, msg=name)


_FORGOT = (r"^minibatch 0 ran a forward with gradients on this rank, but no backward\(\) reached the model's "
           r"parameters, so its step would apply only the optimizer's own terms \(weight decay, momentum\): call "
           r"loss\.backward\(\) for each microbatch, and run a forward for its outputs alone under torch\.no_grad\(\)$")


@pytest.mark.parametrize("how", ["forgot backward()", "an input's gradient alone"])
@pytest.mark.parametrize("engine_name", ["odc", "collective"])
def test_a_minibatch_no_backward_reached_the_parameters_in_is_refused(engine_name, how, one_rank_group):
    """A loop that forgot loss.backward() (or took only an input's gradient): ODC stepped on zero
    gradients, so AdamW's weight decay moved every parameter, without a word; the collective
    engine refused it as a backward(inputs=...) or a gradient sync left off."""
    torch.manual_seed(0)
    model = _Net()
    engine = one_rank_engine(engine_name, one_rank_group)
    try:
        engine.wrap(model, [model.emb, *model.layers, model.head])
        engine.configure_optimizer(lambda params: torch.optim.AdamW(params, lr=0.1, weight_decay=0.1))
        engine.begin_minibatch()
        x = torch.randn(3, 8)
        if how == "forgot backward()":
            model(x)
        else:
            h = x.clone().requires_grad_(True)
            torch.autograd.grad(model(x, hidden=h), h)
        with torch.no_grad():
            model(x)  # an evaluation alone is no training forward
        with pytest.raises(RuntimeError, match=_FORGOT if engine_name == "odc" else _NO_GRADIENT.format(1, "")):
            engine.finish_minibatch()
    finally:
        engine.close()


def test_an_odc_rank_whose_only_microbatch_failed_in_its_forward_still_steps(one_rank_group):
    """A loop that skips a microbatch whose forward ran out of memory: its outputs never carried a
    gradient, so the rank is not refused for the backward it never ran, and its step goes on."""
    torch.manual_seed(0)
    model = _Net()

    def fails(_grad: torch.Tensor) -> None:
        raise torch.OutOfMemoryError("CPU out of memory (a stand-in)")

    engine = one_rank_engine("odc", one_rank_group)
    try:
        engine.wrap(model, [model.emb, *model.layers, model.head])
        engine.configure_optimizer(lambda params: torch.optim.SGD(params, lr=0.1))
        before = engine.full_parameters()
        engine.begin_minibatch()
        handle = model.layers[1].register_forward_pre_hook(lambda _m, _args: fails(torch.zeros(())))
        with pytest.raises(torch.OutOfMemoryError):
            model(torch.randn(3, 8))
        handle.remove()
        engine.finish_minibatch()
        after = engine.full_parameters()
    finally:
        engine.close()
    assert all(torch.equal(before[n], after[n]) for n in before)
