"""ODC's state outside minibatches: the full parameters, and the model's and optimizer's state
dicts, sharded (what a checkpoint saves and loads, odc_core/checkpoint.py) or full, both laid
out as torch.distributed.checkpoint.state_dict gives FSDP2's."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.hooks import RemovableHandle

from odc_core.engine.base import check_state_keys, check_state_shape, reduction_device
from odc_core.engine.odc.unit import Piece, buffer_name
from odc_core.engine.rank0 import rank0_tensor
from odc_core.primitives import gather

if TYPE_CHECKING:
    from odc_core.engine.odc.engine import OdcEngine


class ModuleStateGuard:
    """The wrapped model's own state calls, refused in one line: outside its unit's forward and
    backward a parameter holds no values (they live in the shards), so state_dict() gave tensors
    without data, which torch.save wrote without a word, load_state_dict() crashed the process
    writing into none, and copy.deepcopy(model) (an RL reference model, an EMA copy) gave a
    model of NaN. ODC's own state functions read and load the buffers through them inside
    `internal()`. After close() the shards are gone: those calls and any forward are refused
    naming the close (before, state_dict() and a forward gave NaN without a word)."""

    def __init__(self) -> None:
        self._internal = False
        self._closed = False
        self.handles: list[RemovableHandle] = []
        self._holders: list[nn.Module] = []

    def watch(self, model: nn.Module) -> None:
        self._holders = [m for m in model.modules() if next(m.parameters(recurse=False), None) is not None]
        # Functions, not bound methods: torch marks a state-dict hook with an attribute.
        self.handles += [h for m in self._holders for h in (
            m.register_state_dict_post_hook(lambda *_: self._refuse("state_dict()")),
            m.register_load_state_dict_pre_hook(lambda *_: self._refuse("load_state_dict()")))]
        # Looked up on the instance by copy and pickle, ahead of nn.Module's own; on every module,
        # so that a copy or pickle of any part of the model stops at its first.
        copied, pickled = "copy.deepcopy(model)", "pickling the model (torch.save(model))"
        for m in model.modules():
            object.__setattr__(m, "__deepcopy__", lambda memo: self._refuse(copied, always=True))
            object.__setattr__(m, "__reduce_ex__", lambda protocol: self._refuse(pickled, always=True))

    def close(self) -> None:
        """The engine closed: its shards are freed. A forward, which read NaN, is refused from
        here on too (hooks added only now: a hook per module costs every forward while training)."""
        self._closed = True
        self.handles += [m.register_forward_pre_hook(lambda *_: self._refuse("a forward")) for m in self._holders]

    @contextmanager
    def internal(self) -> Iterator[None]:
        self._internal = True
        try:
            yield
        finally:
            self._internal = False

    def _refuse(self, call: str, always: bool = False) -> None:
        if self._closed:
            raise RuntimeError(f"{call} on a model whose engine odc was closed: its parameters' values lived in the "
                               f"engine's shards, which close() freed; take them before close(), with "
                               f"odc_core.get_state_dict(engine, full=True), engine.full_parameters() or "
                               f"odc_core.checkpoint.save")
        if always or not self._internal:
            raise RuntimeError(f"{call} on a model wrapped by engine odc: its parameters hold values only inside "
                               f"their unit's forward and backward; use odc_core.get_state_dict(engine) (sharded, as "
                               f"FSDP2's model.state_dict() is) or get_state_dict(engine, full=True), and "
                               f"odc_core.set_state_dict(engine, ...) to load")


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


def sharded_state(engine: OdcEngine, for_load: bool = False, optimizer: bool = True) -> dict[str, Any]:
    """The parameters and optimizer state in DCP's FSDP2 layout: each parameter by name as a
    ShardedTensor of the boxes this rank's flat shards hold, viewing the heap. Without
    `optimizer` (an engine that has none, or a load of the model alone), "optim" is left out and
    a fresh optimizer is left without state."""
    from odc_core.checkpoint import flat_pieces

    model = engine.model
    assert model is not None  # the engine's between_minibatches refused a call before wrap()
    if engine.owners is not None:
        raise ValueError("checkpoints of hybrid-sharded ODC are not supported yet; save with shard=full")
    if for_load and engine.staleness and engine.versions.minibatch >= 0:
        raise RuntimeError("with staleness > 0, load state before the first minibatch: the minibatches after "
                           "it would still read the versions before it")
    if for_load:
        engine.drain()  # every owner's step is applied before its shard is overwritten
    opt = engine.optimizer if optimizer else None
    if optimizer:
        _init_state(engine)
    template = _template(engine) if optimizer else {}
    slot = engine.versions.newest_slot
    aliases = _aliases(model)
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
            start = max(0, lo + a - off)  # the parameter's first flat element this rank holds

            def sharded(buf: torch.Tensor, part: slice, name: str = name, shape: torch.Size = p.shape,
                      start: int = start, ranges: list[tuple[int, int, int]] = ranges) -> torch.Tensor:
                return flat_pieces(name, shape, buf[part], start, ranges, engine.rank)

            for alias in aliases[id(p)]:
                model_sd[alias] = sharded(unit.master[slot], slice(a, b) if a < b else slice(0, 0))
            if not unit.trainable[j] or opt is None:
                continue  # no optimizer state, as FSDP2's optimizer keeps none for a frozen parameter
            if a < b:  # the piece holding this rank's elements of the parameter
                held = unit.piece_at(a)
                optim_sd[name] = {k: sharded(v, slice(a - held.lo, b - held.lo)) if _flat(v, held)
                                  else v.detach().clone() for k, v in opt.state[held.param].items()}
            else:
                optim_sd[name] = {k: sharded(torch.empty(0, dtype=v[1], device=engine.device), slice(0, 0))
                                  if isinstance(v, tuple) else v.clone() for k, v in template.items()}
    with engine.module_state.internal():
        for name, buf in model.state_dict().items():  # persistent buffers, replicated
            if name not in model_sd:
                model_sd[name] = buf
    if opt is None:  # a checkpoint of the model alone (odc_core/checkpoint.py)
        return {"model": model_sd}
    return {"model": model_sd, "optim": {"state": optim_sd, "param_groups": _groups(engine)}}


def full_state(engine: OdcEngine, optimizer: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
    """The model's and optimizer's state dicts with every tensor whole, the same on every rank,
    as get_state_dict(full_state_dict=True) gives FSDP2's; collective. Each optimizer state
    tensor is gathered per unit with one all-gather of every rank's shard. Without `optimizer`
    (an engine that has none: a reference model), the optimizer's is {}."""
    model = engine.model
    assert model is not None  # the engine's between_minibatches refused a call before wrap()
    if engine.owners is not None:
        raise ValueError("state dicts of hybrid-sharded ODC are not supported yet; use shard=full")
    params = full_parameters(engine)
    model_sd: dict[str, Any] = {}
    for unit in engine.units:
        for p, name in zip(unit.params, unit.names, strict=True):
            for alias in _aliases(model)[id(p)]:
                model_sd[alias] = params[name]
    with engine.module_state.internal():
        for name, buf in model.state_dict().items():
            if name not in model_sd:  # a buffer, or a module's extra state (get_extra_state), as it gives it
                model_sd[name] = buf.detach().cpu().clone() if isinstance(buf, torch.Tensor) else buf
    if not optimizer:
        return model_sd, {}
    opt = engine.optimizer
    _init_state(engine)
    template = _template(engine)
    on = reduction_device(engine.device)
    optim_sd: dict[str, Any] = {}
    for unit in engine.units:
        for held in (piece for piece in unit.pieces if not piece.frozen):
            if sorted(opt.state[held.param]) != sorted(template):
                raise ValueError("the optimizer keeps different state in different parameter groups (amsgrad in "
                                 "some?): full state dicts need the same in every group")
        whole = {}
        for key, kind in template.items():
            if not isinstance(kind, tuple):
                continue  # a scalar: the same in every piece
            # A frozen piece has no state: zeros hold its place, and no parameter reads them.
            mine = torch.cat([torch.zeros(held.hi - held.lo, dtype=kind[1], device=engine.device) if held.frozen
                              else opt.state[held.param][key] for held in unit.pieces]).to(on)
            every = [torch.empty_like(mine) for _ in range(engine.world_size)]
            dist.all_gather(every, mine)
            whole[key] = torch.cat(every).cpu()
        for p, off, name, trainable in zip(unit.params, unit.offsets, unit.names, unit.trainable, strict=True):
            if trainable:
                optim_sd[name] = {k: whole[k][off:off + p.numel()].view(p.shape).clone() if k in whole
                                  else v.cpu().clone() for k, v in template.items()}
    return model_sd, {"state": optim_sd, "param_groups": _groups(engine)}


def set_state(engine: OdcEngine, model_sd: dict[str, Any], optim_sd: dict[str, Any], from_rank0: bool = False) -> None:
    """Load model and optimizer state dicts, full or sharded, of either engine; collective. Each
    rank copies the parts of each tensor its shards hold: from a full tensor (rank 0's, as FSDP2
    takes it), from a DTensor (FSDP2's sharded dicts, made whole first, collectively) or from a
    sharded ODC dict of the same layout (its own get_state_dict at this world size). With
    `from_rank0`, rank 0's whole dicts, of which the other ranks hold a skeleton (rank0.py):
    every tensor comes from rank 0, buffers too. An empty `optim_sd` loads the model alone and
    leaves the optimizer as it is (a fresh one steps from pretrained weights as in one process)."""
    target = sharded_state(engine, for_load=True, optimizer=bool(optim_sd))
    assert engine.model is not None
    aliases = _aliases(engine.model)
    names = {alias: group for group in aliases.values() for alias in group}
    check_state_keys([names.get(key, [key]) for key in target["model"]], model_sd.keys())
    weights = {key: next(model_sd[n] for n in names.get(key, [key]) if n in model_sd) for key in target["model"]}
    # Every shape before any copy: a refusal loads nothing.
    for key, view in target["model"].items():
        _check_shape(view, weights[key], key)
    targets = target["optim"]["state"] if "optim" in target else {}
    for name, views in targets.items():
        for key, view in views.items() if name in optim_sd["state"] else ():
            _check_shape(view, optim_sd["state"][name][key], f"{name} {key}")
    on = reduction_device(engine.device)
    model = {key: _fill(view, weights[key], key, on, from_rank0) for key, view in target["model"].items()}
    state: dict[str, Any] = {}
    for name, views in targets.items():
        given = optim_sd["state"].get(name)
        if given is None:
            from odc_core.checkpoint import start_fresh

            start_fresh(views)
            continue
        state[name] = {key: _fill(view, given[key], f"{name} {key}", on, from_rank0) for key, view in views.items()}
    optim = {"optim": {"state": state, "param_groups": optim_sd["param_groups"]}} if optim_sd else {}
    load_sharded_state(engine, {"model": model, **optim})


def _check_shape(view: Any, given: Any, what: str) -> None:
    """A one-line error where `given` cannot fill a ShardedTensor view (the boxes of its shards
    would take a slice of a larger tensor, or fail in a smaller one) or a buffer (which torch's
    load_state_dict refused in its lines); a module's extra state is not a tensor."""
    if isinstance(view, torch.Tensor):  # a ShardedTensor is one too
        check_state_shape(what, given, tuple(view.size()))


@torch.no_grad()  # a state dict of nn.Parameters (dict(model.named_parameters())) is a model's state too
def _fill(view: Any, given: Any, what: str, on: torch.device, from_rank0: bool) -> Any:
    """Copy what `given` holds of a ShardedTensor view's local boxes into them; any other value
    is taken as given (a scalar, a buffer; with `from_rank0`, a buffer as rank 0 holds it). A
    whole tensor is rank 0's (rank0.py), broadcast: each rank's boxes lie anywhere in the
    tensor, and a state dict is loaded once, not per step."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torch.distributed.tensor import DTensor

    if not isinstance(view, ShardedTensor):
        return rank0_tensor(given, on) if from_rank0 and isinstance(given, torch.Tensor) and given.dim() else given
    if isinstance(given, DTensor):
        given = given.full_tensor()  # collective: every rank visits the same keys in the same order
    elif isinstance(given, ShardedTensor):
        theirs = {tuple(s.metadata.shard_offsets): s.tensor for s in given.local_shards()}
        for shard in view.local_shards():
            source = theirs.get(tuple(shard.metadata.shard_offsets))
            if source is None or source.shape != shard.tensor.shape:
                raise ValueError(f"{what}: a sharded ODC state dict loads only into the layout it came from (engine "
                                 f"odc, the same world size); pass a full one (get_state_dict(engine, full=True)) "
                                 f"or go through odc_core.checkpoint")
            shard.tensor.copy_(source)
        return view
    elif dist.get_world_size() > 1:
        given = rank0_tensor(given, on)
    for shard in view.local_shards():
        box = tuple(slice(o, o + n) for o, n in zip(shard.metadata.shard_offsets, shard.metadata.shard_sizes,
                                                    strict=True))
        shard.tensor.copy_(given[box])
    return view


def _aliases(model: torch.nn.Module) -> dict[int, list[str]]:
    """Every name of each parameter (tied ones have several), by the parameter's id."""
    aliases: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(name)
    return aliases


def _groups(engine: OdcEngine) -> list[dict[str, Any]]:
    """The optimizer's groups as DCP lays them out: their options and their parameters' names."""
    return [{**{k: v for k, v in g.items() if k != "params"}, "params": names}
            for g, names in zip(engine.optimizer.param_groups, engine.group_names, strict=True)]


def load_sharded_state(engine: OdcEngine, state: dict[str, Any]) -> None:
    """After DCP has loaded into sharded_state(for_load=True)'s views: what is not a view
    (scalars, hyperparameters, buffers) is applied, and the version published to peers. An
    state without "optim" (the model alone) leaves the optimizer as it is."""
    model = engine.model
    assert model is not None
    if "optim" in state:
        _load_optimizer(engine, state["optim"])
    slot = engine.versions.newest_slot
    for unit in engine.units:
        if unit.shadow is not None:
            unit.shadow[slot].copy_(unit.master[slot])
    # What is not a parameter: buffers, and modules' extra state (set_extra_state), which a load
    # of buffers alone left as it was.
    named = {n for n, p in model.named_parameters(remove_duplicate=False)}
    with engine.module_state.internal():
        model.load_state_dict({n: v for n, v in state["model"].items() if n not in named}, strict=False)
    engine.heap.barrier(engine.timeout_s)  # nobody gathers a shard before its owner has loaded it


def _load_optimizer(engine: OdcEngine, loaded: dict[str, Any]) -> None:
    """An optimizer state's groups and scalars, into the optimizer (its moments are views DCP or
    set_state filled)."""
    opt = engine.optimizer
    if len(loaded["param_groups"]) != len(opt.param_groups):
        raise ValueError(f"the state has {len(loaded['param_groups'])} optimizer parameter groups, this optimizer "
                         f"{len(opt.param_groups)}: configure_optimizer with the param_groups it was saved with")
    for group, given in zip(opt.param_groups, loaded["param_groups"], strict=True):
        for key, value in given.items():
            if key != "params":
                group[key] = value
    for unit in engine.units:
        for held in (piece for piece in unit.pieces if not piece.frozen):
            # Scalars (a step count) are a piece's own, not views: take them from a parameter it
            # holds, or where the state has none of those (start_fresh), from any it has.
            inside = [unit.names[j] for j in range(len(unit.params)) if held.lo <= unit.local_range(j)[0] < held.hi]
            given = [loaded["state"][n] for n in inside if n in loaded["state"]] + list(loaded["state"].values())
            for key, value in opt.state[held.param].items():
                source = next((g[key] for g in given if key in g), None)
                if torch.is_tensor(value) and not _flat(value, held) and source is not None:
                    value.copy_(source)


def _flat(value: object, piece: Piece) -> bool:
    """Whether an optimizer state value is per element of the piece (moments), not a scalar."""
    return torch.is_tensor(value) and value.shape == piece.param.shape


def _template(engine: OdcEngine) -> dict[str, Any]:
    """The optimizer state of a trainable piece, by key: ("per element", dtype) for a moment, the
    value for a scalar (a step count: every trainable piece steps at every minibatch, so it is
    the same in all). Where the model has frozen parameters a rank's shards may hold none that
    trains, and so no state to read it from: then the ranks agree on it (collective)."""
    opt = engine.optimizer
    mine = next(({k: ("per element", v.dtype) if _flat(v, piece) else v.detach().clone()
                  for k, v in opt.state[piece.param].items()}
                 for unit in engine.units for piece in unit.pieces if not piece.frozen), None)
    if all(all(unit.trainable) for unit in engine.units):
        assert mine is not None, "a rank holds at least one piece"
        return mine
    every: list[dict[str, Any] | None] = [None] * engine.world_size
    dist.all_gather_object(every, None if mine is None else
                           {k: v if isinstance(v, tuple) else v.cpu() for k, v in mine.items()})
    return mine if mine is not None else next((t for t in every if t is not None), {})


def _init_state(engine: OdcEngine) -> None:
    """Give a fresh optimizer its state (a step at learning rate 0 on zero gradients of the
    trainable pieces), so that a checkpoint can be loaded into it."""
    opt = engine.optimizer
    if opt.state:
        return
    lrs = [g["lr"] for g in opt.param_groups]
    for g in opt.param_groups:
        g["lr"] = 0.0
    for piece in (piece for unit in engine.units for piece in unit.pieces if not piece.frozen):
        piece.param.grad = torch.zeros_like(piece.param)
    opt.step()
    opt.zero_grad(set_to_none=True)
    for g, lr in zip(opt.param_groups, lrs, strict=True):
        g["lr"] = lr
