"""The stale-synchronous time model, its lower bound and LB-Carry (balancers/quality.py,
balancers/lb_carry.py)."""

import math

import pandas as pd
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from odc_bench.balancers.cost import linear, quadratic
from odc_bench.balancers.lb_carry import LbCarryOptions, lb_carry, partition_after
from odc_bench.balancers.lb_mini import lb_mini
from odc_bench.balancers.quality import (
    StaleClock,
    lower_bound,
    odc_time,
    rank_work,
    run_bubble_rate,
    stale_bubble_rate,
    stale_clock,
    stale_lower_bound,
)
from odc_bench.errors import ConfigError
from odc_bench.plan.spec import resolve
from odc_bench.results.series import WORKLOAD, WORKLOAD_COLUMNS, engine_variants, series_names
from odc_bench.studies.staleness import side_by_side, simulated_speed, summary
from odc_bench.tools.balancer_report import plan_quality
from tests.helpers import REPO, run_config, with_series

FAST = settings(max_examples=60, deadline=None)


@st.composite
def runs(draw, max_world=5, max_minibatches=6):
    """Minibatches of lengths, `world` ranks, and a staleness."""
    world = draw(st.integers(1, max_world))
    per = draw(st.integers(1, 4))
    k = draw(st.integers(1, max_minibatches))
    batches = [draw(st.lists(st.integers(2, 3000), min_size=world * per, max_size=world * per)) for _ in range(k)]
    return batches, world, draw(st.integers(0, 3))


def _plans(batches, world, staleness, planner="lb_carry"):
    """Each minibatch's plan and per-rank work (linear costs), planned as resolve() plans them."""
    cost = linear()
    clock, works, plans = StaleClock(world, staleness), [], []
    max_tokens = max(max(b) for b in batches)
    for lens in batches:
        if planner == "lb_carry":
            plan = lb_carry(lens, world, max_tokens, cost, LbCarryOptions(), clock.ready())
        else:
            plan = lb_mini(lens, world, max_tokens, cost)
        clock.advance(rank_work(plan, lens, cost))
        works.append(rank_work(plan, lens, cost))
        plans.append(plan)
    return plans, works, max_tokens


def test_a_rank_starts_when_it_is_free_and_the_version_it_reads_is_out():
    # Two ranks, s = 1. Minibatch 0: rank 0 works 5, rank 1 works 1. Minibatch 1 reads version 0:
    # rank 1 starts at 1. Minibatch 2 reads version 1, out when minibatch 0 is done everywhere (5).
    clock = stale_clock([[5, 1], [1, 1], [1, 3]], staleness=1)
    assert clock.done == [5, 6, 8]
    assert clock.finish == [7, 8]
    # A rank without work passes through: rank 1 idles in minibatch 3 and keeps its finish.
    clock.advance([2, 0])  # reads version 2, out at 6: rank 0 starts when it is free, at 7
    assert clock.finish == [9, 8] and clock.done[-1] == 9
    # With s = 0 every minibatch starts at the last one's end: the synchronous sum of maxima.
    assert stale_clock([[5, 1], [1, 1], [1, 3]], staleness=0).done == [5, 6, 9]


@FAST
@given(run=runs())
def test_staleness_zero_is_the_synchronous_model_and_more_staleness_is_never_slower(run):
    batches, world, _ = run
    plans, works, max_tokens = _plans(batches, world, 0, planner="lb_mini")
    sync = sum(odc_time(p, b, linear()) for p, b in zip(plans, batches, strict=True))
    times = [stale_clock(works, s).done[-1] for s in range(4)]
    assert times[0] == pytest.approx(sync)
    assert all(a >= b - 1e-9 for a, b in zip(times, times[1:], strict=False))


@FAST
@given(run=runs())
def test_the_stale_bound_is_the_per_minibatch_bound_at_zero_and_no_plan_beats_it(run):
    batches, world, staleness = run
    cost = linear()
    max_tokens = max(max(b) for b in batches)
    assert stale_lower_bound(batches, world, max_tokens, cost, 0) == pytest.approx(
        sum(lower_bound(b, world, max_tokens, cost) for b in batches))
    bound = stale_lower_bound(batches, world, max_tokens, cost, staleness)
    for planner in ("lb_carry", "lb_mini"):
        _, works, _ = _plans(batches, world, staleness, planner)
        assert stale_clock(works, staleness).done[-1] >= bound * (1 - 1e-9)
    assert stale_lower_bound(batches, world, max_tokens, cost, staleness + 1) <= bound + 1e-9


def test_the_bound_has_the_ramp_of_costliest_samples_s_plus_one_apart():
    # One long sample (10) per minibatch among short ones, 4 ranks (an even share is 3.25): at s = 1
    # minibatch k + 2 cannot start before minibatch k is done everywhere, so the long samples of
    # minibatches 0 and 2 (or 1 and 3) follow each other.
    batches = [[10, 1, 1, 1]] * 4
    assert stale_lower_bound(batches, 4, 100, linear(), 1) == pytest.approx(20)
    assert stale_lower_bound(batches, 4, 100, linear(), 0) == pytest.approx(40)
    assert stale_lower_bound(batches, 4, 100, linear(), 3) == pytest.approx(13)  # the even share of the run


@FAST
@given(run=runs(), ready=st.lists(st.floats(0, 5000), min_size=5, max_size=5))
def test_lb_carry_places_every_sample_once_and_evens_out_finishes(run, ready):
    batches, world, _ = run
    lens, ready = batches[0], ready[:world]
    costs = [float(n) for n in lens]
    shares = partition_after(costs, ready)
    assert sorted(i for s in shares for i in s) == list(range(len(lens)))
    finish = [r + sum(costs[i] for i in s) for r, s in zip(ready, shares, strict=True)]
    # Never worse than giving everything to the rank that is free first, and within one item of
    # the even spread of all the ranks' time.
    assert max(finish) <= max(min(ready) + sum(costs), max(ready)) + 1e-6
    assert max(finish) <= max(max(ready), (sum(ready) + sum(costs)) / world + max(costs)) + 1e-6


def test_lb_carry_gives_the_lagging_rank_less_and_is_lb_mini_when_nobody_lags():
    lens = [10] * 10
    assert lb_carry(lens, 2, 100, linear(), LbCarryOptions(), [0.0, 0.0]) == lb_mini(lens, 2, 100, linear())
    plan = lb_carry(lens, 2, 100, linear(), LbCarryOptions(), [40.0, 0.0])
    loads = [sum(lens[i] for mb in r for i in mb) for r in plan]
    assert loads == [30, 70]  # both finish at 70


def test_at_the_golden_setting_stale_odc_plans_below_the_synchronous_bound():
    """The issue's plan-model acceptance: LongAlign, 8 ranks, minibatch 4, quadratic 1.5B, 50
    minibatches; s = 1 with LB-Carry predicts a smaller bubble than the per-minibatch lower
    bound allows any synchronous plan."""
    rows = {(r.balancer, r.semantics): r for r in plan_quality("longalign", 8, 4, 50, quadratic("1p5b"),
                                                                staleness=1)}
    carry, mini = rows[("lb_carry", "odc s=1")], rows[("lb_mini", "odc")]
    assert carry.bubble_rate < mini.bound_bubble_rate
    assert carry.bound_bubble_rate <= carry.bubble_rate
    # Staleness alone does not do it: LB-Mini's plans keep the lagging rank on the critical path.
    assert rows[("lb_mini", "odc s=1")].time == pytest.approx(mini.time)


def test_a_stale_run_predicts_its_bubble_on_the_stale_timeline():
    spec = resolve(run_config("engine=odc", "engine.staleness=1", "balancer=lb_carry", "num_minibatches=6",
                              "warmup_minibatches=2"))
    works = [rank_work(mb.plan, mb.lengths, spec.cost_model) for mb in spec.minibatches]
    assert spec.predicted_bubble_rate() == pytest.approx(stale_bubble_rate(works, 1, 2))
    sync = resolve(run_config("engine=odc", "balancer=lb_carry", "num_minibatches=6", "warmup_minibatches=2"))
    assert [mb.plan for mb in sync.minibatches] == [mb.plan for mb in resolve(run_config(
        "engine=odc", "balancer=lb_mini", "num_minibatches=6", "warmup_minibatches=2")).minibatches]
    assert sync.predicted_bubble_rate() == pytest.approx(
        run_bubble_rate([mb.prediction for mb in sync.measured], sync.world_size))
    assert stale_bubble_rate(works, 0, 2) == pytest.approx(
        run_bubble_rate([mb.prediction for mb in resolve(run_config(
            "engine=odc", "engine.staleness=1", "balancer=lb_carry", "num_minibatches=6",
            "warmup_minibatches=2")).measured], spec.world_size))


@pytest.mark.parametrize("dataset", ["longalign", "swe_smith", "pareto"])
def test_the_unavoidable_bubble_is_each_minibatchs_bound_at_zero_and_shrinks_with_staleness(dataset):
    """RunSpec.bound_bubble_rate, the what-if's "unavoidable" column: with s = 0 the per-minibatch
    bounds run one after another; with staleness the stale bound, which relaxes as s grows."""
    def spec(staleness: int):
        return resolve(run_config("engine=odc", "balancer=lb_carry", f"dataset={dataset}", "world_size=4",
                                  "num_minibatches=8", "warmup_minibatches=0", f"engine.staleness={staleness}"))
    sync = spec(0)
    assert sync.bound_bubble_rate() == pytest.approx(
        run_bubble_rate([mb.prediction for mb in sync.measured], sync.world_size, of_bound=True))
    rates = [spec(s).bound_bubble_rate() for s in (0, 1, 2)]
    assert rates[0] == pytest.approx(sync.bound_bubble_rate())
    eps = 1e-12  # a bound that leaves no bubble comes out at 0 to rounding
    assert rates[0] + eps >= rates[1] and rates[1] + eps >= rates[2] and rates[2] > -eps


@pytest.mark.parametrize(("overrides", "message"), [
    (("balancer=dynamic",), "balancer dynamic hands out work from one counter.*use balancer=lb_carry"),
    (("engine.staleness=-1",), "engine.staleness must be an integer >= 0, got -1"),
])
def test_bad_stale_configs_are_one_line_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        resolve(run_config("engine=odc", "engine.staleness=1", *overrides))


def test_staleness_tells_odc_series_apart_in_real_and_simulated_rows():
    def row(engine, where, **options):  # with the series columns its run (or the migration) writes
        return with_series(dict(engine=engine, backend=where, balancer="lb_carry",
                                config=yaml.safe_dump({"engine": {"name": engine, **options}})))

    table = pd.DataFrame([row("odc", "local", staleness=0), row("odc", "local", staleness=1),
                          row("odc", "sim", staleness=2), row("odc", "local"),  # before the option: synchronous
                          row("collective", "sim", backend="nccl")])
    assert list(engine_variants(table)) == ["0", "1", "2", "0", ""]
    assert list(series_names(table))[:3] == ["odc[0]+lb_carry", "odc[1]+lb_carry", "odc[2]+lb_carry"]


def test_the_study_simulates_each_real_run_the_cpu_profile_describes_and_gives_nan_for_the_others():
    """A real run's profile_minibatch and checkpoints, which a simulated run refuses, are left
    out (its re-simulation failed the study); a run of other threads per rank than the
    calibration's, or one the simulator does not model, gets NaN, not the study's end."""
    calibration = str(REPO / "results" / "calibration" / "sim-tiny-cpu.json")

    def speed(*overrides: str) -> float:
        return simulated_speed(yaml.safe_dump(run_config("threads_per_rank=1", *overrides).to_dict()), calibration)

    plain = speed()
    assert plain > 0
    assert speed("profile_minibatch=0", "checkpoint.every=2") == plain
    assert math.isnan(speed("threads_per_rank=2"))
    assert math.isnan(speed("engine=odc", "engine.prefetch=false"))


def test_the_staleness_summary_names_what_its_rows_differ_in_beyond_its_columns():
    """Sets in fp32 and in bf16 are two rows of the summary: before, they read alike."""
    base = dict.fromkeys(WORKLOAD, "") | dict(backend="local", model="tiny", dataset="longalign", world_size=2,
                                              minibatch_size=4, max_tokens=1024, packing_ratio=1.0,
                                              length_scale=0.015625, num_minibatches=8, warmup_minibatches=2)
    pairs = pd.DataFrame([base | dict(precision=p, seed=0, balancer="lb_carry", staleness="1", bubble_rate=0.1,
                                      measured=m, predicted=1.1, base_bubble=0.2) for p, m in (("fp32", 1.05),
                                                                                            ("bf16", 1.08))])
    rows = [line for line in summary(pairs).splitlines() if line.startswith("| local")]
    assert len(rows) == 2
    assert any("odc s=1 + lb_carry (precision=bf16) | 1 " in r and "1.080" in r for r in rows)
    assert any("odc s=1 + lb_carry (precision=fp32) | 1 " in r and "1.050" in r for r in rows)


def test_a_stale_run_is_set_against_the_synchronous_run_of_its_own_engine_options():
    """ODC with and without prefetch, each at s = 0 and 1: each s = 1 run over the s = 0 run
    with its own prefetch. Before, both were set against whichever s = 0 run came first."""
    rows = []
    for staleness, prefetch, speed in ((0, True, 10.0), (0, False, 8.0), (1, True, 11.0), (1, False, 9.6)):
        config = run_config("engine=odc", f"engine.staleness={staleness}",
                            f"engine.prefetch={str(prefetch).lower()}", "balancer=lb_carry", "num_minibatches=4",
                            "warmup_minibatches=1")
        rows.append(dict.fromkeys(WORKLOAD_COLUMNS, 1) | dict(
            backend="local", model="tiny", dataset="longalign", engine="odc", balancer="lb_carry", staleness=staleness,
            seed=0, attempt=0, status="ok", samples_per_s=speed, bubble_rate=0.1,
            config=yaml.safe_dump(config.to_dict(), sort_keys=False)))
    pairs = side_by_side(pd.DataFrame(rows))
    stale = pairs[pairs["staleness"] == "1"].set_index("options")["measured"]
    assert stale.to_dict() == pytest.approx({"prefetch=true": 1.1, "prefetch=false": 1.2})
    assert "odc s=1 + lb_carry (prefetch=false)" in summary(pairs)
