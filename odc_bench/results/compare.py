"""Series side by side: what each engine and balancer achieved on the same workload.

Runs are grouped by their workload (results/series.py); within a workload every series is set
against the paper's strongest collective baseline, the baseline engine with LB-Micro (or
LocalSort when that is all there is), in the engine's preferred variant (FSDP2 on shared
memory or NCCL before gloo). A series' runs (seeds and repeats) are summarised by their median,
robust to the one slow run a shared host gives, and their spread is shown, with four
lines under the tables saying what the columns mean, what compute covers, and how far the runs'
spread lets a difference be trusted; a speedup is split into where its time comes from only
where its runs' range lies above 1. This is what `make demo` prints.
"""

from __future__ import annotations

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from odc_bench.results.series import (
    BASELINE_BALANCERS,
    LAYOUTS,
    WORKLOAD,
    WORKLOAD_COLUMNS,
    balancer_options,
    engine_options,
    engine_variants,
    is_baseline_engine,
    layouts,
    series_names,
    variant_rank,
    with_workload,
)
from odc_bench.results.split import COMPUTE_NOTE, PARTS, per_sample, saving


def comparison(table: pd.DataFrame) -> pd.DataFrame:
    """One row per workload and series: median throughput over its runs with their range, bubbles,
    memory, and the speedup with the range its runs allow."""
    # An ok row without a throughput (a cell emptied or written n/a by hand, which reads as
    # missing) is no run of its series: its runs column counts the runs its median summarises.
    ok = table[(table["status"] == "ok") & pd.to_numeric(table["samples_per_s"], errors="coerce").notna()]
    if ok.empty:
        return pd.DataFrame()
    # Runs of another shard layout (hybrid sharding, topology-aware fetch) are another workload;
    # engine and balancer options and cost models that differ between runs make series of their own.
    ok = with_workload(ok)
    ok = ok.assign(variant=engine_variants(ok), layout=layouts(ok), engine_options=engine_options(ok),
                   balancer_options=balancer_options(ok))
    ok = pd.concat([ok, per_sample(ok)], axis=1)
    means = (ok.groupby([*WORKLOAD, "layout", "engine", "variant", "engine_options", "balancer", "balancer_options",
                         "cost_model"], dropna=False)
             .agg(runs=("run_id", "size"), samples_per_s=("samples_per_s", "median"),
                  slowest=("samples_per_s", "min"), fastest=("samples_per_s", "max"),
                  bubble_rate=("bubble_rate", "mean"), predicted_bubble_rate=("predicted_bubble_rate", "mean"),
                  peak_mem_mb=("peak_mem_mb", "mean"), **{p: (p, "median") for p in PARTS})
             .reset_index())
    parts = []
    for _, workload in means.groupby(WORKLOAD, dropna=False):
        for layout in sorted(set(workload["layout"])):
            # Topology-aware fetch is on-demand fetching's option: the baseline runs without it.
            own = workload["layout"] == layout
            if layout == "nearest":
                own |= (workload["layout"] == "") & workload.engine.map(is_baseline_engine)
            rows = workload[own].assign(layout=layout)
            rows = rows.assign(series=series_names(rows, rows["variant"]))
            for balancer in BASELINE_BALANCERS:
                base = rows[rows.engine.map(is_baseline_engine) & (rows.balancer == balancer)]
                if not base.empty:
                    best = base.iloc[int(base.apply(lambda r: variant_rank(r.engine, r.variant), axis=1).argmin())]
                    rows["baseline"] = best.series
                    rows["speedup"] = rows["samples_per_s"] / float(best.samples_per_s)
                    # Every pairing of a run with a baseline run lies within these.
                    rows["speedup_low"] = rows["slowest"] / float(best.fastest)
                    rows["speedup_high"] = rows["fastest"] / float(best.slowest)
                    rows["saved"] = [saved(r, best) for _, r in rows.iterrows()]
                    break
            parts.append(rows.sort_values("samples_per_s"))
    return pd.concat(parts, ignore_index=True)


NOISE = "within noise"
# The workload's columns every table's title names.
TITLED = ("model", "dataset", "world_size", "minibatch_size", "backend")


def saved(row: pd.Series, baseline: pd.Series) -> str:
    """Where the row's time saved per sample comes from, only where its speedup's range (every pairing
    of its runs with the baseline's) lies above 1: a split of a difference the runs do not show is noise."""
    if row.series == baseline.series:
        return "-"
    if row.speedup_low <= 1 <= row.speedup_high:
        return NOISE
    split = saving(row, baseline) if row.speedup_low > 1 else None
    return split.describe() if split else "-"


def print_comparison(rows: pd.DataFrame, console: Console | None = None) -> None:
    console = console or Console(width=max(Console().width, 150))  # room for the series names in logs
    if rows.empty:
        console.print("no successful runs to compare")
        return
    # Columns of the workload the title does not always show, where the tables' workloads differ in them.
    untitled = [c for c in WORKLOAD_COLUMNS if c not in TITLED and rows[c].astype(str).nunique() > 1]
    for _, group in rows.groupby([*WORKLOAD, "layout"], dropna=False):
        first = group.iloc[0]
        layout = "".join(f", {c}={first[c]:g}" if isinstance(first[c], float) else f", {c}={first[c]}"
                         for c in untitled)
        layout += f", {first.overrides}" if first.overrides else ""
        layout += f", {LAYOUTS[first.layout]}" if first.layout else ""
        layout += f", activation checkpointing {first.checkpointing}" if first.checkpointing else ""
        baseline = first.get("baseline")
        baseline = baseline if isinstance(baseline, str) else "no collective baseline"
        title = (f"{first.model} on {first.dataset}, {first.world_size} ranks, minibatch {first.minibatch_size}/rank "
                 f"({first.backend}{layout}); speedup vs {baseline}")
        table = Table(title=escape(title))
        for col in ("series", "samples/s", "runs' range", "speedup", "time saved per sample", "bubble",
                    "predicted", "peak MB", "runs"):
            # The series' names whole, whatever the width: the other columns wrap instead.
            table.add_column(col, justify="left" if col == "series" else "right",
                             min_width=max(map(len, group.series)) if col == "series" else None)
        for _, r in group.iterrows():
            speedup = f"{r.speedup:.2f}x" if "speedup" in r and pd.notna(r.speedup) else "-"
            if speedup != "-" and r.series != baseline and r.speedup_low != r.speedup_high:
                speedup += f" ({r.speedup_low:.2f}-{r.speedup_high:.2f})"
            split = r.saved if isinstance(r.get("saved"), str) else "-"
            predicted = "-" if pd.isna(r.predicted_bubble_rate) else f"{r.predicted_bubble_rate:.0%}"
            spread = f"{r.slowest:.3g}-{r.fastest:.3g}" if r.runs > 1 else "-"
            memory = "-" if pd.isna(r.peak_mem_mb) else f"{r.peak_mem_mb:.0f}"
            table.add_row(escape(r.series), f"{r.samples_per_s:.3g}", spread, speedup, split,
                          f"{r.bubble_rate:.0%}", predicted, memory, str(r.runs))
        console.print(table)
    for line in legend(rows):
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def legend(rows: pd.DataFrame) -> list[str]:
    """Four lines under the tables: what the columns mean, what compute covers, and how far to trust a
    difference."""
    repeated = rows[rows["runs"] > 1]
    if repeated.empty:
        spread = ("Each series ran once, and one run of a config varies from run to run on a shared host "
                  "(docs/simulator.md, 'Validation'): for a measurement, run every config several times "
                  "(repeat=5) and compare the runs' ranges.")
    else:
        width = float(((repeated["fastest"] - repeated["slowest"]) / repeated["samples_per_s"]).max())
        spread = (f"Runs of one series here span up to {width:.0%} of their median (runs' range): a smaller "
                  f"difference between series is noise; more repeats (repeat=N) narrow it.")
    return [
        "samples/s: the median over a series' runs (runs' range: slowest-fastest); speedup: the medians' ratio "
        "over the collective baseline named in the title, in brackets the range its runs allow (its slowest over "
        "the baseline's fastest to its fastest over the baseline's slowest).",
        "bubble: the share of rank-time spent not computing, as measured; predicted: what the balancer's cost "
        "model expected for the same plans; time saved per sample: where a series' speedup over the baseline "
        "comes from, the shares of the parts that shrank (idle time, what the paper's claim is about; the "
        "optimizer step; compute), adding up to 100%, and what a part that grew took back of that; only where "
        f"the speedup's range lies above 1, else {NOISE!r} (results/split.py).",
        COMPUTE_NOTE,
        spread,
    ]
