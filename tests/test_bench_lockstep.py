"""The lockstep benchmark's two modes do what they say, with real rank processes."""

import os

import pandas as pd
import pytest

from odc_bench import bench_lockstep


def _start_gaps(table: pd.DataFrame) -> pd.Series:
    """Per step, rank 1's start minus rank 0's."""
    starts = table.pivot(index="step", columns="rank", values="start")
    return starts[1] - starts[0]


@pytest.fixture(scope="module")
def runs():
    return {mode: bench_lockstep.measure(tokens=512, steps=4, mode=mode)
            for mode in bench_lockstep.MODES}


def test_aligned_ranks_start_every_step_together(runs):
    table = runs["aligned"]
    step = table["seconds"].median()
    assert sorted(table["rank"].unique()) == [0, 1] and len(table) == 8
    assert (_start_gaps(table).abs() < 0.25 * step).all(), _start_gaps(table).tolist()


def test_staggered_ranks_start_half_a_step_apart(runs):
    table = runs["staggered"]
    step = table["seconds"].median()
    assert _start_gaps(table).iloc[0] > 0.25 * step, (_start_gaps(table).tolist(), step)


def test_summary_is_the_ratio_of_the_modes_medians_per_pair_and_the_kernel_share():
    table = pd.DataFrame([dict(pair=0, mode=m, seconds=s, kernel_seconds=k) for m, s, k in
                          [("aligned", 1.2, 0.2), ("aligned", 1.4, 0.2), ("aligned", 9.0, 0.1),
                           ("staggered", 1.0, 0.5), ("staggered", 1.0, 0.0), ("staggered", 1.0, 0.0)]])
    row = bench_lockstep.summary(table).loc[0]
    assert row["ratio"] == pytest.approx(1.4)
    assert row["kernel_share"] == pytest.approx(1.0 / 14.6)


def test_kernel_time_is_counted_per_step(runs):
    table = runs["aligned"]
    assert (table["kernel_seconds"] >= 0).all() and table["kernel_seconds"].sum() > 0


def test_unpinned_ranks_may_run_anywhere_and_pinned_ones_on_a_cpu_each(runs):
    allowed = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    assert (runs["aligned"]["cpus"] == allowed).all()
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("pinning two ranks apart needs two CPUs; this process may use one")
    pinned = bench_lockstep.measure(tokens=256, steps=1, mode="staggered", pin=True)
    per_rank = pinned.groupby("rank")["cpus"].unique()
    assert all(len(c) == 1 and "," not in c[0] for c in per_rank), per_rank.tolist()
    assert per_rank[0][0] != per_rank[1][0]


def test_a_count_below_one_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        bench_lockstep.main(["--steps", "0"])
    assert exit_.value.code == 2
    assert "--steps must be at least 1, got 0" in capsys.readouterr().err
