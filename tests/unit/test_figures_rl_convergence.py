"""Fig. 9 (RL throughput) and the convergence figure rendered from fixture results, checked through
their matplotlib objects and tables against the fixtures' formulas."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import math  # noqa: E402

import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.container import BarContainer  # noqa: E402

from odc_bench.data.chain import entropy_rate  # noqa: E402
from odc_bench.results.paper import RL_RANGE_TEXT  # noqa: E402
from paper_figures import convergence, fig8_throughput, fig9_rl, fig10_acceleration  # noqa: E402
from paper_figures.inputs import Skip, load  # noqa: E402
from tests.helpers.curves import (  # noqa: E402
    LOSS_SERIES,
    MODEL_SPEED,
    PRECISIONS,
    RL_MINIBATCHES,
    STEP_S,
    STEPS,
    base_loss,
    offset,
    rl_samples_per_s,
    write_loss_runs,
    write_rl_runs,
)

RL_LABELS = ["Collective + LB-Micro", "Collective + verl", "ODC + LB-Micro", "ODC + LB-Mini"]
RL_KEYS = {"Collective + LB-Micro": ("collective", "lb_micro"), "Collective + verl": ("collective", "verl"),
           "ODC + LB-Micro": ("odc", "lb_micro"), "ODC + LB-Mini": ("odc", "lb_mini")}


@pytest.fixture(scope="module")
def rl_inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    write_rl_runs(root / "sim_paper")
    return load(root)


@pytest.fixture(scope="module")
def loss_inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    write_loss_runs(root / "cpu_convergence")
    return load(root)


def test_fig9_bars_are_each_rl_series_samples_per_s(rl_inputs):
    out = fig9_rl.render(rl_inputs)
    fig = out["fig9_rl-sim_paper"]
    assert [t.get_text() for t in fig.legends[0].texts] == RL_LABELS
    assert len(fig.axes) == len(MODEL_SPEED)
    for ax in fig.axes:
        model = ax.get_title().split("\n")[0]
        bars = [c for c in ax.containers if isinstance(c, BarContainer)]
        assert len(bars) == len(RL_LABELS)
        for label, container in zip(RL_LABELS, bars, strict=True):
            expected = [rl_samples_per_s(*RL_KEYS[label], model, mb) for mb in RL_MINIBATCHES]
            assert [b.get_height() for b in container] == pytest.approx(expected)
        assert [t.get_text() for t in ax.get_xticklabels()] == [str(m) for m in RL_MINIBATCHES]
    assert fig.axes[0].get_ylabel() == fig9_rl.Y_LABEL
    assert [ax.get_title().split("\n")[0] for ax in fig.axes] == ["qwen2_1p5b", "qwen2_14b"], "fewer devices first"
    assert fig._suptitle.get_text().endswith("(measured)")


def test_fig9_table_has_every_speedup_and_the_papers_range(rl_inputs):
    text = fig9_rl.render(rl_inputs)["fig9_rl_table-sim_paper"]
    table = fig9_rl.speedups(fig9_rl.rl_runs(rl_inputs.runs))
    assert len(table) == len(MODEL_SPEED) * len(RL_MINIBATCHES)
    mini_over_verl = table["ODC + LB-Mini over Collective + verl (%)"]
    assert list(mini_over_verl) == pytest.approx([100 * (1.1 / 1.0 - 1)] * len(table))
    best = table["best ODC over best collective (%)"]
    assert list(best) == pytest.approx([100 * (1.1 / 1.05 - 1)] * len(table))
    assert RL_RANGE_TEXT in text and f"{best.min():+.1f}% to {best.max():+.1f}%" in text


def test_sft_figures_leave_rl_rows_out_and_fig9_leaves_sft_rows_out(rl_inputs):
    fig8 = fig8_throughput.render(rl_inputs)["fig8_throughput-sim_paper"]
    assert all("grpo" not in ax.get_title() for ax in fig8.axes)
    assert "Collective + verl" not in [t.get_text() for t in fig8.legends[0].texts]
    fig10 = fig10_acceleration.render(rl_inputs)["fig10_acceleration-sim_paper"]
    legends = [ax.get_legend() for ax in fig10.axes if ax.get_legend()] + list(fig10.legends)
    texts = [t.get_text() for legend in legends for t in legend.texts]
    assert texts and not any("grpo" in t or "verl" in t for t in texts)
    assert set(fig9_rl.rl_runs(rl_inputs.runs)["dataset"]) == {"grpo"}


def test_fig9_skips_a_root_without_rl_runs(loss_inputs):
    with pytest.raises(Skip, match="no RL runs"):
        fig9_rl.render(loss_inputs)


def _lines(ax) -> dict[str, object]:
    return {line.get_label(): line for line in ax.lines if line.get_gid() != "floor"}


def _label(engine: str, balancer: str, options: dict) -> str:
    names = {"collective": "Collective", "odc": "ODC", "lb_micro": "LB-Micro", "lb_mini": "LB-Mini"}
    engine_name = names[engine] if engine == "collective" else f"{names[engine]} [s={options['staleness']}]"
    return f"{engine_name} + {names[balancer]}"


def test_convergence_plots_every_series_loss_against_step_and_time(loss_inputs):
    out = convergence.render(loss_inputs)
    fig = out["convergence-cpu_convergence"]
    rows = [fig.axes[i:i + 2] for i in range(0, len(fig.axes), 2)]
    assert len(rows) == len(PRECISIONS), "one row of panels per setting; the synthetic-token run is left out"
    for ax_step, ax_time in rows:
        precision = "bf16" if "bf16" in ax_step.get_title() else "fp32"
        assert ax_step.get_xlabel() == convergence.STEP_LABEL and ax_time.get_xlabel() == convergence.TIME_LABEL
        steps, times = _lines(ax_step), _lines(ax_time)
        assert set(steps) == {_label(*s) for s in LOSS_SERIES}
        for engine, balancer, options in LOSS_SERIES:
            stale = options.get("staleness", 0)
            line = steps[_label(engine, balancer, options)]
            expected = [base_loss(k) + offset(engine, balancer, stale, precision, k) for k in range(STEPS)]
            assert list(line.get_xdata()) == list(range(STEPS))
            assert list(line.get_ydata()) == pytest.approx(expected, rel=1e-12)
            timed = times[_label(engine, balancer, options)]
            assert list(timed.get_xdata()) == pytest.approx([(k + 1) * STEP_S[(engine, balancer, stale)]
                                                             for k in range(STEPS)])
        floors = [line for line in ax_step.lines if line.get_gid() == "floor"]
        assert floors and floors[0].get_ydata()[0] == pytest.approx(entropy_rate())


def test_convergence_gap_table_is_the_largest_per_step_difference(loss_inputs):
    runs = convergence.loss_runs(loss_inputs.runs)
    table = convergence.gaps(convergence.curves(runs))
    assert len(table) == len(PRECISIONS) * (len(LOSS_SERIES) - 1)
    assert set(table["baseline"]) == {"Collective + LB-Micro"}
    for _, row in table.iterrows():
        precision = "bf16" if "bf16" in row["setting"] else "fp32"
        engine, balancer, options = next(s for s in LOSS_SERIES if _label(*s) == row["series"])
        stale = options["staleness"]
        diffs = [abs(offset(engine, balancer, stale, precision, k)) for k in range(STEPS)]
        assert row["max |gap|"] == pytest.approx(max(diffs), rel=1e-6, abs=1e-12)
        assert row["at step"] == diffs.index(max(diffs))
        assert row["final loss"] == pytest.approx(base_loss(STEPS - 1) + offset(engine, balancer, stale, precision,
                                                                                STEPS - 1))
    text = convergence.render(loss_inputs)["convergence_gap-cpu_convergence"]
    assert "largest per-step loss gap" in text and f"floor {entropy_rate():.3f}" in text


def test_loss_curve_divides_the_ranks_loss_sums_by_the_labelled_tokens():
    trace = pd.DataFrame([
        dict(rank=0, minibatch=0, kind="microbatch", tokens=10, samples=2, t0=0.0, t1=1.0, loss_sum=None),
        dict(rank=1, minibatch=0, kind="microbatch", tokens=6, samples=1, t0=0.0, t1=1.5, loss_sum=None),
        dict(rank=0, minibatch=0, kind="minibatch", tokens=None, samples=None, t0=0.0, t1=1.0, loss_sum=16.0),
        dict(rank=1, minibatch=0, kind="minibatch", tokens=None, samples=None, t0=0.0, t1=1.5, loss_sum=10.0),
    ])
    curve = convergence.loss_curve(trace)
    assert list(curve["loss"]) == [pytest.approx(26.0 / 13)]
    assert list(curve["time"]) == [1.5]
    assert math.isclose(curve["step"].iloc[0], 0)


def test_convergence_draws_runs_on_real_token_ids_without_a_floor(tmp_path):
    folder = tmp_path / "results" / "cpu_convergence"
    write_loss_runs(folder)
    table = pd.read_csv(folder / "runs.csv")
    # the same runs, trained on a file's own ids instead (what a run on a JSONL file of ids records)
    on_data = table["config"].str.contains("tokens: learnable")
    table.loc[on_data, "config"] = table.loc[on_data, "config"].str.replace(
        "tokens: learnable", "path: /data/ids.jsonl\n  tokens: data", regex=False)
    table.to_csv(folder / "runs.csv", index=False)
    fig = convergence.render(load(tmp_path / "results"))["convergence-cpu_convergence"]
    assert len(fig.axes) == 2 * len(PRECISIONS), "every real-token setting drawn; the synthetic run left out"
    for ax in fig.axes:
        assert ax.get_title().endswith("\ntoken ids of ids.jsonl")
        assert not [line for line in ax.lines if line.get_gid() == "floor"], "real data has no known floor"
        assert {line.get_label() for line in ax.lines} == {_label(*s) for s in LOSS_SERIES}
