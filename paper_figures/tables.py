"""The numbers behind the figures, as Markdown tables.

- table1_golden: the paper's Table 1 analog (SFT runs): every series at the golden setting (see
  paper_figures.series.golden) with throughput, speedup over the baseline, bubble rates and memory;
- table5_throughput: samples/s of every series at every setting (the Fig. 8 numbers), with the
  best ODC series' speedup over Collective + LB-Micro where both ran;
- table_acceleration: the Fig. 10 numbers, one row per ODC series and setting;
- table_bandwidth: the Fig. 11 numbers, with each primitive's ratio to the collective it replaces.
"""

from __future__ import annotations

import sys

import pandas as pd

from odc_bench.results.series import DERIVED, is_rl
from paper_figures.fig10_acceleration import acceleration
from paper_figures.fig11_bandwidth import OP_NAMES
from paper_figures.inputs import NO_RUNS, Inputs, Skip, by_source
from paper_figures.series import (
    BALANCER_NAMES,
    BASELINE,
    ENGINE_NAMES,
    SETTING,
    describe_setting,
    golden,
    ordered,
    with_series,
)

NAME = "tables"
FLOAT = ".4g"
MISSING = "-"
BASELINE_LABEL = f"{ENGINE_NAMES[BASELINE[0]]} + {BALANCER_NAMES[BASELINE[1]]}"
REPLACES = {"gather": "all_gather", "scatter_accumulate": "reduce_scatter"}
TABLE5_INDEX = ["dataset", "model", "world_size", "minibatch_size", "packing_ratio", "max_tokens"]


def _md(title: str, text: str, table: pd.DataFrame, index: bool = False) -> str:
    body = table.astype(object).where(table.notna(), None).to_markdown(index=index, floatfmt=FLOAT,
                                                                      missingval=MISSING)
    return f"## {title}\n\n{text}\n\n{body}\n"


def _baseline(runs: pd.DataFrame) -> str | None:
    """The series to compare with: the first of the paper's baseline (any variant of it), else the
    first collective one; None without a collective series."""
    order = ordered(runs)
    roots = dict(zip(runs["series"], runs["root"], strict=True))
    collective = set(runs.loc[runs["engine"] == BASELINE[0], "series"])
    return next((s for s in order if roots[s] == BASELINE_LABEL), next((s for s in order if s in collective), None))


def table1(runs: pd.DataFrame) -> str:
    rows = with_series(golden(runs))
    stats = {"samples_per_s": "samples/s", "tokens_per_s": "tokens/s", "bubble_rate": "bubble (measured)",
             "predicted_bubble_rate": "bubble (predicted)", "sync_s": "sync s per rank",
             "peak_mem_mb": "peak memory MB"}
    present = [c for c in stats if c in rows]
    table = rows.groupby("series")[present].mean()
    table = table.reindex(ordered(rows))
    table.insert(0, "runs", rows.groupby("series").size())
    base = _baseline(rows)
    if base is not None:
        table.insert(2, f"speedup over {base} (%)",
                     100 * (table["samples_per_s"] / table.loc[base, "samples_per_s"] - 1))
    table = table.rename(columns=stats).rename_axis("series").reset_index()
    text = (f"Golden setting: {describe_setting(rows.iloc[0])}. Means over runs (seeds); bubble rates are "
            "shares of rank-time not spent computing.")
    return _md("Table 1 analog: the golden setting", text, table)


def table5(runs: pd.DataFrame) -> str:
    runs = with_series(runs)
    index = [c for c in TABLE5_INDEX if c in runs]
    table = runs.pivot_table(index=index, columns="series", values="samples_per_s", aggfunc="mean")
    table = table[ordered(runs)]
    odc = list(runs.loc[runs["engine"] == "odc", "series"].unique())
    base = _baseline(runs)
    if base is not None and odc:
        table[f"best ODC over {base} (%)"] = 100 * (table[odc].max(axis=1) / table[base] - 1)
    table.columns.name = None
    text = "Samples/s, mean over seeds, by setting (rows) and series (columns); blank: not run."
    return _md("Table 5 analog: throughput at every setting", text, table.reset_index())


def table_acceleration(runs: pd.DataFrame) -> str:
    table = acceleration(runs)
    if table.empty:
        raise Skip(f"no odc run shares a setting with a {BASELINE_LABEL} run")
    # What sets a workload apart only in its config (series.DERIVED) is a column where it does.
    cols = [c for c in SETTING if c in table and c not in ("num_minibatches", "warmup_minibatches")
            and not (c in DERIVED and (table[c].fillna("") == "").all())]
    table = table[cols + ["series", "samples_per_s", "baseline_samples_per_s", "acceleration"]]
    table = table.rename(columns={"baseline_samples_per_s": f"{BASELINE_LABEL} samples/s",
                                  "acceleration": "acceleration (%)"})
    text = f"ODC samples/s over {BASELINE_LABEL} samples/s at the same setting and seed, minus 1."
    return _md("Fig. 10 numbers: acceleration", text, table)


def table_bandwidth(prims: pd.DataFrame) -> str:
    rows = prims[prims["op"].isin(OP_NAMES)]
    if rows.empty:
        raise Skip("no gather, scatter_accumulate, all_gather or reduce_scatter rows")
    bw = rows.pivot_table(index=["world_size", "size_bytes"], columns="op", values="bandwidth_gbps", aggfunc="mean")
    for prim, coll in REPLACES.items():
        if prim in bw and coll in bw:
            bw[f"{prim} / {coll}"] = bw[prim] / bw[coll]
    if "ratio_to_memcpy" in rows:
        ratio = rows.pivot_table(index=["world_size", "size_bytes"], columns="op", values="ratio_to_memcpy",
                                 aggfunc="mean")
        for prim in REPLACES:
            if prim in ratio:
                bw[f"{prim} / memcpy"] = ratio[prim]
    bw.columns.name = None
    text = ("Bandwidth in GB/s (mean over repeats) and ratios: a primitive over the collective it replaces, "
            "and over memcpy.")
    return _md("Fig. 11 numbers: bandwidth", text, bw.reset_index())


def render(inputs: Inputs) -> dict[str, object]:
    out: dict[str, object] = {}
    if inputs.runs.empty:
        out["table1_golden"] = Skip(f"no {NO_RUNS} found below the results root")
    else:
        for source, runs in by_source(inputs.runs).items():
            sft = runs[~is_rl(runs)]
            out[f"table1_golden-{source}"] = table1(sft) if not sft.empty else Skip("only RL runs (see fig9_rl)")
            out[f"table5_throughput-{source}"] = table5(runs)
            try:
                out[f"table_acceleration-{source}"] = table_acceleration(runs)
            except Skip as skip:
                out[f"table_acceleration-{source}"] = skip
    if inputs.primitives.empty:
        out["table_bandwidth"] = Skip("no primitives.csv tables found below the results root")
    else:
        for source, prims in by_source(inputs.primitives).items():
            try:
                out[f"table_bandwidth-{source}"] = table_bandwidth(prims)
            except Skip as skip:
                out[f"table_bandwidth-{source}"] = skip
    return out


if __name__ == "__main__":
    from paper_figures.cli import main

    sys.exit(main(only=NAME))
