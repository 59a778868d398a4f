"""What the figures share: series colours and order, and which setting stands for the paper's.

Series, workloads and settings are defined once, in odc_bench/results/series.py (engine and
balancer names come from their registries); here they get the paper's wording, a fixed colour
per series and the paper's order.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.colors import to_rgb

from odc_bench.results.series import (
    BALANCER_LABELS,
    ENGINE_LABELS,
    HEADLINE_BASELINE,
    SETTING,
    series_names,
    with_cost_models,
)

ENGINE_NAMES = ENGINE_LABELS
BALANCER_NAMES = BALANCER_LABELS

# The paper's comparison: ODC (with the best balancer) against the strongest collective baseline.
BASELINE = HEADLINE_BASELINE
# Preference when one run per engine has to be picked (Fig. 1): the paper's headline pair first.
PREFERRED = {"collective": ["lb_micro", "local_sort"], "odc": ["lb_mini", "lb_micro", "dynamic", "local_sort"]}


def _name(value: object, names: dict[str, str]) -> str:
    return names.get(str(value), str(value))


def series_order() -> list[str]:
    return [f"{e} + {b}" for e in ENGINE_NAMES.values() for b in BALANCER_NAMES.values()]


def label_series(runs: pd.DataFrame) -> pd.Series:
    """`Engine + Balancer` for each row; with the engine's variant appended where its runs used
    several (FSDP2 on shared memory and on gloo are different baselines), and the cost model
    where one series ran under several."""
    if {"config", "backend"} <= set(runs.columns):
        return series_names(runs, pretty=True)
    return with_cost_models(series_root(runs), runs)


def series_root(runs: pd.DataFrame) -> pd.Series:
    """The series each row belongs to before its variants (process group, cost model, options):
    `Engine + Balancer`, from its engine and balancer columns."""
    return (runs["engine"].map(lambda v: _name(v, ENGINE_NAMES)) + " + "
            + runs["balancer"].map(lambda v: _name(v, BALANCER_NAMES)))


def _roots(runs: pd.DataFrame) -> dict[str, str]:
    return dict(zip(runs["series"], runs["root"], strict=True))


def ordered(runs: pd.DataFrame) -> list[str]:
    """The series of `runs` (a frame with `series` and `root`, see with_series), in the paper's
    order (collective first), unknown ones last."""
    known = series_order()
    roots = _roots(runs)

    def rank(label: str) -> tuple[int, str]:
        root = roots[label]
        return (known.index(root) if root in known else len(known), label)

    return sorted(roots, key=rank)


# Blues for collective, oranges to reds for ODC; the paper's headline pair in the strongest shades.
COLORS = {
    "Collective + LocalSort": "#9ecae1", "Collective + LB-Micro": "#2171b5", "Collective + LB-Mini": "#08306b",
    "Collective + Dynamic": "#6baed6", "Collective + verl": "#41b6c4", "ODC + LocalSort": "#fdae6b",
    "ODC + LB-Micro": "#e6550d", "ODC + LB-Mini": "#a50f15", "ODC + Dynamic": "#756bb1",
}


# How the second, third, ... variant of one series (another cost model, another process group)
# departs from the series' colour: mixed with black, then with white, then more of each.
VARIANT_MIX = [("black", 0.45), ("white", 0.5), ("black", 0.7), ("white", 0.75)]


def _mix(color: str, toward: str, share: float) -> tuple[float, float, float]:
    a, b = np.array(to_rgb(color)), np.array(to_rgb(toward))
    return tuple(float(v) for v in (1 - share) * a + share * b)  # type: ignore[return-value]


def palette(runs: pd.DataFrame) -> dict[str, object]:
    """One fixed colour per series of `runs` (with `series` and `root`), the same in every figure;
    the variants of one series (its cost models, FSDP2's process groups) each a shade of it, so no
    two labels share a colour; unknown series get greys."""
    labels = ordered(runs)
    roots = _roots(runs)
    gloo = _shown_gloo(runs)
    extra = iter(sns.color_palette("Greys", len(labels) + 2)[2:])
    out: dict[str, object] = {}
    seen: dict[str, int] = {}
    for label in labels:
        root = roots[label]
        base = COLORS.get(root)
        # FSDP2 over gloo, beside FSDP2 over shared memory, is the slow-transport reference: grey.
        if base is None or label in gloo:
            out[label] = next(extra)
            continue
        k = seen.get(root, 0)
        seen[root] = k + 1
        out[label] = base if k == 0 else _mix(base, *VARIANT_MIX[(k - 1) % len(VARIANT_MIX)])
    return out


def _shown_gloo(runs: pd.DataFrame) -> set[str]:
    """The series of FSDP2 over gloo where their label says so (beside another process group)."""
    if "variant" not in runs:
        return set()
    variant = runs["variant"].astype(str)
    several = variant.groupby(runs["engine"]).transform("nunique") > 1
    return set(runs.loc[several & (variant == "gloo"), "series"])


def measured_or_simulated(runs: pd.DataFrame) -> str:
    """How a figure names its numbers: "simulated" when every run is the simulator's."""
    backends = set(runs["backend"].dropna()) if "backend" in runs else set()
    return "simulated" if backends == {"sim"} else "measured"


def with_series(runs: pd.DataFrame) -> pd.DataFrame:
    """`runs` with each row's series label and its root (see series_root)."""
    return runs.assign(series=label_series(runs), root=series_root(runs))


def setting_key(runs: pd.DataFrame) -> pd.Series:
    """A hashable key per row for its setting (missing columns count as absent)."""
    cols = [c for c in SETTING if c in runs]
    return runs[cols].astype(str).agg("|".join, axis=1)


def describe_setting(row: pd.Series) -> str:
    parts = [f"{row.get('model')}", f"{row.get('dataset')}", f"{int(row.get('world_size'))} ranks",
             f"minibatch {int(row.get('minibatch_size'))}", f"packing {row.get('packing_ratio'):g}"]
    if pd.notna(row.get("max_tokens")):
        parts.append(f"max tokens {int(row.get('max_tokens'))}")
    if isinstance(row.get("checkpointing"), str) and row.get("checkpointing"):
        parts.append(f"activation checkpointing {row.get('checkpointing')}")
    if isinstance(row.get("overrides"), str) and row.get("overrides"):
        parts.append(str(row.get("overrides")))
    return ", ".join(parts)


# What a one-factor variation changes (max_tokens follows from length_scale x packing_ratio).
FACTOR_KEYS = ["backend", "model", "dataset", "world_size", "minibatch_size", "packing_ratio", "length_scale",
               "precision"]


def _variations(settings: pd.DataFrame) -> pd.Series:
    """For each setting, how many others differ from it in exactly one factor: the hub of a
    one-factor-at-a-time study (the paper's golden setting) is the one most others vary from."""
    cols = [c for c in FACTOR_KEYS if c in settings]
    values = settings[cols].astype(str).to_numpy()
    differ = (values[:, None, :] != values[None, :, :]).sum(axis=2)
    return pd.Series((differ == 1).sum(axis=1), index=settings.index)


def golden(runs: pd.DataFrame) -> pd.DataFrame:
    """The rows of the setting that stands for the paper's golden one (Table 1).

    Among the settings present, prefer one that has both engines, then the most series, then
    the one the most other settings vary one factor from, then the paper's golden traits
    (LongAlign, minibatch 4 per rank, packing ratio 1). Ties go to the first setting in sorted
    order, so the choice is stable.
    """
    runs = with_series(runs).assign(_key=setting_key(runs))
    settings = runs.drop_duplicates("_key").set_index("_key")
    hub = _variations(settings)

    def score(key: str, part: pd.DataFrame) -> tuple:
        first = part.iloc[0]
        return (part["engine"].nunique() > 1, part["series"].nunique(), hub[key], first.get("dataset") == "longalign",
                first.get("minibatch_size") == 4, first.get("packing_ratio") == 1)

    groups = sorted(runs.groupby("_key", sort=True), key=lambda kv: score(*kv), reverse=True)
    return groups[0][1].drop(columns="_key")
