"""Minibatch balancers: pure functions from sample lengths to a per-rank microbatch plan.

Every balancer is called as `balancer(lengths, world_size, max_tokens, cost, seed, **options)`
where `cost` maps a document length to its predicted compute (a microbatch costs the sum of
its documents: attention runs per document). Options are keyword-only parameters, so the
config can list and check them. No balancer here is randomized; `seed` is part of the
signature so that a randomized one would fit.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

from odc_bench.balancers.dynamic import dynamic, dynamic_queue, list_schedule
from odc_bench.balancers.lb_micro import lb_micro
from odc_bench.balancers.lb_mini import lb_mini
from odc_bench.balancers.local_sort import local_sort
from odc_bench.balancers.packing import Cost
from odc_bench.balancers.plan import Microbatch, Plan, check_plan, microbatch_counts

Balancer = Callable[..., Plan]

BALANCERS: dict[str, Balancer] = {
    "local_sort": local_sort,
    "lb_micro": lb_micro,
    "lb_mini": lb_mini,
    "dynamic": dynamic,
}

# Balancers whose plans give ranks different microbatch counts: only ODC can run them.
UNEQUAL_COUNTS: frozenset[str] = frozenset({"lb_mini", "dynamic"})

# Balancers whose ranks claim work at run time from a shared queue (see balancers/dynamic.py).
QUEUES: dict[str, Callable[..., list[Microbatch]]] = {
    "dynamic": dynamic_queue,
}


def tokens(length: int) -> float:
    """The default cost: a document costs its token count."""
    return float(length)


def balancer_options(name: str) -> dict[str, object]:
    """The options a balancer accepts (its keyword-only parameters), with their defaults."""
    params = inspect.signature(BALANCERS[name]).parameters.values()
    return {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def make_plan(name: str, lengths: Sequence[int], world_size: int, max_tokens: int, cost: Cost = tokens,
              seed: int = 0, **options: object) -> Plan:
    plan = BALANCERS[name](lengths, world_size, max_tokens, cost, seed, **options)
    check_plan(plan, lengths, world_size, max_tokens)
    return plan


def make_queue(name: str, lengths: Sequence[int], world_size: int, max_tokens: int, cost: Cost = tokens,
               **options: object) -> list[Microbatch] | None:
    """The claim queue of a run-time balancer; None for balancers whose plan is final."""
    if name not in QUEUES:
        return None
    return QUEUES[name](lengths, world_size, max_tokens, cost, **options)


__all__ = ["BALANCERS", "QUEUES", "UNEQUAL_COUNTS", "Cost", "Microbatch", "Plan", "balancer_options",
           "check_plan", "list_schedule", "make_plan", "make_queue", "microbatch_counts", "tokens"]
