"""LB-Carry: LB-Mini for stale-synchronous ODC, planning each minibatch given when every rank
will be free for it.

With staleness s >= 1 no barrier ends a minibatch, so a rank that drew minibatch k's longest
sample is still busy when its peers start k + 1 (balancers/quality.py, StaleClock). LB-Mini
would hand it an equal share of k + 1 anyway and the lag would reach the next version every
rank waits for. LB-Carry instead splits minibatch k so that each rank's finish, its ready
time plus its share, comes out even: the rank carrying load gets less, and sample counts are
free, as in LB-Mini. Each rank then packs its share into as few microbatches as max_tokens
allows. With equal ready times (s = 0, or the first minibatch) it is LB-Mini exactly.

The split is Karmarkar-Karp with one pinned item per rank: rank r's ready time, above a
common weight heavier than the whole minibatch. A partition that put two pins in one set
would be worse than any that does not, so the partitioner gives each set one pin, and the
set holding rank r's pin, planned as if it started with r's carried load, goes to rank r.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from odc_bench.balancers.cost import CostModel
from odc_bench.balancers.packing import pack_fewest_each
from odc_bench.balancers.partition import balanced_partition
from odc_bench.balancers.plan import Plan
from odc_bench.sums import left_sum


@dataclass(frozen=True, kw_only=True)
class LbCarryOptions:
    """LB-Carry has no options."""


def partition_after(costs: Sequence[float], ready: Sequence[float]) -> list[list[int]]:
    """One set of item indices per rank (in rank order) that evens out ready[r] + the set's cost."""
    k, n = len(ready), len(costs)
    carried = [r - min(ready) for r in ready]
    if max(carried) == 0:
        return balanced_partition(costs, k)
    pin = left_sum(costs) + max(carried) + 1.0
    parts = balanced_partition([*costs, *(pin + c for c in carried)], k)
    shares: list[list[int] | None] = [None] * k
    for part in parts:
        pins = [i - n for i in part if i >= n]
        if len(pins) != 1:
            return _greedy_after(costs, carried)
        shares[pins[0]] = [i for i in part if i < n]
    return [share or [] for share in shares]


def _greedy_after(costs: Sequence[float], carried: Sequence[float]) -> list[list[int]]:
    """Costliest item first to the rank that frees up first: the fallback should the pinned
    partition ever pair two pins."""
    shares: list[list[int]] = [[] for _ in carried]
    free = [(c, r) for r, c in enumerate(carried)]
    heapq.heapify(free)
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        t, r = heapq.heappop(free)
        shares[r].append(i)
        heapq.heappush(free, (t + costs[i], r))
    return shares


def lb_carry(lengths: Sequence[int], world_size: int, max_tokens: int, cost: CostModel, options: LbCarryOptions,
             ready: Sequence[float]) -> Plan:
    if len(ready) != world_size:
        raise ValueError(f"lb_carry needs a ready time per rank: {len(ready)} for {world_size} ranks")
    shares = partition_after(cost.each(lengths).tolist(), ready)
    return pack_fewest_each(shares, lengths, cost, max_tokens)
