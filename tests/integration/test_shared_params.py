"""Parameters shared between units (tied input and output embeddings) train on both engines as
in one process; odc_core/engine/sharing.py groups the units that share one."""

import socket
from dataclasses import replace
from datetime import timedelta
from functools import partial

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from odc_bench.plan.spec import resolve
from odc_bench.run.local import run_local
from odc_core.engine.base import EngineContext
from odc_core.engine.build import make_engine
from odc_core.engine.registry import OdcOptions
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


class _TupleLayer(nn.Module):
    """A transformers-style decoder layer: hidden states by keyword in, a tuple out."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        out = hidden_states + torch.tanh(self.proj(hidden_states))
        return out, {"aux": out.detach().sum()}


class _Lm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(10, 4)
        self.layers = nn.ModuleList(_TupleLayer() for _ in range(2))
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x, _ = layer(hidden_states=x)
        return nn.functional.cross_entropy(self.head(x)[:-1], ids[1:], reduction="sum")


# Per step, each rank's microbatches (token sequences): uneven, a rank with none included.
STEPS = [([[1, 2, 3, 4], [5, 6, 7]], []), ([[2, 4, 6]], [[9, 8, 7, 6, 5]]), ([], [[3, 3, 1], [0, 1, 2, 3]])]
# eps far above the fp32 rounding of these gradients: parameters then differ by the engine's
# summation order only, not by that noise divided by a tiny second moment.
LR, EPS = 1e-2, 1e-3


def _tokens(step: int) -> int:
    return sum(len(s) - 1 for rank in STEPS[step] for s in rank)


def _odc_rank(rank: int, port: int, out: str) -> None:
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    engine = make_engine("odc", EngineContext(torch.device("cpu"), store, f"tuple{port}", 60.0, "fp32"), OdcOptions())
    model = _Lm()
    engine.wrap(model, [model.embed, *model.layers, model.head])
    engine.configure_optimizer(partial(torch.optim.AdamW, lr=LR, betas=(0.9, 0.999), eps=EPS, weight_decay=0.0))
    for step, mine in enumerate(STEPS):
        engine.begin_minibatch()
        for seq in mine[rank]:
            (model(torch.tensor(seq)) * (engine.loss_scale / _tokens(step))).backward()
        engine.finish_minibatch()
    engine.drain()
    params = engine.full_parameters()
    if rank == 0:
        torch.save(params, out)
    engine.close()
    dist.destroy_process_group()


@pytest.mark.slow
def test_units_taking_keywords_and_returning_tuples_train_as_in_one_process_with_odc(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_odc_rank, args=(port, str(tmp_path / "p.pt")), nprocs=2, start_method="forkserver")
    engine_params = torch.load(tmp_path / "p.pt")
    model = _Lm()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, eps=EPS, weight_decay=0.0)
    for step, ranks in enumerate(STEPS):
        for seq in (s for rank in ranks for s in rank):
            (model(torch.tensor(seq)) / _tokens(step)).backward()
        opt.step()
        opt.zero_grad()
    reference = {n: p.detach() for n, p in model.named_parameters()}
    assert relative_error(engine_params, reference) < 1e-5
    assert relative_error(engine_params, {n: p.detach() for n, p in _Lm().named_parameters()}) > 1e-3, "it trained"
