"""A checkpoint of the model alone: an engine without an optimizer (an RL reference model, a
teacher) loads the model from a training run's checkpoint and saves its model alone, and such a
checkpoint loads into a training engine as the weights it starts from (odc_core/checkpoint.py).
Before, both engines asked for configure_optimizer(), and DCP refused a checkpoint without the
optimizer's groups in words that called it damaged."""

from __future__ import annotations

import copy
from functools import partial

import pytest
import torch
from torch import nn

from odc_core import checkpoint, set_state_dict
from tests.helpers.reference import one_rank_engine, trains_like_one_process

AdamW = partial(torch.optim.AdamW, lr=0.1)


class _Net(nn.Sequential):
    def __init__(self) -> None:
        super().__init__(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x).sum()


def _model() -> _Net:
    return _Net()


def _trained_one_minibatch(engine, model: _Net) -> None:  # type: ignore[no-untyped-def]
    engine.wrap(model, [model[0], model[2]])
    engine.configure_optimizer(AdamW)
    engine.begin_minibatch()
    model(torch.ones(2, 4)).backward()
    engine.finish_minibatch()


@pytest.mark.parametrize(("saver", "loader"), [("odc", "collective"), ("collective", "odc")])
def test_an_engine_without_an_optimizer_loads_the_model_from_a_training_checkpoint(saver, loader, one_rank_group,
                                                                                tmp_path):
    torch.manual_seed(0)
    trained, reference = _model(), _model()
    training = one_rank_engine(saver, one_rank_group)
    try:
        _trained_one_minibatch(training, trained)
        folder = checkpoint.save(training, tmp_path, 1, {"step": 1})
        want = training.full_parameters()
    finally:
        training.close()
    frozen = one_rank_engine(loader, one_rank_group)
    try:
        frozen.wrap(reference, [reference[0], reference[2]])
        assert checkpoint.load(frozen, folder) == {"step": 1}
        got = frozen.full_parameters()
    finally:
        frozen.close()
    assert all(torch.equal(got[name], want[name]) for name in want)


@pytest.mark.parametrize("loader", ["odc", "collective"])
@pytest.mark.parametrize("saver", ["odc", "collective"])
def test_a_checkpoint_of_the_model_alone_loads_as_weights_a_fresh_optimizer_steps_from(saver, loader, one_rank_group,
                                                                                     tmp_path):
    torch.manual_seed(0)
    pretrained, held, model = _model(), _model(), _model()
    reference = copy.deepcopy(pretrained)
    frozen = one_rank_engine(saver, one_rank_group)
    try:
        frozen.wrap(held, [held[0], held[2]])
        set_state_dict(frozen, pretrained.state_dict(), {})
        folder = checkpoint.save(frozen, tmp_path, 1, {})
    finally:
        frozen.close()
    engine = one_rank_engine(loader, one_rank_group)
    try:
        engine.wrap(model, [model[0], model[2]])
        engine.configure_optimizer(AdamW)
        checkpoint.load(engine, folder)
        trains_like_one_process(engine, model, reference, [torch.ones(2, 4), torch.randn(2, 4)], factory=AdamW)
    finally:
        engine.close()


@pytest.mark.parametrize("written", ["by dcp.save, of FSDP2's state dicts", "with one extra for every rank"])
@pytest.mark.parametrize("loader", ["odc", "collective"])
def test_a_dcp_checkpoint_without_this_ranks_extra_loads(loader, written, one_rank_group, tmp_path):
    """An FSDP2 loop's own checkpoint (dcp.save of get_state_dict's model and optimizer dicts)
    loads into either engine with an empty extra (before: "Missing key in checkpoint state_dict:
    extra."), and one of the earlier layout, its extra under one key, gives that extra."""
    import io
    import pickle

    import torch.distributed.checkpoint as dcp

    from odc_core import get_state_dict

    torch.manual_seed(0)
    trained, model = _model(), _model()
    engine = one_rank_engine("collective" if written.startswith("by") else "odc", one_rank_group)
    try:
        _trained_one_minibatch(engine, trained)
        if written.startswith("by"):
            model_sd, optim_sd = get_state_dict(engine)
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=tmp_path)
        else:
            dcp.save({**engine.sharded_state(), "extra": io.BytesIO(pickle.dumps({"step": 1}))},
                     checkpoint_id=tmp_path)
        want = engine.full_parameters()
    finally:
        engine.close()
    engine = one_rank_engine(loader, one_rank_group)
    try:
        engine.wrap(model, [model[0], model[2]])
        engine.configure_optimizer(AdamW)
        assert checkpoint.load(engine, tmp_path) == ({} if written.startswith("by") else {"step": 1})
        got = engine.full_parameters()
    finally:
        engine.close()
    assert all(torch.equal(got[name], want[name]) for name in want)
