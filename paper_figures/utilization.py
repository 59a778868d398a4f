"""Utilization: how much of each rank's time goes to compute, and the bubble rate, predicted vs measured.

Left: per-rank busy fraction (unit compute plus optimizer steps over the measured window,
the definitions of odc_bench.record.metrics) for every series at the golden setting, from the
traces (left out when no run kept one, as paper-scale simulations do not).
Middle: at the same setting, the bubble rate each series measured beside the one its balancer
predicted from its cost model (absent when the run logged no prediction). Right: predicted
against measured bubble rate over every run of the source; points on the diagonal mean the
cost model saw the imbalance the run met. Simulated runs' bubbles are labelled simulated, not
measured; legends stand outside the data.
"""

from __future__ import annotations

import sys

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from odc_bench.record.metrics import BUSY_KINDS
from paper_figures.inputs import NO_RUNS, Inputs, Skip, per_source, read_trace, with_traces
from paper_figures.series import describe_setting, golden, measured_or_simulated, ordered, palette, with_series

NAME = "utilization"
BUSY_LABEL = "busy fraction"
RANK_LABEL = "rank"
BUBBLE_LABEL = "bubble rate"


def busy_fractions(trace: pd.DataFrame, warmup: int) -> pd.DataFrame:
    """Per rank: busy time over the measured window (the same window for every rank)."""
    measured = trace[trace["minibatch"] >= warmup]
    spans = measured[measured["kind"] == "minibatch"]
    window = float(spans["t1"].max() - spans["t0"].min())
    busy = measured[measured["kind"].isin(BUSY_KINDS)]
    per_rank = (busy["t1"] - busy["t0"]).groupby(busy["rank"]).sum()
    ranks = sorted(measured["rank"].unique())
    return pd.DataFrame({"rank": ranks, "busy_fraction": [float(per_rank.get(r, 0.0)) / window for r in ranks]})


def bubbles(runs: pd.DataFrame) -> pd.DataFrame:
    """Long table: series, which (measured or predicted), bubble rate."""
    runs = with_series(runs)
    cols = {"bubble_rate": "measured", "predicted_bubble_rate": "predicted"}
    long = runs.melt(id_vars=["series", "root"], value_vars=[c for c in cols if c in runs], var_name="which",
                     value_name="rate")
    return long.assign(which=long["which"].map(cols)).dropna(subset=["rate"])


def plot(busy: pd.DataFrame, rates: pd.DataFrame, all_runs: pd.DataFrame, setting: str = "",
         word: str = "measured") -> Figure:
    """`busy`: series, rank, busy_fraction and `rates`: series, which, rate at one setting;
    `all_runs`: series, bubble_rate, predicted_bubble_rate of every run. Without traces there is
    no busy panel; `word` says whether the bubbles were measured or simulated."""
    every = pd.concat([busy[["series", "root"]], rates[["series", "root"]], all_runs[["series", "root"]]])
    order = ordered(every)
    colors = palette(every)
    fig = Figure(figsize=(15 if not busy.empty else 10.5, 5.4))
    axes = list(fig.subplots(1, 3 if not busy.empty else 2, width_ratios=[1.3, 1, 1] if not busy.empty else [1, 1]))
    if not busy.empty:
        left = axes.pop(0)
        sns.barplot(data=busy, x="rank", y="busy_fraction", hue="series", hue_order=[s for s in order
                                                                                    if s in set(busy["series"])],
                    palette=colors, ax=left)
        left.set_ylim(0, 1)
        left.legend(fontsize=7, title=None, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
        left.set_xlabel(RANK_LABEL)
        left.set_ylabel(BUSY_LABEL)
        left.set_title("Per-rank busy fraction", loc="left")
    right, scatter = axes
    present = [s for s in order if s in set(rates["series"])]
    sns.barplot(data=rates, x="series", y="rate", hue="which", hue_order=["measured", "predicted"],
                order=present, palette={"measured": "#4c72b0", "predicted": "#bbbbbb"}, errorbar=None, ax=right)
    right.set_ylim(0, 1)
    right.set_xlabel("")
    right.set_ylabel(BUBBLE_LABEL)
    right.tick_params(axis="x", labelrotation=35, labelsize=7)
    for label in right.get_xticklabels():  # long series names: anchor each at its bar
        label.set_horizontalalignment("right")
        label.set_rotation_mode("anchor")
    note = "" if (rates["which"] == "predicted").any() else " (none predicted)"
    right.set_title(f"Bubble rate at this setting{note}", loc="left")
    handles, _ = right.get_legend_handles_labels()
    right.legend(handles, [word, "predicted by the cost model"][:len(handles)], fontsize=7, title=None,
                 loc="lower left", bbox_to_anchor=(0, 1.08), ncol=2, frameon=False)
    predicted = all_runs.dropna(subset=["bubble_rate", "predicted_bubble_rate"])
    scatter.plot([0, 1], [0, 1], color="grey", ls="--", lw=1, gid="diagonal")
    if predicted.empty:
        scatter.text(0.5, 0.5, "no run logged a predicted bubble rate", transform=scatter.transAxes,
                     ha="center", color="grey")
    else:
        sns.scatterplot(data=predicted, x="predicted_bubble_rate", y="bubble_rate", hue="series",
                        hue_order=[s for s in order if s in set(predicted["series"])], palette=colors, ax=scatter)
        scatter.legend(fontsize=7, title=None, loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False)
    scatter.set_xlim(0, 1)
    scatter.set_ylim(0, 1)
    scatter.set_xlabel(f"predicted {BUBBLE_LABEL}")
    scatter.set_ylabel(f"{word} {BUBBLE_LABEL}")
    scatter.set_title("Every run", loc="left")
    fig.suptitle(f"Utilization ({word}){': ' + setting if setting else ''}")
    fig.tight_layout()
    return fig


def draw(runs: pd.DataFrame) -> Figure:
    if runs["bubble_rate"].dropna().empty:
        raise Skip("no run has a bubble_rate value")
    rows = golden(runs)  # labelled among all the source's runs, as the scatter's points are
    parts = []
    for _, row in with_traces(rows).iterrows():
        fractions = busy_fractions(read_trace(row), int(row.get("warmup_minibatches", 0) or 0))
        parts.append(fractions.assign(series=row["series"], root=row["root"], run_id=row["run_id"]))
    busy = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["series", "root", "rank",
                                                                                   "busy_fraction"])
    every = with_series(runs)
    if "predicted_bubble_rate" not in every:
        every = every.assign(predicted_bubble_rate=float("nan"))
    return plot(busy, bubbles(rows), every[["series", "root", "bubble_rate", "predicted_bubble_rate"]],
                describe_setting(rows.iloc[0]), measured_or_simulated(runs))


def render(inputs: Inputs) -> dict[str, object]:
    return per_source(inputs.runs, NAME, draw, NO_RUNS)


if __name__ == "__main__":
    from paper_figures.cli import main

    sys.exit(main(only=NAME))
