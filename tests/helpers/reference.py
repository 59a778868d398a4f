"""A single-process reference trainer: what every data-parallel engine must reproduce."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import torch
from torch import nn

from odc_bench.data.batches import packed_batch
from odc_bench.data.tokens import token_source
from odc_bench.plan.spec import RunSpec
from odc_bench.run.worker import build_model
from odc_core import DataParallelEngine, EngineContext, make_engine


def train_single_process(spec: RunSpec, staleness: int = 0,
                         device: torch.device | None = None) -> tuple[dict[str, torch.Tensor], list[float]]:
    """Train on every minibatch of the spec in one process; return final params and losses.

    With `staleness` s, delayed-gradient training: minibatch k computes forward and backward
    on the parameters after max(0, k - s) steps, and step k applies that gradient to the
    parameters after k steps (docs/staleness.md). On `device` (the CPU by default); the
    parameters come back on the CPU.
    """
    device = device or torch.device("cpu")
    config = spec.config
    torch.manual_seed(0)
    model = build_model(config.model, config.seed, device)
    names = [n for n, _ in model.named_parameters()]
    # The parameters the optimizer steps; the model only computes on a version of them.
    current = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
    versions = [[p.detach().clone() for p in current]]
    o = config.optim
    opt = torch.optim.AdamW(current, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay)
    vocab, seed, tokens_of = config.model.vocab_size, config.seed, token_source(config.dataset)
    losses = []
    for k, mb in enumerate(spec.minibatches):
        with torch.no_grad():
            for p, v in zip(model.parameters(), versions[max(0, k - staleness)], strict=True):
                p.copy_(v)
        total = 0.0
        for i, sid in enumerate(mb.sample_ids):
            batch = packed_batch([tokens_of(seed, sid, mb.lengths[i], vocab)])
            loss = model(**{k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()})
            (loss / mb.labelled_tokens).backward()
            total += float(loss.detach())
        for c, p in zip(current, model.parameters(), strict=True):
            c.grad, p.grad = p.grad, None
        opt.step()
        opt.zero_grad(set_to_none=True)
        versions.append([c.detach().clone() for c in current])
        losses.append(total / mb.labelled_tokens)
    return {n: c.detach().cpu().clone() for n, c in zip(names, current, strict=True)}, losses


def relative_error(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """||a - b|| / ||b|| over the whole parameter vector.

    Not per tensor: the key projection's bias has an identically zero true gradient (softmax
    ignores a shift shared by all keys), so its gradient is pure rounding noise that Adam
    normalises into lr-sized steps, different for every summation order.
    """
    assert a.keys() == b.keys()
    diff = sum(float((a[k].float() - b[k].float()).pow(2).sum()) for k in a)
    norm = sum(float(b[k].float().pow(2).sum()) for k in b)
    return (diff / norm) ** 0.5


def one_rank_engine(engine_name: str, store: torch.distributed.Store) -> DataParallelEngine:
    """An engine of this one process (the one_rank_group fixture's store), fp32 on the CPU."""
    return make_engine(engine_name, EngineContext(torch.device("cpu"), store, uuid.uuid4().hex[:8], 30.0, "fp32"))


def trains_like_one_process(engine: DataParallelEngine, model: nn.Module, reference: nn.Module,
                            inputs: list[torch.Tensor], lr: float = 0.1,
                            factory: Callable[[list[nn.Parameter]], torch.optim.Optimizer] | None = None) -> None:
    """`model`, wrapped and given SGD at `lr` (or the optimizer `factory` builds) by `engine`,
    takes one step per input as `reference` (a copy of it before wrap(), or a model holding the
    weights the engine was loaded with) does in one process: their parameters end equal."""
    for x in inputs:
        engine.begin_minibatch()
        model(x).backward()
        engine.finish_minibatch()
    engine.drain()
    got = engine.full_parameters()
    trained = [p for p in reference.parameters() if p.requires_grad]
    opt = factory(trained) if factory is not None else torch.optim.SGD(trained, lr=lr)
    for x in inputs:
        opt.zero_grad()
        reference(x).backward()
        opt.step()
    for name, p in reference.named_parameters():
        torch.testing.assert_close(got[name], p.detach(), rtol=1e-6, atol=1e-6, msg=name)
