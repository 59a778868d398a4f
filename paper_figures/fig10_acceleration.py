"""Fig. 10 analog: acceleration of ODC over Collective + LB-Micro as one factor varies (SFT runs;
RL runs are Fig. 9's).

Acceleration at a setting = ODC samples/s / (Collective + LB-Micro) samples/s - 1, for every
ODC balancer present (one line each), comparing runs of the same setting and seed. One panel
per factor that some runs vary with everything else fixed: minibatch size, max length (the
longest sample allowed, max_tokens / packing ratio, which the length scale sets), packing
ratio, device count; a footnote names the factors nothing varies. Like the paper's figure, a
panel draws the sweep through the golden setting (paper_figures.series.golden) when there is
one, else every sweep of its factor (each in its own line style). A line needs two points:
a series at one point of a sweep is left out rather than drawn as a lone marker that stretches
the axis. One legend, outside the panels, names the series drawn.
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, NullLocator

from odc_bench.results.series import is_rl
from paper_figures.inputs import NO_RUNS, Inputs, Skip, per_source
from paper_figures.series import (
    BALANCER_NAMES,
    BASELINE,
    ENGINE_NAMES,
    SETTING,
    golden,
    measured_or_simulated,
    ordered,
    palette,
    with_series,
)

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
    odc = runs[runs["engine"] == "odc"].groupby(keys + ["series", "root"], dropna=False)["samples_per_s"].mean()
    table = odc.reset_index().merge(base.reset_index(), on=keys, how="inner")
    table["acceleration"] = 100 * (table["samples_per_s"] / table["baseline_samples_per_s"] - 1)
    table["max_length"] = table["max_tokens"] / table["packing_ratio"]
    return table


def _value(v: object) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def sweeps(table: pd.DataFrame, factor: str, through: dict | None = None) -> pd.DataFrame:
    """The rows of `table` in sweeps of `factor`, labelled by what tells the sweeps apart; with
    `through` (a setting's values), only the sweep through that setting when there is one."""
    others = [k for k in SWEEP_KEYS if k in table and k != factor and not (factor == "max_length" and
                                                                           k == "length_scale")]
    found = []
    for key, part in table.groupby(others, dropna=False, sort=True):
        if part[factor].nunique() >= 2:
            found.append((dict(zip(others, key, strict=True)), part))
    if through is not None:
        hub = [(fixed, part) for fixed, part in found
               if all(str(fixed[k]) == str(through.get(k)) for k in others if k in through)]
        found = hub or found
    if not found:
        return pd.DataFrame()
    differ = [k for k in others if len({str(fixed[k]) for fixed, _ in found}) > 1]
    parts = [part.assign(sweep=", ".join(f"{k}={_value(fixed[k])}" for k in differ) or "all")
             for fixed, part in found]
    return pd.concat(parts, ignore_index=True)


STYLES = [("-", "o"), ("--", "X"), (":", "s"), ("-.", "^"), ((0, (3, 1, 1, 1)), "D"), ((0, (5, 2)), "v")]


def plot(table: pd.DataFrame, through: dict | None = None, word: str = "measured") -> Figure:
    """The panels from an acceleration table (see `acceleration`); `through`: the golden setting."""
    panels = [(f, label, sweeps(table, f, through)) for f, label in FACTORS.items()]
    missing = [label.split(" (")[0] for _, label, data in panels if data.empty]
    panels = [p for p in panels if not p[2].empty]
    cols = min(len(panels), 2)
    rows = -(-len(panels) // cols)
    fig = Figure(figsize=(5 * cols, 3.6 * rows + 1.2))
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    colors = palette(table)
    drawn: set[str] = set()
    styles: dict[str, tuple] = {}
    for ax, (factor, label, data) in zip(axes, panels, strict=False):
        several = data["sweep"].nunique() > 1  # line styles tell a panel's sweeps apart
        for (sweep, series), part in data.groupby(["sweep", "series"], sort=True):
            points = part.groupby(factor)["acceleration"].agg(["mean", "std", "size"]).sort_index()
            if len(points) < 2:
                continue
            line, marker = (styles.setdefault(str(sweep), STYLES[1 + len(styles) % (len(STYLES) - 1)]) if several
                            else STYLES[0])
            yerr = points["std"].fillna(0) if (points["size"] > 1).any() else None
            ax.errorbar(points.index, points["mean"], yerr=yerr, color=colors[series], linestyle=line,
                        marker=marker, markersize=5, capsize=2 if yerr is not None else 0, label=series)
            drawn.add(series)
        ax.axhline(0, color="black", lw=0.8, gid="zero")
        values = np.sort(data[factor].unique())
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(values))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([f"{v:g}" for v in values])
        ax.set_xlabel(label)
        ax.set_ylabel(Y_LABEL)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    labels = [s for s in ordered(table) if s in drawn]
    handles: list[object] = [Line2D([], [], color=colors[s], marker="o", markersize=5) for s in labels]
    if styles:  # the sweeps' line styles, in black
        handles.append(Line2D([], [], color="black", linestyle=STYLES[0][0], marker=STYLES[0][1], markersize=5))
        labels.append("one sweep in its panel")
        for sweep, (line, marker) in styles.items():
            handles.append(Line2D([], [], color="black", linestyle=line, marker=marker, markersize=5))
            labels.append(sweep)
    fig.legend(handles, labels, loc="lower center", ncol=min(3, len(labels)), frameon=False, fontsize=8)
    note = f"; not varied with everything else fixed: {', '.join(missing)}" if missing else ""
    fig.suptitle(f"Acceleration of ODC over {BASELINE_LABEL} ({word}){note}")
    fig.tight_layout(rect=(0, 0.04 + 0.03 * -(-len(labels) // 3), 1, 1))
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
    hub = golden(runs).iloc[0]
    through = {**hub.to_dict(), "max_length": hub["max_tokens"] / hub["packing_ratio"]}
    return plot(table, through, measured_or_simulated(runs))


def render(inputs: Inputs) -> dict[str, object]:
    return per_source(inputs.runs, NAME, draw, NO_RUNS)


if __name__ == "__main__":
    from paper_figures.cli import main

    sys.exit(main(only=NAME))
