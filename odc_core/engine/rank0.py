"""Whole tensors of a state dict as rank 0 holds them, for set_state_dict.

Both engines load a full state dict's tensors as rank 0 holds them: FSDP2's set_state_dict
scatters rank 0's (distribute_tensor), so ODC broadcasts them (rank0_tensor) and ranks whose
dicts hold other values load one model. With broadcast_from_rank0, as torch's StateDictOptions
takes it, only rank 0 holds the dicts: the others first receive a skeleton of them (every key,
each tensor as a meta tensor of its shape and dtype, scalars and options as values) and then
each tensor as the load reaches it, so that no other rank holds a whole state dict at once.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.utils._pytree import tree_leaves, tree_map_only

from odc_core.engine.base import optimizer_state_problem


def skeleton_from_rank0(model_sd: dict[str, Any], optim_sd: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Rank 0's state dicts: its own there, their skeleton elsewhere; a ValueError on every rank
    where rank 0's are not full ones (sharded tensors are each rank's own, not rank 0's to send)."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torch.distributed.tensor import DTensor

    box: list[Any] = [None]
    if dist.get_rank() == 0:
        sharded = next((type(v).__name__ for v in tree_leaves((model_sd, optim_sd))
                        if isinstance(v, DTensor | ShardedTensor)), None)
        problem = (f"broadcast_from_rank0 loads full state dicts, and rank 0's holds a {sharded}: pass "
                   f"get_state_dict(engine, full=True)'s, or load sharded ones on every rank without it"
                   if sharded else optimizer_state_problem(optim_sd))
        box = [(problem, None) if problem else (None, tree_map_only(torch.Tensor, _placeholder, (model_sd, optim_sd)))]
    dist.broadcast_object_list(box, src=0)
    problem, skeleton = box[0]
    if problem is not None:
        raise ValueError(problem)
    return (model_sd, optim_sd) if dist.get_rank() == 0 else skeleton


def _placeholder(t: torch.Tensor) -> torch.Tensor:
    """A tensor as the skeleton carries it: a scalar (a step count) by its value, on the host;
    any other by its shape and dtype only."""
    return t.detach().cpu() if t.dim() == 0 else torch.empty(t.shape, dtype=t.dtype, device="meta")


def rank0_tensor(given: torch.Tensor, on: torch.device) -> torch.Tensor:
    """Rank 0's `given` on every rank, on `on` (collective: every rank calls it for the same
    tensor, in the same order). The other ranks' values are not read: theirs may be a skeleton's
    meta tensor."""
    if dist.get_rank() == 0:
        whole = given.detach().to(on).contiguous()
    else:
        whole = torch.empty(given.shape, dtype=given.dtype, device=on)
    dist.broadcast(whole, src=0)
    return whole
