"""torch's optimizers step a wrapped model as they step it in one process: ODC's over its flat
shards (each updates every element on its own), FSDP2's over its DTensors, where torch 2.13's
Rprop fails at its first step (docs/use_odc.md, "Optimizers")."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from torch import nn

from tests.helpers.reference import one_rank_engine

OPTIMIZERS = {
    "AdamW fused": functools.partial(torch.optim.AdamW, lr=0.01, fused=True),
    "AdamW for-loop": functools.partial(torch.optim.AdamW, lr=0.01, foreach=False),
    "Adam amsgrad maximize": functools.partial(torch.optim.Adam, lr=0.01, amsgrad=True, maximize=True),
    "SGD nesterov": functools.partial(torch.optim.SGD, lr=0.01, momentum=0.9, nesterov=True),
    "Adagrad": functools.partial(torch.optim.Adagrad, lr=0.01),
    "RMSprop centered": functools.partial(torch.optim.RMSprop, lr=0.01, centered=True, momentum=0.5),
    "NAdam decoupled": functools.partial(torch.optim.NAdam, lr=0.01, decoupled_weight_decay=True, weight_decay=0.1),
    "RAdam": functools.partial(torch.optim.RAdam, lr=0.01),
    "Adamax": functools.partial(torch.optim.Adamax, lr=0.01),
    "ASGD": functools.partial(torch.optim.ASGD, lr=0.01),
    "Adadelta": functools.partial(torch.optim.Adadelta, lr=1.0),
    "Rprop": functools.partial(torch.optim.Rprop, lr=0.01),
}


@pytest.mark.parametrize("engine_name", ["odc", "collective"])
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_an_optimizer_steps_a_wrapped_model_as_in_one_process(optimizer, engine_name, one_rank_group):
    if (optimizer, engine_name) == ("Rprop", "collective"):
        pytest.skip("FSDP2 (torch 2.13) fails at Rprop's first step: its index_put_ on a DTensor shard is refused")
    factory = OPTIMIZERS[optimizer]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    reference, reference_start = copy.deepcopy(model), copy.deepcopy(model)
    inputs = [torch.randn(5, 4) for _ in range(3)]
    engine = one_rank_engine(engine_name, one_rank_group)
    try:
        engine.wrap(model, [model[0], model[2]])
        engine.configure_optimizer(factory)
        for x in inputs:
            engine.begin_minibatch()
            model(x).pow(2).mean().backward()
            engine.finish_minibatch()
        engine.drain()
        got = engine.full_parameters()
    finally:
        engine.close()
    opt = factory(reference.parameters())
    for x in inputs:
        opt.zero_grad()
        reference(x).pow(2).mean().backward()
        opt.step()
    initial = dict(reference_start.named_parameters())
    for name, p in reference.named_parameters():
        assert not torch.equal(p, initial[name]), f"{name} trained"
        torch.testing.assert_close(got[name], p.detach(), rtol=1e-6, atol=1e-6, msg=name)


@pytest.mark.parametrize("rank0", [False, True], ids=["every rank", "broadcast_from_rank0"])
@pytest.mark.parametrize("source", ["odc", "collective"])
def test_a_full_state_of_an_optimizer_without_state_tensors_loads_into_fsdp2(source, rank0, one_rank_group):
    """SGD without momentum keeps a momentum_buffer of None per parameter: torch's full load into
    FSDP2 asserted "Expected device to be set" (it had no state tensor to take a device from).
    The state's learning rate, not the loading optimizer's own, steps on after it."""
    from odc_core import get_state_dict, set_state_dict

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    loading = copy.deepcopy(model)
    saved, loader = one_rank_engine(source, one_rank_group), one_rank_engine("collective", one_rank_group)
    try:
        saved.wrap(model, [model[0], model[2]])
        saved.configure_optimizer(functools.partial(torch.optim.SGD, lr=0.1))
        loader.wrap(loading, [loading[0], loading[2]])
        loader.configure_optimizer(functools.partial(torch.optim.SGD, lr=0.5))
        x = torch.randn(3, 4)
        saved.begin_minibatch()
        model(x).sum().backward()
        saved.finish_minibatch()
        set_state_dict(loader, *get_state_dict(saved, full=True), broadcast_from_rank0=rank0)
        for engine, m in ((saved, model), (loader, loading)):
            engine.begin_minibatch()
            m(x).sum().backward()
            engine.finish_minibatch()
        torch.testing.assert_close(loader.full_parameters(), saved.full_parameters(), rtol=0, atol=0)
    finally:
        saved.close()
        loader.close()


class _Branch(nn.Module):
    """A side layer the first minibatch leaves out: FSDP2's optimizer keeps no state for it then."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.side, self.b = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 1)
        self.use_side = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.a(x))
        return self.b(h + self.side(h) if self.use_side else h).sum()


@pytest.mark.parametrize("how", ["full", "full from rank 0", "sharded"])
def test_fsdp2s_state_of_a_parameter_never_stepped_loads_and_it_starts_fresh(how, one_rank_group):
    """FSDP2's own state dict, taken before a layer had its first gradient: torch's strict load
    refused it ("Missing optimizer state for parameter 'side.weight'"), and with strict off its full
    load gave that layer the others' step count, its next AdamW step 0.04 off the saving engine's."""
    from odc_core import get_state_dict, set_state_dict

    torch.manual_seed(0)
    model = _Branch()
    loading = copy.deepcopy(model)
    saved, loader = one_rank_engine("collective", one_rank_group), one_rank_engine("collective", one_rank_group)
    try:
        for engine, m in ((saved, model), (loader, loading)):
            engine.wrap(m, [m.a, m.side, m.b])
            engine.configure_optimizer(functools.partial(torch.optim.AdamW, lr=0.1))
        x = torch.randn(3, 4)
        saved.begin_minibatch()
        model(x).backward()
        saved.finish_minibatch()
        set_state_dict(loader, *get_state_dict(saved, full=how != "sharded"), broadcast_from_rank0=how.endswith("0"))
        for engine, m in ((saved, model), (loader, loading)):
            m.use_side = True
            for _ in range(2):
                engine.begin_minibatch()
                m(x).backward()
                engine.finish_minibatch()
        torch.testing.assert_close(loader.full_parameters(), saved.full_parameters(), rtol=0, atol=0)
    finally:
        saved.close()
        loader.close()
