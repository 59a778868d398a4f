"""balancers/verl.py against a line-by-line re-reading of verl's own code, and against LB-Micro.

The reference below follows verl's seqlen_balancing.py (karmarkar_karp with its heap order,
get_seqlen_balanced_partitions), RayPPOTrainer._balance_batch and rearrange_micro_batches
as read at volcengine/verl b178a3cd and v0.6.0, with the distributed all-reduce done as a max
over ranks. It keeps verl's behaviour of never checking the token limit.
"""

import heapq
import math
import random
from dataclasses import replace

import numpy as np
import pytest

from odc_bench.balancers.cost import linear, quadratic
from odc_bench.balancers.lb_micro import lb_micro
from odc_bench.balancers.plan import check_plan
from odc_bench.balancers.quality import collective_time
from odc_bench.balancers.registry import balancer_options
from odc_bench.balancers.verl import VerlOptions, verl, verl_flops
from odc_bench.data.profiles import PROFILES, profile_lengths
from odc_bench.errors import ConfigError


class _Set:
    def __init__(self):
        self.sum, self.items = 0, []

    def add(self, idx, val):
        self.items.append((idx, val))
        self.sum += val

    def key(self):
        # verl's Set.__lt__: by sum, then item count, then the (index, value) list.
        return (self.sum, len(self.items), self.items)


class _State:
    ties = 0  # orderings that verl decided by its tie-break rather than by sums

    def __init__(self, items, k):
        self.k = k
        self.sets = [_Set() for _ in range(k)]
        for s, (idx, val) in zip(self.sets, items, strict=False):
            s.add(idx, val)
        self._sort()

    def merge(self, other):
        for i in range(self.k):
            for idx, val in other.sets[self.k - 1 - i].items:
                self.sets[i].add(idx, val)
        self._sort()

    def _sort(self):
        self.sets.sort(key=_Set.key, reverse=True)
        sums = [s.sum for s in self.sets if s.items]
        if len(set(sums)) < len(sums):
            _State.ties += 1

    def spread(self):
        return self.sets[0].sum - self.sets[-1].sum

    def __lt__(self, other):
        # Popped first: the larger spread, then the larger heaviest set.
        if self.spread() != other.spread():
            return self.spread() > other.spread()
        _State.ties += self.k > 1  # one set: every order gives the same partition
        return self.sets[0].key() > other.sets[0].key()


def verl_kk(values, k, equal_size):
    ordered = sorted((v, i) for i, v in enumerate(values))
    heap = []
    if equal_size:
        for off in range(0, len(ordered), k):
            heapq.heappush(heap, _State([(i, v) for v, i in ordered[off:off + k]], k))
    else:
        for v, i in ordered:
            heapq.heappush(heap, _State([(i, v)], k))
    while len(heap) > 1:
        a, b = heapq.heappop(heap), heapq.heappop(heap)
        a.merge(b)
        heapq.heappush(heap, a)
    return [sorted(i for i, _ in s.items) for s in heap[0].sets]


def verl_reference(lengths, world, max_tokens, workload):
    """Per rank, the microbatches (sets of sample indices) verl would run for one minibatch.

    Also says whether verl's differencing met a tie anywhere (two partial states of equal
    spread, or two sets of equal sum): verl breaks it by comparing sets, partition.py by
    arrival order; both are valid, and the results may differ.
    """
    _State.ties = 0
    weigh = float if workload == "tokens" else verl_flops
    shares = verl_kk([weigh(n) for n in lengths], world, equal_size=True)
    counts = [min(len(s), math.ceil(sum(lengths[i] for i in s) / max_tokens)) for s in shares]
    k = max(counts)  # the all-reduce MAX
    plan = []
    for share in shares:
        parts = verl_kk([weigh(lengths[i]) for i in share], k, equal_size=False)
        plan.append([[share[j] for j in p] for p in parts])
    return plan, _State.ties > 0


def _shape(plan, lengths):
    """A plan as the lengths it groups: equal-length samples are interchangeable (ties break apart)."""
    return sorted(sorted(tuple(sorted(lengths[i] for i in mb)) for mb in rank) for rank in plan)


def _fits(plan, lengths, max_tokens):
    return all(sum(lengths[i] for i in mb) <= max_tokens for rank in plan for mb in rank)


def _cases(n_cases, seed=0):
    rng = random.Random(seed)
    for _ in range(n_cases):
        world = rng.choice([2, 4, 8])
        per_rank = rng.choice([2, 3, 4, 6, 8])
        lengths = [rng.randint(256, 65_536) for _ in range(world * per_rank)]
        ratio = rng.choice([1, 1.5, 2, 4])
        yield lengths, world, int(max(lengths) * ratio)


@pytest.mark.parametrize("workload", ["tokens", "verl_flops"])
def test_same_plans_as_verl_when_verl_fits(workload):
    checked = 0
    for lengths, world, max_tokens in _cases(300):
        ref, tied = verl_reference(lengths, world, max_tokens, workload)
        if not _fits(ref, lengths, max_tokens):
            continue
        ours = verl(lengths, world, max_tokens, linear(), VerlOptions(workload=workload))
        check_plan(ours, lengths, world, max_tokens)
        assert [len(r) for r in ours] == [len(r) for r in ref]
        if not tied:
            assert _shape(ours, lengths) == _shape(ref, lengths)
            checked += 1
    assert checked > 250


def test_grows_the_count_only_where_verl_overflows():
    overflowed = 0
    for lengths, world, max_tokens in _cases(300, seed=1):
        ref, _ = verl_reference(lengths, world, max_tokens, "tokens")
        ours = verl(lengths, world, max_tokens, linear())
        check_plan(ours, lengths, world, max_tokens)
        if _fits(ref, lengths, max_tokens):
            assert [len(r) for r in ours] == [len(r) for r in ref]
        else:
            overflowed += 1
            assert len(ours[0]) > len(ref[0])
    assert overflowed > 0, "verl's count is a lower bound that its differencing often misses"


def test_verl_runs_oversized_microbatches_where_lb_micro_does_not():
    # Three samples of 60% of the limit per rank: verl asks for ceil(1.8) = 2 microbatches
    # and puts two samples (120% of the limit) into one of them.
    lengths, world, max_tokens = [600] * 6, 2, 1000
    ref, _ = verl_reference(lengths, world, max_tokens, "tokens")
    assert [len(r) for r in ref] == [2, 2] and not _fits(ref, lengths, max_tokens)
    assert [len(r) for r in verl(lengths, world, max_tokens, linear())] == [3, 3]
    assert [len(r) for r in lb_micro(lengths, world, max_tokens, linear())] == [3, 3]


def test_orders_microbatches_costliest_first_on_every_rank():
    cost = quadratic("7b")
    lengths = profile_lengths("longalign", 1.0, seed=3, num_samples=32)
    plan = verl(lengths.tolist(), 8, 65_536, cost, VerlOptions(workload="cost"))
    for rank in plan:
        costs = [sum(cost(lengths[i]) for i in mb) for mb in rank]
        assert costs == sorted(costs, reverse=True)


def test_lb_micro_balances_better_than_verl_on_long_tailed_sft_data():
    """The paper's claim that LB-Micro beats verl's balancer, on long-tailed lengths.

    16 ranks x 4 samples, limit = longest sample, the paper's 7B cost model: verl needs more
    microbatches (its count starts from the token bound and grows jointly) and does not refine
    its differencing, which costs it several percent of collective time over 30 minibatches,
    whichever workload formula it balances. The lengths are a log-normal reaching down to 1K
    (LongAlign's profile before docs/sensitivity.md); on the profile with LongAlign's published
    8K floor the two are at parity (within 4% either way over seeds), so the claim needs the tail.
    """
    cost = quadratic("7b")
    world, size = 16, 64
    tailed = replace(PROFILES["longalign"], min_len=1_024)
    lengths = tailed.sample(size * 30, np.random.default_rng(0)).tolist()
    minibatches = [lengths[k:k + size] for k in range(0, len(lengths), size)]

    def total(balance):
        return sum(collective_time(balance(mb), mb, cost) for mb in minibatches)

    ours = total(lambda mb: lb_micro(mb, world, 65_536, cost))
    for workload in ("tokens", "verl_flops", "cost"):
        assert ours < 0.97 * total(lambda mb, w=workload: verl(mb, world, 65_536, cost, VerlOptions(workload=w)))


def test_refined_variant_is_valid_and_balances_ranks_at_least_as_well():
    """refine=True, workload="cost": the ODC reference's DynamicSameMicro."""
    cost = quadratic("1p5b")
    plain = refined = 0.0
    for lengths, world, max_tokens in _cases(100, seed=2):
        ours = verl(lengths, world, max_tokens, cost, VerlOptions(workload="cost", refine=True))
        check_plan(ours, lengths, world, max_tokens)
        assert len({len(r) for r in ours}) == 1, "collective FSDP needs equal counts"

        def heaviest(plan, lengths=lengths):
            return max(sum(cost(lengths[i]) for mb in rank for i in mb) for rank in plan)

        refined += heaviest(ours)
        plain += heaviest(verl(lengths, world, max_tokens, cost, VerlOptions(workload="cost")))
    assert refined <= plain


def test_checks_its_input():
    with pytest.raises(ValueError, match="equal samples"):
        verl([1, 2, 3], 2, 10, linear())
    with pytest.raises(ValueError, match="cannot fit"):
        verl([5, 20], 2, 10, linear())
    with pytest.raises(ConfigError, match="balancer.options.workload must be one of tokens, verl_flops, cost"):
        balancer_options("verl", {"workload": "flops"})
