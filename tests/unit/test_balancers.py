import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from odc_bench.balancers.cost import CostModel, linear, quadratic
from odc_bench.balancers.dynamic import DynamicOptions, dynamic_queue, scheduled
from odc_bench.balancers.packing import pack_equal_counts, pack_exactly, pack_fewest
from odc_bench.balancers.partition import balanced_partition, largest_differencing
from odc_bench.balancers.plan import check_plan
from odc_bench.balancers.quality import collective_time, lower_bound, odc_time
from odc_bench.balancers.registry import BALANCERS, balancer_options, plan_minibatch
from odc_bench.errors import ConfigError
from odc_bench.plan.spec import resolve
from tests.helpers import run_config

FAST = settings(max_examples=60, deadline=None)
COSTS = {"linear": linear(), "quadratic": quadratic("1p5b")}

# (balancer, options, semantics it is meant to run under)
VARIANTS = [
    ("local_sort", {}, "collective"),
    ("local_sort", {"pack": True}, "collective"),
    ("lb_micro", {}, "collective"),
    ("lb_mini", {}, "odc"),
    ("lb_mini", {"equal_samples": True}, "odc"),
    ("dynamic", {}, "odc"),
    ("dynamic", {"slack": 0.0}, "odc"),
    ("lb_carry", {}, "odc"),
]
IDS = [f"{b}{'-' + '-'.join(o) if o else ''}" for b, o, _ in VARIANTS]


def make_plan(name, lengths, world, max_tokens, cost, **options):
    """A balancer's plan through its registry record, as runs make it."""
    return plan_minibatch(BALANCERS[name], balancer_options(name, options), lengths, world, max_tokens, cost)[0]


@st.composite
def minibatches(draw, max_world=6, max_per_rank=6):
    world = draw(st.integers(1, max_world))
    per_rank = draw(st.integers(1, max_per_rank))
    lengths = draw(st.lists(st.integers(2, 4000), min_size=world * per_rank, max_size=world * per_rank))
    max_tokens = int(max(lengths) * draw(st.sampled_from([1, 1.3, 2, 4])))
    return lengths, world, max_tokens, COSTS[draw(st.sampled_from(sorted(COSTS)))]


def _time(semantics, plan, lengths, cost):
    return collective_time(plan, lengths, cost) if semantics == "collective" else odc_time(plan, lengths, cost)


@pytest.mark.parametrize(("name", "options", "semantics"), VARIANTS, ids=IDS)
@FAST
@given(mb=minibatches())
def test_every_sample_once_and_no_microbatch_over_max_tokens(name, options, semantics, mb):
    lengths, world, max_tokens, cost = mb
    plan = make_plan(name, lengths, world, max_tokens, cost, **options)
    check_plan(plan, lengths, world, max_tokens)  # raises unless every sample once, every microbatch fits
    assert sorted(i for r in plan for m in r for i in m) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in m) <= max_tokens for r in plan for m in r)


@pytest.mark.parametrize(("name", "options", "semantics"), VARIANTS, ids=IDS)
@FAST
@given(mb=minibatches())
def test_plans_are_deterministic_and_never_beat_the_lower_bound(name, options, semantics, mb):
    lengths, world, max_tokens, cost = mb
    plan = make_plan(name, lengths, world, max_tokens, cost, **options)
    assert plan == make_plan(name, list(lengths), world, max_tokens, cost, **options)
    assert _time(semantics, plan, lengths, cost) >= lower_bound(lengths, world, max_tokens, cost) * (1 - 1e-9)


@FAST
@given(mb=minibatches())
def test_lb_micro_gives_equal_microbatch_and_sample_counts(mb):
    lengths, world, max_tokens, cost = mb
    plan = make_plan("lb_micro", lengths, world, max_tokens, cost)
    assert len({len(rank) for rank in plan}) == 1
    assert len({sum(len(m) for m in r) for r in plan}) == 1


@FAST
@given(mb=minibatches())
def test_lb_mini_equal_samples_gives_equal_sample_counts(mb):
    lengths, world, max_tokens, cost = mb
    plan = make_plan("lb_mini", lengths, world, max_tokens, cost, equal_samples=True)
    assert len({sum(len(m) for m in r) for r in plan}) == 1


@pytest.mark.parametrize(("name", "options", "semantics"), VARIANTS, ids=IDS)
@FAST
@given(world=st.integers(1, 6), per_rank=st.integers(1, 6), length=st.integers(2, 3000),
       fits=st.integers(1, 5), cost=st.sampled_from(sorted(COSTS)))
def test_equal_lengths_reach_the_lower_bound(name, options, semantics, world, per_rank, length, fits, cost):
    lengths, model = [length] * (world * per_rank), COSTS[cost]
    max_tokens = length * fits
    plan = make_plan(name, lengths, world, max_tokens, model, **options)
    assert _time(semantics, plan, lengths, model) == pytest.approx(lower_bound(lengths, world, max_tokens, model),
                                                                   rel=1e-9)


@FAST
@given(costs=st.lists(st.integers(1, 10_000), min_size=0, max_size=40), k=st.integers(1, 8))
def test_balanced_partition_places_every_item_once_and_is_no_worse_than_round_robin(costs, k):
    parts = balanced_partition(costs, k)
    assert len(parts) == k
    assert sorted(i for p in parts for i in p) == list(range(len(costs)))
    loads = [sum(costs[i] for i in p) for p in parts]
    assert loads == sorted(loads, reverse=True)
    ranked = sorted(range(len(costs)), key=lambda i: -costs[i])
    robin = [sum(costs[i] for i in ranked[r::k]) for r in range(k)]
    assert max(loads) <= max(robin, default=0)


@FAST
@given(groups=st.integers(1, 8), k=st.integers(1, 6), data=st.data())
def test_equal_size_partition_gives_every_set_the_same_count(groups, k, data):
    costs = data.draw(st.lists(st.floats(0.1, 100), min_size=groups * k, max_size=groups * k))
    parts = balanced_partition(costs, k, equal_size=True)
    assert {len(p) for p in parts} == {groups}


def test_largest_differencing_on_a_known_instance():
    # The textbook example: differencing {8,7,6,5,4} leaves a difference of 2, while
    # {8,7} | {6,5,4} is perfect; one swap of the refinement finds it.
    parts = largest_differencing([8, 7, 6, 5, 4], 2)
    loads = sorted(sum([8, 7, 6, 5, 4][i] for i in p) for p in parts)
    assert loads == [14, 16]
    refined = balanced_partition([8, 7, 6, 5, 4], 2)
    assert sorted(sum([8, 7, 6, 5, 4][i] for i in p) for p in refined) == [15, 15]


def test_equal_size_partition_refuses_an_indivisible_count():
    with pytest.raises(ValueError, match="impossible"):
        largest_differencing([1, 2, 3], 2, equal_size=True)


def test_pack_fewest_uses_the_fewest_microbatches_that_fit():
    lengths = [60, 40, 50, 50, 30, 70]  # 300 tokens, limit 100: 3 microbatches are possible
    mbs = pack_fewest(list(range(6)), lengths, linear(), 100)
    assert len(mbs) == 3 and all(sum(lengths[i] for i in m) <= 100 for m in mbs)
    costs = [sum(lengths[i] for i in m) for m in mbs]
    assert costs == sorted(costs, reverse=True)


def test_pack_exactly_splits_until_the_count_is_reached():
    lengths = [10] * 6
    mbs = pack_exactly(list(range(6)), lengths, linear(), 60, 4)
    assert sorted(len(m) for m in mbs) == [1, 1, 2, 2]
    with pytest.raises(ValueError, match="cannot make 7"):
        pack_exactly(list(range(6)), lengths, linear(), 60, 7)


def test_pack_equal_counts_equalizes_to_the_largest_need():
    lengths = [90, 90, 90, 10, 10, 10]
    plan = pack_equal_counts([[0, 1, 2], [3, 4, 5]], lengths, linear(), 100)
    assert [len(rank) for rank in plan] == [3, 3]  # rank 1 fits in one microbatch but must run three steps


def test_lb_mini_balances_totals_with_unequal_counts():
    # One long sample (cost 8) against eight short ones (cost 1 each): ODC can give the long
    # one a rank of its own; equal sample counts cannot.
    lengths = [8] + [1] * 8
    free = make_plan("lb_mini", lengths, 2, 8, linear())
    assert sorted(sum(lengths[i] for m in r for i in m) for r in free) == [8, 8]
    assert sorted(sum(len(m) for m in r) for r in free) == [1, 8]


def test_dynamic_queue_is_heaviest_first_and_its_schedule_is_greedy():
    lengths = [50, 10, 40, 30, 20, 60]
    cost = linear()
    queue = dynamic_queue(lengths, 2, 60, cost)
    queue_costs = [sum(lengths[i] for i in m) for m in queue]
    assert queue_costs == sorted(queue_costs, reverse=True)
    plan = scheduled([[5], [0], [2], [3], [4], [1]], lengths, cost, 2)
    # 60 -> r0 (free at 60), 50 -> r1 (50), 40 -> r1 (90), 30 -> r0 (90), 20 -> tie, r0 (110), 10 -> r1
    assert plan == [[[5], [3], [4]], [[0], [2], [1]]]
    assert plan_minibatch(BALANCERS["dynamic"], DynamicOptions(), lengths, 2, 60, cost)[1] == queue
    assert plan_minibatch(BALANCERS["lb_mini"], balancer_options("lb_mini", {}), lengths, 2, 60, cost)[1] is None


def test_dynamic_trades_balance_for_fewer_microbatches_only_within_slack():
    lengths = [100] + [10] * 20
    cost = linear()
    exact = dynamic_queue(lengths, 2, 300, cost, DynamicOptions(slack=0.0))
    loose = dynamic_queue(lengths, 2, 300, cost, DynamicOptions(slack=0.5))
    assert len(loose) <= len(exact)
    t_exact = odc_time(scheduled(exact, lengths, cost, 2), lengths, cost)
    t_loose = odc_time(scheduled(loose, lengths, cost, 2), lengths, cost)
    assert t_exact == lower_bound(lengths, 2, 300, cost) == 150
    assert t_loose <= 1.5 * t_exact


def test_dynamic_queue_counts_the_per_microbatch_overhead():
    # Without overhead, finer entries balance 11+..+1 = 35 over 3 ranks best; with a constant
    # per microbatch, a queue of fewer entries is predicted faster and is chosen.
    lengths, world = [11, 3, 3, 9, 4, 1, 4], 3
    free_model, overhead_model = linear(), CostModel("overhead", a=0.0, b=1.0, c=5.0)
    fine = dynamic_queue(lengths, world, 100, free_model, DynamicOptions(slack=0.0))
    coarse = dynamic_queue(lengths, world, 100, overhead_model, DynamicOptions(slack=0.0))
    assert len(coarse) < len(fine)

    def predicted(queue, model):
        return max(sum(model.microbatch(lengths[i] for i in m) for m in r)
                   for r in scheduled(queue, lengths, model, world))

    assert predicted(coarse, overhead_model) < predicted(fine, overhead_model)
    assert predicted(fine, free_model) <= predicted(coarse, free_model)


@pytest.mark.parametrize("balancer", sorted(name for name, spec in BALANCERS.items() if not spec.equal_counts))
def test_collective_engine_refuses_unequal_count_balancers(balancer):
    with pytest.raises(ConfigError, match=f"balancer {balancer} gives ranks different microbatch counts.*engine=odc"):
        resolve(run_config(f"balancer={balancer}"))


@pytest.mark.parametrize(("override", "message"), [
    ("+balancer.options.nosuch=1", "unknown config key 'balancer.options.nosuch'; the keys there are: none"),
    ("balancer.cost_model=cubic", "balancer.cost_model must be one of linear, quadratic, flops, calibrated, "
                                  "got 'cubic'"),
    ("balancer.quadratic_fit=3b", "balancer.quadratic_fit must be one of 1p5b, 7b, got '3b'"),
])
def test_bad_balancer_config_is_a_config_error(override, message):
    with pytest.raises(ConfigError, match=message):
        resolve(run_config("balancer=lb_micro", override))


def test_bad_option_value_is_a_config_error():
    with pytest.raises(ConfigError, match="balancer.options.pack must be true or false"):
        resolve(run_config("balancer=local_sort", "balancer.options.pack=3"))


def test_run_spec_carries_predictions_and_the_cost_model():
    spec = resolve(run_config("balancer=lb_micro", "num_minibatches=3", "warmup_minibatches=1"))
    assert spec.cost_model.label == "quadratic:1p5b"
    assert all(mb.prediction is not None and mb.prediction.time >= mb.prediction.bound for mb in spec.minibatches)
    rate = spec.predicted_bubble_rate()
    measured = spec.minibatches[1:]
    work = sum(mb.prediction.work for mb in measured)
    assert rate == pytest.approx(1 - work / (spec.world_size * sum(mb.prediction.time for mb in measured)))
    assert 0 <= rate < 1 and not math.isnan(rate)


def test_dynamic_queue_terminates_on_extreme_skew_and_free_samples():
    skewed = [2_000_000] + [2] * 30
    queue = dynamic_queue(skewed, 4, 2_000_000, quadratic("1p5b"))
    assert sorted(i for m in queue for i in m) == list(range(31))
    assert dynamic_queue([0, 0, 5], 2, 10, linear()) == [[2, 0, 1]]  # free samples ride along


_COUNT = "a sample's token count, a whole number of at least 1"


@pytest.mark.parametrize("args,kwargs,said", [
    (([5, -1, 3], 2, 64), {}, f"balance(): lengths[1] must be {_COUNT}, got -1"),
    (([5, 5.5], 2, 64), {}, f"balance(): lengths[1] must be {_COUNT}, got 5.5"),
    ((["5", "3"], 2, 64), {}, f"balance(): lengths[0] must be {_COUNT}, got '5'"),
    (([True, 5], 2, 64), {}, f"balance(): lengths[0] must be {_COUNT}, got True"),
    (("53", 2, 64), {}, "balance(): lengths must be a list or an array of the samples' token counts, got str"),
    (([5, 3], True, 64), {}, "balance(): world_size must be a whole number of at least 1, got True"),
    (([5, 3], 2, 0), {}, "balance(): max_tokens must be a whole number of at least 1, got 0"),
    (([5, 3], 2, 64), {"cost": "linear"}, "balance(): cost must be a cost model (linear(), quadratic(fit), "
                                          "flops(model_config)) or None, got str"),
])
def test_balance_refuses_what_no_plan_can_be_made_of_in_one_line(args, kwargs, said):
    """Before, a negative or fractional length or a string was planned without a word (or failed
    deep in one balancer), world_size=True planned one rank, max_tokens=0 was a ZeroDivisionError
    and a cost model by name an AttributeError."""
    import numpy as np

    from odc_bench.balancers import balance

    with pytest.raises((ValueError, TypeError)) as refused:
        balance(*args, **kwargs)
    assert str(refused.value) == said
    # Lengths of any integer or whole float type plan as ints do.
    assert balance(np.array([5.0, 3.0, 9.0, 4.0]), 2.0, 64) == balance([5, 3, 9, 4], 2, 64)
