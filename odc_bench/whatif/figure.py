"""The verdict as one figure: samples/s and speedup by minibatch size, per series.

Its own module because matplotlib takes a good part of the what-if's start-up: the command
imports it while the runs are being simulated (whatif/answer.py: verdict's `meanwhile`)."""

from __future__ import annotations

from itertools import cycle
from pathlib import Path

import pandas as pd
from matplotlib import style
from matplotlib.figure import Figure

from odc_bench.config.engine import ENGINES
from odc_bench.files import atomic_path
from odc_bench.whatif.accuracy import Accuracy
from odc_bench.whatif.question import Question, Series
from odc_bench.whatif.report import title, validated_row

# Baseline engine's series in blues, the others' in oranges to reds (the paper figures' scheme).
BLUES = ["#9ecae1", "#2171b5", "#08306b", "#6baed6"]
REDS = ["#fdae6b", "#e6550d", "#a50f15", "#756bb1", "#fd8d3c", "#67000d"]
# Stale-synchronous series (beyond the paper): greens, dashed.
GREENS = ["#74c476", "#31a354", "#006d2c"]
LEGEND_COLUMNS = 4


def draw(table: pd.DataFrame, question: Question, accuracy: Accuracy, path: Path) -> None:
    """Samples/s by minibatch size per series, and each series' speedup over the baseline with the
    range the validated error allows; every number simulated. Drawn in matplotlib's own style,
    whatever style the process has set (a library caller's, seaborn's theme), so the same verdict
    gives the same file wherever it is drawn."""
    with style.context("default"):
        _draw(table, question, accuracy, path)


def _draw(table: pd.DataFrame, question: Question, accuracy: Accuracy, path: Path) -> None:
    every = list(dict.fromkeys(map(Series, table.engine, table.balancer, table.staleness)))
    legend_rows = -(-len(every) // LEGEND_COLUMNS)
    fig = Figure(figsize=(11, 3.8 + 0.3 * legend_rows))
    left, right = fig.subplots(1, 2)
    # Cycled: a registry that grows past a palette repeats a colour rather than failing to draw.
    blues, reds, greens = cycle(BLUES), cycle(REDS), cycle(GREENS)
    colors = {s.label: next(greens if s.staleness else blues if ENGINES[s.engine].baseline else reds) for s in every}
    sizes = sorted(table.minibatch_size.unique())
    for label, rows in table[table.samples_per_s.notna()].groupby("series", sort=False):
        rows = rows.sort_values("minibatch_size")
        style = dict(marker="o", color=colors[label], linestyle="--" if rows.staleness.iloc[0] else "-")
        left.plot(rows.minibatch_size, rows.samples_per_s, label=label, **style)
        right.plot(rows.minibatch_size, rows.speedup, **style)
        spans = [accuracy.measured_range(v) for v in rows.speedup]
        if validated_row(rows.iloc[0]) and all(s is not None for s in spans):
            right.fill_between(rows.minibatch_size, [s[0] for s in spans if s], [s[1] for s in spans if s],
                               color=colors[label], alpha=0.15, linewidth=0)
    right.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.set_xlabel("minibatch size (samples per device)")
        ax.grid(alpha=0.3)
    left.set_ylabel("samples/s (simulated)")
    right.set_ylabel("speedup over the baseline (simulated)")
    left.set_title("throughput", fontsize=10)
    right.set_title(f"speedup; band: {accuracy.origin}", fontsize=9)
    fig.suptitle(f"Simulated: {title(question)}", fontsize=11)
    handles, labels = left.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), LEGEND_COLUMNS), frameon=False)
    else:
        fig.text(0.5, 0.04, "no run fits in the devices' memory", ha="center")
    # The legend's rows below the axes, each about 0.3 inch of the figure's height.
    fig.tight_layout(rect=(0, 0.3 * legend_rows / fig.get_figheight() + 0.02, 1, 1))
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
