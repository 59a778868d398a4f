"""Frozen parameters (requires_grad False, as in LoRA) and trainable ones a microbatch does not
use train on ODC as in one process: a frozen one is gathered and never pushed or stepped, and
keeps no optimizer state (as under FSDP2); an unused trainable one gets a zero gradient, as in a
flat-buffer trainer; a unit a microbatch skips after its prefetch began is not read stale in the
next minibatch (docs/use_odc.md, "Frozen and unused parameters")."""

import socket
from datetime import timedelta
from functools import partial
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from odc_core import checkpoint, get_state_dict, set_state_dict
from odc_core.engine.base import EngineContext
from odc_core.engine.build import make_engine
from odc_core.engine.registry import CollectiveOptions, OdcOptions
from tests.helpers.reference import relative_error


class _Adapted(nn.Module):
    """A layer with a frozen base and a trainable low-rank update, its frozen weights first so
    that rank 0's shard of it holds frozen elements only; `spare` trains but is never used."""

    def __init__(self) -> None:
        super().__init__()
        self.base = nn.Linear(8, 8)
        self.base2 = nn.Linear(8, 8)
        self.down = nn.Linear(8, 2, bias=False)
        self.up = nn.Linear(2, 8, bias=False)
        self.spare = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.base2(self.base(x)) + self.up(self.down(x)))


class _Lm(nn.Module):
    """`skip`: even-length sequences skip the last layer (as layer drop or an early exit would),
    whose parameters the previous layer's forward has already begun to prefetch."""

    def __init__(self, skip: bool = False) -> None:
        super().__init__()
        self.skip = skip
        torch.manual_seed(0)
        self.embed = nn.Embedding(10, 8)
        self.layers = nn.ModuleList(_Adapted() for _ in range(2))
        self.head = nn.Linear(8, 10, bias=False)
        for module in (self.embed, self.head, *(m for layer in self.layers for m in (layer.base, layer.base2))):
            module.requires_grad_(False)
        nn.init.normal_(self.layers[0].up.weight)  # LoRA starts it at zero; here it trains from the first step

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers[:-1] if self.skip and len(ids) % 2 == 0 else self.layers:
            x = layer(x)
        return nn.functional.cross_entropy(self.head(x)[:-1], ids[1:], reduction="sum")


# Per step, each rank's microbatches: uneven, a rank with none included; rank 1 ends step 2 with
# a microbatch that skips the last layer and starts step 3 with one that runs it.
STEPS = [([[1, 2, 3, 4], [5, 6, 7]], []), ([[2, 4, 6]], [[9, 8, 7, 6, 5]]), ([], [[3, 3, 1], [0, 1, 2, 3]]),
         ([[4, 1, 4, 1]], [[7, 7, 2]])]
LR, EPS, DECAY, CLIP = 1e-2, 1e-3, 0.1, 0.5
AdamW = partial(torch.optim.AdamW, lr=LR, eps=EPS, weight_decay=DECAY)


def _tokens(step: int) -> int:
    return sum(len(s) - 1 for rank in STEPS[step] for s in rank)


def _rank(rank: int, port: int, out: str) -> None:
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    engine = make_engine("odc", EngineContext(torch.device("cpu"), store, f"frozen{port}", 60.0, "fp32"),
                         OdcOptions())
    model = _Lm(skip=True)
    engine.wrap(model, [model.embed, *model.layers, model.head])
    engine.configure_optimizer(AdamW, max_grad_norm=CLIP)
    norms = []
    for step, mine in enumerate(STEPS):
        if step == len(STEPS) - 1:  # the state of the steps so far, read and loaded back before the last
            full = get_state_dict(engine, full=True)
            set_state_dict(engine, *get_state_dict(engine))
        engine.begin_minibatch()
        for seq in mine[rank]:
            (model(torch.tensor(seq)) * (engine.loss_scale / _tokens(step))).backward()
        norms.append(engine.finish_minibatch())
    unfrozen = model.layers[0].base.weight.requires_grad_(True)
    with pytest.raises(RuntimeError, match=r"layers\.0\.base\.weight was unfrozen after wrap\(\)"):
        engine.begin_minibatch()
    unfrozen.requires_grad_(False)
    engine.drain()
    params = engine.full_parameters()
    if rank == 0:
        torch.save({"params": params, "state": full[1]["state"], "norms": norms}, out)
    engine.close()
    dist.destroy_process_group()


def _reference() -> tuple[dict[str, torch.Tensor], dict[str, dict], list[float]]:
    """One process: the trainable parameters' gradients, an unused one's zero; clipped; AdamW."""
    model = _Lm(skip=True)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = AdamW(trainable)
    names = {id(p): n for n, p in model.named_parameters()}
    state, norms = {}, []
    for step, ranks in enumerate(STEPS):
        if step == len(STEPS) - 1:
            state = {names[id(p)]: {k: v.clone() for k, v in s.items()} for p, s in opt.state.items()}
        for seq in (s for rank in ranks for s in rank):
            (model(torch.tensor(seq)) / _tokens(step)).backward()
        for p in trainable:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        norms.append(float(torch.nn.utils.clip_grad_norm_(trainable, CLIP)))
        opt.step()
        opt.zero_grad()
    return {n: p.detach() for n, p in model.named_parameters()}, state, norms


@pytest.mark.slow
def test_frozen_unused_and_skipped_parameters_train_as_in_one_process_with_odc(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_rank, args=(port, str(tmp_path / "out.pt")), nprocs=2, start_method="forkserver")
    got = torch.load(tmp_path / "out.pt")
    params, state, norms = _reference()
    initial = dict(_Lm().named_parameters())
    assert relative_error(got["params"], params) < 1e-5
    for name, p in initial.items():
        moved = not torch.equal(got["params"][name], p.detach())
        assert moved == p.requires_grad, f"{name}: frozen parameters stay, trainable ones (the unused too) move"
    assert got["norms"] == pytest.approx(norms, rel=1e-5)
    # As under FSDP2, the optimizer's state names only trainable parameters, and holds the same values.
    assert sorted(got["state"]) == sorted(state)
    for name, values in state.items():
        for key, value in values.items():
            assert torch.allclose(got["state"][name][key], value, rtol=1e-4, atol=1e-7), f"{name} {key}"


# The collective engine needs the same count on every rank: each rank runs every sequence of a step.
EVEN = [(ranks[0] + ranks[1], ranks[1] + ranks[0]) for ranks in STEPS]


def _engine(name: str, store: dist.Store, tag: str) -> tuple[Any, _Lm]:
    options = OdcOptions() if name == "odc" else CollectiveOptions()
    engine = make_engine(name, EngineContext(torch.device("cpu"), store, tag, 60.0, "fp32"), options)
    model = _Lm()
    engine.wrap(model, [model.embed, *model.layers, model.head])
    engine.configure_optimizer(AdamW, max_grad_norm=CLIP)
    return engine, model


def _step(engine: Any, model: _Lm, rank: int, step: int) -> None:
    engine.begin_minibatch()
    for seq in EVEN[step % len(EVEN)][rank]:
        (model(torch.tensor(seq)) * (engine.loss_scale / (2 * _tokens(step % len(EVEN))))).backward()
    engine.finish_minibatch()


def _resume_rank(rank: int, port: int, root: str, out: str) -> None:
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    collective, trained = _engine("collective", store, f"c{port}")
    for step in range(3):
        _step(collective, trained, rank, step)
    checkpoint.save(collective, f"{root}/collective", 3)
    odc, odc_model = _engine("odc", store, f"o{port}")
    checkpoint.load(odc, checkpoint.latest(f"{root}/collective"))  # FSDP2's: no state for the unused parameter
    for engine, model in ((collective, trained), (odc, odc_model)):
        _step(engine, model, rank, 3)
    params = [collective.full_parameters(), odc.full_parameters()]
    checkpoint.save(odc, f"{root}/odc", 4)  # ODC's: state for every trainable parameter
    again, again_model = _engine("collective", store, f"a{port}")
    checkpoint.load(again, checkpoint.latest(f"{root}/odc"))
    for engine, model in ((collective, trained), (again, again_model)):
        _step(engine, model, rank, 4)
    params += [collective.full_parameters(), again.full_parameters()]
    if rank == 0:
        torch.save(params, out)
    for engine in (collective, odc, again):
        engine.close()
    dist.destroy_process_group()


@pytest.mark.slow
def test_checkpoints_of_frozen_and_unused_parameters_resume_on_the_other_engine(tmp_path):
    """FSDP2 to ODC and back through odc_core.checkpoint: the unused parameter's state is absent
    from FSDP2's checkpoint and starts fresh in ODC; every other parameter resumes exactly."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_resume_rank, args=(port, str(tmp_path), str(tmp_path / "out.pt")), nprocs=2,
                       start_method="forkserver")
    straight4, odc4, straight5, again5 = (
        {name: p for name, p in params.items() if "spare" not in name}  # which the engines step differently
        for params in torch.load(tmp_path / "out.pt"))
    assert relative_error(odc4, straight4) < 1e-6
    assert relative_error(again5, straight5) < 1e-6
