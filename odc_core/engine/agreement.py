"""That every rank wraps the same model (its parameters, units, precision and engine options) and
configures the same optimizer.

Ranks that disagree fail late or not at all: ODC's heap refuses the first allocation whose size
differs ("asymmetric allocation", naming neither the model nor the fix), and FSDP2 shards each
rank's own shapes and dtypes, all-gathers them into one another's and trains on without a word
(a layer one row wider on one rank, or bf16 on one rank and fp32 on the other, left the ranks'
parameters apart or at 1e35). So wrap() first compares a digest of what each rank wraps, one
short value per rank through the run's store, and only where the digests differ the whole
descriptions, to name the first difference on every rank in one line. configure_optimizer()
does the same for the optimizer each rank built: its type, every group's options, the LR
schedule's type and the clipping (a rate computed from a rank's own share of the data stepped
each rank's shards at its own rate, on both engines, without a word). set_state_dict() does the
same for the state dicts each rank loads: their keys, each tensor's kind, dtype and shape, each
scalar's value and the optimizer groups' options (a rank missing a key failed alone or aborted
gloo, a rank's own learning rate in its state dict stepped its shards at that rate).
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import json
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from odc_core.engine.base import MixedPrecision, OptimizerStep
from odc_core.transport.exchange import exchange

WRAP_FIX = "every rank must wrap the same model, with the same units, precision and engine options"
STATE_FIX = ("every rank must load the same state dicts: whole ones on every rank, or each rank's shards of one "
             "state (state dicts on rank 0 only load with set_state_dict(..., broadcast_from_rank0=True))")
OPTIMIZER_FIX = ("every rank must configure the same optimizer, with the same group options, LR schedule and "
                 "max_grad_norm")
# Checks of this process by job id (an engine context's): ranks wrap and configure in one order.
_wraps: dict[str, itertools.count] = collections.defaultdict(itertools.count)


def precision_name(policy: MixedPrecision) -> str:
    """A precision policy as the message names it: "bfloat16 compute with float32 reduction"."""
    return (f"{str(policy.param_dtype).removeprefix('torch.')} compute with "
            f"{str(policy.reduce_dtype).removeprefix('torch.')} reduction")


def description(model: nn.Module, units: Sequence[nn.Module], settings: Mapping[str, object]) -> dict[str, object]:
    """What the ranks must agree on, in plain values: the engine's settings, every parameter's
    name, shape, dtype and requires_grad in the model's order, and the units by their names."""
    names = {id(m): name or "(the model)" for name, m in model.named_modules(remove_duplicate=False)}
    return {"settings": {f"the engine's {k}": str(v) for k, v in settings.items()},
            "parameters": [[n, list(p.shape), str(p.dtype).removeprefix("torch."), p.requires_grad]
                           for n, p in model.named_parameters()],
            "units": [names.get(id(u), type(u).__name__) for u in units]}


def optimizer_description(step: OptimizerStep) -> dict[str, object]:
    """What the ranks' optimizers must agree on: everything but the parameters each rank steps."""
    settings: dict[str, object] = {"the optimizer": type(step.optimizer).__name__,
                                   "the LR scheduler": type(step.scheduler).__name__ if step.scheduler else "none",
                                   "max_grad_norm": step.max_grad_norm}
    for i, group in enumerate(step.optimizer.param_groups):
        settings.update({f"the optimizer's group {i} {k}": _value(v) for k, v in group.items() if k != "params"})
    return {"settings": {k: str(v) for k, v in settings.items()}}


def state_description(model_sd: Mapping[str, Any], optim_sd: Mapping[str, Any]) -> dict[str, object]:
    """What the ranks' state dicts must agree on: every key, each tensor's kind, dtype and shape (a
    scalar's value too), and each optimizer group's options and parameter names. Not the values
    of larger tensors: both engines load rank 0's (FSDP2's distribute_tensor scatters rank 0's)."""
    settings = {f"the model state dict's {k}": _entry(v) for k, v in model_sd.items()}
    state = optim_sd.get("state", {}) if isinstance(optim_sd, Mapping) else {}
    for name, values in state.items():
        settings.update({f"the optimizer state of {name} {k}": _entry(v) for k, v in values.items()})
    groups = optim_sd.get("param_groups", []) if isinstance(optim_sd, Mapping) else []
    for i, group in enumerate(groups):
        settings.update({f"the state dict's optimizer group {i} {k}": _value(v) for k, v in group.items()})
    return {"settings": settings}


def _entry(v: object) -> str:
    """A state dict's value as ranks compare it: a tensor by kind, dtype and shape (a scalar by its
    value too), anything else by its value."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torch.distributed.tensor import DTensor

    if not isinstance(v, torch.Tensor):
        return _value(v)
    kind = "a DTensor" if isinstance(v, DTensor) else "a ShardedTensor" if isinstance(v, ShardedTensor) else "a tensor"
    dtype = str(v.dtype).removeprefix("torch.")
    if v.dim() == 0 and kind == "a tensor":
        return f"{kind} {dtype} {v.item()!r}"
    return f"{kind} {dtype} {tuple(v.size())}"


def _value(v: object) -> str:
    """An option's value as ranks compare it: a tensor (a learning rate as a tensor, capturable
    Adam's) by its values, not its device, which is each rank's own."""
    if isinstance(v, torch.Tensor):
        return repr(v.detach().cpu().tolist()) if v.numel() <= 16 else f"a tensor of shape {tuple(v.shape)}"
    return repr(v)


class RanksDifferWarning(UserWarning):
    """The ranks wrap the same model with other values in it."""


def fingerprints(model: nn.Module) -> list[float | None]:
    """A number per parameter that equal values give equally on every rank: the sum of up to 1,024
    of its elements, evenly strided, in float64 (None on the meta device, which holds no values).
    Read to the host once for the whole model."""
    sums, at = [], []
    for i, p in enumerate(model.parameters()):
        if p.is_meta:
            continue
        # A complex parameter's real and imaginary parts both count (.double() drops the second, warning).
        flat = (torch.view_as_real(p.detach()) if p.is_complex() else p.detach()).reshape(-1)
        sums.append(flat[:: max(1, flat.numel() // 1024)][:1024].double().sum())
        at.append(i)
    values = torch.stack(sums).cpu().tolist() if sums else []
    out: list[float | None] = [None] * sum(1 for _ in model.parameters())
    for i, v in zip(at, values, strict=True):
        out[i] = v
    return out


def warn_if_values_differ(store: dist.Store, job_id: str, rank: int, world_size: int, timeout_s: float,
                          model: nn.Module) -> None:
    """A RanksDifferWarning on every rank, naming the first parameter, where the ranks' values
    differ: both engines shard each rank's own values, so a model loaded on rank 0 only (or drawn
    from another seed per rank) trains as a mixture of them, without a word. A warning, not an
    error: ranks initialised from different seeds train a model that is random either way."""
    found = _unlike(store, job_id, rank, world_size, timeout_s, fingerprints(model),
                    "the check that the ranks wrap equal values")
    if found is None:
        return
    first, theirs, other = found
    name = next(n for (n, _), a, b in zip(model.named_parameters(), first, theirs, strict=True) if a != b)
    warnings.warn(f"the ranks wrap different values: parameter {name} differs between rank 0 and rank {other} (a "
                  f"model loaded on some ranks only, or drawn from another seed): both engines shard each rank's own "
                  f"values, so the model trained mixes them; load the same weights on every rank before wrap(), or "
                  f"seed every rank alike", RanksDifferWarning, stacklevel=3)


def check_ranks_agree(store: dist.Store, job_id: str, rank: int, world_size: int, timeout_s: float,
                      mine: dict[str, object], fix: str = WRAP_FIX) -> None:
    """ValueError on every rank, one line naming the first difference and `fix`, where another
    rank's description (description(), optimizer_description(), state_description()) is not this
    rank's; PeerTimeout naming a rank that never makes the call."""
    found = _unlike(store, job_id, rank, world_size, timeout_s, mine,
                    "the check that the ranks agree (wrap(), configure_optimizer(), set_state_dict())")
    if found is not None:
        first, theirs, other = found
        raise ValueError(f"the ranks disagree on {difference(first, theirs, other)}; {fix}")


def _unlike(store: dist.Store, job_id: str, rank: int, world_size: int, timeout_s: float, mine: Any,
            what: str) -> tuple[Any, Any, int] | None:
    """Where another rank's `mine` (plain values) is not rank 0's: rank 0's, the first such rank's,
    and that rank; else None. One digest per rank through the store, and the whole values only
    where digests differ, every rank taking every one, so that all of them name the same
    difference; PeerTimeout naming a rank that never makes the call."""
    if world_size == 1:
        return None
    key = f"odc_core/agree/{job_id}/{next(_wraps[job_id])}"
    text = json.dumps(mine, sort_keys=True)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    peers = exchange(store, f"{key}/digest", rank, world_size, digest, f"{what}: its digest", timeout_s)
    if all(d == digest for _, d in peers):
        return None
    every = {rank: json.loads(text)}
    for peer, value in exchange(store, f"{key}/whole", rank, world_size, text, f"{what}: its values", timeout_s):
        every[peer] = json.loads(value)
    other = next(r for r in range(1, world_size) if every[r] != every[0])
    return every[0], every[other], other


def difference(first: dict, other: dict, rank: int) -> str:
    """The first way rank `rank`'s description differs from rank 0's, in words."""
    for k in sorted(set(first["settings"]) | set(other["settings"])):
        a, b = first["settings"].get(k, "absent"), other["settings"].get(k, "absent")
        if a != b:
            return f"{k}: {a} on rank 0, {b} on rank {rank}"
    ours, theirs = first.get("parameters", []), other.get("parameters", [])
    for a, b in zip(ours, theirs, strict=False):
        if a[0] != b[0]:
            return f"the model's parameters: {a[0]} on rank 0 where rank {rank} has {b[0]}"
        if a != b:
            return f"parameter {a[0]}: {_param(a)} on rank 0, {_param(b)} on rank {rank}"
    if len(ours) != len(theirs):
        extra = (ours if len(ours) > len(theirs) else theirs)[min(len(ours), len(theirs))][0]
        return (f"the model's parameters: {len(ours)} on rank 0, {len(theirs)} on rank {rank} (the first one only "
                f"rank {0 if len(ours) > len(theirs) else rank} has: {extra})")
    return f"the units: {_units(first.get('units', []))} on rank 0, {_units(other.get('units', []))} on rank {rank}"


def _param(p: list) -> str:
    name, shape, dtype, grad = p
    return f"{dtype} {tuple(shape)}{'' if grad else ' frozen'}"


def _units(units: list[str], shown: int = 4) -> str:
    more = f" and {len(units) - shown} more" if len(units) > shown else ""
    return f"{len(units)} ({', '.join(units[:shown])}{more})"
