"""Balanced k-way partitioning: Karmarkar-Karp's largest differencing method, then swaps.

Balancers need to split a few dozen costs into k groups of nearly equal sum, fast enough to
plan every minibatch of a sweep. The largest differencing method (LDM) does this well: it
keeps partial solutions ("states" of k partial sets) and repeatedly combines the two states
whose sets are most uneven, laying the heaviest set of one onto the lightest of the other,
so large differences cancel first. A local search then swaps (and, without the equal-size
constraint, moves) single items between the heaviest or lightest set and the others while
that narrows the pair's gap, fixing the small misfits LDM leaves.

With `equal_size`, every set gets the same number of items: the initial states are the
sorted costs taken k at a time, one item per set, so every combination keeps sizes equal,
and the local search only swaps.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence

# A set of a state: (sum of costs, item indices).
_Set = tuple[float, list[int]]


def _spread(state: list[_Set]) -> float:
    return state[0][0] - state[-1][0]


def _combine(a: list[_Set], b: list[_Set]) -> list[_Set]:
    """Heaviest set of one with the lightest of the other, and so on; sorted heaviest first."""
    merged = [(sa + sb, ia + ib) for (sa, ia), (sb, ib) in zip(a, reversed(b), strict=True)]
    return sorted(merged, key=lambda s: -s[0])


def largest_differencing(costs: Sequence[float], k: int, equal_size: bool = False) -> list[list[int]]:
    """Karmarkar-Karp's largest differencing method for k sets (without refinement)."""
    order = sorted(range(len(costs)), key=lambda i: (costs[i], i))
    if equal_size:
        if len(costs) % k:
            raise ValueError(f"equal-size partition of {len(costs)} items into {k} sets is impossible")
        groups = [order[j:j + k] for j in range(0, len(order), k)]
    else:
        groups = [[i] for i in order]
    tie = itertools.count()
    heap: list[tuple[float, int, list[_Set]]] = []
    for group in groups:
        state = [(float(costs[i]), [i]) for i in group] + [(0.0, []) for _ in range(k - len(group))]
        state.sort(key=lambda s: -s[0])
        heapq.heappush(heap, (-_spread(state), next(tie), state))
    if not heap:
        return [[] for _ in range(k)]
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        state = _combine(a, b)
        heapq.heappush(heap, (-_spread(state), next(tie), state))
    return [items for _, items in heap[0][2]]


def _best_exchange(costs: Sequence[float], heavy: list[int], light: list[int], gap: float, eps: float,
                   moves: bool) -> tuple[int, int | None] | None:
    """The swap (or move, light index None) that best halves the gap between two sets.

    Moving d = cost(x) - cost(y) from the heavier set to the lighter narrows their gap iff
    0 < d < gap; the best d is gap / 2. Every such exchange lowers the sum of squared set
    loads, so repeating them terminates.
    """
    best, best_err = None, None
    candidates: list[int | None] = [*light, None] if moves else list(light)
    for x in heavy:
        for y in candidates:
            d = costs[x] - (costs[y] if y is not None else 0.0)
            if eps < d < gap - eps:
                err = abs(gap - 2 * d)
                if best_err is None or err < best_err:
                    best, best_err = (x, y), err
    return best


def refine(costs: Sequence[float], parts: list[list[int]], moves: bool = False,
           max_rounds: int = 10_000) -> list[list[int]]:
    """Swap items between the heaviest (or lightest) set and the others while it helps."""
    parts = [list(p) for p in parts]
    loads = [sum(costs[i] for i in p) for p in parts]
    eps = 1e-12 * max(1.0, sum(abs(c) for c in costs))
    for _ in range(max_rounds):
        order = sorted(range(len(parts)), key=lambda p: (-loads[p], p))
        heavy, light = order[0], order[-1]
        pairs = [(heavy, q) for q in reversed(order[1:])] + [(p, light) for p in order[1:-1]]
        for p, q in pairs:
            found = _best_exchange(costs, parts[p], parts[q], loads[p] - loads[q], eps, moves)
            if found is None:
                continue
            x, y = found
            parts[p].remove(x)
            parts[q].append(x)
            delta = costs[x]
            if y is not None:
                parts[q].remove(y)
                parts[p].append(y)
                delta -= costs[y]
            loads[p] -= delta
            loads[q] += delta
            break
        else:
            break
    return parts


def _quality(costs: Sequence[float], parts: list[list[int]]) -> tuple[float, float]:
    loads = [sum(costs[i] for i in p) for p in parts]
    return max(loads), max(loads) - min(loads)


def balanced_partition(costs: Sequence[float], k: int, equal_size: bool = False) -> list[list[int]]:
    """k sets of nearly equal total cost, heaviest first, each listing item indices.

    Without the equal-size constraint the equal-size variant is tried as well (when the
    count divides), and the better one kept: on a few items LDM's greedy start can lose to
    the more structured one. Better means a lower heaviest set, then a smaller spread.
    """
    if k < 1:
        raise ValueError(f"cannot partition into {k} sets")
    parts = refine(costs, largest_differencing(costs, k, equal_size), moves=not equal_size)
    if not equal_size and costs and len(costs) % k == 0:
        alt = refine(costs, largest_differencing(costs, k, True), moves=True)
        if _quality(costs, alt) < _quality(costs, parts):
            parts = alt
    loads = [sum(costs[i] for i in p) for p in parts]
    order = sorted(range(k), key=lambda p: (-loads[p], min(parts[p], default=len(costs))))
    return [sorted(parts[p], key=lambda i: (-costs[i], i)) for p in order]
