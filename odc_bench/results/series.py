"""What a series is and which runs are comparable: the one definition the results commands and
the figures share.

A *series* is an engine x balancer pair, with the engine's variant where its record names an
option that tells series apart (FSDP2 on shared memory and on gloo are different baselines),
read from the row's own columns (variant, shard, fetch, staleness); any other engine or
balancer option whose value differs between the table's runs (read from their configs), and
the cost model where one balancer ran under several, make series of their own. A *workload* is
everything else that defines what a run computed: the row's columns (WORKLOAD_COLUMNS) and
what only its config says (DERIVED: activation checkpointing, and the overrides that set runs
of one named workload apart, such as the simulated GPU). A *setting* adds the seed: runs of
different series at one setting saw the same minibatches, so their throughputs compare
directly.
"""

from __future__ import annotations

import functools

import pandas as pd
import yaml

from odc_bench.balancers.registry import BALANCERS
from odc_bench.config.engine import ENGINES
from odc_bench.config.run import RunConfig

# The row's columns that name a workload; the rest of it is read from the rows' configs (DERIVED,
# with_workload), so every consumer keys on the same dimensions.
WORKLOAD_COLUMNS = ["backend", "model", "dataset", "world_size", "minibatch_size", "max_tokens", "packing_ratio",
                    "length_scale", "precision", "num_minibatches", "warmup_minibatches"]
DERIVED = ["checkpointing", "overrides"]
WORKLOAD = [*WORKLOAD_COLUMNS, *DERIVED]
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
    """`engine[variant, options]+balancer[options] (cost model)` (or `Engine [variant, options] +
    Balancer [options] (cost model)` when pretty) for each row: the variant only where the rows
    hold several of one engine, the options where they differ between its runs (engine_options,
    balancer_options; read from the table's columns of those names where it has them, else from
    its configs), the cost model where one series ran under several."""
    variants = engine_variants(table) if variants is None else variants
    several = {e for e, v in variants.groupby(table["engine"]) if v.nunique() > 1}
    shown = variants.where(table["engine"].isin(several) & (variants != ""), "")
    engine_opts = table["engine_options"] if "engine_options" in table else engine_options(table)
    balancer_opts = table["balancer_options"] if "balancer_options" in table else balancer_options(table)
    if pretty:
        shown = pd.Series([ENGINES[e].series_pretty.format(v) if e in ENGINES and v else v
                           for e, v in zip(table["engine"], shown, strict=True)], index=table.index, dtype=object)
        engines = table["engine"].map(lambda e: ENGINE_LABELS.get(e, e))
        balancers = table["balancer"].map(lambda b: BALANCER_LABELS.get(b, b))
        space = " "
    else:
        engines, balancers, space = table["engine"], table["balancer"], ""
    inner = [", ".join(part for part in (v, o) if part) for v, o in zip(shown, engine_opts, strict=True)]
    engine_part = [f"{e}{space}[{i}]" if i else e for e, i in zip(engines, inner, strict=True)]
    balancer_part = [f"{b}{space}[{o}]" if o else b for b, o in zip(balancers, balancer_opts, strict=True)]
    join = " + " if pretty else "+"
    names = pd.Series([f"{e}{join}{b}" for e, b in zip(engine_part, balancer_part, strict=True)],
                      index=table.index, dtype=object)
    return with_cost_models(names, table)


# A config as the results hold it, parsed by libyaml where this PyYAML has it (a table holds
# hundreds of configs).
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.lru_cache(maxsize=4096)
def _parsed(config: str) -> dict:
    """A config's text as a dict (shared between callers: never changed); {} for one cut short."""
    try:
        value = yaml.load(config, Loader=_LOADER)
    except yaml.YAMLError:
        value = None
    return value if isinstance(value, dict) else {}


def configs(table: pd.DataFrame) -> pd.Series:
    """Each row's config as a dict, parsed once per distinct text; {} where the row has no config
    or a config cut short."""
    if table.empty or "config" not in table:
        return pd.Series([{}] * len(table), index=table.index, dtype=object)
    return table["config"].map(lambda c: _parsed(c) if isinstance(c, str) else {}).astype(object)


def config_value(table: pd.DataFrame, path: str) -> pd.Series:
    """Each row's value of a dotted config key (`dataset.loader`), read from its `config` column;
    None where the row has no config, a config cut short, or the key is absent."""
    def lookup(value: object) -> object:
        for part in path.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return value

    return configs(table).map(lookup).astype(object)


def _flat(config: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _shown(value: object) -> str:
    """A config value as an override writes it."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    return str(value)


def differing(configs: pd.Series, skip: tuple[str, ...] = ()) -> pd.Series:
    """`key=value, ...` for each config (dicts, as `configs` gives them) of the keys whose values
    differ between the configs, but those in `skip` (a key, or a section of keys); "" where none
    do. A section picked by name (model, dataset, backend.hardware) reads as its group's override,
    `backend/hardware=a100`, and its other keys are named only where they differ between configs
    of one name. A key some configs lack tells only those that have it apart."""
    flat = [_flat(c) for c in configs]
    keys = sorted({k for f in flat for k in f if not any(k == s or k.startswith(f"{s}.") for s in skip)})
    differ = [k for k in keys if len({repr(f[k]) for f in flat if k in f}) > 1]
    named = {k.removesuffix(".name") for k in differ if k.endswith(".name")}

    def section(k: str) -> str | None:
        return next((s for s in named if k.startswith(f"{s}.") and k != f"{s}.name"), None)

    # Per key of a section picked by name, the names under which its value differs.
    differs_under: dict[str, set[str]] = {}
    for k in differ:
        if (s := section(k)) is not None:
            values: dict[str, set[str]] = {}
            for f in flat:
                if k in f:
                    values.setdefault(repr(f.get(f"{s}.name")), set()).add(repr(f[k]))
            differs_under[k] = {name for name, seen in values.items() if len(seen) > 1}

    def shown(k: str, f: dict[str, object]) -> bool:
        s = section(k)
        return k in f and (s is None or repr(f.get(f"{s}.name")) in differs_under[k])

    def key(k: str) -> str:
        s = k.removesuffix(".name")
        return s.replace(".", "/") if s in named else k

    def describe(f: dict[str, object]) -> str:
        return ", ".join(f"{key(k)}={_shown(f[k])}" for k in differ if shown(k, f))

    return pd.Series([describe(f) for f in flat], index=configs.index, dtype=object)


# Config keys that do not set one workload apart from another, or that other columns key on: the
# series (engine and balancer: engine_options, balancer_options), the seed, where results,
# checkpoints and lengths caches go, waits and repeats, the profiled warm-up minibatch, the simulator's trace file,
# the layout (backend.odc_fetch: layouts), checkpointing (its own column), max_tokens (the row's
# column holds the value it resolved to), and the token ids' source (dataset.tokens: the same
# work on other ids; the loss curves key on it themselves, paper_figures/convergence.py).
NOT_WORKLOAD = ("engine", "balancer", "seed", "results_dir", "repeat", "timeout_s", "deadline_s", "checkpoint",
                "profile_minibatch", "backend.write_trace", "backend.odc_fetch", "backend.recompute",
                "backend.recompute_mode", "backend.recompute_blocks", "max_tokens", "dataset.tokens",
                "dataset.cache_dir")


# Keys of a real run's ranks that a simulated run takes and does not simulate (studies/validation.py
# gives its real and simulated runs the same threads_per_rank, which a CPU profile checks against its own).
NOT_SIMULATED = ("threads_per_rank", "compile", "device")


# Keys a run's record leaves out while unset (config/run.py to_dict): absent, they hold their default.
UNSET = {"compile": RunConfig.__dataclass_fields__["compile"].default}


def overrides(table: pd.DataFrame) -> pd.Series:
    """Each row's `key=value, ...` of the config keys that set it apart from other rows of the same
    named workload (WORKLOAD_COLUMNS): the simulated hardware (`backend/hardware=h100`), a model's
    shape under one name, another data file, compile, threads per rank; "" where its workload's
    rows agree. Before, `results compare` took such runs for repeats of one series."""
    out = pd.Series("", index=table.index, dtype=object)
    if table.empty or "config" not in table:
        return out
    parsed = configs(table).map(lambda c: {**UNSET, **c} if c else c)
    keys = [c for c in WORKLOAD_COLUMNS if c in table]
    for _, part in (table.groupby(keys, dropna=False) if keys else [(None, table)]):
        simulated = "backend" in part and (part["backend"] == "sim").all()
        out.loc[part.index] = differing(parsed.loc[part.index], NOT_WORKLOAD + (NOT_SIMULATED if simulated else ()))
    return out


def with_workload(table: pd.DataFrame) -> pd.DataFrame:
    """`table` with its workload columns read from its rows' configs (DERIVED: checkpointing and
    overrides); a table that has them already is returned as it is."""
    if set(DERIVED) <= set(table.columns):
        return table
    return table.assign(checkpointing=checkpointing(table), overrides=overrides(table))


def _options(table: pd.DataFrame, section: str, owner: str, skip: tuple[str, ...]) -> pd.Series:
    out = pd.Series("", index=table.index, dtype=object)
    if table.empty or "config" not in table:
        return out
    values = config_value(table, section).map(lambda v: v if isinstance(v, dict) else {})
    for _, part in table.groupby(owner, dropna=False):
        out.loc[part.index] = differing(values.loc[part.index], skip)
    return out


def engine_options(table: pd.DataFrame) -> pd.Series:
    """Each row's `key=value, ...` of its engine's options whose values differ between the table's
    runs of that engine (ODC with and without prefetch, over shm and over MPI, hybrid sharding over
    nodes of 2 and of 4 ranks), but the name, the series option (the variant) and the shard layout
    (layouts): series of their own, each run of the engine named with them."""
    named = tuple({spec.series_option for spec in ENGINES.values() if spec.series_option})
    return _options(table, "engine", "engine", ("name", "shard", *named))


def balancer_options(table: pd.DataFrame) -> pd.Series:
    """The same for a balancer's options (`options.equal_samples`), but its cost model, which the
    row's `cost_model` column names (with_cost_models)."""
    return _options(table, "balancer", "balancer", ("name", "cost_model", "quadratic_fit", "calibration"))


def with_cost_models(names: pd.Series, table: pd.DataFrame) -> pd.Series:
    """`names` (series names of the table's rows) with ` (cost model)` where one name ran under
    several cost models (`calibrated:tiny-cpu` and `linear`): series of their own."""
    if "cost_model" not in table:
        return names
    costs = table["cost_model"].fillna("none").astype(str)
    several = costs.groupby(names).transform("nunique") > 1
    return names.where(~several, names + " (" + costs + ")")


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
