"""What a series is and which runs are comparable: the one definition the results commands and
the figures share.

A *series* is an engine x balancer pair, with the engine's variant where its record names an
option that tells series apart (FSDP2 on shared memory and on gloo are different baselines);
names and labels come from the engine and balancer registries. A *workload* is everything
else that defines what a run computed; a *setting* adds the seed: runs of different series at
one setting saw the same minibatches, so their throughputs compare directly.
"""

from __future__ import annotations

import pandas as pd
import yaml

from odc_bench.balancers.registry import BALANCERS
from odc_core.engine.registry import ENGINES

WORKLOAD = ["backend", "model", "dataset", "world_size", "minibatch_size", "max_tokens", "packing_ratio",
            "length_scale", "precision", "num_minibatches", "warmup_minibatches"]
SETTING = [*WORKLOAD, "seed"]
# The balancers a baseline engine is paired with for speedups, the paper's strongest first.
BASELINE_BALANCERS = ("lb_micro", "local_sort")

ENGINE_LABELS = {name: spec.label for name, spec in ENGINES.items()}
BALANCER_LABELS = {name: spec.label for name, spec in BALANCERS.items()}


def engine_variants(table: pd.DataFrame) -> pd.Series:
    """Each row's engine variant: the value of its engine's series option ("" when it has none,
    and for simulated rows where the option is the transport, which the hardware profile models).
    Rows written before collective's `engine.backend` existed ran on the default group, gloo on
    CPU; before odc's `engine.staleness`, synchronously (0)."""
    def variant(row: pd.Series) -> str:
        spec = ENGINES.get(str(row["engine"]))
        config = row.get("config")
        if spec is None or spec.series_option is None or not isinstance(config, str):
            return ""
        if row["backend"] == "sim" and not spec.series_option_simulated:
            return ""
        engine = (yaml.safe_load(config) or {}).get("engine", {})
        return str(engine.get(spec.series_option, spec.series_preference[-1] if spec.series_preference else ""))

    if table.empty:
        return pd.Series(dtype=str, index=table.index)
    return table.apply(variant, axis=1).astype(str)


def known_engines(table: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The rows of engines the registry knows, and the names of the others (retired diagnostics)."""
    known = table["engine"].isin(list(ENGINES))
    return table[known], sorted(set(table.loc[~known, "engine"].astype(str)))


def series_names(table: pd.DataFrame, variants: pd.Series | None = None, pretty: bool = False) -> pd.Series:
    """`engine[variant]+balancer` (or `Engine [variant] + Balancer` when pretty) for each row; the
    variant only where the rows hold several of one engine."""
    variants = engine_variants(table) if variants is None else variants
    several = {e for e, v in variants.groupby(table["engine"]) if v.nunique() > 1}
    shown = variants.where(table["engine"].isin(several) & (variants != ""), "")
    if pretty:
        engines = table["engine"].map(lambda e: ENGINE_LABELS.get(e, e))
        balancers = table["balancer"].map(lambda b: BALANCER_LABELS.get(b, b))
        return engines + (" [" + shown + "]").where(shown != "", "") + " + " + balancers
    return table["engine"] + ("[" + shown + "]").where(shown != "", "") + "+" + table["balancer"]


def is_baseline_engine(engine: str) -> bool:
    spec = ENGINES.get(engine)
    return spec is not None and spec.baseline


def variant_rank(engine: str, variant: str) -> int:
    """Where a variant stands in its engine's preference (the fairest first)."""
    order = ENGINES[engine].series_preference if engine in ENGINES else ()
    return order.index(variant) if variant in order else len(order)
