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

Stale-synchronous ODC (engine.staleness=s >= 1) has no barrier per minibatch, so its time is a
property of the run, not a sum over minibatches: StaleClock predicts it, stale_lower_bound
bounds it (docs/staleness.md).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from odc_bench.balancers.cost import CostModel
from odc_bench.balancers.plan import Plan
from odc_bench.sums import left_sum

SEMANTICS = ("collective", "odc")


def microbatch_costs(plan: Plan, lengths: Sequence[int], cost: CostModel) -> list[list[float]]:
    """[[cost.microbatch(lengths[i] for i in mb) for mb in rank] for rank in plan], for every
    microbatch at once: each one's documents summed left to right from zero, as left_sum() does, one
    column of a zero-padded matrix at a time (adding a padding zero changes nothing)."""
    mbs = [mb for rank in plan for mb in rank]
    sizes = np.fromiter(map(len, mbs), np.int64, count=len(mbs))
    items = np.fromiter(itertools.chain.from_iterable(mbs), np.int64, count=int(sizes.sum()))
    docs = np.zeros((len(mbs), int(sizes.max(initial=0))))
    docs[np.repeat(np.arange(len(mbs)), sizes), np.arange(items.size) - np.repeat(np.cumsum(sizes) - sizes, sizes)] = \
        cost.each(np.asarray(lengths)[items])
    total = np.zeros(len(mbs))
    for column in docs.T:
        total += column
    flat = (cost.c + total).tolist()
    out, at = [], 0
    for rank in plan:
        out.append(flat[at:at + len(rank)])
        at += len(rank)
    return out


def collective_time(plan: Plan, lengths: Sequence[int], cost: CostModel) -> float:
    return _collective_time(microbatch_costs(plan, lengths, cost))


def _collective_time(per_rank: list[list[float]]) -> float:
    steps = max((len(r) for r in per_rank), default=0)
    return left_sum(max(r[j] if j < len(r) else 0.0 for r in per_rank) for j in range(steps))


def odc_time(plan: Plan, lengths: Sequence[int], cost: CostModel) -> float:
    return _odc_time(microbatch_costs(plan, lengths, cost))


def _odc_time(per_rank: list[list[float]]) -> float:
    return max((left_sum(r) for r in per_rank), default=0.0)


def _plan_time(per_rank: list[list[float]], semantics: str) -> float:
    if semantics == "collective":
        return _collective_time(per_rank)
    if semantics == "odc":
        return _odc_time(per_rank)
    raise ValueError(f"unknown semantics {semantics!r}; choose one of {', '.join(SEMANTICS)}")


def plan_work(plan: Plan, lengths: Sequence[int], cost: CostModel) -> float:
    """Busy rank-time the plan needs: every microbatch's cost once."""
    return left_sum(left_sum(r) for r in microbatch_costs(plan, lengths, cost))


def least_work(lengths: Sequence[int], max_tokens: int, cost: CostModel) -> float:
    """The least busy rank-time any plan needs: every sample once, the fewest microbatches."""
    fewest = math.ceil(sum(lengths) / max_tokens) if len(lengths) else 0
    return left_sum(cost.each(lengths).tolist()) + cost.c * fewest


def lower_bound(lengths: Sequence[int], world_size: int, max_tokens: int, cost: CostModel) -> float:
    if not len(lengths):
        return 0.0
    costliest = float(cost.each(lengths).max()) + cost.c
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
            semantics: str, per_rank: list[list[float]] | None = None) -> Prediction:
    """`per_rank`: the plan's microbatch_costs, where the caller has them already."""
    if per_rank is None:
        per_rank = microbatch_costs(plan, lengths, cost)
    return Prediction(time=_plan_time(per_rank, semantics), work=left_sum(left_sum(r) for r in per_rank),
                      bound=lower_bound(lengths, world_size, max_tokens, cost),
                      bound_work=least_work(lengths, max_tokens, cost))


def run_bubble_rate(predictions: Iterable[Prediction], world_size: int, of_bound: bool = False) -> float:
    """The predicted bubble of minibatches run one after another (or of their lower bounds)."""
    preds = list(predictions)
    if of_bound:
        return bubble_rate(left_sum(p.bound_work for p in preds), world_size, left_sum(p.bound for p in preds))
    return bubble_rate(left_sum(p.work for p in preds), world_size, left_sum(p.time for p in preds))


# ---- stale-synchronous ODC ----------------------------------------------------------------
#
# With staleness s, minibatch k computes on the parameters after k - s steps, and step j needs
# every rank's gradients of minibatch j: a rank starts minibatch k once it has finished k - 1
# and every rank has finished k - s - 1 (taking communication and the step as free, as the
# synchronous model does). A rank without work in k passes through without waiting. s = 0 is
# the synchronous model: every minibatch starts when the last rank finished the one before.


@dataclass
class StaleClock:
    """Predicted stale-synchronous timing, one minibatch at a time, so that a balancer can plan
    minibatch k knowing when each rank will be free for it."""

    world_size: int
    staleness: int
    # Per rank: when its work of the latest minibatch ended.
    finish: list[float] = field(default_factory=list)
    # Per minibatch so far: when every rank had finished it.
    done: list[float] = field(default_factory=list)
    # Per minibatch so far, per rank: when the rank left it (its span's end): its own finish,
    # or with s = 0 the barrier, which every rank leaves together.
    left: list[list[float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.finish:
            self.finish = [0.0] * self.world_size

    def version_time(self, minibatch: int) -> float:
        """When the version minibatch `minibatch` computes on is published everywhere."""
        needed = minibatch - self.staleness - 1  # the last minibatch whose step it needs
        return self.done[needed] if needed >= 0 else 0.0

    def ready(self) -> list[float]:
        """When each rank can start working on the next minibatch."""
        version = self.version_time(len(self.done))
        return [max(f, version) for f in self.finish]

    def advance(self, work: Sequence[float]) -> None:
        """The next minibatch runs with `work` (busy time per rank)."""
        self.finish = [r + w if w > 0 else f for r, w, f in zip(self.ready(), work, self.finish, strict=True)]
        self.done.append(max(self.finish))
        self.left.append([self.done[-1]] * self.world_size if self.staleness == 0 else list(self.finish))


def stale_clock(works: Sequence[Sequence[float]], staleness: int) -> StaleClock:
    """The clock after minibatches with busy time works[k][r]."""
    clock = StaleClock(len(works[0]) if works else 0, staleness)
    for work in works:
        clock.advance(work)
    return clock


def rank_work(plan: Plan, lengths: Sequence[int], cost: CostModel) -> list[float]:
    """Busy time of each rank in one minibatch."""
    return [left_sum(r) for r in microbatch_costs(plan, lengths, cost)]


def stale_window(works: Sequence[Sequence[float]], staleness: int, warmup: int = 0) -> float:
    """The predicted time of the minibatches from `warmup` on, measured as runs measure it: from
    the earliest start of a measured minibatch on any rank (a rank starts minibatch k when it
    leaves k - 1) to the end of the last one."""
    if not works:
        return 0.0
    clock = stale_clock(works, staleness)
    return clock.done[-1] - (min(clock.left[warmup - 1]) if warmup > 0 else 0.0)


def stale_bubble_rate(works: Sequence[Sequence[float]], staleness: int, warmup: int = 0) -> float:
    """The predicted bubble of the minibatches from `warmup` on (see stale_window)."""
    busy = left_sum(left_sum(w) for w in works[warmup:])
    return bubble_rate(busy, len(works[0]), stale_window(works, staleness, warmup)) if works else 0.0


def stale_lower_bound(minibatches: Sequence[Sequence[int]], world_size: int, max_tokens: int, cost: CostModel,
                      staleness: int) -> float:
    """A lower bound on the time of minibatches (lists of lengths) run stale-synchronously.

    With B_k the time every rank has finished minibatch k: minibatch i starts nowhere before
    B_{i-s-1}, so all work of minibatches j..k falls between B_{j-s-1} and B_k, divided at best
    evenly over the ranks, and minibatch k's costliest sample alone lies between B_{k-s-1} and
    B_k. Bounding B recursively gives the run's bound: the total work over the ranks plus the
    ramp, the chains of costliest samples s + 1 minibatches apart that no rank can overlap (at
    the run's start and end, and wherever one sample outweighs s + 1 minibatches' share of a
    rank). With s = 0 it is the sum of the per-minibatch bounds, lower_bound().
    """
    work = [least_work(lens, max_tokens, cost) for lens in minibatches]
    costliest = [max(cost(n) for n in lens) + cost.c if lens else 0.0 for lens in minibatches]
    bound: list[float] = []

    def before(k: int) -> float:
        return bound[k] if k >= 0 else 0.0

    for k in range(len(minibatches)):
        best = max(before(k - 1), before(k - staleness - 1) + costliest[k])
        tail = 0.0
        for j in range(k, -1, -1):
            tail += work[j]
            best = max(best, before(j - staleness - 1) + tail / world_size)
        bound.append(best)
    return bound[-1] if bound else 0.0
