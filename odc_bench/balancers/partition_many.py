"""The classic partition (partition.py) of many small instances at once, in numpy.

LB-Micro packs every rank's share of a minibatch into the count the busiest rank needs, so
at 1,024 ranks it splits some 600 shares of a few samples each per minibatch, every one with
balanced_partition's classic pipeline (largest differencing, then swaps). Those instances
share their size, so this module runs the same pipeline on all of them together, one step of
every instance at a time: the same states, the same comparisons and the same floating-point
additions in the same order (sums left to right in each set's list order, as left_sum() adds), so
the same answer to the last bit as balanced_partition's, which a test holds it to.

Instances are rows of a (m, n) cost matrix; a partition is a (m, k, n) matrix of item indices
per set in list order, -1 past each set's count.
"""

from __future__ import annotations

import numpy as np

from odc_bench.balancers import partition

# Largest differencing keeps n states of k sets, each set n slots wide: n * n * k per instance.
MAX_WORK = partition._VECTOR_FROM - 1


def balanced_partitions(costs: np.ndarray, k: int, equal_size: bool = False) -> np.ndarray:
    """[balanced_partition(row, k, equal_size) for row in costs] as a (m, k, n) matrix of item
    indices (-1 past each set's items): the same sets in the same order, item for item.

    Only for instances balanced_partition gives to its classic pipeline alone (n * k below
    partition._VECTOR_FROM) and n at least 1."""
    m, n = costs.shape
    if not (n >= 1 and k >= 1 and n * k <= MAX_WORK):
        raise ValueError(f"balanced_partitions is for 1 to {MAX_WORK} items x sets, not {n} x {k}")
    if equal_size and n % k:
        raise ValueError(f"equal-size partition of {n} items into {k} sets is impossible")
    costs = np.ascontiguousarray(costs, dtype=np.float64)
    parts = _refine(costs, _differencing(costs, k, equal_size), moves=not equal_size)
    if not equal_size and n % k == 0:
        alt = _refine(costs, _differencing(costs, k, True), moves=True)
        better = _quality_less(_set_loads(costs, alt), _set_loads(costs, parts))
        parts[better] = alt[better]
    return _ordered(costs, parts)


def _set_loads(costs: np.ndarray, parts: np.ndarray) -> np.ndarray:
    """Each set's load summed left to right in list order from zero, as left_sum() does (an empty
    slot adds 0.0, which changes nothing)."""
    slot = np.where(parts >= 0, np.take_along_axis(costs[:, None, :], np.maximum(parts, 0), axis=2), 0.0)
    loads = np.zeros(parts.shape[:2])
    for column in np.moveaxis(slot, 2, 0):
        loads += column
    return loads


def _quality_less(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """partition._quality(a) < partition._quality(b), per row: (heaviest, spread) compared in turn."""
    a_max, b_max = a.max(axis=1), b.max(axis=1)
    return (a_max < b_max) | ((a_max == b_max) & (a_max - a.min(axis=1) < b_max - b.min(axis=1)))


def _differencing(costs: np.ndarray, k: int, equal_size: bool) -> np.ndarray:
    """partition.largest_differencing of every row: a heap of states becomes arrays of states,
    popped in the heap's order (largest spread first, then the earliest pushed)."""
    m, n = costs.shape
    rows = np.arange(m)
    order = np.argsort(costs, axis=1, kind="stable")  # by (cost, index)
    size = k if equal_size else 1
    states = n // size
    # State s holds group s: its items one per set, then empty sets, sorted heaviest first.
    ids = np.full((m, states, k), -1, dtype=np.int64)
    ids[:, :, :size] = order.reshape(m, states, size)
    loads = np.where(ids >= 0, np.take_along_axis(costs, np.maximum(ids, 0).reshape(m, -1), axis=1)
                     .reshape(m, states, k), 0.0)
    by_load = np.argsort(-loads, axis=2, kind="stable")
    loads = np.take_along_axis(loads, by_load, axis=2)
    items = np.full((m, states, k, n), -1, dtype=np.int64)
    items[..., 0] = np.take_along_axis(ids, by_load, axis=2)
    counts = (items[..., 0] >= 0).astype(np.int64)
    spread = loads[..., 0] - loads[..., -1]
    tie = np.broadcast_to(np.arange(states), (m, states)).copy()
    alive = np.ones((m, states), dtype=bool)
    slots = np.arange(n)
    for step in range(states - 1):
        popped = np.lexsort((tie, np.where(alive, -spread, np.inf)), axis=1)
        a, b = popped[:, 0], popped[:, 1]
        # The heaviest set of a with the lightest of b, and so on: lists concatenated.
        merged = loads[rows, a] + loads[rows, b][:, ::-1]
        a_items, a_counts = items[rows, a], counts[rows, a]
        b_items, b_counts = items[rows, b][:, ::-1], counts[rows, b][:, ::-1]
        new = a_items.copy()
        r, s, j = np.nonzero(slots < b_counts[..., None])
        new[r, s, a_counts[r, s] + j] = b_items[r, s, j]
        by_load = np.argsort(-merged, axis=1, kind="stable")
        loads[rows, a] = np.take_along_axis(merged, by_load, axis=1)
        items[rows, a] = np.take_along_axis(new, by_load[..., None], axis=1)
        counts[rows, a] = np.take_along_axis(a_counts + b_counts, by_load, axis=1)
        spread[rows, a] = loads[rows, a, 0] - loads[rows, a, -1]
        tie[rows, a] = states + step
        alive[rows, b] = False
    return items[rows, alive.argmax(axis=1)]


def _refine(costs: np.ndarray, parts: np.ndarray, moves: bool, max_rounds: int = 10_000) -> np.ndarray:
    """partition._swap_refine of every row: each round, every row still improving makes the
    exchange the scalar search would make next."""
    m, k, n = parts.shape
    parts = parts.copy()
    counts = (parts >= 0).sum(axis=2)
    loads = _set_loads(costs, parts)
    total = np.zeros(m)
    for column in np.abs(costs).T:
        total += column
    eps = 1e-12 * np.maximum(1.0, total)
    if k < 2:
        return parts
    active = np.arange(m)
    slots = np.arange(n)
    for _ in range(max_rounds):
        if not active.size:
            break
        sets = np.broadcast_to(np.arange(k), (active.size, k))
        order = np.lexsort((sets, -loads[active]), axis=1)
        heavy, light = order[:, :1], order[:, -1:]
        # The scalar search's pairs in its order: (heaviest, each other from the lightest up),
        # then (each middle set from the heaviest down, lightest).
        give = np.hstack([np.repeat(heavy, k - 1, axis=1), order[:, 1:-1]])
        take = np.hstack([order[:, 1:][:, ::-1], np.repeat(light, k - 2, axis=1)])
        row = active[:, None]
        x_ids, y_ids = parts[row, give], parts[row, take]  # (a, pairs, n)
        cx = np.where(x_ids >= 0, costs[row[..., None], np.maximum(x_ids, 0)], 0.0)
        cy = np.where(y_ids >= 0, costs[row[..., None], np.maximum(y_ids, 0)], 0.0)
        d = cx[..., :, None] - cy[..., None, :]
        ok: np.ndarray = (x_ids >= 0)[..., :, None] & (y_ids >= 0)[..., None, :]
        if moves:  # a move: the light set's candidate None, after its items
            d = np.concatenate([d, cx[..., :, None] - 0.0], axis=3)
            ok = np.concatenate([ok, (x_ids >= 0)[..., :, None]], axis=3)
        gap = (loads[row, give] - loads[row, take])[..., None, None]
        e = eps[active][:, None, None, None]
        ok &= (e < d) & (d < gap - e)
        err = np.where(ok, np.abs(gap - 2 * d), np.inf).reshape(active.size, give.shape[1], -1)
        has = np.any(ok.reshape(err.shape), axis=2)
        found = has.any(axis=1)
        active = active[found]
        if not active.size:
            break
        pair = has[found].argmax(axis=1)
        i = np.arange(active.size)
        best = err[found][i, pair].argmin(axis=1)
        x_slot, y_slot = np.divmod(best, d.shape[3])
        p, q = give[found][i, pair], take[found][i, pair]
        x = parts[active, p, x_slot]
        swap = y_slot < n
        y = np.where(swap, parts[active, q, np.minimum(y_slot, n - 1)], -1)
        delta = costs[active, x] - np.where(swap, costs[active, np.maximum(y, 0)], 0.0)
        loads[active, p] -= delta
        loads[active, q] += delta
        # parts[p]: x removed, y appended; parts[q]: x appended, then y removed.
        parts[active, p] = _removed(parts[active, p], x_slot, slots)
        counts[active, p] -= 1
        parts[active, q, counts[active, q]] = x
        counts[active, q] += 1
        s = np.flatnonzero(swap)
        parts[active[s], q[s]] = _removed(parts[active[s], q[s]], y_slot[s], slots)
        counts[active[s], q[s]] -= 1
        parts[active[s], p[s], counts[active[s], p[s]]] = y[s]
        counts[active[s], p[s]] += 1
    return parts


def _removed(lists: np.ndarray, at: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """Each row with its slot `at` taken out, the rest shifted left and -1 appended."""
    shifted = np.concatenate([lists[:, 1:], np.full((len(lists), 1), -1, dtype=lists.dtype)], axis=1)
    return np.where(slots < at[:, None], lists, shifted)


def _ordered(costs: np.ndarray, parts: np.ndarray) -> np.ndarray:
    """balanced_partition's order: sets heaviest first (loads in list order), then by their
    lowest item; items costliest first, then by index."""
    m, k, n = parts.shape
    loads = _set_loads(costs, parts)
    lowest = np.where(parts >= 0, parts, n).min(axis=2)
    sets = np.lexsort((lowest, -loads), axis=1)
    parts = np.take_along_axis(parts, sets[..., None], axis=1)
    real = parts >= 0
    item_costs = np.take_along_axis(costs[:, None, :], np.maximum(parts, 0), axis=2)
    # Empty slots last: (empty, -cost, index).
    within = np.lexsort((np.where(real, parts, n), np.where(real, -item_costs, 0.0), ~real), axis=2)
    return np.take_along_axis(parts, within, axis=2)
