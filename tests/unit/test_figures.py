"""Each figure rendered from a small fixture results root, checked through its matplotlib objects."""

from __future__ import annotations

import subprocess
import sys

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.collections import PathCollection  # noqa: E402
from matplotlib.container import BarContainer  # noqa: E402

from odc_bench.data.profiles import PROFILES  # noqa: E402
from paper_figures import (  # noqa: E402
    cli,
    fig1_timeline,
    fig7_lengths,
    fig8_throughput,
    fig10_acceleration,
    fig11_bandwidth,
    series,
    tables,
    utilization,
)
from paper_figures.inputs import LengthsFormat, Skip, load  # noqa: E402
from tests.helpers import REPO, with_series  # noqa: E402
from tests.helpers.curves import write_loss_runs, write_rl_runs  # noqa: E402
from tests.helpers.figures import (  # noqa: E402
    COSTS,
    GOLDEN,
    MINIBATCHES,
    PRIM_SIZES,
    PRIM_WORLDS,
    SYNC_GAP,
    UNITS,
    VARIATIONS,
    WARMUP,
    results_root,
    samples_per_s,
    trace_events,
    write_runs,
    write_staleness_runs,
)

ALL_SERIES = ["Collective + LocalSort", "Collective + LB-Micro", "ODC + LB-Micro", "ODC + LB-Mini"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return load(results_root(tmp_path_factory.mktemp("results")))


def _only(outputs: dict, prefix: str):
    (item,) = [v for k, v in outputs.items() if k.startswith(prefix)]
    if isinstance(item, Skip):
        raise AssertionError(f"{prefix} was skipped: {item}")
    return item


def _spans(ax, gid: str) -> int:
    return sum(len(c.get_paths()) for c in ax.collections if c.get_gid() == gid)


def test_loader_tags_sources_and_leaves_out_failed_rows_and_the_scratch_folder(tmp_path):
    root = results_root(tmp_path / "results")
    runs = pd.read_csv(root / "cpu" / "runs.csv")
    failed = runs.iloc[[0]].assign(run_id="broken", status="failed")
    pd.concat([runs, failed]).to_csv(root / "cpu" / "runs.csv", index=False)
    (root / "local").mkdir()
    runs.to_csv(root / "local" / "runs.csv", index=False)
    loaded = load(root)
    assert set(loaded.runs["source"]) == {"cpu"}
    assert len(loaded.runs) == len(runs)
    assert any("1 failed run" in note for note in loaded.notes)
    assert set(loaded.primitives["source"]) == {"primitives"}


def test_loader_leaves_out_a_table_without_the_columns_figures_need(tmp_path):
    root = results_root(tmp_path / "results")
    (tmp_path / "results" / "old").mkdir()
    pd.DataFrame({"run_id": ["x"], "status": ["ok"]}).to_csv(root / "old" / "runs.csv", index=False)
    loaded = load(root)
    assert set(loaded.runs["source"]) == {"cpu"}
    assert any("old/runs.csv left out" in note and "engine" in note for note in loaded.notes)


def test_loader_leaves_out_runs_of_a_diagnostic_engine_with_a_note(tmp_path):
    root = results_root(tmp_path / "results")
    runs = pd.read_csv(root / "cpu" / "runs.csv")
    lockstep = runs[runs["engine"] == "odc"].assign(engine="odc_lockstep", run_id=lambda t: t["run_id"] + "-lockstep")
    pd.concat([runs, lockstep]).to_csv(root / "cpu" / "runs.csv", index=False)
    loaded = load(root)
    assert len(lockstep) > 0 and len(loaded.runs) == len(runs)
    assert set(loaded.runs["engine"]) == {"collective", "odc"}
    assert any("runs of engine(s) odc_lockstep left out" in note for note in loaded.notes)


def test_cli_refuses_a_missing_results_root(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--results", str(tmp_path / "nowhere")])
    assert exit_.value.code == 2
    assert "is neither a folder nor a .csv table" in capsys.readouterr().err


def test_figures_read_a_collected_table_and_keep_its_repeats(tmp_path):
    from odc_bench.results.collect import collect

    root = results_root(tmp_path / "results", primitives=False)
    table = pd.read_csv(root / "cpu" / "runs.csv")
    again = table[table["run_id"] == "odc-lb_mini-longalign-4"].assign(attempt=1, samples_per_s=0.0)
    pd.concat([table.assign(attempt=0), again]).to_csv(root / "cpu" / "runs.csv", index=False)
    collected = tmp_path / "collected.csv"
    collect([root], collected)
    inputs = load(collected)
    assert set(inputs.runs["source"]) == {"collected"}
    assert len(inputs.runs) == len(table) + 1, "the repeat is kept"
    fig = _only(fig8_throughput.render(inputs), "fig8_throughput")
    longalign = next(ax for ax in fig.axes if ax.get_title().startswith("longalign"))
    mini = [c for c in longalign.containers if isinstance(c, BarContainer)][-1]
    assert mini[MINIBATCHES.index(4)].get_height() == pytest.approx(samples_per_s("odc", "lb_mini", 4) / 2), \
        "the two runs of the config are averaged"


def test_fig1_draws_both_engines_and_marks_the_time_saved(inputs):
    fig = _only(fig1_timeline.render(inputs), "fig1_timeline")
    top, bottom = fig.axes[:2]
    assert "Collective + LB-Micro" in top.get_title(loc="left") and "ODC + LB-Mini" in bottom.get_title(loc="left")
    assert top.get_ylabel() == fig1_timeline.Y_LABEL and bottom.get_xlabel() == fig1_timeline.X_LABEL
    phases = 2 * len(UNITS)
    assert _spans(top, "compute") == phases * sum(len(c) for c in COSTS["collective"])
    assert _spans(bottom, "compute") == phases * sum(len(c) for c in COSTS["odc"])
    assert _spans(top, "sync") == _spans(bottom, "sync") == 2
    assert [t.get_text() for t in fig.legends[0].texts] == [v[2] for v in fig1_timeline.KINDS.values()] + [
        fig1_timeline.IDLE[1]]
    # Collective waits for the slowest rank at every step; ODC only at the end.
    collective = sum(max(step) for step in zip(*COSTS["collective"], strict=True)) + SYNC_GAP + 0.01
    odc = max(sum(c) for c in COSTS["odc"]) + SYNC_GAP + 0.01
    (note,) = [t for t in top.texts if t.get_text().startswith("time saved")]
    assert f"{collective - odc:.3g} s" in note.get_text()
    assert [a.get_gid() for a in top.patches].count("difference") == 1


def test_fig1_says_so_when_the_second_run_is_slower():
    fast, slow = pd.DataFrame(trace_events("odc")), pd.DataFrame(trace_events("collective"))
    fig = fig1_timeline.plot([("A", fast), ("B", slow)], WARMUP)
    top, bottom = fig.axes[:2]
    assert not top.texts
    (note,) = bottom.texts
    assert note.get_text().startswith("no time saved: B takes")


def test_fig1_with_one_engine_draws_it_alone_and_says_so(tmp_path):
    fig = _only(fig1_timeline.render(load(results_root(tmp_path, engines=("collective",)))), "fig1_timeline")
    assert len(fig.axes) == 1
    assert "only Collective runs" in fig._suptitle.get_text()
    assert not [t for t in fig.axes[0].texts if t.get_text().startswith("time saved")]


def test_fig1_draws_the_first_measured_minibatch():
    trace = pd.DataFrame(trace_events("odc"))
    events, span = fig1_timeline.minibatch_spans(trace, WARMUP)
    assert set(events["minibatch"]) == {WARMUP}
    assert events["t0"].min() == pytest.approx(0.0)
    assert span == pytest.approx(events["t1"].max())


def test_fig7_has_one_histogram_per_profile_and_real_dataset(tmp_path):
    np.save(tmp_path / "mine.npy", np.array([10, 20, 20, 30, 400]))
    fig = _only(fig7_lengths.render(load(tmp_path / "nowhere", [tmp_path / "mine.npy"])), "fig7_lengths")
    titles = [ax.get_title().split("\n")[0] for ax in fig.axes]
    assert titles == [f"{p} (profile)" for p in fig7_lengths.PAPER_PROFILES] + [fig7_lengths.RL_PANEL, "mine (real)"]
    assert set(fig7_lengths.PAPER_PROFILES) <= set(PROFILES)
    for ax in fig.axes:
        assert ax.get_xlabel() == fig7_lengths.X_LABEL and ax.get_ylabel() == fig7_lengths.Y_LABEL
        assert len(ax.patches) == fig7_lengths.BINS
    assert sum(p.get_height() for p in fig.axes[-1].patches) == 5


def test_fig7_reads_the_whatifs_lengths_formats_titled_with_the_datas_name(tmp_path):
    (tmp_path / "my_lengths.txt").write_text("200\n1\n60000\n512\n")  # a count under 2 tokens is not usable
    (tmp_path / "chat.jsonl").write_text('{"n": 7}\n{"n": 9}\n')
    np.save(tmp_path / "longtail.jsonl.lengths-0123456789ab.npy", np.array([1, 300, 40]))
    files = [tmp_path / "my_lengths.txt", tmp_path / "chat.jsonl", tmp_path / "longtail.jsonl.lengths-0123456789ab.npy"]
    lengths = load(tmp_path / "nowhere", files, LengthsFormat(field="n")).lengths
    assert {k: v.tolist() for k, v in lengths.items()} == {"my_lengths": [200, 60000, 512], "chat": [7, 9],
                                                           "longtail": [300, 40]}
    assert not list(tmp_path.glob("my_lengths.txt.*"))  # reading writes no cache beside the data


def test_fig7_lengths_that_cannot_be_read_are_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "bad.txt").write_text("200\nmany\n")
    with pytest.raises(SystemExit) as stop:
        cli.main(["--results", str(tmp_path), "--out", str(tmp_path / "out"), "--lengths", str(tmp_path / "bad.txt"),
                  "--only", "fig7_lengths"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m paper_figures: error: --lengths") and "bad.txt line 2 is not valid JSON" in err
    assert err.count("\n") == 1, "one line, without argparse's usage"
    assert not (tmp_path / "out").exists()


def test_fig8_bars_are_the_throughput_of_each_series(inputs):
    fig = _only(fig8_throughput.render(inputs), "fig8_throughput")
    assert len(fig.axes) == 2  # longalign and swe_smith, one model
    assert [t.get_text() for t in fig.legends[0].texts] == ALL_SERIES
    for ax in fig.axes:
        assert ax.get_ylabel() == fig8_throughput.Y_LABEL
        bars = [c for c in ax.containers if isinstance(c, BarContainer)]
        assert len(bars) == len(ALL_SERIES)
        assert all(len(c) == len(MINIBATCHES) for c in bars)
        # The one-factor variations (other world size, packing, scale) are not averaged in.
        odc_mini = [b.get_height() for b in bars[-1]]
        assert odc_mini == pytest.approx([samples_per_s("odc", "lb_mini", mb) for mb in MINIBATCHES])
    assert fig.axes[-1].get_xlabel() == fig8_throughput.X_LABEL
    assert [t.get_text() for t in fig.axes[-1].get_xticklabels()] == [str(m) for m in MINIBATCHES]


def _data_lines(ax):
    return [line for line in ax.lines if line.get_gid() != "zero" and len(line.get_xdata()) > 0]


def test_fig10_plots_the_acceleration_of_each_odc_series_per_factor(inputs):
    fig = _only(fig10_acceleration.render(inputs), "fig10_acceleration")
    axes = dict(zip(fig10_acceleration.FACTORS, fig.axes, strict=False))
    assert [ax.get_xlabel() for ax in fig.axes] == list(fig10_acceleration.FACTORS.values())
    assert all(ax.get_ylabel() == fig10_acceleration.Y_LABEL for ax in fig.axes)
    # Every factor: the sweep through the golden setting (LongAlign, minibatch 4), two ODC series.
    points = {"minibatch_size": len(MINIBATCHES), "max_length": 2, "packing_ratio": 3, "world_size": 2}
    for factor, n in points.items():
        lines = _data_lines(axes[factor])
        assert len(lines) == 2
        assert all(len(line.get_xdata()) == n for line in lines)
    # One legend, outside the panels, naming the series drawn.
    assert not any(ax.get_legend() for ax in fig.axes)
    assert [t.get_text() for t in fig.legends[0].texts] == ["ODC + LB-Micro", "ODC + LB-Mini"]
    assert "(measured)" in fig._suptitle.get_text()
    mini = _data_lines(axes["packing_ratio"])[1]
    bonus = {1: 1.0} | {c["packing_ratio"]: b for c, b in VARIATIONS if "packing_ratio" in c}
    assert list(mini.get_xdata()) == [1, 2, 4]
    assert list(mini.get_ydata()) == pytest.approx([100 * (1.3 * bonus[p] - 1) for p in (1, 2, 4)])


def test_fig10_skips_without_odc_runs(tmp_path):
    out = fig10_acceleration.render(load(results_root(tmp_path, engines=("collective",))))
    assert isinstance(out["fig10_acceleration-cpu"], Skip)
    assert "no odc runs" in str(out["fig10_acceleration-cpu"])


def test_fig11_has_a_panel_per_world_size_with_every_primitive_and_the_memcpy_limit(inputs):
    fig = _only(fig11_bandwidth.render(inputs), "fig11_bandwidth")
    assert [ax.get_title() for ax in fig.axes] == [f"{w} ranks" for w in PRIM_WORLDS]
    expected = ["gather (shm)", "scatter-accumulate (shm)", "all-gather (gloo)", "reduce-scatter (gloo)",
                fig11_bandwidth.MEMCPY]
    for ax in fig.axes:
        assert ax.get_xlabel() == fig11_bandwidth.X_LABEL and ax.get_ylabel() == fig11_bandwidth.Y_LABEL
        assert [t.get_text() for t in ax.get_legend().texts] == expected
        lines = [line for line in ax.lines if len(line.get_xdata()) > 0]
        assert len(lines) == 5 and all(len(line.get_xdata()) == len(PRIM_SIZES) for line in lines)
        (memcpy,) = [line for line in lines if line.get_gid() == "memcpy"]
        assert list(memcpy.get_ydata()) == [10.0] * len(PRIM_SIZES)


def _below_every_axes(fig, legend) -> bool:
    """Whether a figure legend lies outside the data: below the lowest panel."""
    fig.canvas.draw()
    box = legend.get_window_extent()
    return all(box.y1 <= ax.get_window_extent().y0 for ax in fig.axes if ax.get_visible())


def test_fig10_draws_only_lines_legends_them_outside_and_gives_each_variant_its_colour(tmp_path):
    fig = _only(fig10_acceleration.render(load(results_root(tmp_path, variants=True))), "fig10_acceleration")
    names = [t.get_text() for t in fig.legends[0].texts]
    # ODC + LocalSort has one point per sweep (the golden one): no line, so not in the legend either.
    assert not any("LocalSort" in n for n in names)
    assert all(len(line.get_xdata()) >= 2 for ax in fig.axes for line in _data_lines(ax))
    assert _below_every_axes(fig, fig.legends[0])
    colors = [tuple(line.get_color()) if not isinstance(line.get_color(), str) else line.get_color()
              for line in fig.legends[0].get_lines()]
    assert len(set(colors)) == len(colors), "one colour per series"


def test_every_variant_of_a_series_gets_a_colour_of_its_own():
    runs = [("collective", "lb_micro", "linear"), ("collective", "lb_micro", "calibrated:tiny-cpu"),
            ("odc", "lb_mini", "linear"), ("odc", "lb_mini", "calibrated:tiny-cpu"), ("odc", "lb_mini", "flops"),
            ("odc", "lb_micro", "linear"), ("collective", "local_sort", "linear")]
    labelled = series.with_series(pd.DataFrame(runs, columns=["engine", "balancer", "cost_model"]))
    labels = list(labelled["series"])
    assert labels[:2] == ["Collective + LB-Micro (linear)", "Collective + LB-Micro (calibrated:tiny-cpu)"]
    colors = series.palette(labelled)
    rgb = [matplotlib.colors.to_rgb(colors[label]) for label in labels]
    assert len(set(rgb)) == len(labels)
    distances = [np.linalg.norm(np.subtract(a, b)) for i, a in enumerate(rgb) for b in rgb[i + 1:]]
    assert min(distances) > 0.1, "told apart at a glance, not by a rounding error"
    assert colors["ODC + LB-Mini (calibrated:tiny-cpu)"] == series.COLORS["ODC + LB-Mini"], "the first keeps the colour"


def test_simulated_numbers_say_so(tmp_path):
    inputs = load(results_root(tmp_path, backend="sim", primitives=False))
    fig8 = _only(fig8_throughput.render(inputs), "fig8_throughput")
    fig10 = _only(fig10_acceleration.render(inputs), "fig10_acceleration")
    fig1 = _only(fig1_timeline.render(inputs), "fig1_timeline")
    util = _only(utilization.render(inputs), "utilization")
    for fig in (fig8, fig10, fig1, util):
        title = fig._suptitle.get_text()
        assert "(simulated)" in title and "measured" not in title, title
    scatter = util.axes[-1]
    assert scatter.get_ylabel() == f"simulated {utilization.BUBBLE_LABEL}"
    assert [t.get_text() for t in util.axes[-2].get_legend().texts] == ["simulated", "predicted by the cost model"]


def test_utilization_without_traces_has_no_empty_panel(tmp_path):
    root = results_root(tmp_path, primitives=False)
    for trace in (root / "cpu" / "traces").iterdir():
        trace.unlink()
    fig = _only(utilization.render(load(root)), "utilization")
    assert len(fig.axes) == 2 and fig.axes[0].get_ylabel() == utilization.BUBBLE_LABEL


@pytest.mark.parametrize(("damage", "said"), [
    (lambda path: path.write_bytes(path.read_bytes()[:40]), "is not an event trace (no "),  # cut short
    (lambda path: path.write_bytes(b"\xff\xfe\x00garbage"), "cannot be read ('utf-8' codec can't decode"),
    (lambda path: path.write_bytes(b""), "cannot be read (No columns to parse from file)"),
    (lambda path: path.write_text("a,b\n1,2\n"), "is not an event trace (no rank, minibatch, microbatch, kind"),
])
def test_a_damaged_trace_skips_its_figure_in_one_line_naming_the_file(tmp_path, capsys, damage, said):
    """Before, a trace cut short or of another kind ended the command in a traceback."""
    root = results_root(tmp_path / "results", primitives=False)
    for trace in (root / "cpu" / "traces").iterdir():
        damage(trace)
    assert cli.main(["--results", str(root), "--out", str(tmp_path / "out"), "--only", "fig1_timeline"]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("skip fig1_timeline")]
    assert said in line and "/cpu/traces/" in line and line.endswith("copy it again, or remove it to draw without it")


def test_fig1_compares_runs_planned_with_the_same_cost_model(tmp_path):
    fig = _only(fig1_timeline.render(load(results_root(tmp_path, variants=True, primitives=False))),
                "fig1_timeline")
    top, bottom = fig.axes[:2]
    # ODC + LB-Mini ran under two cost models; collective only under linear: the pair is the linear one.
    assert top.get_title(loc="left").startswith("Collective + LB-Micro")
    assert bottom.get_title(loc="left").startswith("ODC + LB-Mini (linear)")
    assert "both planned with the linear cost model" in fig._suptitle.get_text()


def test_utilization_shows_per_rank_busy_fraction_and_predicted_vs_measured_bubble(inputs):
    fig = _only(utilization.render(inputs), "utilization")
    busy, rates, scatter = fig.axes[:3]
    assert busy.get_xlabel() == utilization.RANK_LABEL and busy.get_ylabel() == utilization.BUSY_LABEL
    assert [t.get_text() for t in busy.get_legend().texts] == ALL_SERIES
    bars = [c for c in busy.containers if isinstance(c, BarContainer)]
    assert len(bars) == len(ALL_SERIES) and all(len(c) == GOLDEN["world_size"] for c in bars)
    # Synthetic ODC trace: both ranks compute the same 0.30 s per minibatch, so their fractions are equal.
    odc_mini = [b.get_height() for b in bars[-1]]
    assert odc_mini[0] == pytest.approx(odc_mini[1]) and 0 < odc_mini[0] < 1
    assert [t.get_text() for t in rates.get_legend().texts] == ["measured", "predicted by the cost model"]
    measured, predicted = [c for c in rates.containers if isinstance(c, BarContainer)]
    assert [b.get_height() for b in measured] == pytest.approx([0.5, 0.5, 0.2, 0.2])
    assert scatter.get_xlabel().startswith("predicted") and scatter.get_ylabel().startswith("measured")
    points = sum(len(c.get_offsets()) for c in scatter.collections if isinstance(c, PathCollection))
    runs = inputs.runs
    assert points == runs["predicted_bubble_rate"].notna().sum()


def test_busy_fraction_matches_the_trace():
    trace = pd.DataFrame(trace_events("collective"))
    fractions = utilization.busy_fractions(trace, WARMUP).set_index("rank")["busy_fraction"]
    measured = trace[trace["minibatch"] >= WARMUP]
    whole = measured[measured["kind"] == "minibatch"]
    window = whole["t1"].max() - whole["t0"].min()
    per_minibatch = [sum(c) + 0.01 for c in COSTS["collective"]]
    n = trace["minibatch"].max() + 1 - WARMUP
    assert list(fractions) == pytest.approx([n * b / window for b in per_minibatch])


def _markdown_rows(text: str) -> dict[str, dict[str, str]]:
    lines = [line for line in text.splitlines() if line.startswith("|")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    header, rows = cells[0], cells[2:]
    return {row[0]: dict(zip(header, row, strict=True)) for row in rows}


def test_tables_hold_the_numbers_behind_the_figures(inputs):
    out = tables.render(inputs)
    golden = _markdown_rows(out["table1_golden-cpu"])
    assert list(golden) == ALL_SERIES
    speedup = "speedup over Collective + LB-Micro (%)"
    assert float(golden["ODC + LB-Mini"][speedup]) == pytest.approx(30)
    assert float(golden["Collective + LB-Micro"][speedup]) == pytest.approx(0)
    table5 = out["table5_throughput-cpu"]
    assert all(s in table5 for s in ALL_SERIES)
    assert "best ODC over Collective + LB-Micro (%)" in table5
    assert "acceleration (%)" in out["table_acceleration-cpu"]
    bandwidth = out["table_bandwidth-primitives"]
    assert "gather / all_gather" in bandwidth and "scatter_accumulate / reduce_scatter" in bandwidth


def test_cli_skips_a_figure_without_inputs_and_renders_the_others(tmp_path, capsys):
    root = results_root(tmp_path / "results", primitives=False)
    out = tmp_path / "out"
    assert cli.main(["--results", str(root), "--out", str(out), "--only", "fig11_bandwidth", "fig8_throughput"]) == 0
    assert "skip fig11_bandwidth: no primitives.csv" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["fig8_throughput-cpu.pdf", "fig8_throughput-cpu.png"]


def test_cli_docs_writes_small_pngs_only(tmp_path, monkeypatch):
    root = results_root(tmp_path / "results")
    monkeypatch.chdir(tmp_path)
    stale = tmp_path / cli.DOCS_DIR / "fig8_throughput-old.png"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"")
    assert cli.main(["--results", str(root), "--docs", "--only", "fig8_throughput", "fig7_lengths"]) == 0
    written = sorted(p.name for p in (tmp_path / cli.DOCS_DIR).iterdir())
    assert written == ["fig7_lengths.png", "fig8_throughput-cpu.png"]


@pytest.mark.slow
def test_python_m_paper_figures_renders_without_torch(tmp_path):
    """The figures read results files only: the entry point never even imports torch, so it cannot train."""
    root = results_root(tmp_path / "results")
    write_rl_runs(root / "cpu")
    write_loss_runs(root / "cpu_convergence")
    write_staleness_runs(root / "cpu_ssp_convergence")
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['paper_figures', '--results', {str(root)!r}, '--out', {str(tmp_path / 'out')!r}]\n"
        "try:\n"
        "    runpy.run_module('paper_figures', run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "assert 'torch' not in sys.modules, 'paper_figures imported torch'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # every figure draws but the scaling study's, whose input (a sim_scaling sweep) the fixture
    # lacks (tests/unit/test_scaling_figure.py draws it), and the loss-curve experiments'
    # throughput figures (they have no one-factor sweeps or the like)
    skips = [line for line in done.stdout.splitlines() if line.startswith("skip")]
    scaling = ("skip scaling: no hybrid-sharding or topology-aware-fetch runs below the results root "
               "(python -m odc_bench sweep=sim_scaling)")
    assert scaling in skips, done.stdout
    assert all(s == scaling or "-cpu_convergence:" in s or "-cpu_ssp_convergence:" in s for s in skips), done.stdout
    names = {p.name for p in (tmp_path / "out").iterdir()}
    for fig in ["fig1_timeline-cpu", "fig8_throughput-cpu", "fig10_acceleration-cpu", "utilization-cpu",
                "fig11_bandwidth-primitives", "fig7_lengths", "fig9_rl-cpu", "convergence-cpu_convergence",
                "staleness-cpu_ssp_convergence"]:
        assert {f"{fig}.png", f"{fig}.pdf"} <= names
    tables = ["table1_golden-cpu", "table5_throughput-cpu", "table_acceleration-cpu", "table_bandwidth-primitives",
              "fig9_rl_table-cpu", "convergence_gap-cpu_convergence"]
    assert {f"{t}.md" for t in tables} <= names


def test_series_name_fsdp2s_process_group_only_where_a_table_has_several():
    def row(engine, group=None):
        config = f"engine:\n  name: {engine}\n" + (f"  backend: {group}\n" if group else "")
        return with_series(dict(engine=engine, balancer="local_sort", backend="local", cost_model="linear",
                                config=config))

    both = pd.DataFrame([row("collective", "shm"), row("collective", "gloo"), row("odc")])
    labels = list(series.label_series(both))
    assert labels == ["Collective [shm] + LocalSort", "Collective [gloo] + LocalSort", "ODC + LocalSort"]
    labelled = series.with_series(both.iloc[::-1])
    assert series.ordered(labelled)[-1] == "ODC + LocalSort", "tagged series keep the paper's order: collective first"
    colors = series.palette(labelled)
    assert colors["Collective [shm] + LocalSort"] == series.COLORS["Collective + LocalSort"]
    assert colors["Collective [gloo] + LocalSort"] not in series.COLORS.values(), "gloo is drawn in grey"
    one = pd.DataFrame([row("collective", "shm"), row("odc")])
    assert list(series.label_series(one)) == ["Collective + LocalSort", "ODC + LocalSort"]


def test_a_table_whose_runs_all_failed_is_skipped_as_having_no_successful_runs(tmp_path, capsys):
    """Not as 'no runs.csv tables': the table is there, and the note says how many failed."""
    table = write_runs(tmp_path / "cpu")
    table.assign(status="failed").to_csv(tmp_path / "cpu" / "runs.csv", index=False)
    assert cli.main(["--results", str(tmp_path), "--out", str(tmp_path / "out"), "--only", "fig8_throughput",
                     "tables"]) == 0
    out = capsys.readouterr().out
    assert f"note: {tmp_path / 'cpu' / 'runs.csv'}: {len(table)} failed run(s) left out" in out
    assert ("skip fig8_throughput: no successful runs (rows of runs.csv with status ok) found below the results "
            "root") in out and "runs.csv tables found" not in out


@pytest.mark.parametrize("fallback", [(), cli._FALLBACK])
def test_a_name_in_letters_the_font_lacks_is_drawn_in_an_installed_one_or_said_once(tmp_path, capsys, monkeypatch,
                                                                                    fallback):
    """A model named in CJK letters: matplotlib warned once per glyph and drawing (a page of
    UserWarnings) and drew boxes; an installed CJK font now draws them (seaborn's theme had
    replaced the fonts a matplotlibrc gives), and without one the command says so in one note."""
    from matplotlib import font_manager

    monkeypatch.setattr(cli, "_FALLBACK", fallback)
    table = write_runs(tmp_path / "results", engines=("collective",))
    table.assign(model="模型").to_csv(tmp_path / "results" / "runs.csv", index=False)
    assert cli.main(["--results", str(tmp_path / "results"), "--out", str(tmp_path / "out"), "--only",
                     "fig8_throughput"]) == 0
    out, err = capsys.readouterr()
    assert "missing from font" not in err
    installed = any(k in f.name for f in font_manager.fontManager.ttflist for k in fallback)
    note = "note: no installed font has a glyph for 模 型 in the names the figures draw, drawn as boxes; "
    assert (note in out) is not installed, out
