"""configure_optimizer's param_groups (odc_core/engine/base.py): parameters grouped by their
options in model order, lr_scale applied to the built optimizer's rate, and a bad option or
group refused in one line naming it."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch import nn

from odc_core.engine.base import OptimizerStep, group_options

ADAMW = partial(torch.optim.AdamW, lr=0.1)


def _named() -> list[tuple[str, nn.Parameter]]:
    model = nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2), nn.Linear(2, 2))
    return list(model.named_parameters())


def test_groups_follow_the_first_parameter_of_each_and_lr_scale_scales_the_rate():
    named = _named()
    groups = group_options(named, lambda n, p: {"weight_decay": 0.0} if p.dim() < 2 else
                           ({"lr_scale": 0.5} if n.startswith("2") else {}))
    assert groups == [({}, ["0.weight"]), ({"weight_decay": 0.0}, ["0.bias", "1.weight", "1.bias", "2.bias"]),
                      ({"lr_scale": 0.5}, ["2.weight"])]
    params = dict(named)
    step = OptimizerStep.build([{"params": [params[n] for n in names], **options} for options, names in groups],
                               ADAMW, None, None)
    assert [g["lr"] for g in step.optimizer.param_groups] == pytest.approx([0.1, 0.1, 0.05])
    assert [g["weight_decay"] for g in step.optimizer.param_groups] == [0.01, 0.0, 0.01]


def test_an_option_the_optimizer_does_not_take_is_refused_by_name():
    p = _named()[0][1]
    with pytest.raises(ValueError, match="param_groups gave option 'weight_decy', which AdamW does not take"):
        OptimizerStep.build([{"params": [p], "weight_decy": 0.0}], ADAMW, None, None)


@pytest.mark.parametrize("options, wrong", [({"params": []}, "without 'params'"), ([], "must return a dict"),
                                            ({"lr_scale": 0}, "lr_scale 0; it must be a number > 0")])
def test_a_rule_giving_no_options_dict_or_a_bad_scale_is_refused(options, wrong):
    with pytest.raises(ValueError, match=wrong):
        group_options(_named(), lambda n, p: options)
