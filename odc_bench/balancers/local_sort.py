"""LocalSort: each rank takes its strided share of the minibatch and sorts it by length.

No cross-rank balancing at all: it is the paper's weakest baseline and the only balancer
that needs no cost model. One sample per microbatch, longest first.
"""

from __future__ import annotations

from collections.abc import Sequence

from odc_bench.balancers.plan import Plan


def local_sort(lengths: Sequence[int], world_size: int, max_tokens: int, **_: object) -> Plan:
    plan: Plan = []
    for rank in range(world_size):
        share = sorted(range(rank, len(lengths), world_size), key=lambda i: (-lengths[i], i))
        plan.append([[i] for i in share])
    return plan
