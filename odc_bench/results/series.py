"""What a series is and which runs are comparable: the one definition the results commands and
the figures share.

A *series* is an engine x balancer pair, with the engine's variant where its record names an
option that tells series apart (FSDP2 on shared memory and on gloo are different baselines),
read from the row's own columns (variant, shard, fetch, staleness), never its config text;
names and labels come from the engine and balancer registries. A *workload* is everything
else that defines what a run computed; a *setting* adds the seed: runs of different series at
one setting saw the same minibatches, so their throughputs compare directly.
"""

from __future__ import annotations

import pandas as pd
import yaml

from odc_bench.balancers.registry import BALANCERS
from odc_bench.config.engine import ENGINES

WORKLOAD = ["backend", "model", "dataset", "world_size", "minibatch_size", "max_tokens", "packing_ratio",
            "length_scale", "precision", "num_minibatches", "warmup_minibatches"]
SETTING = [*WORKLOAD, "seed"]
# The balancers a baseline engine is paired with for speedups, the paper's strongest first.
BASELINE_BALANCERS = ("lb_micro", "local_sort")
# The paper's comparison, written once: the speedup every command and figure calls "the"
# speedup is ODC with LB-Mini over collective FSDP with LB-Micro, its strongest baseline.
HEADLINE_ODC = ("odc", "lb_mini")
HEADLINE_BASELINE = ("collective", BASELINE_BALANCERS[0])
# The paper's other series: ODC with the baseline's balancer (what the engine alone gains) and,
# for RL, verl's own balancing as the baseline.
ODC_LB_MICRO = ("odc", "lb_micro")
VERL_BASELINE = ("collective", "verl")


def series_key(series: tuple[str, str]) -> str:
    """`engine+balancer`, as tables and comparisons name a series."""
    return "+".join(series)


def comparison_key(ours: tuple[str, str], baseline: tuple[str, str]) -> str:
    """`engine+balancer vs engine+balancer`: a speedup of `ours` over `baseline`."""
    return f"{series_key(ours)} vs {series_key(baseline)}"

ENGINE_LABELS = {name: spec.label for name, spec in ENGINES.items()}
BALANCER_LABELS = {name: spec.label for name, spec in BALANCERS.items()}


def _text(value: object) -> str:
    """A cell of a text column as written: "" for an empty one, and a number pandas read as a
    float (a column of staleness values with gaps) without its ".0"."""
    if isinstance(value, str):
        return value
    if value is None or pd.isna(value):
        return ""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def engine_variants(table: pd.DataFrame) -> pd.Series:
    """Each row's engine variant, its `variant` column: the value of its engine's series option
    ("" when it has none, and for simulated rows where the option is the transport, which the
    hardware profile models)."""
    if table.empty or "variant" not in table:
        return pd.Series("", dtype=str, index=table.index)
    hidden = pd.Series([spec is None or (backend == "sim" and not spec.series_option_simulated)
                        for spec, backend in zip(table["engine"].map(ENGINES.get), table["backend"], strict=True)],
                       index=table.index)
    return table["variant"].map(_text).where(~hidden, "").astype(str)


# How a run laid out and fetched its shards (engine.shard, backend.odc_fetch), when not the
# default (every unit sharded over all ranks, shards read from their owners): runs of different
# layouts are different workloads, drawn and compared apart.
LAYOUTS = {"": "full sharding", "hybrid": "hybrid sharding", "nearest": "topology-aware fetch"}


def checkpointing(table: pd.DataFrame) -> pd.Series:
    """Each row's activation checkpointing (backend.recompute), read from its config: "" when
    off, else its mode, "full", "op" or "blocks 0.25". A run with it does other work than one
    without: they are different workloads, compared apart (before, `results compare` took runs
    with and without it for repeats of one series)."""
    def name(backend: object) -> str:
        if not isinstance(backend, dict) or not backend.get("recompute"):
            return ""
        mode = str(backend.get("recompute_mode", "full"))
        return f"blocks {float(backend.get('recompute_blocks', 0.5)):g}" if mode == "blocks" else mode

    return config_value(table, "backend").map(name).astype(str)


def _fetches_on_demand(engine: object) -> bool:
    spec = ENGINES.get(str(engine))
    return spec is not None and spec.simulated_as == "odc"


def layouts(table: pd.DataFrame) -> pd.Series:
    """Each row's layout, from its `shard` and `fetch` columns: "hybrid" (engine.shard=hybrid),
    "nearest" (an engine that fetches on demand, ODC, with backend.odc_fetch=nearest and full
    sharding), or "" (the default)."""
    if table.empty or not {"shard", "fetch"} <= set(table.columns):
        return pd.Series("", dtype=str, index=table.index)
    shard, fetch = table["shard"].map(_text), table["fetch"].map(_text)
    nearest = (fetch == "nearest") & table["engine"].map(_fetches_on_demand).astype(bool)
    found = ["hybrid" if s == "hybrid" else "nearest" if n else "" for s, n in zip(shard, nearest, strict=True)]
    return pd.Series(found, index=table.index, dtype=str)


def in_layout(table: pd.DataFrame, layout: str) -> pd.Series:
    """The rows a comparison within `layout` reads: its own, and for topology-aware fetch (an
    option of on-demand fetching alone) also the full-sharding rows of the other engines, the
    baselines it is compared with."""
    found = layouts(table)
    own = found == layout
    if layout != "nearest":
        return own
    return own | ((found == "") & ~table["engine"].map(_fetches_on_demand).astype(bool))


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
        pretty_shown = pd.Series([ENGINES[e].series_pretty.format(v) if e in ENGINES and v else v
                                  for e, v in zip(table["engine"], shown, strict=True)],
                                 index=table.index, dtype=object)
        return engines + (" [" + pretty_shown + "]").where(shown != "", "") + " + " + balancers
    return table["engine"] + ("[" + shown + "]").where(shown != "", "") + "+" + table["balancer"]


# A config as the results hold it, parsed by libyaml where this PyYAML has it (a table holds
# hundreds of configs).
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def config_value(table: pd.DataFrame, path: str) -> pd.Series:
    """Each row's value of a dotted config key (`dataset.loader`), read from its `config` column;
    None where the row has no config, a config cut short, or the key is absent."""
    if table.empty or "config" not in table:
        return pd.Series([None] * len(table), index=table.index, dtype=object)
    parsed: dict[str, object] = {}

    def lookup(config: object) -> object:
        if not isinstance(config, str):
            return None
        if config not in parsed:
            try:
                value: object = yaml.load(config, Loader=_LOADER) or {}
            except yaml.YAMLError:
                value = {}
            for part in path.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            parsed[config] = value
        return parsed[config]

    return table["config"].map(lookup).astype(object)


def is_rl(table: pd.DataFrame) -> pd.Series:
    """Rows of an RL workload (dataset=grpo: prompts x groups of responses), which Fig. 9 draws
    and the SFT figures leave out."""
    return config_value(table, "dataset.loader") == "grpo"


def is_baseline_engine(engine: str) -> bool:
    spec = ENGINES.get(engine)
    return spec is not None and spec.baseline


def variant_rank(engine: str, variant: str) -> int:
    """Where a variant stands in its engine's preference (the fairest first)."""
    order = ENGINES[engine].series_preference if engine in ENGINES else ()
    return order.index(variant) if variant in order else len(order)
