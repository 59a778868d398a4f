"""Fig. 10 analog: acceleration of ODC over Collective + LB-Micro as one factor varies (SFT runs;
RL runs are Fig. 9's).

Acceleration at a setting = ODC samples/s / (Collective + LB-Micro) samples/s - 1, for every
ODC balancer present (one line each), comparing runs of the same setting and seed. Four
panels: minibatch size, max length (the longest sample allowed, max_tokens / packing ratio,
which the length scale sets), packing ratio and device count. A panel draws the runs that vary
its factor with everything else fixed; when several such sweeps exist (say two models), each
gets its own line style. A panel with no such sweep says so.
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullLocator

from odc_bench.results.series import is_rl
from paper_figures.inputs import Inputs, Skip, per_source
from paper_figures.series import BALANCER_NAMES, BASELINE, ENGINE_NAMES, SETTING, ordered, palette, with_series

NAME = "fig10_acceleration"
FACTORS = {"minibatch_size": "minibatch size (samples per rank)", "max_length": "max length (tokens)",
           "packing_ratio": "packing ratio", "world_size": "devices"}
BASELINE_LABEL = f"{ENGINE_NAMES[BASELINE[0]]} + {BALANCER_NAMES[BASELINE[1]]}"
Y_LABEL = "acceleration (%)"
# What stays fixed along one sweep: the setting without the seed (repeats are averaged) and with
# max_tokens expressed as max_length x packing_ratio.
SWEEP_KEYS = ["backend", "model", "dataset", "world_size", "minibatch_size", "max_length", "packing_ratio",
              "length_scale", "precision", "num_minibatches", "warmup_minibatches"]


def acceleration(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per ODC series and setting (seed included) that has a baseline run: its acceleration in %."""
    runs = with_series(runs)
    keys = [c for c in SETTING if c in runs]
    engine, balancer = BASELINE
    base = (runs[(runs["engine"] == engine) & (runs["balancer"] == balancer)]
            .groupby(keys, dropna=False)["samples_per_s"].mean().rename("baseline_samples_per_s"))
    odc = runs[runs["engine"] == "odc"].groupby(keys + ["series"], dropna=False)["samples_per_s"].mean()
    table = odc.reset_index().merge(base.reset_index(), on=keys, how="inner")
    table["acceleration"] = 100 * (table["samples_per_s"] / table["baseline_samples_per_s"] - 1)
    table["max_length"] = table["max_tokens"] / table["packing_ratio"]
    return table


def _value(v: object) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def sweeps(table: pd.DataFrame, factor: str) -> pd.DataFrame:
    """The rows of `table` in sweeps of `factor`, labelled by what tells the sweeps apart."""
    others = [k for k in SWEEP_KEYS if k in table and k != factor and not (factor == "max_length" and
                                                                           k == "length_scale")]
    found = []
    for key, part in table.groupby(others, dropna=False, sort=True):
        if part[factor].nunique() >= 2:
            found.append((dict(zip(others, key, strict=True)), part))
    if not found:
        return pd.DataFrame()
    differ = [k for k in others if len({str(fixed[k]) for fixed, _ in found}) > 1]
    parts = [part.assign(sweep=", ".join(f"{k}={_value(fixed[k])}" for k in differ) or "all")
             for fixed, part in found]
    return pd.concat(parts, ignore_index=True)


def plot(table: pd.DataFrame) -> Figure:
    """The four panels from an acceleration table (see `acceleration`)."""
    fig = Figure(figsize=(10, 7.5))
    axes = fig.subplots(2, 2).ravel()
    hue_order = ordered(table["series"])
    colors = palette(hue_order)
    for ax, (factor, label) in zip(axes, FACTORS.items(), strict=True):
        data = sweeps(table, factor)
        ax.set_xlabel(label)
        ax.set_ylabel(Y_LABEL)
        if data.empty:
            ax.text(0.5, 0.5, f"no runs vary the {label.split(' (')[0]}\nwith everything else fixed",
                    transform=ax.transAxes, ha="center", va="center", color="grey")
            ax.set_xticks([])
            continue
        several = data["sweep"].nunique() > 1
        repeats = data.groupby(["sweep", "series", factor]).size().max() > 1
        sns.lineplot(data=data, x=factor, y="acceleration", hue="series", hue_order=hue_order, palette=colors,
                     style="sweep" if several else None, markers=several, dashes=several,
                     marker=None if several else "o", errorbar="sd" if repeats else None, ax=ax)
        ax.axhline(0, color="black", lw=0.8, gid="zero")
        values = np.sort(data[factor].unique())
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(values))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([f"{v:g}" for v in values])
        ax.set_xlabel(label)
        ax.set_ylabel(Y_LABEL)
        ax.legend(fontsize=7, title=None)
    fig.suptitle(f"Acceleration of ODC over {BASELINE_LABEL}")
    fig.tight_layout()
    return fig


def draw(runs: pd.DataFrame) -> Figure:
    runs = runs[~is_rl(runs)]
    if runs.empty:
        raise Skip("only RL runs here (Fig. 9 draws them)")
    engines = sorted(runs["engine"].dropna().unique())
    if "odc" not in engines:
        raise Skip(f"no odc runs (engines found: {', '.join(engines)})")
    engine, balancer = BASELINE
    if runs[(runs["engine"] == engine) & (runs["balancer"] == balancer)].empty:
        raise Skip(f"no {engine} + {balancer} runs to compare against")
    table = acceleration(runs)
    if table.empty:
        raise Skip(f"no odc run shares a setting (and seed) with a {engine} + {balancer} run")
    if all(sweeps(table, f).empty for f in FACTORS):
        raise Skip(f"odc and {engine} + {balancer} runs match, but none vary {', '.join(FACTORS)} "
                   "with everything else fixed (see the tables for the single-setting numbers)")
    return plot(table)


def render(inputs: Inputs) -> dict[str, object]:
    return per_source(inputs.runs, NAME, draw, "runs.csv tables")


if __name__ == "__main__":
    from paper_figures.cli import main

    sys.exit(main(only=NAME))
