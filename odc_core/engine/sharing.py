"""Which parameters each sharding unit holds, and which units share one.

A unit holds the parameters of its module that no other unit inside it holds (FSDP2's rule:
fully_shard on an outer module manages what its inner fully_shard'ed modules do not), so a
root-like unit that contains the decoder layers holds only what lies outside them. A parameter
two units hold (tied input and output embeddings) makes them one sharing group; each engine
decides what to do with such groups (odc/unit.py: one flat group gathered from the first unit's
forward to the last one's backward; fsdp2.py: the shared parameter falls to the root).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn


def unit_parameters(units: Sequence[nn.Module]) -> list[list[nn.Parameter]]:
    """Each unit's own parameters, in module order, each once per unit."""
    positions = {id(m): i for i, m in enumerate(units)}
    held: list[list[nn.Parameter]] = []
    for i, module in enumerate(units):
        inner: set[int] = set()
        for sub in module.modules():
            j = positions.get(id(sub))
            if j is not None and j != i:
                inner.update(id(p) for p in sub.parameters())
        held.append([p for p in module.parameters() if id(p) not in inner])
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
