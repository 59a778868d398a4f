"""From per-rank traces to the run's summary numbers.

Definitions (also in results/README.md):
- measured window: from the earliest start of a measured (post-warm-up) minibatch on any
  rank to the latest end of one; throughput is measured samples and tokens over it;
- busy time of a rank: its unit compute spans (forward and backward) and optimizer steps
  inside measured minibatches;
- bubble rate: 1 - total busy time / (world size x window): the share of rank-time spent not
  computing, whether waiting at a barrier or moving data that no compute overlaps.
"""

from __future__ import annotations

import pandas as pd
from pandas.api.typing import SeriesGroupBy

BUSY_KINDS = ("fwd", "bwd", "optimizer")


def events_frame(rank_results: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([e for r in rank_results for e in r["events"]])


def window_totals(events: pd.DataFrame, warmup: int) -> dict[str, float]:
    """The measured window (wall_s) and the busy, compute and sync seconds summed over ranks in it."""
    measured = events[events["minibatch"] >= warmup]
    kind = measured["kind"]
    spans = measured[kind == "minibatch"]
    seconds = measured["t1"] - measured["t0"]
    start, end = spans["t0"].min(), spans["t1"].max()
    # A checkpoint is a pause of every rank together, not the run's work: its seconds (rank 0's
    # spans inside the window) leave the window.
    saves = measured[(kind == "checkpoint") & (measured["rank"] == 0) & (measured["t0"] >= start)
                     & (measured["t1"] <= end)]
    return dict(wall_s=float(end - start - (saves["t1"] - saves["t0"]).sum()),
                busy_s=float(seconds[kind.isin(BUSY_KINDS)].sum()),
                compute_s=float(seconds[kind.isin(("fwd", "bwd"))].sum()),
                sync_s=float(seconds[kind == "sync"].sum()))


def summary(totals: dict[str, float], world_size: int, samples: int, tokens: int) -> dict:
    """The row's timing columns from a run's window_totals (or the simulator's, computed without a trace)."""
    wall = totals["wall_s"]
    return dict(
        wall_s=wall,
        samples_per_s=samples / wall,
        tokens_per_s=tokens / wall,
        bubble_rate=max(0.0, 1.0 - totals["busy_s"] / (world_size * wall)),
        compute_s=totals["compute_s"] / world_size,
        sync_s=totals["sync_s"] / world_size,
    )


def summarize(events: pd.DataFrame, world_size: int, warmup: int, samples: int, tokens: int) -> dict:
    return summary(window_totals(events, warmup), world_size, samples, tokens)


def sum_kept_nan(groups: SeriesGroupBy) -> pd.Series:
    """Each group's sum, NaN where any of its values is NaN (a loss that diverged)."""
    return groups.agg(lambda values: values.sum(skipna=False))


def minibatch_losses(events: pd.DataFrame, labelled_tokens: list[int]) -> list[float]:
    """Global mean token loss of each minibatch: per-rank loss sums over the global token count.
    A rank's NaN stays NaN (sum_kept_nan): pandas' sum skips it, so a run whose loss diverged to
    NaN recorded a loss of 0, the best there is."""
    mb = sum_kept_nan(events[events["kind"] == "minibatch"].groupby("minibatch")["loss_sum"])
    return [float(mb.loc[k]) / labelled_tokens[k] for k in sorted(mb.index)]
