"""What a balancer produces, and checks every plan must pass.

A plan says, for each rank, the ordered microbatches it runs in one minibatch; a microbatch
is a list of indices into that minibatch's list of sample lengths.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

Microbatch = list[int]
RankPlan = list[Microbatch]
Plan = list[RankPlan]


def check_plan(plan: Plan, lengths: Sequence[int], world_size: int, max_tokens: int) -> None:
    """Raise ValueError unless every sample appears exactly once and microbatches fit (the first
    microbatch, rank by rank, that is empty or over the limit is named)."""
    if len(plan) != world_size:
        raise ValueError(f"plan has {len(plan)} ranks, expected {world_size}")
    mbs = [mb for rank in plan for mb in rank]
    sizes = np.fromiter(map(len, mbs), np.int64, count=len(mbs))
    items = np.fromiter(itertools.chain.from_iterable(mbs), np.int64, count=int(sizes.sum()))
    if items.size != len(lengths) or not np.array_equal(np.sort(items), np.arange(items.size)):
        raise ValueError("plan must place every sample of the minibatch exactly once")
    tokens = np.bincount(np.repeat(np.arange(len(mbs)), sizes), np.asarray(lengths, dtype=np.int64)[items],
                         minlength=len(mbs)).astype(np.int64)
    bad = np.flatnonzero((sizes == 0) | (tokens > max_tokens))
    if bad.size:
        first = int(bad[0])
        r = int(np.searchsorted(np.cumsum([len(rank) for rank in plan]), first, side="right"))
        if sizes[first] == 0:
            raise ValueError(f"rank {r} has an empty microbatch")
        raise ValueError(f"rank {r} has a microbatch of {int(tokens[first])} tokens over the limit {max_tokens}")
