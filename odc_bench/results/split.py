"""Where a speedup comes from: the time a series saves per sample, split into idle time and the rest.

The paper's claim is about idle time: ODC removes the waits at per-layer barriers and LB-Mini the
imbalance between ranks. A measured speedup can also come from elsewhere, most of all from a
cheaper optimizer step (ODC steps over one flat shard per unit, FSDP2 over every parameter's
DTensor shard). From a row's measured window, bubble rate and compute seconds, a sample's share of
job time splits into:

- idle: rank-time spent neither computing nor stepping (bubble_rate of the window);
- compute: the units' forward and backward (compute_s);
- optimizer: the rest of the busy time, the optimizer step (metrics.BUSY_KINDS).
"""

from __future__ import annotations

import pandas as pd

PARTS = ("idle", "compute", "optimizer")


def per_sample(rows: pd.DataFrame) -> pd.DataFrame:
    """Seconds of job time per sample, by part, for each row (they add up to 1 / samples_per_s);
    NaN for rows that lack a column they need (tables written before it existed)."""
    nan = pd.Series(float("nan"), index=rows.index)
    total = 1.0 / rows["samples_per_s"]
    idle = rows.get("bubble_rate", nan) * total
    compute = rows.get("compute_s", nan) / rows.get("wall_s", nan) * total
    return pd.DataFrame({"idle": idle, "compute": compute, "optimizer": total - idle - compute}, index=rows.index)


def gain_shares(series: pd.Series, baseline: pd.Series) -> dict[str, float] | None:
    """The share of the time per sample the series saves against the baseline that each part
    saves (shares add up to 1; a part that grew has a negative share); None when nothing is saved."""
    saved = sum(float(baseline[p]) - float(series[p]) for p in PARTS)
    if saved <= 0:
        return None
    return {p: (float(baseline[p]) - float(series[p])) / saved for p in PARTS}
