"""Which parameters each sharding unit holds, and which units share one.

A unit holds the parameters of its module that no other unit inside it holds (FSDP2's rule:
fully_shard on an outer module manages what its inner fully_shard'ed modules do not), so a
root-like unit that contains the decoder layers holds only what lies outside them. A parameter
two units hold (tied input and output embeddings) makes them one sharing group; each engine
decides what to do with such groups (odc/unit.py: one flat group gathered from the first unit's
forward to the last one's backward; fsdp2.py: the shared parameter falls to the root).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from torch import nn


def check_units(model: nn.Module, units: Iterable[object]) -> list[nn.Module]:
    """The units as a list, or a one-line error for a list no engine can shard by: each unit is a
    module of the model that its forward calls, listed once."""
    inside = {id(m) for m in model.modules()}
    first: dict[int, int] = {}
    checked: list[nn.Module] = []
    # A module alone, or None: Python's "object is not iterable" said neither. A module with a
    # forward that iterates (nn.Sequential) would have given its children as the units.
    called = isinstance(units, nn.Module) and type(units).forward is not nn.Module.forward
    if called or not isinstance(units, Iterable):
        raise TypeError(f"units is a {type(units).__name__}, not a list of modules: list the modules to shard by "
                        f"([model.head] for one module, [] for the model as one unit)")
    for i, unit in enumerate(units):
        if not isinstance(unit, nn.Module):
            raise TypeError(f"units[{i}] is a {type(unit).__name__}, not a module: list the modules to shard "
                            f"by (a decoder layer each, the embeddings, the head)")
        what = f"units[{i}] ({type(unit).__name__})"
        if id(unit) not in inside:
            raise ValueError(f"{what} is not a module of the model given to wrap(): list modules of that model")
        if id(unit) in first:
            raise ValueError(f"{what} is units[{first[id(unit)]}] again: list each module once")
        first[id(unit)] = i
        if type(unit).forward is nn.Module.forward:
            # Hooks on a module nobody calls never run: its parameters would never be gathered
            # (FSDP2 refuses ModuleList and ModuleDict for the same reason).
            raise ValueError(f"{what} has no forward, so the model never calls it: list the modules it holds "
                             f"instead (*model.layers for a ModuleList)")
        checked.append(unit)
    return checked


def unit_parameters(units: Sequence[nn.Module]) -> list[list[nn.Parameter]]:
    """Each unit's own parameters, in module order, each once per unit: those registered in its
    modules that are not inside another unit. A parameter also registered outside the unit that
    holds it (`model.w = model.layers[0].weight`) is held by both, as FSDP2 sees it."""
    listed = {id(m) for m in units}
    held: list[list[nn.Parameter]] = []
    for module in units:
        params: dict[int, nn.Parameter] = {}
        seen: set[int] = set()
        todo = [module]
        while todo:
            sub = todo.pop(0)  # in module order, as module.parameters() lists them
            if id(sub) in seen or (sub is not module and id(sub) in listed):
                continue
            seen.add(id(sub))
            for p in sub._parameters.values():
                if p is not None:
                    params.setdefault(id(p), p)
            todo[:0] = [child for child in sub._modules.values() if child is not None]
        held.append(list(params.values()))
    return held


def sharing_groups(held: Sequence[Sequence[nn.Parameter]]) -> list[list[int]]:
    """The units, grouped so that no parameter is held by units of two groups; each group's
    units in their order, groups ordered by their first unit."""
    parent = list(range(len(held)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first_holder: dict[int, int] = {}
    for i, params in enumerate(held):
        for p in params:
            j = first_holder.setdefault(id(p), i)
            parent[root(i)] = root(j)
    groups: dict[int, list[int]] = {}
    for i in range(len(held)):
        groups.setdefault(root(i), []).append(i)
    return sorted(groups.values(), key=lambda g: g[0])
