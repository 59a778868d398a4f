"""paper_figures/staleness.py on synthetic runs whose loss curves and clocks are known."""

import numpy as np
import pandas as pd
import pytest

from paper_figures import staleness
from paper_figures.inputs import load
from tests.helpers.figures import STALENESS_SERIES as SERIES
from tests.helpers.figures import STALENESS_STEPS as STEPS
from tests.helpers.figures import staleness_loss as loss
from tests.helpers.figures import staleness_trace as trace
from tests.helpers.figures import write_staleness_runs


@pytest.fixture
def root(tmp_path):
    write_staleness_runs(tmp_path / "cpu_ssp_convergence")
    return tmp_path

def test_the_loss_curve_is_each_minibatchs_loss_at_the_time_its_last_rank_left_it():
    curve = staleness.loss_curve(trace(0.02, 0.2))
    assert curve["loss"].to_numpy() == pytest.approx([loss(0.02, k) for k in range(STEPS)])
    assert curve["seconds"].to_numpy() == pytest.approx([0.2 * (k + 1) + 0.01 for k in range(STEPS)])


def test_the_figure_draws_every_series_against_steps_and_seconds_and_the_table_has_the_gaps(root):
    out = staleness.render(load(root))
    fig, table = out["staleness-cpu_ssp_convergence"], out["staleness_table-cpu_ssp_convergence"]
    by_step, by_time = fig.axes
    for ax, x in ((by_step, "step"), (by_time, "seconds")):
        lines = {line.get_gid(): line for line in ax.get_lines()}
        assert set(lines) == set(SERIES)
        decay, seconds = SERIES["ODC s=1 + LB-Carry"][3:]
        xs = lines["ODC s=1 + LB-Carry"].get_xdata()
        assert xs[-1] == pytest.approx(STEPS - 1 if x == "step" else STEPS * seconds + 0.01)
    # Target: ODC s=0's smoothed loss at step 60; the others reach it where their own smoothed curve does.
    reference = pd.Series([loss(0.02, k) for k in range(STEPS)]).rolling(staleness.WINDOW, min_periods=1).mean()
    target = reference.iloc[STEPS // 2]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in table.splitlines() if line.startswith("| ") and "series" not in line}
    for label, (_, _, _, decay, seconds) in SERIES.items():
        own = pd.Series([loss(decay, k) for k in range(STEPS)]).rolling(staleness.WINDOW, min_periods=1).mean()
        step = int(np.flatnonzero(own.to_numpy() <= target * (1 + staleness.SAME_LOSS))[0])
        final, _, steps, _, secs, _, _ = rows[label]
        assert float(final) == pytest.approx(np.mean([loss(decay, k) for k in range(STEPS - 25, STEPS)]), abs=1e-3)
        assert int(steps) == step
        assert float(secs) == pytest.approx(seconds * (step + 1) + 0.01, abs=0.05)
    assert rows["ODC s=0 + LB-Carry"][3] == "+0.0%"
    assert rows["ODC s=2 + LB-Carry"][3].startswith("+"), "the stalest series needs more steps"
    assert float(rows["ODC s=2 + LB-Carry"][1]) > 0, "and ends at a higher loss"


def test_without_a_synchronous_odc_run_it_skips_with_the_reason(root):
    table = root / "cpu_ssp_convergence" / "runs.csv"
    runs = pd.read_csv(table)
    runs[runs["run_id"] != "r1"].to_csv(table, index=False)
    out = staleness.render(load(root))
    assert "no ODC run at staleness 0" in str(out["staleness-cpu_ssp_convergence"])


def test_a_folder_of_synchronous_runs_only_is_left_to_the_convergence_figure(root):
    table = root / "cpu_ssp_convergence" / "runs.csv"
    runs = pd.read_csv(table)
    runs[runs["run_id"].isin(["r0", "r1"])].to_csv(table, index=False)  # collective and ODC s=0
    out = staleness.render(load(root))
    assert "no ODC run at engine.staleness >= 1" in str(out["staleness-cpu_ssp_convergence"])


def _rows(table: str) -> dict[str, list[str]]:
    return {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in table.splitlines() if line.startswith("| ") and "series" not in line}


def test_side_by_side_sets_give_the_median_seconds_gap_within_sets_and_its_range(tmp_path):
    """Three complete sets in which s = 1's steps take 1.0, 1.3 and 0.9 times as long and ODC
    s = 0's 1.0, 1.1 and 0.8 times: each set's gap is taken within the set, so the median is not
    the gap of the medians. A fourth run of the collective series alone makes no set."""
    slower = {"ODC s=1 + LB-Carry": (1.0, 1.3, 0.9), "ODC s=0 + LB-Carry": (1.0, 1.1, 0.8)}
    write_staleness_runs(tmp_path / "cpu_ssp_convergence", sets=3, slower=slower,
                         incomplete=("Collective + LB-Micro",))
    table_path = tmp_path / "cpu_ssp_convergence" / "runs.csv"
    pd.read_csv(table_path).iloc[::-1].to_csv(table_path, index=False)  # the stalest series ran first
    out = staleness.render(load(tmp_path))
    fig, table = out["staleness-cpu_ssp_convergence"], out["staleness_table-cpu_ssp_convergence"]
    reference = pd.Series([loss(0.02, k) for k in range(STEPS)]).rolling(staleness.WINDOW, min_periods=1).mean()
    target = reference.iloc[STEPS // 2]

    def steps_to_target(decay: float) -> int:
        own = pd.Series([loss(decay, k) for k in range(STEPS)]).rolling(staleness.WINDOW, min_periods=1).mean()
        return int(np.flatnonzero(own.to_numpy() <= target * (1 + staleness.SAME_LOSS))[0])

    def seconds(label: str, j: int) -> float:
        _, _, _, decay, per_step = SERIES[label]
        factor = slower.get(label, (1.0,) * 3)[j]
        return per_step * factor * (steps_to_target(decay) + 1) + 0.01

    gaps = [seconds("ODC s=1 + LB-Carry", j) / seconds("ODC s=0 + LB-Carry", j) - 1 for j in range(3)]
    rows = _rows(table)
    _, _, _, _, secs, gap, _ = rows["ODC s=1 + LB-Carry"]
    assert float(secs) == pytest.approx(np.median([seconds("ODC s=1 + LB-Carry", j) for j in range(3)]), abs=0.05)
    assert gap == f"{np.median(gaps):+.1%} ({min(gaps):+.1%} to {max(gaps):+.1%})"
    assert rows["ODC s=0 + LB-Carry"][5] == "+0.0%"
    assert "median of 3 side-by-side sets" in table
    assert list(rows) == list(SERIES), "rows in the legend's order"
    # Steps do not depend on the sets: one curve per series against steps, one per set against seconds.
    by_step, by_time = fig.axes
    assert sorted(line.get_gid() for line in by_step.get_lines()) == sorted(SERIES)
    assert sorted(line.get_gid() for line in by_time.get_lines()) == sorted(list(SERIES) * 3)
    assert "3 side-by-side sets" in fig.get_suptitle()
