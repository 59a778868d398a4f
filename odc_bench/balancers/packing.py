"""Packing one rank's samples into microbatches under the token limit.

A microbatch's compute is the sum of its documents' costs (attention runs per document), and
its memory grows with its token count, so packing has two goals that pull apart: few
microbatches (each one costs a full pass of parameter gathers) and microbatches of similar
cost (under collective FSDP every microbatch step waits for the slowest rank). The helpers
try cost-balanced splits first, token-balanced splits next, and first-fit decreasing on
tokens last, which always succeeds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from odc_bench.balancers.cost import CostModel
from odc_bench.balancers.partition import balanced_partition
from odc_bench.balancers.plan import Microbatch, Plan


def microbatch_cost(mb: Sequence[int], lengths: Sequence[int], cost: CostModel) -> float:
    """The documents' costs, without the per-microbatch constant (the same for every microbatch)."""
    return sum(cost(lengths[i]) for i in mb)


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


def pack_equal_counts(shares: Sequence[Sequence[int]], lengths: Sequence[int], cost: CostModel,
                      max_tokens: int) -> Plan:
    """Pack every rank's share, then give all ranks the largest count any rank needs.

    Collective FSDP runs one microbatch step on every rank at once, so counts must match;
    ranks that fit in fewer microbatches split theirs, which also evens out step costs. A
    share with fewer samples than that count cannot reach it and keeps one per microbatch.
    """
    plan = [pack_fewest(share, lengths, cost, max_tokens) for share in shares]
    target = max((len(r) for r in plan), default=0)
    return [mbs if len(mbs) == target else pack_exactly(share, lengths, cost, max_tokens,
                                                          min(target, len(share)))
            for share, mbs in zip(shares, plan, strict=True)]
