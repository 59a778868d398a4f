"""How good a plan is, predicted from the cost model alone.

Two execution semantics (paper, section 3):
- collective: every microbatch step is a barrier (each layer's all-gather and
  reduce-scatter), so a step takes as long as its slowest rank and the minibatch takes the
  sum over steps of the max over ranks (Eq. 1); a rank without a microbatch at some step
  contributes nothing to it;
- odc: ranks only meet at the end of the minibatch, so it takes the max over ranks of each
  rank's own sum.

No plan can beat the lower bound max(total cost / world size, costliest single sample):
work divides at best evenly, and a sample cannot be split. The bubble rate is the idle
share of rank-time, 1 - total cost / (world size x time); the lower bound's own bubble is
the part no balancer can remove.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from odc_bench.balancers.cost import CostModel
from odc_bench.balancers.plan import Plan

SEMANTICS = ("collective", "odc")


def microbatch_costs(plan: Plan, lengths: Sequence[int], cost: CostModel) -> list[list[float]]:
    return [[cost.microbatch(lengths[i] for i in mb) for mb in rank] for rank in plan]


def collective_time(plan: Plan, lengths: Sequence[int], cost: CostModel) -> float:
    per_rank = microbatch_costs(plan, lengths, cost)
    steps = max((len(r) for r in per_rank), default=0)
    return sum(max(r[j] if j < len(r) else 0.0 for r in per_rank) for j in range(steps))


def odc_time(plan: Plan, lengths: Sequence[int], cost: CostModel) -> float:
    return max((sum(r) for r in microbatch_costs(plan, lengths, cost)), default=0.0)


def plan_time(plan: Plan, lengths: Sequence[int], cost: CostModel, semantics: str) -> float:
    if semantics == "collective":
        return collective_time(plan, lengths, cost)
    if semantics == "odc":
        return odc_time(plan, lengths, cost)
    raise ValueError(f"unknown semantics {semantics!r}; choose one of {', '.join(SEMANTICS)}")


def plan_work(plan: Plan, lengths: Sequence[int], cost: CostModel) -> float:
    """Busy rank-time the plan needs: every microbatch's cost once."""
    return sum(sum(r) for r in microbatch_costs(plan, lengths, cost))


def least_work(lengths: Sequence[int], max_tokens: int, cost: CostModel) -> float:
    """The least busy rank-time any plan needs: every sample once, the fewest microbatches."""
    fewest = math.ceil(sum(lengths) / max_tokens) if lengths else 0
    return sum(cost(n) for n in lengths) + cost.c * fewest


def lower_bound(lengths: Sequence[int], world_size: int, max_tokens: int, cost: CostModel) -> float:
    if not lengths:
        return 0.0
    costliest = max(cost(n) for n in lengths) + cost.c
    return max(least_work(lengths, max_tokens, cost) / world_size, costliest)


def bubble_rate(work: float, world_size: int, time: float) -> float:
    return 1.0 - work / (world_size * time) if time > 0 else 0.0


@dataclass(frozen=True)
class Prediction:
    """One minibatch's predicted time and busy rank-time, with its lower bound."""

    time: float
    work: float
    bound: float
    bound_work: float


def predict(plan: Plan, lengths: Sequence[int], world_size: int, max_tokens: int, cost: CostModel,
            semantics: str) -> Prediction:
    return Prediction(time=plan_time(plan, lengths, cost, semantics), work=plan_work(plan, lengths, cost),
                      bound=lower_bound(lengths, world_size, max_tokens, cost),
                      bound_work=least_work(lengths, max_tokens, cost))


def run_bubble_rate(predictions: Iterable[Prediction], world_size: int, of_bound: bool = False) -> float:
    """The predicted bubble of minibatches run one after another (or of their lower bounds)."""
    preds = list(predictions)
    if of_bound:
        return bubble_rate(sum(p.bound_work for p in preds), world_size, sum(p.bound for p in preds))
    return bubble_rate(sum(p.work for p in preds), world_size, sum(p.time for p in preds))
