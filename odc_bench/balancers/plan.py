"""What a balancer produces, and checks every plan must pass.

A plan says, for each rank, the ordered microbatches it runs in one minibatch; a microbatch
is a list of indices into that minibatch's list of sample lengths.
"""

from __future__ import annotations

from collections.abc import Sequence

Microbatch = list[int]
RankPlan = list[Microbatch]
Plan = list[RankPlan]


def check_plan(plan: Plan, lengths: Sequence[int], world_size: int, max_tokens: int) -> None:
    """Raise ValueError unless every sample appears exactly once and microbatches fit."""
    if len(plan) != world_size:
        raise ValueError(f"plan has {len(plan)} ranks, expected {world_size}")
    seen = sorted(i for rank in plan for mb in rank for i in mb)
    if seen != list(range(len(lengths))):
        raise ValueError("plan must place every sample of the minibatch exactly once")
    for r, rank in enumerate(plan):
        for mb in rank:
            if not mb:
                raise ValueError(f"rank {r} has an empty microbatch")
            tokens = sum(lengths[i] for i in mb)
            if tokens > max_tokens:
                raise ValueError(f"rank {r} has a microbatch of {tokens} tokens over the limit {max_tokens}")
