"""Float sums the same bits on every Python: left_sum rounds each addition, as sum() did before
Python 3.12, and the vectorised cost sums equal the scalar ones to the last bit with it."""

import math
import random

from odc_bench.balancers.cost import quadratic
from odc_bench.balancers.quality import microbatch_costs
from odc_bench.sums import left_sum


def test_left_sum_rounds_every_addition():
    # 1e16 + 1.0 rounds back to 1e16; a compensated sum (Python 3.12's sum(), math.fsum) keeps the 1.0.
    assert left_sum([1e16, 1.0, -1e16]) == 0.0 and math.fsum([1e16, 1.0, -1e16]) == 1.0
    assert left_sum([]) == 0.0 and left_sum(iter([0.5, 0.25])) == 0.75


def test_the_vectorised_microbatch_costs_equal_the_cost_models_own_to_the_last_bit():
    rng = random.Random(7)
    lengths = [rng.randint(1, 60_000) for _ in range(3_000)]
    ids = list(range(len(lengths)))
    rng.shuffle(ids)
    plan, at = [], 0
    for _ in range(4):  # ranks
        rank = []
        for _ in range(20):  # microbatches of 1 to 30 documents
            size = rng.randint(1, 30)
            rank.append(ids[at:at + size])
            at += size
        plan.append(rank)
    cost = quadratic("7b")
    assert microbatch_costs(plan, lengths, cost) == [[cost.microbatch(lengths[i] for i in mb) for mb in rank]
                                                     for rank in plan]
