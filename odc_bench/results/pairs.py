"""Two engines compared pair by pair: the reading for controls whose effect is near the noise.

On a shared host the same run repeated an hour later can be 10-20% faster or slower, so
averaging each engine's runs (results/compare.py) mixes that drift into a few-percent
comparison. The control sweeps therefore run the engines back to back, seed by seed; this
module pairs those runs (same results folder, setting and balancer), takes each pair's
throughput ratio and reads the median over the pairs. Its 95% interval comes from a
bootstrap that resamples the result folders first and the pairs within them second, because
pairs from one sweep share that sweep's host conditions and are not independent of each other.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from seaborn.algorithms import bootstrap

from odc_bench.errors import PairingError
from odc_bench.results.series import SETTING, balancer_options, engine_options, engine_variants, with_workload

# A pair: the same setting, balancer (with its options and cost model) and repeat of the two series, in
# one results folder.
KEY = [*SETTING, "balancer", "balancer_options", "cost_model", "attempt"]


def _labels(table: pd.DataFrame) -> pd.Series:
    """`engine[variant, options]`: the variant and the engine options that differ between its runs."""
    inner = [", ".join(p for p in parts if p) for parts in zip(engine_variants(table), engine_options(table),
                                                                   strict=True)]
    return pd.Series([f"{e}[{i}]" if i else e for e, i in zip(table["engine"], inner, strict=True)],
                     index=table.index, dtype=object)


def _pick(table: pd.DataFrame, labels: pd.Series, series: str) -> pd.DataFrame:
    """Rows of one series: `odc`, `collective` (any process group) or `collective[shm]`."""
    return table[(labels == series) if "[" in series else (table["engine"] == series)]


def paired_ratios(tables: Mapping[str, pd.DataFrame], engine: str, baseline: str) -> pd.DataFrame:
    """One row per pair: samples/s of both series and engine / baseline, labelled by results folder."""
    if engine == baseline:
        raise PairingError(f"engine and baseline are both {engine}; compare two different series")
    labelled = {}
    for run, table in tables.items():
        ok = table[table["status"] == "ok"].drop_duplicates(subset=["run_id"], keep="last")
        if not ok.empty:
            ok = with_workload(ok).assign(balancer_options=balancer_options(ok))
            labelled[run] = ok, _labels(ok)
    held = {name for ok, labels in labelled.values() for name in (*ok["engine"], *labels)}
    for series in (engine, baseline):
        if series not in held:  # else "no workload ran as both", which reads as a pairing problem
            raise PairingError(f"no ok run of these folders is of series {series!r}; they hold "
                               f"{', '.join(sorted(held)) or 'none'}")
    pairs = []
    for run, (ok, labels) in labelled.items():
        sides = []
        for series, column in ((engine, "engine_samples_per_s"), (baseline, "baseline_samples_per_s")):
            rows = _pick(ok, labels, series)
            doubled = rows[rows.duplicated(subset=KEY, keep=False)]
            if not doubled.empty:
                groups = sorted(set(labels[doubled.index]))
                fix = (f"name one of {', '.join(groups)}" if len(groups) > 1 else
                       "give a folder with one such run per seed (they differ in a setting pairs does not key on)")
                raise PairingError(f"{run} holds {len(doubled)} {series} runs of the same workload, balancer and seed; "
                                   f"{fix}")
            sides.append(rows[KEY + ["samples_per_s"]].rename(columns={"samples_per_s": column}))
        matched = sides[0].merge(sides[1], on=KEY)
        if not matched.empty:
            pairs.append(matched.assign(run=run, ratio=matched.engine_samples_per_s / matched.baseline_samples_per_s))
    if not pairs:
        raise PairingError(f"no workload and seed ran as both {engine} and {baseline} in one results folder; "
                           "give the folders of a sweep that ran both (e.g. sweep=odc_engine_balanced)")
    columns = ["run", "balancer", "seed", "baseline_samples_per_s", "engine_samples_per_s", "ratio"]
    return pd.concat(pairs, ignore_index=True)[columns].sort_values(["run", "seed"], ignore_index=True)


def summarize(pairs: pd.DataFrame, n_boot: int = 10_000, seed: int = 0) -> dict[str, float | int]:
    """Median ratio over the pairs, its 95% interval (folders resampled, then pairs), and counts."""
    ratios = pairs["ratio"].to_numpy(dtype=float)
    medians = bootstrap(ratios, func=np.median, units=pairs["run"].to_numpy(), n_boot=n_boot, seed=seed)
    low, high = np.percentile(medians, [2.5, 97.5])
    return dict(median=float(np.median(ratios)), low=float(low), high=float(high), pairs=len(ratios),
                runs=int(pairs["run"].nunique()), slower=int((ratios < 1).sum()))


def print_pairs(pairs: pd.DataFrame, engine: str, baseline: str, console: Console | None = None) -> None:
    console = console or Console(width=max(Console().width, 100))
    table = Table(title=escape(f"{engine} / {baseline}, pair by pair"))
    for col in ("results", "balancer", "seed", f"{baseline} samples/s", f"{engine} samples/s", "ratio"):
        table.add_column(escape(col), justify="left" if col in ("results", "balancer") else "right")
    for _, r in pairs.iterrows():
        table.add_row(escape(r.run), r.balancer, str(r.seed), f"{r.baseline_samples_per_s:.4g}",
                      f"{r.engine_samples_per_s:.4g}", f"{r.ratio:.3f}")
    console.print(table)
    for run, rows in pairs.groupby("run", sort=False):
        console.print(escape(f"{run}: median {rows.ratio.median():.3f} over {len(rows)} pairs"), soft_wrap=True)
    s = summarize(pairs)
    console.print(escape(
        f"{engine} / {baseline}: median {s['median']:.3f} over {s['pairs']} pairs in {s['runs']} results folders, "
        f"95% interval {s['low']:.3f}-{s['high']:.3f} (bootstrap over folders, then pairs); "
        f"{engine} the slower in {s['slower']} of {s['pairs']} pairs"), soft_wrap=True)
