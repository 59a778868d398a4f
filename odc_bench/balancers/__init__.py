"""Minibatch balancers: pure functions from sample lengths to a per-rank microbatch plan."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from odc_bench.balancers.local_sort import local_sort
from odc_bench.balancers.plan import Plan, check_plan, microbatch_counts

Balancer = Callable[..., Plan]

BALANCERS: dict[str, Balancer] = {
    "local_sort": local_sort,
}

# Balancers whose plans give ranks different microbatch counts: only ODC can run them.
UNEQUAL_COUNTS: frozenset[str] = frozenset()


def make_plan(name: str, lengths: Sequence[int], world_size: int, max_tokens: int, **options: object) -> Plan:
    plan = BALANCERS[name](lengths, world_size, max_tokens, **options)
    check_plan(plan, lengths, world_size, max_tokens)
    return plan


__all__ = ["BALANCERS", "UNEQUAL_COUNTS", "Plan", "check_plan", "make_plan", "microbatch_counts"]
