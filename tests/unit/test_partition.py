"""The rewritten partition against the one it replaced (tests/helpers/reference_partition.py).

Every answer must place every item once (equal counts under equal_size) and its heaviest
set must be no heavier than the reference's. Up to partition._CLASSIC_UP_TO items x sets
that holds by construction (the classic pipeline is the floor); above it only the
vectorised pipeline runs, so that pipeline is also held against the reference on its own,
on the heavy-tailed costs the balancers see.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from odc_bench.balancers import partition, partition_many
from odc_bench.balancers.partition import balanced_partition
from tests.helpers import reference_partition as reference

REL = 1e-9
DISTRIBUTIONS = ("integers", "floats", "heavy", "ties", "zeros")
HEAVY = ("heavy", "zeros")


def _costs(kind: str, n: int, seed: int, as_int: bool) -> list[float]:
    rng = np.random.default_rng(seed)
    if kind == "integers":
        values = rng.integers(1, 10_000, n)
    elif kind == "floats":
        values = rng.uniform(0.1, 100.0, n)
    elif kind == "heavy":
        values = rng.lognormal(0.0, 2.0, n)
    elif kind == "ties":
        values = rng.integers(1, 4, n) ** 3
    else:
        values = np.where(rng.random(n) < 0.3, 0.0, rng.pareto(1.5, n))
    return [int(v) for v in np.rint(values)] if as_int else [float(v) for v in values]


@st.composite
def instances(draw, kinds=DISTRIBUTIONS, max_k=48, max_work=partition._CLASSIC_UP_TO + 4096):
    k = draw(st.integers(1, max_k))
    equal_size = draw(st.booleans())
    per_set = draw(st.integers(1, 8))
    n = k * per_set if equal_size else draw(st.integers(k, 8 * k))
    while n * k > max_work:
        n -= k if equal_size else 1
    kind = draw(st.sampled_from(kinds))
    as_int = kind in ("integers", "ties") or draw(st.booleans())
    return _costs(kind, n, draw(st.integers(0, 2**32 - 1)), as_int), k, equal_size


def _heaviest(costs, parts) -> float:
    return max((sum(costs[i] for i in p) for p in parts), default=0.0)


def _check_valid(costs, k, equal_size, parts) -> None:
    assert len(parts) == k
    assert sorted(i for p in parts for i in p) == list(range(len(costs)))
    if equal_size:
        assert {len(p) for p in parts} == {len(costs) // k}


@settings(max_examples=150, deadline=None)
@given(instance=instances())
def test_valid_and_no_heavier_than_the_reference(instance):
    costs, k, equal_size = instance
    parts = balanced_partition(costs, k, equal_size)
    _check_valid(costs, k, equal_size, parts)
    old = reference.balanced_partition(costs, k, equal_size)
    assert _heaviest(costs, parts) <= _heaviest(costs, old) * (1 + REL)


@settings(max_examples=60, deadline=None)
@given(instance=instances(kinds=HEAVY, max_k=64, max_work=64 * 256))
def test_vectorised_pipeline_alone_is_no_heavier_on_heavy_tails(instance):
    costs, k, equal_size = instance
    parts = partition._vectorised(np.asarray(costs, dtype=float), k, equal_size).parts()
    _check_valid(costs, k, equal_size, parts)
    old = reference.balanced_partition(costs, k, equal_size)
    assert _heaviest(costs, parts) <= _heaviest(costs, old) * (1 + REL)


@settings(max_examples=40, deadline=None)
@given(instance=instances(max_k=200, max_work=200 * 1600))
def test_large_inputs_are_valid_and_deterministic(instance):
    costs, k, equal_size = instance
    parts = balanced_partition(costs, k, equal_size)
    _check_valid(costs, k, equal_size, parts)
    assert parts == balanced_partition(list(costs), k, equal_size)


def test_small_inputs_keep_the_classic_plans():
    # Packing splits a rank's few samples many times; those plans must not move.
    rng = np.random.default_rng(7)
    for k in range(1, 9):
        for n in range(k, min(4 * k, (partition._VECTOR_FROM - 1) // k) + 1):
            costs = [float(c) for c in rng.lognormal(0.0, 1.0, n)]
            assert balanced_partition(costs, k) == reference.balanced_partition(costs, k)


@pytest.mark.parametrize("costs", [[], [0.0, 0.0, 0.0, 0.0], [5.0], [-1.0, 2.0, -3.0, 4.0]])
def test_degenerate_inputs(costs):
    for k in (1, 2, 4):
        parts = balanced_partition(costs, k)
        _check_valid(costs, k, False, parts)
        if costs:
            vectorised = partition._vectorised(np.asarray(costs, dtype=float), k, False).parts()
            _check_valid(costs, k, False, vectorised)


def test_equal_size_refuses_an_indivisible_count():
    with pytest.raises(ValueError, match="impossible"):
        balanced_partition([1.0] * 700, 64, equal_size=True)


@pytest.mark.parametrize("kind", DISTRIBUTIONS)
def test_many_small_partitions_at_once_are_balanced_partitions_answers(kind):
    # LB-Micro splits hundreds of rank shares per minibatch together: item for item the same sets.
    for seed, (n, k, equal_size) in enumerate([(4, 2, False), (4, 2, True), (5, 3, False), (6, 3, True),
                                               (7, 1, False), (8, 8, False), (12, 4, False), (30, 6, True)]):
        rows = [_costs(kind, n, 100 * seed + r, kind in ("integers", "ties")) for r in range(40)]
        many = partition_many.balanced_partitions(np.array(rows, dtype=float), k, equal_size)
        for costs, sets in zip(rows, many.tolist(), strict=True):
            assert [[i for i in s if i >= 0] for s in sets] == balanced_partition(costs, k, equal_size)
