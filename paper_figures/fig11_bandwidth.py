"""Fig. 11 analog: bandwidth of ODC's primitives against the collectives they replace.

One panel per world size; x = message size, y = bandwidth. Solid lines: the one-sided
primitives (gather, scatter-accumulate); dashed: the collectives (all-gather, reduce-scatter);
the dotted black line is the memcpy rate, the limit for a copy through shared memory.
Repeated measurements are averaged. Bandwidth is the table's `bandwidth_gbps` (GB/s).
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullLocator

from odc_bench.sizes import size_label
from paper_figures.inputs import Inputs, Skip, per_source

NAME = "fig11_bandwidth"
X_LABEL = "message size"
Y_LABEL = "bandwidth (GB/s)"
OP_NAMES = {"gather": "gather", "scatter_accumulate": "scatter-accumulate", "all_gather": "all-gather",
            "reduce_scatter": "reduce-scatter"}
ONE_SIDED = {"gather", "scatter_accumulate"}
MEMCPY = "memcpy limit"


def series(prims: pd.DataFrame) -> pd.DataFrame:
    """Primitive and collective rows labelled `op (transport)`, with `one_sided` for the line style."""
    rows = prims[prims["op"].isin(OP_NAMES)]
    return rows.assign(series=rows["op"].map(OP_NAMES) + " (" + rows["transport"].astype(str) + ")",
                       one_sided=rows["op"].isin(ONE_SIDED))


def memcpy_limit(prims: pd.DataFrame) -> pd.DataFrame:
    """Memcpy bandwidth by size: the `memcpy` rows, or else the memcpy_gbps measured beside each row."""
    rows = prims[prims["op"] == "memcpy"]
    if not rows.empty:
        return rows.groupby("size_bytes", as_index=False)["bandwidth_gbps"].mean()
    if "memcpy_gbps" in prims and prims["memcpy_gbps"].notna().any():
        return (prims.dropna(subset=["memcpy_gbps"]).groupby("size_bytes", as_index=False)["memcpy_gbps"].mean()
                .rename(columns={"memcpy_gbps": "bandwidth_gbps"}))
    return pd.DataFrame(columns=["size_bytes", "bandwidth_gbps"])


def plot(prims: pd.DataFrame) -> Figure:
    data = series(prims)
    if data.empty:
        raise Skip("no gather, scatter_accumulate, all_gather or reduce_scatter rows")
    limit = memcpy_limit(prims)
    worlds = sorted(data["world_size"].unique())
    order = sorted(data["series"].unique(), key=lambda s: (not s.startswith(("gather ", "scatter-accumulate ")), s))
    colors = dict(zip(order, sns.color_palette("colorblind", len(order)), strict=True))
    fig = Figure(figsize=(4.6 * len(worlds), 3.8))
    axes = fig.subplots(1, len(worlds), squeeze=False, sharey=True)[0]
    for ax, world in zip(axes, worlds, strict=True):
        part = data[data["world_size"] == world]
        sns.lineplot(data=part, x="size_bytes", y="bandwidth_gbps", hue="series", hue_order=order, palette=colors,
                     style="one_sided", style_order=[True, False], markers=True, errorbar=None, ax=ax)
        if not limit.empty:
            ax.plot(limit["size_bytes"], limit["bandwidth_gbps"], color="black", ls=":", lw=1.5, label=MEMCPY,
                    gid="memcpy")
        sizes = np.sort(part["size_bytes"].unique())
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ticks = sizes[:: max(1, len(sizes) // 6)]
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([size_label(s) for s in ticks], rotation=30)
        ax.set_title(f"{world} ranks")
        ax.set_xlabel(X_LABEL)
        ax.set_ylabel(Y_LABEL)
        handles, labels = ax.get_legend_handles_labels()
        keep = [(h, lab) for h, lab in zip(handles, labels, strict=True) if lab in order or lab == MEMCPY]
        ax.legend([h for h, _ in keep], [lab for _, lab in keep], fontsize=7)
    fig.suptitle("One-sided primitives vs collectives")
    fig.tight_layout()
    return fig


def render(inputs: Inputs) -> dict[str, object]:
    return per_source(inputs.primitives, NAME, plot, "primitives.csv tables")


if __name__ == "__main__":
    from paper_figures.cli import main

    sys.exit(main(only=NAME))
