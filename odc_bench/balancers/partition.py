"""Balanced k-way partitioning: Karmarkar-Karp's largest differencing method, then swaps.

Balancers split a minibatch's costs into k groups of nearly equal sum, once per minibatch,
for k up to thousands of ranks, and packing splits one rank's few samples the same way many
times over. Two pipelines serve the two ends; `balanced_partition` runs the classic one
where it is cheap, the vectorised one where it is not, both in between, and keeps the best.

Classic (pure Python, quadratic in k): the largest differencing method (LDM) keeps partial
solutions ("states" of k partial sets) and repeatedly combines the two states whose sets are
most uneven, laying the heaviest set of one onto the lightest of the other, so large
differences cancel first. A local search then swaps (and, without the equal-size
constraint, moves) single items between the heaviest or lightest set and the others while
that narrows the pair's gap. With `equal_size`, the initial states are the sorted costs
taken k at a time, one item per set, so every combination keeps sizes equal, and the local
search only swaps.

Vectorised (numpy, near n log n): two starts, each a (k, n/k) matrix of item ids. One is
the same LDM over those chunk states (zeros pad the lightest chunk without the equal-size
constraint): n/k combinations instead of n. The other puts the k largest items one per set
and gives the i-th largest the i-th run of the rest in ascending order, so under heavy tails
the largest items share their sets with the smallest ones, which contiguous chunks cannot
arrange. Rounds then pair the i-th heaviest set with the (i + shift)-th lightest and make
every pair's best exchange at once, which evens the whole load profile; a polish gives the
heaviest set, and the lightest, an exchange of one or two slots with the farthest set that
can trade, for a step budget that shrinks with k. Empty slots are zero-cost items, so a
swap with one is a move; with `equal_size` they take no part. Reaching the lower bound
(max of total / k and the heaviest item with the fewest fillers) ends the search.

Where both run, the classic answer is the floor: the vectorised one replaces it only when
strictly better. Above _CLASSIC_UP_TO only the vectorised pipeline runs; on heavy-tailed
costs it is at least as good as the classic one, on light-tailed ones it can come out a
hair heavier (pairwise local searches end in different local optima).
"""

from __future__ import annotations

import functools
import heapq
import itertools
from collections.abc import Sequence

import numpy as np

from odc_bench.sums import left_sum

# A set of a classic state: (sum of costs, item indices).
_Set = tuple[float, list[int]]

# Up to this many items x sets the classic pipeline runs (alone below _VECTOR_FROM): its cost
# grows as n k log k, and it is the reference every faster answer is held against.
_CLASSIC_UP_TO = 16_384
_VECTOR_FROM = 2048
# Rounds of pairwise exchanges in the vectorised pipeline: each evens the load profile, and
# the polish after them finishes what they leave. A polish step costs about k, so the step
# budget shrinks with k to keep the whole near n log n.
_ROUNDS = 32
_POLISH_WORK = 65_536
_POLISH_MIN = 16
_POLISH_MAX = 256
_WINDOW = 64


def balanced_partition(costs: Sequence[float], k: int, equal_size: bool = False) -> list[list[int]]:
    """k sets of nearly equal total cost, heaviest first, each listing item indices.

    Better means a lower heaviest set, then a smaller spread; the answer is deterministic.
    """
    if k < 1:
        raise ValueError(f"cannot partition into {k} sets")
    if equal_size and len(costs) % k:
        raise ValueError(f"equal-size partition of {len(costs)} items into {k} sets is impossible")
    work = len(costs) * k
    if work > _CLASSIC_UP_TO:
        array = np.asarray(costs, dtype=float)
        return _heaviest_first(array, _vectorised(array, k, equal_size).items)
    candidates = [_classic(costs, k, equal_size)]
    if work >= _VECTOR_FROM:
        candidates.append(_vectorised(np.asarray(costs, dtype=float), k, equal_size).parts())
    parts = min(candidates, key=lambda p: _quality(costs, p))
    loads = [left_sum(costs[i] for i in p) for p in parts]
    order = sorted(range(k), key=lambda p: (-loads[p], min(parts[p], default=len(costs))))
    return [sorted(parts[p], key=lambda i: (-costs[i], i)) for p in order]


def _heaviest_first(costs: np.ndarray, items: np.ndarray) -> list[list[int]]:
    """The sets of a (k, width) matrix of item ids (-1: an empty slot) as balanced_partition
    returns them, in the same order: each set's load summed over its row left to right from
    zero, as left_sum() does (an empty slot adds 0.0, which changes nothing), heaviest first, then by
    the lowest item; items costliest first, then by index."""
    k, width = items.shape
    real = items >= 0
    slot_costs = np.where(real, costs[np.maximum(items, 0)], 0.0)
    loads = np.zeros(k)
    for column in slot_costs.T:
        loads += column
    lowest = np.where(real, items, len(costs)).min(axis=1, initial=len(costs))
    rank = np.empty(k, dtype=np.int64)
    rank[np.lexsort((lowest, -loads))] = np.arange(k)
    row, col = np.nonzero(real)
    ids = items[row, col]
    flat = ids[np.lexsort((ids, -costs[ids], rank[row]))].tolist()
    sizes = np.bincount(rank[row], minlength=k).tolist()
    out, at = [], 0
    for n in sizes:
        out.append(flat[at:at + n])
        at += n
    return out


def _quality(costs: Sequence[float], parts: list[list[int]]) -> tuple[float, float]:
    loads = [left_sum(costs[i] for i in p) for p in parts]
    return max(loads), max(loads) - min(loads)


# --- classic pipeline ---------------------------------------------------------------------


def _classic(costs: Sequence[float], k: int, equal_size: bool) -> list[list[int]]:
    """LDM and swaps; without the equal-size constraint the equal-size start is tried as well
    (when the count divides): on a few items LDM's greedy start can lose to the structured one."""
    parts = _swap_refine(costs, largest_differencing(costs, k, equal_size), moves=not equal_size)
    if not equal_size and costs and len(costs) % k == 0:
        alt = _swap_refine(costs, largest_differencing(costs, k, True), moves=True)
        if _quality(costs, alt) < _quality(costs, parts):
            parts = alt
    return parts


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


def _swap_refine(costs: Sequence[float], parts: list[list[int]], moves: bool = False,
                 max_rounds: int = 10_000) -> list[list[int]]:
    """Swap items between the heaviest (or lightest) set and the others while it helps."""
    parts = [list(p) for p in parts]
    loads = [left_sum(costs[i] for i in p) for p in parts]
    eps = 1e-12 * max(1.0, left_sum(abs(c) for c in costs))
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


# --- vectorised pipeline ------------------------------------------------------------------


class _Sets:
    """k sets as rows of a padded matrix: item ids (-1 marks an empty slot) and their costs.

    Without the equal-size constraint every row keeps a free slot, so a move is always a swap
    with an empty slot and the search needs no special case for it. With it, the count divides
    evenly (balanced_partition checks), so every slot holds an item and swaps keep it so.
    """

    def __init__(self, costs: np.ndarray, items: np.ndarray, movable: bool) -> None:
        self.movable = movable
        self.items = items
        load_matrix = np.where(items >= 0, costs[np.maximum(items, 0)], 0.0)
        self.loads = load_matrix.sum(axis=1)
        # Slot costs stored by slot, (width, k): the searches gather sets' slots with take(),
        # which is several times faster than gathering rows and transposing them.
        self.columns = np.ascontiguousarray(load_matrix.T)
        self.eps = 1e-12 * max(1.0, float(np.abs(costs).sum()))
        self._keep_free_slot()

    def _keep_free_slot(self) -> None:
        """Pack every row's items to the left and keep exactly one column past the fullest."""
        if not self.movable or not (self.items[:, -1] >= 0).any():
            return
        packed = np.argsort(self.items < 0, axis=1, kind="stable")
        self.items = np.take_along_axis(self.items, packed, axis=1)
        load_matrix = np.take_along_axis(self.columns.T, packed, axis=1)
        width = int((self.items >= 0).sum(axis=1).max()) + 1
        k, have = self.items.shape
        if width > have:
            self.items = np.hstack([self.items, np.full((k, width - have), -1, dtype=self.items.dtype)])
            load_matrix = np.hstack([load_matrix, np.zeros((k, width - have))])
        else:
            self.items, load_matrix = self.items[:, :width], load_matrix[:, :width]
        self.columns = np.ascontiguousarray(load_matrix.T)

    def exchange(self, give: np.ndarray, give_slot: np.ndarray, take: np.ndarray, take_slot: np.ndarray) -> None:
        """Swap slot give_slot of rows `give` with take_slot of rows `take` (disjoint rows)."""
        items = self.items
        a, b = items[give, give_slot], items[take, take_slot]
        items[give, give_slot], items[take, take_slot] = b, a
        columns = self.columns
        ca, cb = columns[give_slot, give], columns[take_slot, take]
        columns[give_slot, give], columns[take_slot, take] = cb, ca
        self.loads[give] += cb - ca
        self.loads[take] += ca - cb
        self._keep_free_slot()

    def swap(self, give: int, give_slot: int, take: int, take_slot: int) -> None:
        """exchange() of one pair of slots, by scalar indexing (a polish step's few swaps)."""
        items, columns = self.items, self.columns
        items[give, give_slot], items[take, take_slot] = items[take, take_slot], items[give, give_slot]
        ca, cb = columns[give_slot, give], columns[take_slot, take]
        columns[give_slot, give], columns[take_slot, take] = cb, ca
        self.loads[give] += cb - ca
        self.loads[take] += ca - cb
        self._keep_free_slot()

    def parts(self) -> list[list[int]]:
        return [[i for i in row if i >= 0] for row in self.items.tolist()]


def _vectorised(costs: np.ndarray, k: int, equal_size: bool) -> _Sets:
    """Both starts, each evened by pair rounds and polished; the lower heaviest set wins.

    The search stops early at the lower bound, where nothing can do better.
    """
    bound = _lower_bound(costs, k, equal_size)
    best: _Sets | None = None
    for start in (_chunked_differencing(costs, k), _top_with_smallest(costs, k)):
        sets = _Sets(costs, start, movable=not equal_size)
        for shift in range(_ROUNDS):
            # An idle round ends them, except the first: shifted partners may still trade.
            if sets.loads.max() <= bound or not _pair_round(sets, shift) and shift:
                break
        for _ in range(min(_POLISH_MAX, max(_POLISH_MIN, _POLISH_WORK // k))):
            if sets.loads.max() <= bound or not (_polish_step(sets, heaviest=True)
                                                 or _polish_step(sets, heaviest=False)):
                break
        if best is None or sets.loads.max() < best.loads.max():
            best = sets
        if best.loads.max() <= bound:
            break
    assert best is not None, "there is at least one start"
    return best


def _top_with_smallest(costs: np.ndarray, k: int) -> np.ndarray:
    """The k largest items one per set, the i-th largest with the i-th run of the rest in
    ascending order (zeros padding): (k, n / k) ids.

    Under heavy tails the largest items decide the heaviest set, and each should share its
    set with the smallest items, which LDM's contiguous chunks cannot arrange.
    """
    ids = np.concatenate([np.argsort(-costs, kind="stable"), np.full(-len(costs) % k, -1, dtype=np.int64)])
    return np.hstack([ids[:k].reshape(k, 1), ids[k:][::-1].reshape(k, -1)])


def _lower_bound(costs: np.ndarray, k: int, equal_size: bool) -> float:
    """A load no set can stay under (so reaching it ends the search); -inf when costs can be
    negative, which breaks the argument."""
    if not costs.size or costs.min() < 0:
        return -np.inf
    per_set = len(costs) // k
    heaviest = costs.max() + (np.sort(costs)[:per_set - 1].sum() if equal_size else 0.0)
    return max(costs.sum() / k, heaviest)


def _chunked_differencing(costs: np.ndarray, k: int) -> np.ndarray:
    """LDM over states of k sorted items each (zeros pad the lightest chunk): (k, n / k) ids.

    States keep loads sorted heaviest first, so combining lays one state reversed onto the
    other; a stable sort keeps ties in a fixed order, which makes the result deterministic.
    """
    order = np.argsort(costs, kind="stable")
    pad = -len(costs) % k
    ids = np.concatenate([np.full(pad, -1, dtype=np.int64), order])
    chunk_costs = np.concatenate([np.zeros(pad), costs[order]])
    tie = itertools.count()
    heap = []
    for j in range(0, len(ids), k):
        loads = chunk_costs[j:j + k][::-1].copy()
        heap.append((loads[-1] - loads[0], next(tie), loads, ids[j:j + k][::-1].reshape(k, 1)))
    heapq.heapify(heap)
    while len(heap) > 1:
        _, _, loads_a, ids_a = heapq.heappop(heap)
        _, _, loads_b, ids_b = heapq.heappop(heap)
        loads = loads_a + loads_b[::-1]
        order = np.argsort(-loads, kind="stable")
        loads, ids = loads[order], np.hstack([ids_a, ids_b[::-1]])[order]
        heapq.heappush(heap, (loads[-1] - loads[0], next(tie), loads, ids))
    return heap[0][3].copy()


def _pair_round(sets: _Sets, shift: int) -> bool:
    """Pair the i-th heaviest set with the (i + shift)-th lightest and make every pair's
    exchange that best halves its gap, all at once; False if no pair had one."""
    k = len(sets.loads)
    half = k // 2
    if not half:
        return False
    order = _order(sets.loads)
    heavy = order[::-1][:half]
    turn = shift % half
    light = np.concatenate((order[turn:half], order[:turn]))  # np.roll(order[:half], -turn)
    gap = sets.loads[heavy] - sets.loads[light]
    # (heavy slot, light slot, pair): the pairs innermost and contiguous, so numpy's loops run over them.
    d = sets.columns.take(heavy, axis=1)[:, None, :] - sets.columns.take(light, axis=1)[None, :, :]
    ok = (d > sets.eps) & (d < gap - sets.eps)
    # |gap - 2 d| where the exchange narrows the gap, inf elsewhere.
    err = d * 2
    np.subtract(gap, err, out=err)
    np.abs(err, out=err)
    flat = np.where(ok, err, np.inf).reshape(-1, half)
    best = flat.argmin(axis=0)
    found = np.isfinite(flat[best, np.arange(half)])
    if not found.any():
        return False
    give_slot, take_slot = np.divmod(best[found], sets.items.shape[1])
    sets.exchange(heavy[found], give_slot, light[found], take_slot)
    return True


def _polish_step(sets: _Sets, heaviest: bool) -> bool:
    """The heaviest set's exchange with the lightest set that has one (or the lightest set's
    with the heaviest that has one), halving their gap as well as it can; False if none.

    Taking the farthest partner that can trade, as the classic search does, moves the most
    load per step and keeps lowering the sets just under the top, which frees the heaviest
    set to trade again later. Single slots are tried before pairs of slots, and the nearest
    _WINDOW partners before the rest, which is where a trade is usually found: in that order,
    the first partner of the first kind that has a trade. Single slots are searched over all
    partners at once, pairs only where no single slot of a nearer window trades.
    """
    order = _order(sets.loads)
    t = int(order[-1] if heaviest else order[0])
    partners = order[:-1] if heaviest else order[1:][::-1]
    if not partners.size:
        return False
    width = sets.items.shape[1]
    mine, theirs = sets.columns[:, t], sets.columns.take(partners, axis=1)
    loads = sets.loads.take(partners)
    gap = sets.loads[t] - loads if heaviest else loads - sets.loads[t]
    singles = _Trades(sets, mine, theirs, gap, partners, _slots(width), heaviest)
    found = singles.first(0, _WINDOW)
    if found is None:
        pairs = _Trades(sets, mine, theirs[:, :_WINDOW], gap[:_WINDOW], partners[:_WINDOW], _slot_pairs(width),
                        heaviest)
        found = pairs.first(0, _WINDOW) or singles.first(_WINDOW, partners.size)
        if found is None and partners.size > _WINDOW:
            found = _Trades(sets, mine, theirs[:, _WINDOW:], gap[_WINDOW:], partners[_WINDOW:], _slot_pairs(width),
                            heaviest).first(0, partners.size)
    if found is None:
        return False
    q, mine_group, their_group, group = found
    for mine_slot, their_slot in zip(group[mine_group].tolist(), group[their_group].tolist(), strict=True):
        if heaviest:
            sets.swap(t, mine_slot, q, their_slot)
        else:
            sets.swap(q, their_slot, t, mine_slot)
    return True


class _Trades:
    """Set t's trades of a slot group (single slots, or pairs of slots) with each of `partners`:
    which groups would narrow the gap of the pair, moving d from the heavier set to the lighter
    with 0 < d < gap (eps either side). `mine`: t's slot costs; `theirs`: the partners' (slot,
    partner); `gap`: each pair's gap."""

    def __init__(self, sets: _Sets, mine: np.ndarray, theirs: np.ndarray, gap: np.ndarray, partners: np.ndarray,
                 group: np.ndarray, heaviest: bool) -> None:
        self.partners, self.group, self.gap = partners, group, gap
        if group.shape[1] == 2:  # a pair's load, its two slots added
            mine, theirs = mine[group[:, 0]] + mine[group[:, 1]], theirs[group[:, 0]] + theirs[group[:, 1]]
        # (t's group, partner's group, partner): the partners innermost, so numpy's loops run over them.
        mine3, theirs3 = mine[:, None, None], theirs[None, :, :]
        self.d = mine3 - theirs3 if heaviest else theirs3 - mine3
        self.valid = (self.d > sets.eps) & (self.d < gap - sets.eps)
        # Over t's groups, then the partner's: two reductions along long contiguous rows, where
        # one over both runs a short row of partners per pair of groups.
        self.can = self.valid.any(axis=0).any(axis=0)

    def first(self, lo: int, hi: int) -> tuple[int, int, int, np.ndarray] | None:
        """The first partner among partners[lo:hi] that can trade, and the groups that best
        halve their gap: (partner, t's group, partner's group, the groups), or None."""
        can = self.can[lo:hi]
        if not can.any():
            return None
        other = lo + int(can.argmax())
        err = np.where(self.valid[:, :, other], np.abs(self.gap[other] - 2 * self.d[:, :, other]), np.inf)
        mine_group, their_group = divmod(int(err.argmin()), len(self.group))
        return int(self.partners[other]), mine_group, their_group, self.group


def _order(loads: np.ndarray) -> np.ndarray:
    """np.argsort(loads, kind="stable"), from an unstable sort where no two loads tie (the order
    is then the only one): on the shuffled loads a round leaves, the stable sort is about 3x
    slower."""
    order = loads.argsort()
    ranked = loads[order]
    if (ranked[1:] == ranked[:-1]).any() or np.isnan(ranked[-1:]).any():
        return loads.argsort(kind="stable")
    return order


@functools.cache
def _slots(width: int) -> np.ndarray:
    slots = np.arange(width).reshape(width, 1)
    slots.flags.writeable = False
    return slots


@functools.cache
def _slot_pairs(width: int) -> np.ndarray:
    pairs = np.array(list(itertools.combinations(range(width), 2)), dtype=np.int64).reshape(-1, 2)
    pairs.flags.writeable = False
    return pairs
