"""Model and optimizer state dicts of either engine, as torch.distributed.checkpoint.state_dict's
get_state_dict and set_state_dict give and take them for FSDP2: the same keys (parameters by
name, the optimizer's state by parameter name, its param_groups with their parameters' names),
so that a full state dict of one engine loads into the other. Sharded, FSDP2's are DTensors and
ODC's ShardedTensors of the flat ranges each rank holds (odc_core/checkpoint.py saves them)."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from odc_core.engine.base import DataParallelEngine


@contextlib.contextmanager
def sharded_tensors_quietly() -> Iterator[None]:
    """torch warns at every use of a ShardedTensor (its size(), DCP's planning) that DTensor
    replaces it; but a DTensor is an even split of whole dimensions and cannot hold ODC's flat
    ranges, which ShardedTensor's boxes can. Users saw the warning at every load of an ODC state
    dict or checkpoint, a dozen of them where the model had as many parameters."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Please use DTensor instead", FutureWarning)
        yield


def get_state_dict(engine: DataParallelEngine, *, full: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """(model_state_dict, optim_state_dict) of a wrapped engine with its optimizer configured:
    this rank's shards (views of them: copy what must outlive the next step), or with `full`
    every tensor whole, on every rank (fp32 parameters). Collective: call it on every rank,
    between minibatches.

    The FSDP2 counterpart: torch.distributed.checkpoint.state_dict.get_state_dict(model,
    optimizer, options=StateDictOptions(full_state_dict=full))."""
    engine.between_minibatches("get_state_dict")
    if not isinstance(full, bool):  # full="no" gave whole tensors
        raise TypeError(f"get_state_dict's full is True or False, got {full!r}")
    with sharded_tensors_quietly():
        return engine.state_dict(full)


def set_state_dict(engine: DataParallelEngine, model_state_dict: dict[str, Any],
                   optim_state_dict: dict[str, Any], *, broadcast_from_rank0: bool = False) -> None:
    """Load state dicts into a wrapped engine with its optimizer configured: full ones of either
    engine, or sharded ones of FSDP2 (DTensors) or of ODC at the same world size. Collective,
    between minibatches (ODC with staleness > 0: before the first); the optimizer needs the
    parameter groups the state was saved with. Every rank loads the same state dicts (ranks that
    differ are refused on every rank in one line); with `broadcast_from_rank0`, rank 0's full
    ones only, which it sends one tensor at a time: the other ranks' dicts are not read (pass
    {}), so that only rank 0 holds a whole state dict.

    The FSDP2 counterpart: set_state_dict(model, optimizer, model_state_dict=...,
    optim_state_dict=..., options=StateDictOptions(full_state_dict=..., broadcast_from_rank0=...))."""
    engine.between_minibatches("set_state_dict")
    if not (isinstance(model_state_dict, Mapping) and isinstance(optim_state_dict, Mapping)):
        # a list or None failed in "'list' object has no attribute 'items'"
        raise TypeError(f"set_state_dict takes the model's and the optimizer's state dicts, as get_state_dict returns "
                        f"them ({{}} for both on the ranks other than 0 with broadcast_from_rank0); got "
                        f"{type(model_state_dict).__name__} and {type(optim_state_dict).__name__}")
    if not isinstance(broadcast_from_rank0, bool):
        raise TypeError(f"set_state_dict's broadcast_from_rank0 is True or False, got {broadcast_from_rank0!r}")
    with sharded_tensors_quietly():
        engine.load_state_dict(model_state_dict, optim_state_dict, broadcast_from_rank0=broadcast_from_rank0)
