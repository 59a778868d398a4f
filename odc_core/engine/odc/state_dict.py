"""ODC's state outside minibatches: the full parameters, and the sharded state a checkpoint
saves and loads (odc_core/checkpoint.py), in DCP's FSDP2 layout."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from odc_core.engine.odc.unit import Piece, buffer_name
from odc_core.primitives import gather

if TYPE_CHECKING:
    from odc_core.engine.odc.engine import OdcEngine


def full_parameters(engine: OdcEngine) -> dict[str, torch.Tensor]:
    """The newest version's parameters, once every step begun is applied everywhere."""
    engine.drain()
    engine.heap.barrier(engine.timeout_s)
    slot = engine.versions.newest_slot
    out: dict[str, torch.Tensor] = {}
    for unit in engine.units:
        flat = torch.empty(unit.layout.padded_numel, dtype=torch.float32, device=engine.device)
        gather(engine.heap, buffer_name("master", unit.name, slot), flat, unit.layout, engine.owners)
        for name, p, off in zip(unit.names, unit.params, unit.offsets, strict=True):
            out[name] = flat[off:off + p.numel()].view(p.shape).cpu().clone()
    engine.heap.barrier(engine.timeout_s)  # nobody closes the heap while a peer still reads it
    return out


def sharded_state(engine: OdcEngine, for_load: bool = False) -> dict[str, Any]:
    """The parameters and optimizer state in DCP's FSDP2 layout: each parameter by name as a
    ShardedTensor of the boxes this rank's flat shards hold, viewing the heap."""
    from odc_core.checkpoint import flat_pieces

    model = engine.model
    if model is None:
        raise RuntimeError("wrap() the model before saving or loading a checkpoint")
    if engine.owners is not None:
        raise ValueError("checkpoints of hybrid-sharded ODC are not supported yet; save with shard=full")
    if for_load and engine.versions.minibatch >= 0:
        raise RuntimeError("load a checkpoint before the first minibatch")
    opt = engine.optimizer
    _init_state(opt)
    slot = engine.versions.newest_slot
    aliases: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(name)
    model_sd: dict[str, Any] = {}
    optim_sd: dict[str, Any] = {}
    for unit in engine.units:
        size = unit.layout.shard_numel
        lo = engine.shard_index * size
        for j, (p, off, name) in enumerate(zip(unit.params, unit.offsets, unit.names, strict=True)):
            n = p.numel()
            ranges = [(r, max(0, r * size - off), min(n, (r + 1) * size - off)) for r in range(engine.world_size)]
            ranges = [(r, a, b) for r, a, b in ranges if a < b]
            a, b = unit.local_range(j)
            # The piece holding this rank's elements of the parameter (any piece's scalars where it holds none).
            held = unit.piece_at(a) if a < b else unit.pieces[0]
            start = max(0, lo + a - off)  # the parameter's first flat element this rank holds

            def sharded(buf: torch.Tensor, part: slice, name: str = name, shape: torch.Size = p.shape,
                      start: int = start, ranges: list[tuple[int, int, int]] = ranges) -> torch.Tensor:
                return flat_pieces(name, shape, buf[part], start, ranges, engine.rank)

            for alias in aliases[id(p)]:
                model_sd[alias] = sharded(unit.master[slot], slice(a, b) if a < b else slice(0, 0))
            part = slice(a - held.lo, b - held.lo) if a < b else slice(0, 0)
            optim_sd[name] = {k: sharded(v, part) if _flat(v, held) else v.detach().clone()
                              for k, v in opt.state[held.param].items()}
    for name, buf in model.state_dict().items():  # persistent buffers, replicated
        if name not in model_sd:
            model_sd[name] = buf
    groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": names}
              for g, names in zip(opt.param_groups, engine.group_names, strict=True)]
    return {"model": model_sd, "optim": {"state": optim_sd, "param_groups": groups}}


def load_sharded_state(engine: OdcEngine, state: dict[str, Any]) -> None:
    """After DCP has loaded into sharded_state(for_load=True)'s views: what is not a view
    (scalars, hyperparameters, buffers) is applied, and the version published to peers."""
    model = engine.model
    assert model is not None
    opt = engine.optimizer
    loaded = state["optim"]
    if len(loaded["param_groups"]) != len(opt.param_groups):
        raise ValueError(f"the state has {len(loaded['param_groups'])} optimizer parameter groups, this optimizer "
                         f"{len(opt.param_groups)}: configure_optimizer with the param_groups it was saved with")
    for group, given in zip(opt.param_groups, loaded["param_groups"], strict=True):
        for key, value in given.items():
            if key != "params":
                group[key] = value
    slot = engine.versions.newest_slot
    for unit in engine.units:
        for held in unit.pieces:
            # Scalars (a step count) are a piece's own, not views: take them from a parameter it holds.
            j = next((j for j in range(len(unit.params)) if held.lo <= unit.local_range(j)[0] < held.hi), 0)
            first = loaded["state"][unit.names[j]]
            for key, value in opt.state[held.param].items():
                if torch.is_tensor(value) and not _flat(value, held):
                    value.copy_(first[key])
        if unit.shadow is not None:
            unit.shadow[slot].copy_(unit.master[slot])
    buffers = {n for n, _ in model.named_buffers()}
    model.load_state_dict({n: v for n, v in state["model"].items() if n in buffers}, strict=False)
    engine.heap.barrier(engine.timeout_s)  # nobody gathers a shard before its owner has loaded it


def _flat(value: object, piece: Piece) -> bool:
    """Whether an optimizer state value is per element of the piece (moments), not a scalar."""
    return torch.is_tensor(value) and value.shape == piece.param.shape


def _init_state(opt: torch.optim.Optimizer) -> None:
    """Give a fresh optimizer its state (a step at learning rate 0 on zero gradients), so that
    a checkpoint can be loaded into it."""
    if opt.state:
        return
    lrs = [g["lr"] for g in opt.param_groups]
    for g in opt.param_groups:
        g["lr"] = 0.0
        for p in g["params"]:
            p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    for g, lr in zip(opt.param_groups, lrs, strict=True):
        g["lr"] = lr
