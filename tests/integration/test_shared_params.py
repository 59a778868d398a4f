"""Parameters shared between units (tied input and output embeddings) train on both engines as
in one process; odc_core/engine/sharing.py groups the units that share one."""

from dataclasses import replace

import pytest
from torch import nn

from odc_bench.plan.spec import resolve
from odc_bench.run.local import run_local
from odc_core.engine.sharing import sharing_groups, unit_parameters
from tests.helpers import run_config
from tests.helpers.reference import relative_error, train_single_process

TIED = ("model.tie_embeddings=true", "model.num_layers=2", "world_size=2", "minibatch_size=2",
        "warmup_minibatches=0", "num_minibatches=3", "optim.weight_decay=0.1", "dataset.length_scale=0.005")


@pytest.mark.slow
def test_tied_embeddings_train_as_in_one_process_on_both_engines():
    odc = resolve(run_config("engine=odc", *TIED))
    # Uneven counts, a rank with none included: the tied weight's gradient still reaches its owners.
    splits = [([0, 1, 2, 3], []), ([0, 1, 2], [3]), ([], [0, 1, 2, 3])]
    odc = replace(odc, minibatches=[replace(mb, plan=[[[i] for i in mine], [[i] for i in theirs]])
                                    for mb, (mine, theirs) in zip(odc.minibatches, splits, strict=True)])
    reference, _ = train_single_process(odc)
    assert "head.lm_head.weight" not in reference, "one tensor, named once"
    odc_params = run_local(odc, collect_params=True)[0]["params"]
    collective = run_local(resolve(run_config("engine=collective", *TIED)), collect_params=True)[0]["params"]
    # Default AdamW eps: the comparison's bound is the existing engines' (1e-5 relative), and the
    # tied weight's gradient is the sum of two uses, not a vanishing one that eps would amplify.
    assert relative_error(odc_params, reference) < 1e-5
    assert relative_error(collective, reference) < 1e-5


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight


def test_units_sharing_a_parameter_form_one_group_and_a_root_holds_only_what_its_units_do_not():
    model = _Tied()
    units = [model.embed, *model.layers, model.head]
    held = unit_parameters(units)
    assert [len(h) for h in held] == [1, 2, 2, 1]
    assert sharing_groups(held) == [[0, 3], [1], [2]]
    # The model itself as the last unit (FSDP2's convention) holds no layer's parameters.
    with_root = [*model.layers, model]
    held = unit_parameters(with_root)
    assert [len(h) for h in held] == [2, 2, 1], "embed and head: one tensor"
    assert sharing_groups(held) == [[0], [1], [2]]
