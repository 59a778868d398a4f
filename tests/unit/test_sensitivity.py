"""studies/sensitivity.py on a tiny grid: its points are the harness's own runs, its speedups follow
from its bubbles, the length distribution moves them the way it must, and the study resumes."""

from dataclasses import replace

import pandas as pd
import pytest

from odc_bench.config.compose import compose_run
from odc_bench.data.profiles import PROFILES
from odc_bench.plan.spec import resolve
from odc_bench.record.row import sim_timing
from odc_bench.sim import simulate
from odc_bench.studies import sensitivity as S

TINY = S.Cell("qwen2_1p5b", 8, 2)
MB, WARMUP = 4, 1


def _point(label: str, **profile) -> S.Point:
    return S.Point("one factor", label, replace(PROFILES["longalign"], **profile), TINY)


def test_a_point_on_the_datasets_own_profile_is_the_harness_run():
    row = S.run_point(S.Point("one factor", "own", PROFILES["longalign"], TINY), seed=3, minibatches=MB,
                      warmup=WARMUP)
    for label, engine, balancer in S.SERIES:
        config = compose_run([*S.PAPER_SETTINGS, "model=qwen2_1p5b", "world_size=8", "minibatch_size=2",
                              "dataset.length_scale=1", f"engine={engine}", f"balancer={balancer}", "seed=3",
                              f"num_minibatches={MB}", f"warmup_minibatches={WARMUP}"])
        spec = resolve(config)
        assert row[f"{label}_samples_per_s"] == pytest.approx(sim_timing(spec, simulate(spec))["samples_per_s"])
        assert row[f"{label}_predicted_bubble"] == pytest.approx(spec.predicted_bubble_rate())


def test_speedups_follow_from_the_bubbles_and_spread_makes_the_collective_wait(tmp_path):
    points = [_point("equal lengths", sigma=0.0, mean=16_000), _point("wide", sigma=1.0)]
    table = S.run(points, tmp_path / "rows.csv", seeds=[0], minibatches=MB, warmup=WARMUP, echo=False)
    t = S.derived(table).set_index("label")
    # Equal work but for the per-microbatch launch overheads (LB-Mini packs fewer microbatches).
    for s in ("odc_lb_mini", "odc_lb_micro"):
        assert (t[f"{s}_speedup"] - t[f"{s}_implied"]).abs().max() < 0.005
    assert abs(t.loc["equal lengths", "odc_lb_mini_speedup"]) < 0.03, "nothing to balance, nothing to gain"
    assert t.loc["wide", "collective_bubble"] > t.loc["equal lengths", "collective_bubble"] + 0.1
    assert t.loc["wide", "odc_lb_mini_speedup"] > 0.05


def test_the_study_resumes_and_tables_what_it_has(tmp_path):
    rows = tmp_path / "rows.csv"
    points = [_point("base"), S.Point("one factor", "packing ratio 2", PROFILES["longalign"], TINY, packing_ratio=2.0)]
    first = S.run(points[:1], rows, seeds=[0, 1], minibatches=MB, warmup=WARMUP, echo=False)
    both = S.run(points, rows, seeds=[0, 1], minibatches=MB, warmup=WARMUP, echo=False)
    assert len(first) == 2 and len(both) == 4
    assert both.iloc[:2].equals(first), "points already there are not run again"
    assert pd.read_csv(rows)["label"].tolist() == ["base", "base", "packing ratio 2", "packing ratio 2"]
    text = S.table(rows, tmp_path / "doc.md", points)
    assert (tmp_path / "doc.md").read_text() == text
    assert "## The paper's three numbers" in text and "## One factor at a time" in text
    assert "## Profiles consistent" not in text, "no candidate rows, no candidate section"
    assert text.count("| packing ratio 2 |") == 1


def test_the_paper_cell_is_inconsistent_as_shares_of_all_time_and_consistent_as_idle_over_busy():
    b_c, b_m = S.PAPER_COLL_BUSY, S.PAPER_MINI_BUSY
    speedup = S.CELL_14B["speedup_odc_lb_mini"]
    assert (1 - b_m) / (1 - b_c) - 1 > 2 * speedup
    assert abs((1 + b_c) / (1 + b_m) - 1 - speedup) < 0.02
