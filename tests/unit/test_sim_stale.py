"""The stale-synchronous simulator timeline (sim/stale.py): worked cases, the plan model it must
reduce to without overheads, and a simulated run's row and events."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from odc_bench.balancers.quality import stale_clock
from odc_bench.plan.spec import resolve
from odc_bench.sim import simulate
from odc_bench.sim.stale import stale_odc
from odc_bench.sim.timeline import odc
from tests.helpers import run_config
from tests.unit.test_sim import costs, no_tokens


def test_a_rank_starts_when_free_and_its_version_is_visible_and_steps_follow_the_last_push():
    # Two ranks, s = 1, one microbatch of one position per rank and minibatch.
    comp = np.array([[5.0, 1.0], [1.0, 1.0], [1.0, 3.0]]).reshape(3, 2, 1, 1)
    nmb = np.ones((3, 2), dtype=int)
    st_ = stale_odc(comp, nmb, no_tokens(comp), costs(1, opt=0.5, barrier=0.25), staleness=1)
    # Minibatch 0 from the barrier: rank 0 done at 5, rank 1 at 1; step 0 at 5.25 .. 5.75, visible 6.
    assert st_.left[0] == pytest.approx([5.0, 1.0])
    assert st_.step[0] == pytest.approx([5.25, 5.75]) and st_.visible[1] == pytest.approx(6.0)
    # Minibatch 1 reads version 0: each rank goes on at once.
    assert st_.left[1] == pytest.approx([6.0, 2.0])
    # Minibatch 2 reads version 1 (visible at 6): rank 1 waits from 2 to 6.
    assert st_.left[2] == pytest.approx([7.0, 9.0])
    assert st_.timeline.start[2, 1, 0, 0] == pytest.approx(6.0)
    assert st_.duration == pytest.approx(9.0 + 0.25 + 0.5 + 0.25)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(0, 3), st.integers(1, 3), st.integers(0, 2**31 - 1))
def test_without_overheads_it_is_the_plan_model_and_never_slower_than_synchronous(ranks, micro, staleness, seed):
    rng = np.random.default_rng(seed)
    comp = rng.exponential(size=(5, ranks, max(micro, 1), 4))
    nmb = rng.integers(0, micro + 1, size=(5, ranks))
    comp[np.arange(comp.shape[2])[None, None, :] >= nmb[..., None]] = 0.0
    c, tok = costs(4), no_tokens(comp)
    st_ = stale_odc(comp, nmb, tok, c, staleness)
    work = comp.sum(axis=(2, 3))
    assert st_.duration == pytest.approx(stale_clock(work.tolist(), staleness).done[-1])
    assert st_.duration <= odc(comp, nmb, tok, c).duration.sum() + 1e-9


def test_a_simulated_stale_run_writes_a_row_and_the_events_of_a_real_one():
    config = ("backend=sim", "engine=odc", "balancer=lb_carry", "model=qwen2_1p5b", "world_size=8",
              "dataset.length_scale=1", "precision=bf16", "backend.recompute=true", "num_minibatches=12")
    sync = simulate(resolve(run_config(*config)))
    spec = resolve(run_config(*config, "engine.staleness=1"))
    stale = simulate(spec)
    events = stale.events
    per = events[events["kind"].isin(["sync", "optimizer", "minibatch"])].groupby(["rank", "minibatch", "kind"],
                                                                                  observed=True).size()
    assert (per == 1).all() and len(per) == 3 * 8 * 12, "one sync, step and minibatch span per rank and minibatch"
    micro = events[events["kind"] == "microbatch"].groupby(["minibatch", "rank"]).size()
    assert micro.to_dict() == {(k, r): len(mb.plan[r]) for k, mb in enumerate(spec.minibatches)
                               for r in range(8) if mb.plan[r]}
    spans = stale.events[stale.events["kind"] == "minibatch"].sort_values(["rank", "minibatch"])
    for _, rank in spans.groupby("rank"):
        # A rank's minibatches follow each other without a gap: each starts where the last one left.
        assert np.allclose(rank["t0"].to_numpy()[1:], rank["t1"].to_numpy()[:-1])
    steps = stale.events[stale.events["kind"] == "optimizer"]
    assert (steps.groupby("minibatch")["t0"].nunique() == 1).all(), "every owner steps at once"
    end = lambda events: events[events["kind"] == "minibatch"]["t1"].max()  # noqa: E731
    assert end(stale.events) < end(sync.events)
