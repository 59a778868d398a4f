"""What the figures share: series names and colours, and which runs are comparable.

A *series* is an engine x balancer pair ("Collective + LB-Micro"), named as in the paper and
coloured the same in every figure. A *setting* is everything else that defines a run's
workload; runs of different series at one setting saw the same minibatches (the sample order
depends on the seed only), so their throughputs compare directly.
"""

from __future__ import annotations

import pandas as pd
import seaborn as sns

ENGINE_NAMES = {"collective": "Collective", "odc": "ODC"}
BALANCER_NAMES = {"local_sort": "LocalSort", "lb_micro": "LB-Micro", "lb_mini": "LB-Mini", "dynamic": "Dynamic"}

# The paper's comparison: ODC (with the best balancer) against the strongest collective baseline.
BASELINE = ("collective", "lb_micro")
# Preference when one run per engine has to be picked (Fig. 1): the paper's headline pair first.
PREFERRED = {"collective": ["lb_micro", "local_sort"], "odc": ["lb_mini", "lb_micro", "dynamic", "local_sort"]}

# Columns that define a run's workload (the series columns engine, balancer, cost_model aside).
SETTING = ["backend", "model", "dataset", "world_size", "minibatch_size", "max_tokens", "packing_ratio",
           "length_scale", "precision", "seed", "num_minibatches", "warmup_minibatches"]


def _name(value: object, names: dict[str, str]) -> str:
    return names.get(str(value), str(value))


def series_order() -> list[str]:
    return [f"{e} + {b}" for e in ENGINE_NAMES.values() for b in BALANCER_NAMES.values()]


def label_series(runs: pd.DataFrame) -> pd.Series:
    """`Engine + Balancer` for each row; with the cost model appended where one series ran under several."""
    base = (runs["engine"].map(lambda v: _name(v, ENGINE_NAMES)) + " + "
            + runs["balancer"].map(lambda v: _name(v, BALANCER_NAMES)))
    if "cost_model" not in runs:
        return base
    costs = runs["cost_model"].fillna("none").astype(str)
    several = costs.groupby(base).transform("nunique") > 1
    return base.where(~several, base + " (" + costs + ")")


def ordered(labels: pd.Series | list[str]) -> list[str]:
    """The series present, in the paper's order (collective first), unknown ones last."""
    known = series_order()
    present = sorted(set(labels), key=lambda s: (known.index(s.split(" (")[0]) if s.split(" (")[0] in known
                                                 else len(known), s))
    return present


def palette(labels: list[str]) -> dict[str, tuple]:
    """One fixed colour per series, the same in every figure: blues for collective, warm for ODC."""
    known = series_order()
    colors = sns.color_palette("Blues_d", 4)[::-1] + sns.color_palette("YlOrRd_d", 4)[::-1]
    extra = iter(sns.color_palette("Greys", len(labels) + 2)[2:])
    out = {}
    for s in labels:
        root = s.split(" (")[0]
        out[s] = colors[known.index(root)] if root in known else next(extra)
    return out


def with_series(runs: pd.DataFrame) -> pd.DataFrame:
    return runs.assign(series=label_series(runs))


def setting_key(runs: pd.DataFrame) -> pd.Series:
    """A hashable key per row for its setting (missing columns count as absent)."""
    cols = [c for c in SETTING if c in runs]
    return runs[cols].astype(str).agg("|".join, axis=1)


def describe_setting(row: pd.Series) -> str:
    parts = [f"{row.get('model')}", f"{row.get('dataset')}", f"{int(row.get('world_size'))} ranks",
             f"minibatch {int(row.get('minibatch_size'))}", f"packing {row.get('packing_ratio'):g}"]
    if pd.notna(row.get("max_tokens")):
        parts.append(f"max tokens {int(row.get('max_tokens'))}")
    return ", ".join(parts)


def golden(runs: pd.DataFrame) -> pd.DataFrame:
    """The rows of the setting closest to the paper's golden one (Table 1).

    The paper's golden setting is LongAlign, minibatch 4 per rank, packing ratio 1; among the
    settings present, prefer one that has both engines, then the most series, then those three
    traits, then more ranks. Ties go to the first setting in sorted order, so the choice is stable.
    """
    runs = with_series(runs).assign(_key=setting_key(runs))

    def score(part: pd.DataFrame) -> tuple:
        first = part.iloc[0]
        return (part["engine"].nunique() > 1, part["series"].nunique(), first.get("dataset") == "longalign",
                first.get("minibatch_size") == 4, first.get("packing_ratio") == 1, first.get("world_size", 0))

    groups = sorted(runs.groupby("_key", sort=True), key=lambda kv: score(kv[1]), reverse=True)
    return groups[0][1].drop(columns="_key")
