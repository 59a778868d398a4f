"""List scheduling: entries of a queue taken in order by whichever rank frees up first.

It is what run-time claiming produces when every entry takes its predicted time, so the
dynamic balancer predicts its outcome with it, and the simulator replays claims with it
under its own per-microbatch times.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def list_schedule(seconds: Sequence[float], world_size: int) -> list[list[int]]:
    """Entry indices per rank: each entry in turn to the rank that frees up first (ties: lower rank)."""
    ranks: list[list[int]] = [[] for _ in range(world_size)]
    free_at = [(0.0, r) for r in range(world_size)]
    for i, s in enumerate(seconds):
        t, r = heapq.heappop(free_at)
        ranks[r].append(i)
        heapq.heappush(free_at, (t + s, r))
    return ranks
