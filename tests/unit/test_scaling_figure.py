"""The scaling study's figure and table, from a small results table whose numbers are known."""

import pandas as pd
import pytest
import yaml

from odc_bench.record.schema import COLUMNS, SCHEMA_VERSION
from odc_bench.results.scaling import acceleration
from odc_bench.results.series import DERIVED, layouts
from odc_bench.studies.pages import render
from odc_bench.studies.paper import scaling as scaling_rows
from paper_figures import fig10_acceleration, scaling
from paper_figures.inputs import Skip, by_source, load
from tests.helpers import with_series

WORLDS = [8, 16, 32]
# samples/s per (engine, layout) at 8 devices; every run scales with the device count, ODC's
# layouts by their own factor per doubling.
BASE = {("collective", "full"): 1.0, ("collective", "hybrid"): 0.9, ("odc", "full"): 1.2, ("odc", "hybrid"): 1.17,
        ("odc", "nearest"): 1.26}
GROWTH = {"full": 1.05, "hybrid": 1.10, "nearest": 1.08}


def speed(engine: str, layout: str, world: int) -> float:
    doublings = WORLDS.index(world)
    return BASE[(engine, layout)] * world * (GROWTH[layout] ** doublings if engine == "odc" else 1.0)


def expected(layout: str, world: int) -> float:
    base = speed("collective", "hybrid" if layout == "hybrid" else "full", world)
    return 100 * (speed("odc", layout, world) / base - 1)


def row(engine: str, layout: str, world: int, model: str) -> dict:
    balancer = "lb_micro" if engine == "collective" else "lb_mini"
    config = {"engine": {"name": engine, "shard": "hybrid" if layout == "hybrid" else "full"},
              "backend": {"name": "sim", "odc_fetch": "nearest" if layout == "nearest" else "owner"}}
    out = {c: None for c in COLUMNS}
    out.update(run_id=f"{engine}-{layout}-{world}-{model}", schema_version=SCHEMA_VERSION, status="ok", backend="sim",
               engine=engine, balancer=balancer, cost_model="linear", model=model, dataset="longalign",
               world_size=world, minibatch_size=4, max_tokens=65536, packing_ratio=1, length_scale=1.0,
               precision="bf16", seed=0, num_minibatches=3, warmup_minibatches=1,
               samples_per_s=speed(engine, layout, world),
               # hybrid sharding of the big model does not fit
               mem_estimate_mb=90_000.0 if (model == "big" and layout == "hybrid") else 50_000.0,
               mem_limit_mb=76_000.0, config=yaml.safe_dump(config))
    return with_series(out)


@pytest.fixture
def root(tmp_path):
    rows = [row(e, layout, w, m) for m in ("small", "big") for w in WORLDS
            for e, layout in [("collective", "full"), ("collective", "hybrid"), ("odc", "full"), ("odc", "hybrid"),
                              ("odc", "nearest")]]
    (tmp_path / "sim_scaling").mkdir()
    pd.DataFrame(rows, columns=COLUMNS).to_csv(tmp_path / "sim_scaling" / "runs.csv", index=False)
    return tmp_path


def test_the_scaling_figure_draws_each_layouts_acceleration_against_its_own_baseline(root):
    fig = scaling.render(load(root))["scaling-sim_scaling"]
    assert [ax.get_title() for ax in fig.axes] == ["big, longalign", "small, longalign"]
    for ax in fig.axes:
        assert ax.get_xlabel() == scaling.X_LABEL and ax.get_ylabel() == scaling.Y_LABEL
        lines = {line.get_gid(): line for line in ax.lines}
        for layout in ("full", "hybrid", "nearest"):
            line = lines["" if layout == "full" else layout]
            assert list(line.get_xdata()) == WORLDS
            assert list(line.get_ydata()) == pytest.approx([expected(layout, w) for w in WORLDS])
    big = {line.get_gid(): line for line in fig.axes[0].lines}
    # hybrid sharding of the big model: every point hollow (over memory); the others filled
    assert len(big["hybrid-over"].get_xdata()) == 3 and len(big["hybrid-fits"].get_xdata()) == 0
    assert len(big["-fits"].get_xdata()) == 3
    assert "does not fit in memory" in [t.get_text() for t in fig.axes[0].get_legend().texts]


def test_without_a_scaling_study_it_is_skipped_with_the_reason(tmp_path, root):
    plain = [row(e, "full", w, "small") for w in WORLDS for e in ("collective", "odc")]
    (tmp_path / "sim").mkdir()
    pd.DataFrame(plain, columns=COLUMNS).to_csv(tmp_path / "sim" / "runs.csv", index=False)
    with pytest.raises(Skip, match="no hybrid-sharding or topology-aware-fetch runs"):
        scaling.render(load(tmp_path / "sim"))
    # beside a study, other sources are not its business: one figure, for the study
    assert list(scaling.render(load(tmp_path))) == ["scaling-sim_scaling"]


def test_the_other_figures_draw_each_layout_apart_with_its_baseline(root):
    parts = by_source(load(root).runs)
    assert sorted(parts) == ["sim_scaling-full", "sim_scaling-hybrid", "sim_scaling-nearest"]
    kinds = {name: {run.rsplit("-", 2)[0] for run in part["run_id"]} for name, part in parts.items()}
    assert kinds["sim_scaling-full"] == {"collective-full", "odc-full"}
    assert kinds["sim_scaling-hybrid"] == {"collective-hybrid", "odc-hybrid"}
    # topology-aware fetch is ODC's: its split holds the full-sharding collective runs as baseline
    assert kinds["sim_scaling-nearest"] == {"collective-full", "odc-nearest"}
    out = fig10_acceleration.render(load(root))
    assert not any(isinstance(v, Skip) for k, v in out.items() if "sim_scaling" in k)


def test_runs_with_and_without_activation_checkpointing_are_drawn_apart(root):
    """A source holding runs of both is two figures' worth, as two layouts are: drawn together,
    a series' points mixed runs that did different work."""
    runs = load(root).runs
    runs = runs[layouts(runs) == ""].copy()
    on = runs["run_id"].str.startswith("odc") | (runs.index % 2 == 0)
    runs.loc[on, "config"] = "backend:\n  name: sim\n  recompute: true\n  recompute_mode: full\n"
    parts = by_source(runs.drop(columns=DERIVED))  # read again from the configs changed here
    assert sorted(parts) == ["sim_scaling-no-recompute", "sim_scaling-recompute-full"]
    assert set(parts["sim_scaling-recompute-full"]["run_id"]) == set(runs.loc[on, "run_id"])
    assert set(parts["sim_scaling-no-recompute"]["run_id"]) == set(runs.loc[~on, "run_id"])


def scaling_table(scaling_dir):
    """The page's scaling section alone, as lines."""
    return render("simulator_paper_scaling", scaling=scaling_rows(scaling_dir)).splitlines()


def test_the_scaling_table_marks_settings_over_memory(root):
    lines = scaling_table(root / "sim_scaling")
    header = next(line for line in lines if line.startswith("| model"))
    assert header.split(" | ")[3:6] == ["full sharding", "hybrid sharding", "topology-aware fetch"]
    big32 = next(line for line in lines if line.startswith("| big | longalign | 32 |"))
    cells = big32.strip("| ").split(" | ")
    assert cells[3] == f"{expected('full', 32):+.1f}%"
    assert cells[4] == f"{expected('hybrid', 32):+.1f}%*"
    assert cells[5] == f"{expected('nearest', 32):+.1f}%"
    assert "No rows yet" in scaling_table(root / "nowhere")[2]


def test_results_compare_sets_each_layout_against_its_own_baseline(root):
    from odc_bench.results.compare import comparison

    rows = comparison(pd.read_csv(root / "sim_scaling" / "runs.csv"))
    odc = rows[(rows["engine"] == "odc") & (rows["model"] == "small") & (rows["world_size"] == 32)].set_index("layout")
    for layout, key in (("", "full"), ("hybrid", "hybrid"), ("nearest", "nearest")):
        assert odc.loc[layout, "speedup"] == pytest.approx(1 + expected(key, 32) / 100)


def test_runs_on_two_hardware_profiles_are_accelerations_of_their_own(tmp_path):
    """A study simulated on two GPUs: each ODC run against the baseline on its own GPU, drawn
    apart. Before, every ODC run met every baseline run of its setting (an A100 ODC run over an
    H100 baseline) and one figure mixed both."""
    rows = []
    for hardware, scale in (("a100", 1.0), ("h100", 3.0)):
        for e, layout in [("collective", "full"), ("odc", "full"), ("odc", "nearest")]:
            for w in WORLDS:
                r = row(e, layout, w, "small")
                config = yaml.safe_load(r["config"])
                config["backend"]["hardware"] = {"name": hardware, "peak_tflops": 312 * scale}
                rows.append(r | {"run_id": f"{r['run_id']}-{hardware}", "config": yaml.safe_dump(config),
                                 "samples_per_s": r["samples_per_s"] * (scale if e == "odc" else 1.0)})
    table = pd.DataFrame(rows, columns=COLUMNS)
    found = acceleration(table)
    assert len(found) == 2 * 2 * len(WORLDS), "one row per profile, layout and device count"
    a100 = found[found["overrides"] == "backend/hardware=a100"]
    assert sorted(a100["acceleration"]) == pytest.approx(sorted(expected(layout, w) for layout in ("full", "nearest")
                                                                for w in WORLDS))
    (tmp_path / "sim_scaling").mkdir()
    table.to_csv(tmp_path / "sim_scaling" / "runs.csv", index=False)
    parts = by_source(load(tmp_path).runs)
    assert sorted(parts) == ["sim_scaling-full-backend-hardware-a100", "sim_scaling-full-backend-hardware-h100",
                             "sim_scaling-nearest-backend-hardware-a100", "sim_scaling-nearest-backend-hardware-h100"]
    assert set(parts["sim_scaling-full-backend-hardware-h100"]["run_id"].str[-4:]) == {"h100"}
