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

BUSY_KINDS = ("fwd", "bwd", "optimizer")


def events_frame(rank_results: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([e for r in rank_results for e in r["events"]])


def summarize(events: pd.DataFrame, world_size: int, warmup: int, samples: int, tokens: int) -> dict:
    measured = events[events["minibatch"] >= warmup]
    spans = measured[measured["kind"] == "minibatch"]
    wall = float(spans["t1"].max() - spans["t0"].min())
    busy = measured[measured["kind"].isin(BUSY_KINDS)]
    busy_s = float((busy["t1"] - busy["t0"]).sum())
    compute = measured[measured["kind"].isin(("fwd", "bwd"))]
    sync = measured[measured["kind"] == "sync"]
    return dict(
        wall_s=wall,
        samples_per_s=samples / wall,
        tokens_per_s=tokens / wall,
        bubble_rate=max(0.0, 1.0 - busy_s / (world_size * wall)),
        compute_s=float((compute["t1"] - compute["t0"]).sum()) / world_size,
        sync_s=float((sync["t1"] - sync["t0"]).sum()) / world_size,
    )


def minibatch_losses(events: pd.DataFrame, labelled_tokens: list[int]) -> list[float]:
    """Global mean token loss of each minibatch: per-rank loss sums over the global token count."""
    mb = events[events["kind"] == "minibatch"].groupby("minibatch")["loss_sum"].sum()
    return [float(mb.loc[k]) / labelled_tokens[k] for k in sorted(mb.index)]
