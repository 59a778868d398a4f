"""Fig. 9 analog: RL (GRPO) training throughput by model and PPO minibatch size, one bar per series.

Rows are those of an RL workload (dataset=grpo, odc_bench.results.series.is_rl); the SFT figures
leave them out. One panel per model (its device count in the title), bars: engine x balancer,
samples/s over training time only, as the paper measures it. Repeated seeds are averaged, with
their standard deviation as error bars. Beside it, a table: every series' samples/s, each ODC
series' speedup over each collective one, and the range of the best ODC series over the best
collective series across settings, next to the paper's range.
"""

from __future__ import annotations

import sys

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from odc_bench.results.paper import RL_RANGE_TEXT
from odc_bench.results.series import is_rl
from paper_figures.inputs import NO_RUNS, Inputs, Skip, by_source
from paper_figures.series import measured_or_simulated, ordered, palette, with_series

NAME = "fig9_rl"
X_LABEL = "PPO minibatch size (samples per device)"
Y_LABEL = "samples/s"
SETTING = ["model", "world_size", "minibatch_size"]


def rl_runs(runs: pd.DataFrame) -> pd.DataFrame:
    rl = runs[is_rl(runs)] if not runs.empty else runs
    if rl.empty:
        raise Skip("no RL runs (dataset=grpo) below the results root: run sweep=fig9_rl or fig9_rl_cpu")
    return with_series(rl)


def plot(runs: pd.DataFrame) -> Figure:
    """Bars of samples/s; `runs` is one source's RL rows with their series."""
    hue_order = ordered(runs)
    # Smallest model first: the panels read as the paper's, 1.5B to 14B.
    models = sorted(runs["model"].unique(), key=lambda m: (runs.loc[runs["model"] == m, "world_size"].min(), m))
    repeats = runs.groupby([*SETTING, "series"]).size().max() > 1
    grid = sns.catplot(data=runs, kind="bar", x="minibatch_size", y="samples_per_s", hue="series",
                       hue_order=hue_order, palette=palette(runs), col="model", col_order=models,
                       errorbar="sd" if repeats else None, sharey=False, height=3.4, aspect=1.2, legend_out=True)
    grid.set_axis_labels(X_LABEL, Y_LABEL)
    for model, ax in grid.axes_dict.items():
        devices = sorted(runs.loc[runs["model"] == model, "world_size"].unique())
        ax.set_title(f"{model}\n{', '.join(str(d) for d in devices)} devices")
    grid.legend.set_title("engine + balancer")
    grid.figure.suptitle(f"RL (GRPO) throughput, training time only ({measured_or_simulated(runs)})")
    grid.tight_layout()
    return grid.figure


def speedups(runs: pd.DataFrame) -> pd.DataFrame:
    """Per setting: mean samples/s of every series, each ODC series over each collective one (%),
    and the best ODC series over the best collective series (%)."""
    means = runs.pivot_table(index=SETTING, columns="series", values="samples_per_s", aggfunc="mean")
    means = means[[s for s in ordered(runs) if s in means.columns]]
    odc = [s for s in means.columns if runs.loc[runs["series"] == s, "engine"].iloc[0] == "odc"]
    coll = [s for s in means.columns if s not in odc]
    table = means.copy()
    for o in odc:
        for c in coll:
            table[f"{o} over {c} (%)"] = 100 * (means[o] / means[c] - 1)
    if odc and coll:
        table["best ODC over best collective (%)"] = 100 * (means[odc].max(axis=1) / means[coll].max(axis=1) - 1)
    table.columns.name = None
    return table.reset_index()


def table_text(runs: pd.DataFrame) -> str:
    table = speedups(runs)
    lines = ["## Fig. 9 numbers: RL (GRPO) throughput", "",
             "Samples/s (mean over seeds) by model, devices and PPO minibatch size (samples per device), and "
             "each ODC series' speedup over each collective series.", ""]
    body = table.astype(object).where(table.notna(), None).to_markdown(index=False, floatfmt=".4g", missingval="-")
    lines.append(body)
    best = "best ODC over best collective (%)"
    if best in table:
        lo, hi = table[best].min(), table[best].max()
        lines += ["", f"Best ODC series over the best collective series across these settings: {lo:+.1f}% to "
                      f"{hi:+.1f}%; the paper: {RL_RANGE_TEXT}."]
    return "\n".join(lines) + "\n"


def render(inputs: Inputs) -> dict[str, object]:
    if inputs.runs.empty:
        raise Skip(f"no {NO_RUNS} found below the results root")
    out: dict[str, object] = {}
    for source, part in by_source(inputs.runs).items():
        try:
            runs = rl_runs(part)
        except Skip:
            continue
        out[f"{NAME}-{source}"] = plot(runs)
        out[f"{NAME}_table-{source}"] = table_text(runs)
    if not out:
        raise Skip("no RL runs (dataset=grpo) below the results root: run sweep=fig9_rl or fig9_rl_cpu")
    return out


if __name__ == "__main__":
    from paper_figures.cli import main

    sys.exit(main(only=NAME))
