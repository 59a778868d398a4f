"""Dynamic: ranks claim microbatches from one shared queue at run time (ODC only).

Static balancers trust the cost model, and where it is wrong the error turns into idle time
at the minibatch barrier. Dynamic corrects it at run time: the whole minibatch is packed
into one queue of microbatches, heaviest first, and whichever rank finishes first takes the
next entry. Only ODC can run it: ranks end with different, unpredictable microbatch counts.

How the runtime uses the queue (`dynamic_queue`; the run spec carries it per minibatch):

- every rank holds the same queue for minibatch k, computed before the run;
- one 64-bit counter on the symmetric heap, owned by rank 0, hands out entries: a rank
  claims by an atomic fetch-and-add of 1 and runs entry `claimed - base_k`; once that index
  reaches the queue's length the rank stops claiming and enters finish_minibatch. That last,
  failing claim also counts, so base_k is the sum over earlier minibatches of (queue length
  + world size). The counter is never reset; no rank claims for k + 1 before every rank has
  made its failing claim for k, since that precedes the minibatch barrier (run/worker.py);
- a rank may run zero microbatches; the loss stays normalized by the minibatch's global
  token count, so who ran what does not change the gradient.

`scheduled` gives the predicted outcome of that process under the cost model: list
scheduling of the queue (balancers/schedule.py), which is what the claims produce when the
cost model is right. Plan quality and the predicted bubble rate use it.

Queue granularity trades balance against overhead: small entries at the tail let the
claims even out cost-model error, while each entry costs a pass of parameter gathers. So
the queue is chosen by the cost model: candidates pack samples first-fit decreasing under
max_tokens and a per-entry cost cap (the lower bound, then 0.8 times that, and so on down to
one sample per entry), each is list-scheduled, and the fewest-entry candidate whose predicted
time is within `slack` of the best one wins. The cost model's per-microbatch constant (c,
see cost.py) is what makes fewer entries pay off; with equal lengths the winner
reaches the lower bound.

There is no `equal_samples` option: which rank runs which entry is decided at run time, so
equal sample counts per rank cannot be promised; use lb_mini with equal_samples instead.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from odc_bench.balancers.cost import CostModel
from odc_bench.balancers.packing import heaviest_first
from odc_bench.balancers.plan import Microbatch, Plan
from odc_bench.balancers.schedule import list_schedule
from odc_bench.config.fields import require
from odc_bench.sums import left_sum

# Candidate entry-cost caps: the lower bound, then shrinking by this factor down to the
# cheapest sample (a geometric ladder: a handful of candidates even for very skewed costs).
CAP_RATIO = 0.8
# The default slack. Exact predicted balance (0) is the wrong target for a balancer whose
# point is to correct the cost model at run time: under a model without a per-microbatch
# cost (linear, quadratic, flops) it picks the finest queue that balances on paper, and every
# microbatch costs a pass of gathers the model does not see (measured in docs/balancers.md).
DEFAULT_SLACK = 0.05


@dataclass(frozen=True, kw_only=True)
class DynamicOptions:
    # Accept this much more predicted time (0.05 = 5%) for a queue of fewer microbatches.
    slack: float = DEFAULT_SLACK

    def __post_init__(self) -> None:
        require(self.slack >= 0, f"balancer.options.slack must be a number >= 0, got {self.slack!r}")


def capped_packing(lengths: Sequence[int], max_tokens: int, cost: CostModel, cap: float) -> list[Microbatch]:
    """First-fit decreasing by cost: entries up to `cap` in cost and max_tokens in tokens."""
    entries: list[Microbatch] = []
    room: list[tuple[float, int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        c, n = cost(lengths[i]), lengths[i]
        for e, (free_cost, free_tokens) in enumerate(room):
            if c <= free_cost and n <= free_tokens:
                entries[e].append(i)
                room[e] = (free_cost - c, free_tokens - n)
                break
        else:
            entries.append([i])
            room.append((cap - c, max_tokens - n))
    return entries


def schedule_time(plan: Plan, lengths: Sequence[int], cost: CostModel) -> float:
    return max((left_sum(cost.microbatch(lengths[i] for i in mb) for mb in rank) for rank in plan), default=0.0)


def scheduled(queue: Sequence[Microbatch], lengths: Sequence[int], cost: CostModel, world_size: int) -> Plan:
    """The plan claiming produces when every entry takes the time `cost` predicts."""
    seconds = [cost.microbatch(lengths[i] for i in mb) for mb in queue]
    return [[list(queue[i]) for i in rank] for rank in list_schedule(seconds, world_size)]


def dynamic_queue(lengths: Sequence[int], world_size: int, max_tokens: int, cost: CostModel,
                  options: DynamicOptions = DynamicOptions()) -> list[Microbatch]:
    """The minibatch's microbatches in claim order, heaviest first."""
    if not lengths:
        return []
    costs = [cost(n) for n in lengths]
    bound = max(left_sum(costs) / world_size, max(costs))
    smallest = min((c for c in costs if c > 0), default=0.0)
    candidates, seen = [], set()
    for step in itertools.count():
        cap = bound * CAP_RATIO**step
        queue = heaviest_first(capped_packing(lengths, max_tokens, cost, cap), lengths, cost)
        key = tuple(map(tuple, queue))
        if key not in seen:
            seen.add(key)
            candidates.append((schedule_time(scheduled(queue, lengths, cost, world_size), lengths, cost), queue))
        if len(queue) == len(lengths) or cap < smallest:
            break
    best = min(t for t, _ in candidates)
    return min((q for t, q in candidates if t <= best * (1 + options.slack)), key=len)
