"""ODC's hooks on units that return tuples, as transformers decoder layers do, and both engines' on
units that return other types (odc_core/engine/outputs.py)."""

import copy
import dataclasses
import uuid
from functools import partial
from typing import NamedTuple

import pytest
import torch
from torch import nn
from torch.utils._pytree import register_pytree_node
from torch.utils.checkpoint import checkpoint

from odc_core.engine.base import EngineContext
from odc_core.engine.fsdp2 import _FSDP2_WALK
from odc_core.engine.odc import build
from odc_core.engine.odc.unit import Storage
from odc_core.engine.outputs import check_output
from odc_core.engine.registry import OdcOptions
from tests.helpers.reference import one_rank_engine, trains_like_one_process


class TupleLayer(nn.Module):
    """Returns (hidden, aux) with both carrying gradients, like a decoder layer with a cache."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.tanh(self.lin(x))
        return h, h.square().mean()


class Net(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.layers = nn.ModuleList(TupleLayer(width) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        aux = x.new_zeros(())
        for layer in self.layers:
            x, a = layer(x)
            aux = aux + a
        return x.sum() + aux


def test_units_returning_tuples_get_their_backward_hooks(one_rank_group):
    torch.manual_seed(0)
    model = Net()
    reference = copy.deepcopy(model)
    initial = model.layers[0].lin.weight.detach().clone()
    engine = build(EngineContext(torch.device("cpu"), one_rank_group, uuid.uuid4().hex[:8], 30.0, "fp32"),
                   OdcOptions(transport="shm", prefetch=False))
    try:
        engine.wrap(model, list(model.layers))
        # eps well above the gradients' fp32 rounding: a tiny eps would turn summation-order
        # noise in near-zero gradients into full-size steps and hide what the engine did.
        engine.configure_optimizer(partial(torch.optim.AdamW, lr=0.1, betas=(0.9, 0.999), eps=1e-3, weight_decay=0.0))
        x = torch.randn(4, 8, requires_grad=True)
        engine.begin_minibatch()
        model(x).backward()  # without the hooks on tuple outputs, no flat gradient exists to push into
        engine.finish_minibatch()
        got = engine.full_parameters()
    finally:
        engine.close()
    opt = torch.optim.AdamW(reference.parameters(), lr=0.1, betas=(0.9, 0.999), eps=1e-3, weight_decay=0.0)
    reference(x.detach().requires_grad_()).backward()
    opt.step()
    want = dict(reference.named_parameters())
    assert set(got) == set(want)
    for name, p in want.items():
        torch.testing.assert_close(got[name], p.detach(), rtol=1e-6, atol=1e-6)
    # The step moved the weights: the comparison is not of two untouched copies.
    assert not torch.allclose(got["layers.0.lin.weight"], initial)


class Checkpointed(Net):
    """Each layer called through torch.utils.checkpoint, as transformers' gradient checkpointing
    calls decoder layers: the unit's hooks fire again as its forward is recomputed in backward."""

    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        aux = x.new_zeros(())
        for layer in self.layers:
            x, a = checkpoint(layer, x, use_reentrant=self.reentrant)
            aux = aux + a
        return x.sum() + aux


def _odc(group_store, model: nn.Module):  # type: ignore[no-untyped-def]
    engine = build(EngineContext(torch.device("cpu"), group_store, uuid.uuid4().hex[:8], 30.0, "fp32"),
                   OdcOptions(transport="shm"))
    engine.wrap(model, list(model.layers))
    engine.configure_optimizer(partial(torch.optim.SGD, lr=0.1))
    return engine


@pytest.mark.parametrize("reentrant", [False, True])
def test_units_under_activation_checkpointing_train_as_in_one_process(one_rank_group, reentrant):
    torch.manual_seed(0)
    model = Checkpointed(reentrant)
    reference = copy.deepcopy(model)
    engine = _odc(one_rank_group, model)
    xs = [torch.randn(4, 8, requires_grad=True) for _ in range(2)]
    try:
        for x in xs:
            engine.begin_minibatch()
            model(x).backward()
            engine.finish_minibatch()
        got = engine.full_parameters()
    finally:
        engine.close()
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for x in xs:
        reference(x).backward()
        opt.step()
        opt.zero_grad()
    for name, p in reference.named_parameters():
        torch.testing.assert_close(got[name], p.detach(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("engine_name", ["odc", "collective"])
def test_a_second_backward_through_one_forward_trains_as_in_one_process(one_rank_group, engine_name):
    """The first backward (retain_graph=True) pushed the units' gradients and freed their
    parameters; a second one through the same forward gathers them again into the buffer autograd
    saved views of and pushes its own gradients, which the owners add, as .grad accumulates in one
    process (before: refused in one line, where FSDP2 ran it). A loss of the first layer's output
    alone reaches one unit's outputs and the other's inputs. A backward through a forward of a
    minibatch already finished is refused in one line on ODC."""
    torch.manual_seed(0)
    model = Net()
    reference = copy.deepcopy(model)
    engine = one_rank_engine(engine_name, one_rank_group)
    engine.wrap(model, list(model.layers))
    engine.configure_optimizer(partial(torch.optim.SGD, lr=0.1))
    xs = [torch.randn(4, 8, requires_grad=True) for _ in range(2)]

    def losses(net: Net, x: torch.Tensor) -> None:
        first, _ = net.layers[0](x)
        hidden, aux = net.layers[1](first)
        loss = hidden.sum() + aux
        loss.backward(retain_graph=True)
        loss.square().backward(retain_graph=True)
        first.square().mean().backward()

    try:
        for x in xs:
            engine.begin_minibatch()
            losses(model, x)
            engine.finish_minibatch()
        got = engine.full_parameters()
        if engine_name == "odc":
            engine.begin_minibatch()
            loss = model(xs[0])
            loss.backward(retain_graph=True)
            engine.finish_minibatch()
            engine.begin_minibatch()
            with pytest.raises(RuntimeError, match=r"^unit layers\.1 \(TupleLayer\): a gradient reached it after "
                                                    r"its backward was over \(a backward through a forward of a "
                                                    r"minibatch already finished, .* call backward before "
                                                    r"finish_minibatch\(\)"):
                loss.backward()
    finally:
        engine.close()
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for x in xs:
        losses(reference, x)
        opt.step()
        opt.zero_grad()
    for name, p in reference.named_parameters():
        torch.testing.assert_close(got[name], p.detach(), rtol=1e-6, atol=1e-6)


class Direct(Net):
    """Calls its layers' forward methods, which skips every module hook."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x, _ = layer.forward(x)
        return x.sum()


def test_a_unit_whose_forward_method_is_called_directly_is_named_in_the_error(one_rank_group):
    """Its parameters are placeholders outside the engine's hooks: the error names the unit and
    the call (before: `unit u1`, and a second backward or a parameter used elsewhere as the causes)."""
    model = Direct()
    engine = _odc(one_rank_group, model)
    try:
        engine.begin_minibatch()
        loss = model(torch.randn(4, 8, requires_grad=True))
        with pytest.raises(RuntimeError, match=r"^unit layers\.1 \(TupleLayer\): .* as when unit\.forward\(x\) is "
                                                r"called, which skips the engine's hooks, rather than unit\(x\)"):
            loss.backward()
    finally:
        engine.close()


@pytest.mark.usefixtures("cpu_compile")
@pytest.mark.slow
def test_compiled_units_keep_odcs_hooks_and_match_a_single_process(one_rank_group):
    """unit.compile() after wrap(): Dynamo runs the module hooks too (with graph breaks at the
    heap calls), and two steps still match eager single-process AdamW."""
    torch.manual_seed(0)
    model = Net()
    reference = copy.deepcopy(model)
    engine = build(EngineContext(torch.device("cpu"), one_rank_group, uuid.uuid4().hex[:8], 30.0, "fp32"),
                   OdcOptions(transport="shm", prefetch=False))
    x = torch.randn(4, 8, requires_grad=True)
    try:
        engine.wrap(model, list(model.layers))
        for layer in model.layers:
            layer.compile()
        torch._dynamo.utils.counters.clear()
        # eps as in the test above: the comparison measures the engine, not rounding noise.
        engine.configure_optimizer(partial(torch.optim.AdamW, lr=0.1, betas=(0.9, 0.999), eps=1e-3, weight_decay=0.0))
        for _ in range(2):
            engine.begin_minibatch()
            model(x).backward()
            engine.finish_minibatch()
        got = engine.full_parameters()
    finally:
        engine.close()
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0, "the units ran compiled"
    opt = torch.optim.AdamW(reference.parameters(), lr=0.1, betas=(0.9, 0.999), eps=1e-3, weight_decay=0.0)
    for _ in range(2):
        opt.zero_grad()
        reference(x).backward()
        opt.step()
    for name, p in reference.named_parameters():
        torch.testing.assert_close(got[name], p.detach(), rtol=1e-6, atol=1e-6)


@pytest.mark.usefixtures("cpu_compile")
@pytest.mark.slow
@pytest.mark.parametrize("engine_name", ["odc", "collective"])
def test_a_model_compiled_whole_after_wrap_trains_like_one_process(engine_name, one_rank_group):
    """torch.compile(model) after wrap(), as FSDP2 recipes compile: Dynamo traces into ODC's
    module hooks, breaking its graphs at the heap's calls (and warning of what it met there);
    the engines' hooks still run every time, in order."""
    torch.manual_seed(0)
    model = Net()
    reference = copy.deepcopy(model)
    engine = one_rank_engine(engine_name, one_rank_group)
    try:
        engine.wrap(model, list(model.layers))
        engine.configure_optimizer(partial(torch.optim.SGD, lr=0.1))
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        trains_like_one_process(engine, torch.compile(model), reference, [torch.randn(4, 8) for _ in range(3)])
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0, "the model ran compiled"
    finally:
        engine.close()


class Rooted(nn.Module):
    """Two units and a head no unit holds: the head falls to the root, the model itself."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.layers = nn.ModuleList(TupleLayer(width) for _ in range(2))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x, _ = layer(x)
        return self.head(x).sum()


def test_the_root_holds_what_no_unit_does_and_evaluation_reads_every_step(one_rank_group):
    torch.manual_seed(0)
    model = Rooted()
    reference = copy.deepcopy(model)
    engine = build(EngineContext(torch.device("cpu"), one_rank_group, uuid.uuid4().hex[:8], 30.0, "fp32"),
                   OdcOptions(transport="shm", prefetch=False))
    opt = torch.optim.AdamW(reference.parameters(), lr=0.1, eps=1e-3)
    x = torch.randn(4, 8)
    try:
        engine.wrap(model, list(model.layers))
        assert len(engine.units) == 3, "the head became a third unit: the root"
        engine.configure_optimizer(partial(torch.optim.AdamW, lr=0.1, eps=1e-3))
        for _ in range(2):
            engine.begin_minibatch()
            model(x).backward()
            engine.finish_minibatch()
            reference(x).backward()
            opt.step()
            opt.zero_grad()
            with torch.no_grad():  # evaluation between steps: every unit gathered afresh, then let go
                got, want = model(x), reference(x)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            assert all(unit.storage is Storage.SHARDED for unit in engine.units)
    finally:
        engine.close()


@dataclasses.dataclass
class Out:
    hidden: torch.Tensor


class Box:
    """An output type neither engine looks into."""

    def __init__(self, hidden: torch.Tensor) -> None:
        self.hidden = hidden


class Fields(dict):
    """A dict subclass torch's pytree was not told of."""


class Pair(NamedTuple):
    hidden: torch.Tensor
    steps: int


class Registered:
    """A type registered with torch's pytree: ODC looks into it, FSDP2 on torch 2.13 does not."""

    def __init__(self, hidden: torch.Tensor) -> None:
        self.hidden = hidden


register_pytree_node(Registered, lambda r: ([r.hidden], None), lambda children, _: Registered(children[0]))

WRAPS = {"dataclass": Out, "dict-subclass": lambda h: Fields(hidden=h), "namedtuple": lambda h: Pair(h, 1),
         "object": Box, "pytree-registered": Registered}


class Wrapping(nn.Module):
    def __init__(self, wrap, width: int = 8) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.lin, self.wrap = nn.Linear(width, width), wrap

    def forward(self, x: torch.Tensor) -> object:
        return self.wrap(torch.tanh(self.lin(x)))


class WrappingNet(nn.Module):
    def __init__(self, wrap) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.layers = nn.ModuleList(Wrapping(wrap) for _ in range(2))
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            out = layer(x)
            x = out["hidden"] if isinstance(out, dict) else out.hidden
        return self.head(x).sum()


@pytest.mark.parametrize("engine_name", ["odc", "collective"])
@pytest.mark.parametrize("kind", list(WRAPS))
def test_a_unit_output_the_engine_cannot_look_into_is_refused_at_its_forward_and_others_train(
        kind, engine_name, one_rank_group):
    """The engines hook the tensors in a unit's output to start its backward. An output type they
    do not look into hid them: ODC said a gradient came after the unit's backward (as if backward
    ran twice), FSDP2 hung across ranks or failed in a storage error inside backward."""
    torch.manual_seed(0)
    model = WrappingNet(WRAPS[kind])
    reference = copy.deepcopy(model)
    engine = one_rank_engine(engine_name, one_rank_group)
    x = torch.randn(4, 8)
    # FSDP2 looks where its torch's FSDP2 does (outputs.py): on torch 2.13 not into a pytree type.
    hidden_from = {"odc": {"object"}, "collective": {"object", "pytree-registered"} if _FSDP2_WALK == "containers"
                   else {"object", "dataclass", "dict-subclass"}}
    try:
        engine.wrap(model, list(model.layers))
        engine.configure_optimizer(partial(torch.optim.SGD, lr=0.1))
        if kind not in hidden_from[engine_name]:
            trains_like_one_process(engine, model, reference, [x])
            return
        engine.begin_minibatch()
        named = type(WRAPS[kind](x)).__qualname__  # the output's type: some wraps are lambdas that make it
        with pytest.raises(TypeError, match=rf"^the forward of layers\.0 \(Wrapping\) returned an object of type "
                                            rf"{named}, into which the engine does not look for the "
                                            rf"tensors that carry its gradient, .*; return them as a tensor, or in .*"):
            model(x)
    finally:
        engine.close()


def test_an_output_the_engine_cannot_look_into_is_refused_only_where_a_gradient_could_hide_in_it():
    hidden = torch.ones(2, requires_grad=True) * 2
    # Nothing in the unit carries a gradient (frozen, its input too): no backward to miss.
    assert check_output("u", Box(hidden), "both", lambda: False) == []
    # A cache object beside the hidden states: the hidden states start the backward.
    assert check_output("u", (hidden, Box(hidden)), "both", lambda: True) == [hidden]
    with pytest.raises(TypeError, match=r"^the forward of u returned an object of type Box inside a tuple, "):
        check_output("u", (hidden.detach(), Box(hidden), 3, None), "both", lambda: True)


class HalfFrozen(nn.Module):
    """A frozen weight applied first, a trainable one last (an adapter over a frozen base), the
    hidden states passed in a dict or a tuple: the trainable gradients are all in before the
    input's gradient has passed the frozen weight."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.base, self.adapter = nn.Linear(width, width), nn.Linear(width, width)
        self.base.requires_grad_(False)

    def forward(self, state: dict | tuple | Out) -> dict[str, torch.Tensor]:
        x = state["x"] if isinstance(state, dict) else state.hidden if isinstance(state, Out) else state[0]
        return {"x": self.adapter(torch.tanh(self.base(x)))}


class HalfFrozenNet(nn.Module):
    def __init__(self, boxed: str) -> None:
        super().__init__()
        self.embed, self.boxed = nn.Linear(8, 8), boxed
        self.layers = nn.ModuleList(HalfFrozen() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        state = {"x": self.embed(x)}
        for layer in self.layers:
            boxed = {"dict": state, "tuple": (state["x"], None), "dataclass": Out(state["x"])}[self.boxed]
            state = layer(boxed)
        return state["x"].square().sum()


@pytest.mark.parametrize("engine_name", ["odc", "collective"])
@pytest.mark.parametrize("boxed", ["dict", "tuple", "dataclass"])
def test_a_unit_whose_input_comes_in_a_container_keeps_its_weights_until_its_input_gradient_leaves(
        boxed, engine_name, one_rank_group):
    """ODC waited for the gradient of a unit's first tensor argument only: with the hidden states
    inside a dict or tuple it waited for none, pushed and freed the unit once the adapter's
    gradients were in, and the frozen weight's backward then read freed storage. A dataclass,
    which ODC takes as a unit's output, did the same as an input until inputs were found as
    outputs are."""
    torch.manual_seed(0)
    model = HalfFrozenNet(boxed)
    reference = copy.deepcopy(model)
    engine = one_rank_engine(engine_name, one_rank_group)
    try:
        engine.wrap(model, list(model.layers))
        engine.configure_optimizer(partial(torch.optim.SGD, lr=0.1))
        trains_like_one_process(engine, model, reference, [torch.randn(4, 8)] * 2)
    finally:
        engine.close()
