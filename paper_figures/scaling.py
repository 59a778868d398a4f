"""Scaling: the acceleration of ODC + LB-Mini over Collective + LB-Micro against the device count,
for full sharding, hybrid sharding and topology-aware fetch (the sim_scaling sweep; the numbers
and each layout's baseline: odc_bench/results/scaling.py).

One panel per model and dataset, one line per layout; a hollow marker is a setting whose memory
estimate (mem_estimate_mb) is over the device's (mem_limit_mb): simulated anyway, it would not fit.
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, NullLocator

from odc_bench.results.scaling import acceleration
from odc_bench.results.series import LAYOUTS, layouts
from paper_figures.inputs import Inputs, Skip

NAME = "scaling"
COLORS = {"": "#a50f15", "hybrid": "#2171b5", "nearest": "#31a354"}
MARKERS = {"": "o", "hybrid": "s", "nearest": "^"}
X_LABEL, Y_LABEL = "devices", "acceleration (%)"


def plot(table: pd.DataFrame) -> Figure:
    panels = list(table.groupby(["model", "dataset"], sort=True))
    cols = min(2, len(panels))
    rows = -(-len(panels) // cols)
    fig = Figure(figsize=(5 * cols, 3.8 * rows))
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    for ax, ((model, dataset), part) in zip(axes, panels, strict=False):
        for layout in [k for k in LAYOUTS if k in set(part["layout"])]:
            line = part[part["layout"] == layout]
            color, marker = COLORS[layout], MARKERS[layout]
            ax.plot(line["world_size"], line["acceleration"], color=color, label=LAYOUTS[layout], gid=layout)
            for fit, face in ((True, color), (False, "none")):
                pts = line[line["fits"] == fit]
                ax.plot(pts["world_size"], pts["acceleration"], linestyle="none", marker=marker, color=color,
                        markerfacecolor=face, gid=f"{layout}-{'fits' if fit else 'over'}")
        ax.axhline(0, color="black", lw=0.8, gid="zero")
        values = np.sort(part["world_size"].unique())
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(values))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([f"{v:g}" for v in values])
        ax.set_title(f"{model}, {dataset}")
        ax.set_xlabel(X_LABEL)
        ax.set_ylabel(Y_LABEL)
        handles = [Line2D([], [], color=COLORS[k], marker=MARKERS[k], label=LAYOUTS[k])
                   for k in LAYOUTS if k in set(part["layout"])]
        if not part["fits"].all():
            handles.append(Line2D([], [], color="grey", marker="o", markerfacecolor="none", linestyle="none",
                                  label="does not fit in memory"))
        ax.legend(handles=handles, fontsize=7)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    fig.suptitle("Acceleration of ODC + LB-Mini over Collective + LB-Micro by device count")
    fig.tight_layout()
    return fig


def draw(runs: pd.DataFrame) -> Figure:
    table = acceleration(runs)
    if table.empty:
        raise Skip("no odc + lb_mini run shares a setting (and seed) with a collective + lb_micro run of its layout")
    if table.groupby(["model", "dataset", "layout"])["world_size"].nunique().max() < 2:
        raise Skip("no layout has runs at two or more device counts")
    return plot(table)


def render(inputs: Inputs) -> dict[str, object]:
    """One figure per source holding a scaling study (runs of hybrid sharding or topology-aware fetch)."""
    runs = inputs.runs
    studies = {} if runs.empty else {source: part for source, part in runs.groupby("source", sort=True)
                                     if layouts(part).isin(["hybrid", "nearest"]).any()}
    if not studies:
        raise Skip("no hybrid-sharding or topology-aware-fetch runs below the results root "
                   "(python -m odc_bench sweep=sim_scaling)")
    out: dict[str, object] = {}
    for source, part in studies.items():
        try:
            out[f"{NAME}-{source}"] = draw(part)
        except Skip as skip:
            out[f"{NAME}-{source}"] = skip
    return out


if __name__ == "__main__":
    from paper_figures.cli import main

    sys.exit(main(only=NAME))
