"""Each minibatch's plan, planned once per command: the memo a Planner keeps (plan/spec.py), and
many minibatches planned side by side.

Plans are pure functions of their inputs, so runs over the same minibatches (the series of a
what-if, the jobs of a sweep, which differ only in the engine) plan each minibatch once. A
large run's minibatches are planned in processes forked from this one (forked.py), but for a
carry planner's, each planned knowing the one before."""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from odc_bench.balancers.cost import CostModel
from odc_bench.balancers.plan import Microbatch, Plan
from odc_bench.balancers.registry import BalancerSpec, plan_minibatch
from odc_bench.forked import first_here, usable_cpus

# A minibatch's plan, and the claim queue of a run-time balancer (else None).
Planned = tuple[Plan, list[Microbatch] | None]
# Plans of fewer samples than this, in all, are planned here: forking workers and sending the
# plans back (about a quarter of a microsecond a sample) would cost more than they save.
PARALLEL_FROM = 100_000


def _memo_key(balancer: BalancerSpec, options: Any, lengths: list[int], world: int, max_tokens: int,
              cost: CostModel, ready: Sequence[float] | None) -> tuple | None:
    """What a plan depends on (the ranks' clock only for a carry planner); None when unhashable."""
    key = (balancer.name, options, cost, world, max_tokens, tuple(lengths),
           None if ready is None or balancer.carry is None else tuple(ready))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _plan_each(balancer: BalancerSpec, options: Any, minibatches: list[list[int]], world: int, max_tokens: int,
               cost: CostModel) -> list[Planned | ValueError]:
    """One share of Plans.plan_all."""
    out: list[Planned | ValueError] = []
    with no_cycle_collection():
        for lengths in minibatches:
            try:
                out.append(plan_minibatch(balancer, options, lengths, world, max_tokens, cost))
            except ValueError as e:
                out.append(e)
    return out


class Plans:
    """The plans of one command, each planned once. Plans are never modified after planning."""

    KEPT = 4096  # plans remembered before they are all forgotten

    def __init__(self) -> None:
        self._plans: dict[tuple, Planned] = {}

    def plan(self, balancer: BalancerSpec, options: Any, lengths: list[int], world: int, max_tokens: int,
             cost: CostModel, ready: Sequence[float] | None = None) -> tuple[Plan, list[Microbatch] | None]:
        """One minibatch's plan (balancers/registry.py plan_minibatch), planned once."""
        key = _memo_key(balancer, options, lengths, world, max_tokens, cost, ready)
        if key is None:  # options holding a mutable value: plan without the memo
            return plan_minibatch(balancer, options, lengths, world, max_tokens, cost, ready)
        if key not in self._plans:
            self._remember(key, plan_minibatch(balancer, options, lengths, world, max_tokens, cost, ready))
        return self._plans[key]

    def plan_all(self, balancer: BalancerSpec, options: Any, minibatches: Sequence[list[int]], world: int,
                 max_tokens: int, cost: CostModel) -> list[Planned | ValueError]:
        """plan() of each minibatch, for a balancer that plans without the ranks' clock (any but a
        carry planner), or the ValueError it raised. Those not planned yet are planned side by side,
        where they hold PARALLEL_FROM samples or more: one share here, one in each process forked
        for each other CPU this process may use (forked.py)."""
        assert balancer.carry is None, "a carry planner plans each minibatch knowing the one before"
        keys = [_memo_key(balancer, options, lens, world, max_tokens, cost, None) for lens in minibatches]
        todo = [i for i, key in enumerate(keys) if key is None or key not in self._plans]
        planned: dict[int, Planned | ValueError] = {}
        if todo:
            ways = usable_cpus() if sum(len(minibatches[i]) for i in todo) >= PARALLEL_FROM else 1
            shares = [todo[j::ways] for j in range(min(ways, len(todo)))]
            calls = [(balancer, options, [minibatches[i] for i in share], world, max_tokens, cost) for share in shares]
            done = first_here(_plan_each, calls, ways - 1)
            planned = {i: result for share, results in zip(shares, done, strict=True)
                       for i, result in zip(share, results, strict=True)}
        out: list[Planned | ValueError] = []
        for i, key in enumerate(keys):
            if i not in planned:
                assert key is not None, "a plan without a key is never remembered, so always planned"
                out.append(self._plans[key])
            elif isinstance(result := planned[i], ValueError) or key is None:
                out.append(result)
            else:
                self._remember(key, result)
                out.append(result)
        return out

    def _remember(self, key: tuple, planned: Planned) -> None:
        if len(self._plans) >= self.KEPT:
            self._plans.clear()
        self._plans[key] = planned


@contextmanager
def no_cycle_collection() -> Iterator[None]:
    """Plans are many small lists, none in a cycle: the cyclic collector would only scan them
    again and again as they grow (a quarter of the planning time at 1,024 ranks)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
