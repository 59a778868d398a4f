"""Packing one rank's samples into microbatches under the token limit.

A microbatch's compute is the sum of its documents' costs (attention runs per document), and
its memory grows with its token count, so packing has two goals that pull apart: few
microbatches (each one costs a full pass of parameter gathers) and microbatches of similar
cost (under collective FSDP every microbatch step waits for the slowest rank). The helpers
try cost-balanced splits first, token-balanced splits next, and first-fit decreasing on
tokens last, which always succeeds.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from odc_bench.balancers import partition_many
from odc_bench.balancers.cost import CostModel
from odc_bench.balancers.partition import balanced_partition
from odc_bench.balancers.plan import Microbatch, Plan
from odc_bench.sums import left_sum


def microbatch_cost(mb: Sequence[int], lengths: Sequence[int], cost: CostModel) -> float:
    """The documents' costs, without the per-microbatch constant (the same for every microbatch)."""
    return left_sum(cost(lengths[i]) for i in mb)


def heaviest_first(mbs: list[Microbatch], lengths: Sequence[int], cost: CostModel) -> list[Microbatch]:
    """Costliest microbatch first; samples inside a microbatch longest first."""
    ordered = [sorted(mb, key=lambda i: (-lengths[i], i)) for mb in mbs]
    return sorted(ordered, key=lambda mb: (-microbatch_cost(mb, lengths, cost), min(mb)))


def _fits(parts: list[list[int]], lengths: Sequence[int], max_tokens: int) -> bool:
    return all(sum(lengths[i] for i in p) <= max_tokens for p in parts)


def split_into(samples: Sequence[int], lengths: Sequence[int], cost: CostModel, max_tokens: int,
               k: int) -> list[Microbatch] | None:
    """Exactly k non-empty microbatches under max_tokens, cost-balanced if possible; None if not found."""
    if not 1 <= k <= len(samples):
        return None
    for key in (lambda i: cost(lengths[i]), lambda i: float(lengths[i])):
        parts = balanced_partition([key(i) for i in samples], k)
        if _fits(parts, [lengths[i] for i in samples], max_tokens):
            return [[samples[j] for j in p] for p in parts]
    return None


def first_fit_decreasing(samples: Sequence[int], lengths: Sequence[int], max_tokens: int) -> list[Microbatch]:
    bins: list[Microbatch] = []
    room: list[int] = []
    for i in sorted(samples, key=lambda i: (-lengths[i], i)):
        for b, free in enumerate(room):
            if lengths[i] <= free:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(max_tokens - lengths[i])
    return bins


def pack_fewest(samples: Sequence[int], lengths: Sequence[int], cost: CostModel, max_tokens: int) -> list[Microbatch]:
    """As few microbatches as the token limit allows (no more than first-fit decreasing needs)."""
    if not samples:
        return []
    fallback = first_fit_decreasing(samples, lengths, max_tokens)
    fewest = max(1, math.ceil(sum(lengths[i] for i in samples) / max_tokens))
    for k in range(fewest, len(fallback)):
        found = split_into(samples, lengths, cost, max_tokens, k)
        if found is not None:
            return heaviest_first(found, lengths, cost)
    return heaviest_first(fallback, lengths, cost)


def pack_fewest_each(shares: Sequence[Sequence[int]], lengths: Sequence[int], cost: CostModel,
                     max_tokens: int) -> Plan:
    """[pack_fewest(share, ...) for share in shares], the same plan, with first-fit decreasing
    run for every share at once: where it reaches the fewest microbatches the token count
    allows (most shares), its packing is pack_fewest's answer, ordered as heaviest_first orders
    it; the other shares take pack_fewest's search.

    A microbatch's cost is summed over its samples in the order first-fit placed them, longest
    first, which is heaviest_first's order: the same additions, so the same ties and order."""
    k = len(shares)
    sizes = np.fromiter((len(share) for share in shares), np.int64, count=k)
    width = int(sizes.max(initial=0))
    if width == 0:
        return [[] for _ in shares]
    lens = np.asarray(lengths, dtype=np.int64)
    costs = cost.each(lens)
    items = np.fromiter(itertools.chain.from_iterable(shares), np.int64, count=int(sizes.sum()))
    owner = np.repeat(np.arange(k), sizes)
    order = _by_share_longest_first(owner, lens[items], items, k, len(lens))
    items = items[order]
    slot = np.arange(items.size) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    doc = np.full((k, width), -1)
    doc[owner, slot] = items
    # First-fit decreasing, every share's t-th longest sample at once: bins[r, t] is the bin
    # it lands in; room -1 marks a bin not opened (no sample fits it).
    room = np.full((k, width), -1, dtype=np.int64)
    load, first = np.zeros((k, width)), np.full((k, width), np.iinfo(np.int64).max)
    opened = np.zeros(k, dtype=np.int64)
    bins = np.full((k, width), -1)
    for t in range(width):
        r = np.flatnonzero(sizes > t)
        i = doc[r, t]
        fits = room[r] >= lens[i][:, None]
        b = fits.argmax(axis=1)
        new = ~fits[np.arange(r.size), b]
        b[new] = opened[r[new]]
        opened[r[new]] += 1
        room[r, b] = np.where(new, max_tokens, room[r, b]) - lens[i]
        load[r, b] += costs[i]
        first[r, b] = np.minimum(first[r, b], i)
        bins[r, t] = b
    tokens = np.bincount(owner, lens[items], minlength=k)
    fewest = np.maximum(1, np.ceil(tokens / max_tokens)).astype(np.int64)
    # heaviest_first: costliest bin first, ties by the lowest sample index.
    r, b = np.nonzero(np.arange(width) < opened[:, None])
    by_cost = np.lexsort((first[r, b], -load[r, b], r))
    place = np.empty((k, width), dtype=np.int64)
    place[r[by_cost], b[by_cost]] = np.arange(by_cost.size) - np.repeat(np.cumsum(opened) - opened, opened)
    where = place[owner, bins[owner, slot]]
    flat = items[np.argsort((owner * width + where) * width + slot)].tolist()  # lexsort((slot, where, owner))
    counts = np.zeros((k, width), dtype=np.int64)
    np.add.at(counts, (owner, where), 1)
    # Every share's bins in order, each a slice of `flat`; shares first-fit did not pack into
    # the fewest bins take pack_fewest's search instead.
    ends = np.cumsum(counts[np.arange(width) < opened[:, None]]).tolist()
    micro = [flat[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]
    last = np.cumsum(opened).tolist()
    plan: Plan = [micro[a:b] for a, b in zip([0, *last[:-1]], last, strict=True)]
    for share in np.flatnonzero(opened > fewest).tolist():
        plan[share] = pack_fewest(shares[share], lengths, cost, max_tokens)
    return plan


def _by_share_longest_first(owner: np.ndarray, lens: np.ndarray, items: np.ndarray, shares: int, n: int
                            ) -> np.ndarray:
    """np.lexsort((items, -lens, owner)): by share, longest first, then by index; one sort of
    one integer key where it fits in 63 bits (the keys are distinct, so the order is the same)."""
    longest = int(lens.max(initial=0))
    if shares * (longest + 1) * n >= 2**62:
        return np.lexsort((items, -lens, owner))
    return np.argsort((owner * (longest + 1) + (longest - lens)) * n + items)


def pack_exactly(samples: Sequence[int], lengths: Sequence[int], cost: CostModel, max_tokens: int,
                 k: int) -> list[Microbatch]:
    """k microbatches (k at least the fewest that fit, at most the sample count).

    A balanced split into k is tried first; failing that, the fewest packing is taken and
    its costliest multi-sample microbatch split in two until there are k.
    """
    if k > len(samples):
        raise ValueError(f"cannot make {k} microbatches from {len(samples)} samples")
    found = split_into(samples, lengths, cost, max_tokens, k)
    if found is not None:
        return heaviest_first(found, lengths, cost)
    mbs = pack_fewest(samples, lengths, cost, max_tokens)
    if len(mbs) > k:
        raise ValueError(f"{len(samples)} samples need {len(mbs)} microbatches of at most {max_tokens} tokens, "
                         f"more than {k}")
    while len(mbs) < k:
        target = max((mb for mb in mbs if len(mb) > 1), key=lambda mb: microbatch_cost(mb, lengths, cost))
        mbs.remove(target)
        mbs.extend([target[j] for j in half] for half in balanced_partition([cost(lengths[i]) for i in target], 2))
    return heaviest_first(mbs, lengths, cost)


def pack_exactly_each(shares: Sequence[Sequence[int]], lengths: Sequence[int], cost: CostModel, max_tokens: int,
                      target: int) -> Plan:
    """[pack_exactly(share, ..., min(target, len(share))) for share in shares], the same plan,
    with the balanced splits of shares of one size made together (partition_many.py); shares
    no balanced split fits (and sizes it does not take) go through pack_exactly itself."""
    plan: Plan = [[] for _ in shares]
    by_size: dict[int, list[int]] = {}
    for r, share in enumerate(shares):
        by_size.setdefault(len(share), []).append(r)
    lens = np.asarray(lengths, dtype=np.int64)
    costs = cost.each(lens)
    for n, ranks in by_size.items():
        k = min(target, n)
        if not (k >= 1 and n * k <= partition_many.MAX_WORK):
            for r in ranks:
                plan[r] = pack_exactly(shares[r], lengths, cost, max_tokens, k)
            continue
        samples = np.array([shares[r] for r in ranks], dtype=np.int64).reshape(len(ranks), n)
        left = np.arange(len(ranks))
        for key in (costs, lens.astype(np.float64)):  # split_into's keys, in its order
            if not left.size:
                break
            local = partition_many.balanced_partitions(key[samples[left]], k)
            ids = np.where(local >= 0, np.take_along_axis(samples[left][:, None, :], np.maximum(local, 0), axis=2), -1)
            tokens = np.where(ids >= 0, lens[np.maximum(ids, 0)], 0).sum(axis=2)
            # heaviest_first needs every microbatch non-empty: pack_exactly decides the others.
            ok = (tokens <= max_tokens).all(axis=1) & (ids[:, :, 0] >= 0).all(axis=1)
            for r, mbs in zip(left[ok].tolist(), _heaviest_first_each(ids[ok], lens, costs), strict=True):
                plan[ranks[r]] = mbs
            left = left[~ok]
        for r in left.tolist():
            plan[ranks[r]] = pack_exactly(shares[ranks[r]], lengths, cost, max_tokens, k)
    return plan


def _heaviest_first_each(parts: np.ndarray, lens: np.ndarray, costs: np.ndarray) -> Plan:
    """heaviest_first of every row of a (m, k, n) matrix of sample ids (-1 past each
    microbatch's samples, none empty): samples longest first, then by id; microbatches
    costliest first (their costs summed in that order, as microbatch_cost does), then by
    their lowest id."""
    if not len(parts):
        return []
    big = np.iinfo(np.int64).max
    real = parts >= 0
    safe = np.maximum(parts, 0)
    within = np.lexsort((np.where(real, parts, big), np.where(real, -lens[safe], big)), axis=2)
    parts = np.take_along_axis(parts, within, axis=2)
    real = parts >= 0
    slot = np.where(real, costs[np.maximum(parts, 0)], 0.0)
    load = np.zeros(parts.shape[:2])
    for column in np.moveaxis(slot, 2, 0):
        load += column
    lowest = np.where(real, parts, big).min(axis=2)
    parts = np.take_along_axis(parts, np.lexsort((lowest, -load), axis=1)[..., None], axis=1)
    return [[[i for i in mb if i >= 0] for mb in row] for row in parts.tolist()]


def pack_equal_counts(shares: Sequence[Sequence[int]], lengths: Sequence[int], cost: CostModel,
                      max_tokens: int) -> Plan:
    """Pack every rank's share, then give all ranks the largest count any rank needs.

    Collective FSDP runs one microbatch step on every rank at once, so counts must match;
    ranks that fit in fewer microbatches split theirs, which also evens out step costs. A
    share with fewer samples than that count cannot reach it and keeps one per microbatch.
    """
    plan = pack_fewest_each(shares, lengths, cost, max_tokens)
    target = max((len(r) for r in plan), default=0)
    todo = [r for r, mbs in enumerate(plan) if len(mbs) != target]
    for r, mbs in zip(todo, pack_exactly_each([shares[r] for r in todo], lengths, cost, max_tokens, target),
                      strict=True):
        plan[r] = mbs
    return plan
