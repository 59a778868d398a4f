"""The verdict on the terminal (a table and a few lines) and as a CSV (whatif/figure.py draws it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from odc_bench.config.engine import ENGINES
from odc_bench.data.lengths import reuse_note
from odc_bench.files import atomic_write_text
from odc_bench.whatif.accuracy import Accuracy
from odc_bench.whatif.question import Question, Series


def _cell(value: float, fmt: str) -> str:
    return "-" if pd.isna(value) else format(value, fmt)


def validated_row(row: pd.Series) -> bool:
    """Whether the simulator's validated error applies to the row: validation measured synchronous
    ODC against collective FSDP, so neither the baseline engine's own series nor stale ones have it."""
    return not ENGINES[row.engine].baseline and not row.staleness


def _range(accuracy: Accuracy, row: pd.Series) -> str:
    """The speedup a measurement would give if the simulator errs as it did in validation."""
    if not validated_row(row) or pd.isna(row.speedup):
        return "-"
    span = accuracy.measured_range(row.speedup)
    return "-" if span is None else f"{span[0]:.2f}-{span[1]:.2f}x"


def describe_pool(lengths: np.ndarray, question: Question, source: str) -> str:
    """One line: the lengths the runs draw from (after --length-scale) and how they draw them."""
    p50, p99 = np.percentile(lengths, [50, 99])
    scale = "as given" if question.length_scale == 1 else f"x {question.length_scale:g}"
    drawn = {m: question.num_minibatches * question.world_size * m for m in question.minibatch_sizes}
    reused = [m for m in sorted(drawn) if reuse_note(lengths.size, drawn[m])]
    reuse = ""
    if reused:
        top = reused[-1]
        reuse = (f"; from minibatch {reused[0]} on a run draws more samples than there are, so samples repeat "
                 f"(at minibatch {top}: {drawn[top]} drawn, {reuse_note(lengths.size, drawn[top])})")
    return (f"lengths: {lengths.size} samples of {source} ({scale}): mean {lengths.mean():.0f}, p50 {p50:.0f}, "
            f"p99 {p99:.0f}, max {lengths.max()} tokens; each run draws {question.num_minibatches} minibatches of "
            f"{question.world_size} devices x the minibatch size{reuse}")


def title(question: Question) -> str:
    return (f"{question.model_name} on {question.world_size} x {question.hardware_name} ({question.nodes} node"
            f"{'s' * (question.nodes > 1)} x {question.devices_per_node}), lengths {Path(question.lengths).name}")


def print_table(table: pd.DataFrame, question: Question, accuracy: Accuracy, console: Console) -> None:
    base = next(s.label for s in map(Series, table.engine, table.balancer) if s.is_baseline)
    t = Table(title=escape(f"Simulated: {title(question)}; speedup over {base}"), title_justify="left")
    for col in ("series", "mb/device", "samples/s", "tokens/s", "speedup", "if it errs as validated", "bubble",
                "unavoidable", "GiB/device", "fits"):
        t.add_column(escape(col), justify="left" if col == "series" else "right", no_wrap=col == "series")
    for m, group in table.groupby("minibatch_size", sort=True):
        for _, r in group.iterrows():
            limit = f" of {r.mem_limit_gib:.0f}" if pd.notna(r.mem_limit_gib) else ""
            t.add_row(escape(r.series), str(m), _cell(r.samples_per_s, ".3g"), _cell(r.tokens_per_s, ",.0f"),
                      _cell(r.speedup, ".2f") + ("x" if pd.notna(r.speedup) else ""), _range(accuracy, r),
                      _cell(r.bubble_rate, ".0%"), _cell(r.unavoidable_bubble_rate, ".0%"), f"{r.mem_gib:.1f}{limit}",
                      "yes" if r.fits else "NO")
        t.add_section()
    console.print(t)


def verdict_lines(table: pd.DataFrame, accuracy: Accuracy, advice: dict[int, str] | None = None) -> list[str]:
    """Per minibatch size: the fastest synchronous series of another engine than the baseline's
    against the baseline, and whether the simulator's validated error leaves the gain standing;
    then, where stale-synchronous series were asked for, the fastest of them beside it. Where
    the comparison does not fit in memory, `advice` says what would make it fit."""
    lines = []
    for m, group in table.groupby("minibatch_size", sort=True):
        base = group[[Series(e, b).is_baseline for e, b in zip(group.engine, group.balancer, strict=True)]]
        others = group[~group.engine.map(lambda e: ENGINES[e].baseline) & group.samples_per_s.notna()
                       & (group.staleness == 0)]
        if base.empty or base.samples_per_s.isna().all() or others.empty:
            fix = (advice or {}).get(int(m), "")
            lines.append(f"minibatch {m}/device: does not fit in memory (see GiB/device){'; ' + fix if fix else ''}")
            continue
        best, b = others.loc[others.speedup.idxmax()], base.iloc[0]
        span = accuracy.measured_range(best.speedup)
        if span is None:
            call = "the simulator's error is unknown here"
        else:
            within = f"{span[0]:.2f}-{span[1]:.2f}x within {accuracy.band()}"
            call = (f"pays off ({within})" if span[0] > 1 else f"does not pay off ({within})" if span[1] < 1
                    else f"too close to call ({within})")
        idle = f"; of the time it saves per sample: {best.saved}" if isinstance(best.saved, str) and best.saved else ""
        lines.append(f"minibatch {m}/device: {best.series} runs at {best.speedup:.2f}x {b.series}: {call}; bubble "
                     f"{best.bubble_rate:.0%} ({best.unavoidable_bubble_rate:.0%} unavoidable) against "
                     f"{b.bubble_rate:.0%} ({b.unavoidable_bubble_rate:.0%}){idle}")
        lines += _stale_line(m, group, best, b)
    return lines


def _stale_line(m: int, group: pd.DataFrame, best: pd.Series, base: pd.Series) -> list[str]:
    """The fastest stale-synchronous series at this minibatch size against the baseline and the
    synchronous best (no line when none was asked for; one saying so when none fits)."""
    stale = group[group.staleness > 0]
    if stale.empty:
        return []
    fitting = stale[stale.samples_per_s.notna()]
    if fitting.empty:
        return [f"minibatch {m}/device, stale-synchronous: no staleness asked for fits in memory (s + 1 copies of "
                f"each owned shard and accumulator; see GiB/device)"]
    top = fitting.loc[fitting.speedup.idxmax()]
    steps = f"{top.staleness} step{'s' * int(top.staleness > 1)}"
    return [f"minibatch {m}/device, stale-synchronous (beyond the paper): {top.series} runs at {top.speedup:.2f}x "
            f"{base.series} ({top.samples_per_s / best.samples_per_s:.2f}x {best.series}); bubble "
            f"{top.bubble_rate:.0%} ({top.unavoidable_bubble_rate:.0%} unavoidable). It trains on gradients {steps} "
            f"old, which costs steps to a given loss: weigh it with docs/staleness.md"]


def write_csv(table: pd.DataFrame, path: Path) -> None:
    atomic_write_text(path, table.to_csv(index=False))
