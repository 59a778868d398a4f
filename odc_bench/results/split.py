"""Where a speedup comes from: the time a series saves per sample, split into idle time and the rest.

The paper's claim is about idle time: ODC removes the waits at per-layer barriers and LB-Mini the
imbalance between ranks. A measured speedup can also come from elsewhere, most of all from a
cheaper optimizer step (ODC steps over one flat shard per unit, FSDP2 over every parameter's
DTensor shard). From a row's measured window, bubble rate and compute seconds, a sample's share of
job time splits into:

- idle: rank-time spent neither computing nor stepping (bubble_rate of the window);
- compute: the units' forward and backward (compute_s);
- optimizer: the rest of the busy time, the optimizer step (metrics.BUSY_KINDS).

Both engines run the same model on the same samples, so compute is the same work: a compute share is
that work running faster or slower, from the balancer's packing (fewer, larger microbatches run the
matrix products more efficiently; per-microbatch overheads) or, on a shared host, from the cores and
memory bandwidth communication takes from compute (COMPUTE_NOTE, printed under comparisons).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

PARTS = ("idle", "optimizer", "compute")
COMPUTE_NOTE = ("compute: the units' forward and backward seconds. Both engines run the same model on the same "
                "samples, so a compute share is the same work done faster or slower: the balancer's packing (fewer, "
                "larger microbatches run matrix products more efficiently) or, on a shared host, the cores and "
                "memory bandwidth communication takes from compute; it is not work one engine skips.")


def per_sample(rows: pd.DataFrame) -> pd.DataFrame:
    """Seconds of job time per sample, by part, for each row (they add up to 1 / samples_per_s);
    NaN for rows that lack a column they need (tables written before it existed)."""
    nan = pd.Series(float("nan"), index=rows.index)
    total = 1.0 / rows["samples_per_s"]
    idle = rows.get("bubble_rate", nan) * total
    compute = rows.get("compute_s", nan) / rows.get("wall_s", nan) * total
    return pd.DataFrame({"idle": idle, "compute": compute, "optimizer": total - idle - compute}, index=rows.index)


ROUNDING = 1e-9
SHOWN = 0.005
NAMES = {"idle": "idle", "optimizer": "optimizer step", "compute": "compute"}


@dataclass(frozen=True)
class Saving:
    """Where the time a series saves per sample against the baseline comes from.

    `shares`: the parts that shrank, each its share of their summed saving (the gross saving), each
    in 0-1 and together 1. `took_back`: the parts that grew, each the share of the gross saving its
    growth gave back; together below 1, as the series saves time net. (As shares of the net saving a
    part that grew is negative and the others above 100%: 825%/17%/-742% once, which reads as noise.)
    """

    shares: dict[str, float]
    took_back: dict[str, float]

    def describe(self) -> str:
        """`idle 80%, optimizer step 20%; compute grew, taking back 10%` (parts in PARTS' order; a part under
        0.5% is left out rather than printed as 0%)."""
        saved = ", ".join(f"{NAMES[p]} {self.shares[p]:.0%}" for p in PARTS if self.shares.get(p, 0) >= SHOWN)
        grew = "".join(f"; {NAMES[p]} grew, taking back {self.took_back[p]:.0%}" for p in PARTS
                       if self.took_back.get(p, 0) >= SHOWN)
        return saved + grew


def saving(series: pd.Series, baseline: pd.Series) -> Saving | None:
    """The split of the time per sample the series saves against the baseline; None when it saves
    none net (or a part is unknown)."""
    change = {p: float(baseline[p]) - float(series[p]) for p in PARTS}
    if any(pd.isna(v) for v in change.values()) or sum(change.values()) <= 0:
        return None
    # The optimizer part is the total less the others: a part that did not change differs by rounding.
    change = {p: v for p, v in change.items() if abs(v) > ROUNDING * float(sum(baseline[q] for q in PARTS))}
    gross = sum(v for v in change.values() if v > 0)
    return Saving(shares={p: v / gross for p, v in change.items() if v > 0},
                  took_back={p: -v / gross for p, v in change.items() if v < 0})
