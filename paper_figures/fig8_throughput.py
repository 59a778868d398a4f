"""Fig. 8 analog: training throughput (samples/s) by model and minibatch size, one bar per series.

SFT runs only (RL runs are Fig. 9's). Panels: one row per dataset, one column per model; bars:
engine x balancer. Within a dataset x model panel only the most common world size, packing ratio and length scale are
drawn (the Fig. 10 sweeps vary those and would otherwise be averaged into the bars); the
panel title says which. Repeated seeds are averaged, with their standard deviation as error bars.
"""

from __future__ import annotations

import sys

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from odc_bench.results.series import is_rl
from paper_figures.inputs import NO_RUNS, Inputs, Skip, per_source
from paper_figures.series import measured_or_simulated, ordered, palette, with_series

NAME = "fig8_throughput"
X_LABEL = "minibatch size (samples per rank)"
Y_LABEL = "samples/s"
FIXED = ["world_size", "packing_ratio", "length_scale"]


def main_setting(runs: pd.DataFrame) -> pd.DataFrame:
    """Per dataset x model, the rows at the most common world size, packing ratio and length scale."""
    keep = []
    for _, part in runs.groupby(["dataset", "model"], sort=True):
        group = part.groupby(FIXED, dropna=False, sort=True).ngroup()
        keep.append(part[group == group.value_counts(sort=False).idxmax()])
    return pd.concat(keep)


def plot(runs: pd.DataFrame) -> Figure:
    """Bars of samples/s; `runs` is one source's successful run rows."""
    data = with_series(main_setting(runs))
    hue_order = ordered(data)
    repeats = data.groupby(["dataset", "model", "minibatch_size", "series"]).size().max() > 1
    grid = sns.catplot(data=data, kind="bar", x="minibatch_size", y="samples_per_s", hue="series",
                       hue_order=hue_order, palette=palette(data), row="dataset", col="model",
                       row_order=sorted(data["dataset"].unique()), col_order=sorted(data["model"].unique()),
                       errorbar="sd" if repeats else None, sharey=False, height=3.2, aspect=1.3,
                       legend_out=True)
    grid.set_axis_labels(X_LABEL, Y_LABEL)
    for (dataset, model), ax in grid.axes_dict.items():
        part = data[(data["dataset"] == dataset) & (data["model"] == model)]
        if part.empty:
            ax.set_title(f"{dataset} · {model}: no runs")
            continue
        first = part.iloc[0]
        ax.set_title(f"{dataset} · {model}\n{int(first['world_size'])} ranks, packing {first['packing_ratio']:g}")
    grid.legend.set_title("engine + balancer")
    grid.figure.suptitle(f"Throughput by model and minibatch size ({measured_or_simulated(runs)})")
    grid.tight_layout()
    return grid.figure


def render(inputs: Inputs) -> dict[str, object]:
    def draw(runs: pd.DataFrame) -> Figure:
        runs = runs[~is_rl(runs)]
        if runs.empty:
            raise Skip("only RL runs here (Fig. 9 draws them)")
        if runs["samples_per_s"].dropna().empty:
            raise Skip("no run has a samples_per_s value")
        return plot(runs[runs["samples_per_s"].notna()])

    return per_source(inputs.runs, NAME, draw, NO_RUNS)


if __name__ == "__main__":
    from paper_figures.cli import main

    sys.exit(main(only=NAME))
