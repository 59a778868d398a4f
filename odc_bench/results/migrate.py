"""Bring runs.csv tables of an earlier schema to this one: `python -m odc_bench.results migrate PATH...`.

Schema 1 -> 2 adds `attempt` (the row's place among its run's rows, in file order), the
lengths that ran (`samples`, `len_mean`, `len_p50`, `len_p99`, `len_max`) and the memory
estimate and limit (`mem_estimate_mb`, `mem_limit_mb`). The lengths and the estimate are
recomputed from the row's own config (planning it again, which reads its dataset); a row
whose config no longer plans (a retired engine, data that has moved) keeps them empty, and so
does the limit of a real run, which depended on the host it ran on. Every other value is kept.

Schema 2 -> 3 adds `resumed_from` and `requeues` (checkpoints, docs/checkpoints.md): 0 for
every earlier row, since no run could resume before; and the series columns `variant`, `shard`,
`fetch` and `staleness` (record/row.py series_columns), read here, once, from the row's config
text, with what rows written before each key existed ran with: collective FSDP on the default
group (gloo on CPU), ODC synchronous, full sharding, shards fetched from their owners.

Schema 3 -> 4 adds `mfu` (model FLOPs utilisation, record/row.py), empty for earlier rows: a
simulated row gets it by running again (seconds), a real one never had a stated peak.

Schema 4 -> 5 keys every run by its whole config (plan/identity.py). Before, keys added to the
config after rows were recorded were left out of the key while they held the value those rows
had, so that the rows kept their keys; keys added without that care left rows with keys no
config had any more, which a re-run sweep ran again. A row whose config, planned again, draws
the lengths the row recorded (`samples`, `len_*`) now gets the key of its config, and a re-run
sweep skips it; a row whose config no longer plans, or plans other lengths (a profile refitted
since, data that changed), or that never recorded its own lengths (schema 1), keeps its key,
which no config has, so a re-run measures it again. `attempt` is counted again over the new keys.

Schema 5 -> 6 adds `attention`, the attention kernel the ranks ran (models/attention.py):
sdpa_per_doc for every earlier real run (one SDPA call per document was the only kernel there
was), empty for simulated rows.

Schema 6 -> 7 stores traces gzipped: a row's trace `traces/X.csv` becomes `traces/X.csv.gz`,
the same bytes compressed (results/table.py's `compressed`), and the .csv is removed once the
table names the .csv.gz. A trace that is missing stays named as it was.

Within schema 7, since 2026-12-06, the key of a run of real data (dataset=jsonl or hf_disk)
hashes the samples it draws too, and no key hashes timeout_s or deadline_s (plan/identity.py):
such a row (real data, or those limits at other values than config.yaml's), of any schema from
2, gets the key of its config where planning it again draws the lengths the row recorded, as in
4 -> 5; where the data changed since, the row keeps its key and a re-run measures the run again.

Within schema 7, since 2026-12-07, the key of a run whose balancer plans with the calibrated
cost model hashes the model's coefficients too, and that of a simulated run of a fitted
hardware profile what the fit holds (plan/identity.py). A row of the calibrated cost model gets
the key of its config where planning it again draws the lengths the row recorded and predicts
the bubble rate it recorded (the plans the calibration then gives are the row's); else, and
for a simulated row of a fitted profile, whose fit no column of the row shows, it keeps its
key, and a re-run measures the run again.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from odc_bench.config.engine import ENGINES
from odc_bench.config.run import run_config
from odc_bench.errors import ConfigError, TableError
from odc_bench.files import atomic_path, atomic_write_text, locked
from odc_bench.plan.identity import GUARDS, REAL_LOADERS
from odc_bench.plan.spec import RunSpec, resolve
from odc_bench.provenance import REPO_ROOT
from odc_bench.record.row import MB
from odc_bench.record.schema import COLUMNS, SCHEMA_VERSION
from odc_bench.results.table import TEXT_DTYPES, TRACE_SUFFIX, compressed, read_csv, repeated_header, table_paths

HARDWARE_DIR = REPO_ROOT / "odc_bench" / "conf" / "backend" / "hardware"


def _with_hardware_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """A simulated row's hardware profile with the keys it gained since (from the profile's file)."""
    hardware = config.get("backend", {}).get("hardware")
    if isinstance(hardware, dict) and (HARDWARE_DIR / f"{hardware.get('name')}.yaml").is_file():
        current = yaml.safe_load((HARDWARE_DIR / f"{hardware['name']}.yaml").read_text())
        config["backend"]["hardware"] = {**current, **hardware}
    return config


def _planned(config_yaml: object) -> RunSpec | None:
    """The row's config planned again; None when it no longer plans."""
    try:
        return resolve(run_config(_with_hardware_defaults(yaml.safe_load(str(config_yaml)) or {})))
    except (ConfigError, ValueError, TypeError, KeyError):
        return None


def _recomputed(config_yaml: object) -> dict[str, float | None]:
    """What schema 2 adds that the row's config determines; empty when it no longer plans."""
    spec = _planned(config_yaml)
    if spec is None:
        return {}
    config = spec.config
    limit = spec.memory_limit if config.simulated else None
    return {**spec.length_stats(), "mem_estimate_mb": spec.memory.total / MB,
            "mem_limit_mb": limit / MB if limit is not None else None}


def series_from_config(engine: object, backend: object, config_yaml: object) -> tuple[str, str, str, int]:
    """(variant, shard, fetch, staleness) of a row written before schema 3, from its config."""
    record = ENGINES.get(str(engine))
    config = yaml.safe_load(str(config_yaml)) if isinstance(config_yaml, str) else {}
    options = (config or {}).get("engine") or {}
    variant = ""
    if record is not None and record.series_option and isinstance(config_yaml, str):
        variant = str(options.get(record.series_option, record.series_preference[-1]))
    on_demand = record is not None and record.simulated_as == "odc"
    fetch = ((config or {}).get("backend") or {}).get("odc_fetch", "owner") if backend == "sim" else "owner"
    return variant, str(options.get("shard", "full")), fetch if on_demand else "", int(options.get("staleness", 0))


def migrate_table(path: Path) -> int:
    """Rewrite one runs.csv in this schema, atomically; return how many rows changed."""
    with locked(path):
        table = read_csv(path, {**TEXT_DTYPES, "schema_version": str})
        if (header := repeated_header(table)) is not None:
            raise TableError(f"{path}: {header}")
        # Every schema since 1 only added columns: one outside this schema's was added by hand,
        # and the rewrite below, to this schema's columns, dropped it without a word.
        if foreign := [str(c) for c in table.columns if c not in COLUMNS]:
            raise TableError(f"{path} has the column(s) {', '.join(foreign)}, which no schema of the results table "
                             f"holds: migrating would drop them; keep them in a file of your own, remove them from "
                             f"the table, then migrate it")
        versions = set(table["schema_version"].dropna()) if "schema_version" in table else set()
        current = versions <= {str(SCHEMA_VERSION)} and list(table.columns) == COLUMNS
        rekeyable = pd.Series([_keyed_otherwise_before(c) for c in table["config"]], index=table.index, dtype=bool) \
            if "config" in table else pd.Series(False, index=table.index)
        if current and not rekeyable.any():
            return 0
        if versions - {"1", "2", "3", "4", "5", "6", str(SCHEMA_VERSION)}:
            raise TableError(f"{path} holds rows of schema_version {', '.join(sorted(versions))}; this code "
                             f"migrates schemas 1 to 6")
        old = table["schema_version"] == "1" if "schema_version" in table else pd.Series(True, index=table.index)
        keyed_before = ~old & (~table["schema_version"].isin(["5", "6", str(SCHEMA_VERSION)]) | rekeyable) \
            if "schema_version" in table else ~old
        if keyed_before.any():
            keys = _rekeyed(table.loc[keyed_before])
            if current and list(table.loc[keyed_before, "run_id"]) == keys:
                return 0
            table.loc[keyed_before, "run_id"] = keys
            table["attempt"] = table.groupby("run_id").cumcount()
        if old.any():
            added = pd.DataFrame([_recomputed(c) for c in table.loc[old, "config"]], index=table.index[old])
            for column in added.columns:
                table.loc[old, column] = added[column]
            table["attempt"] = table.groupby("run_id").cumcount()
        for column in ("resumed_from", "requeues"):
            table[column] = table[column].fillna(0).astype(int) if column in table else 0
        if not {"variant", "shard", "fetch", "staleness"} <= set(table.columns):
            derived = pd.DataFrame([series_from_config(e, b, c) for e, b, c in zip(table["engine"], table["backend"],
                                                                          table["config"], strict=True)],
                                   index=table.index, columns=["variant", "shard", "fetch", "staleness"])
            for column in derived.columns:
                table[column] = derived[column]
        if "attention" not in table:
            table["attention"] = ["" if backend == "sim" else "sdpa_per_doc" for backend in table["backend"]]
        table["trace"], replaced = _compressed_traces(path.parent, table["trace"])
        table["schema_version"] = SCHEMA_VERSION
        atomic_write_text(path, table.reindex(columns=COLUMNS).to_csv(index=False))
        for trace in replaced:  # only now that the table names their compressed copies
            trace.unlink()
    return len(table)


def _compressed_traces(folder: Path, traces: pd.Series) -> tuple[list[object], list[Path]]:
    """Each row's trace named as schema 7 stores it, a .csv written compressed beside itself
    (schema 6 -> 7); and the .csv files that the compressed ones replace."""
    names: list[object] = []
    replaced: list[Path] = []
    for trace in traces:
        if not (isinstance(trace, str) and trace.endswith(".csv")):
            names.append(trace)
            continue
        named = trace.removesuffix(".csv") + TRACE_SUFFIX
        csv, gz = folder / trace, folder / named
        if csv.is_file() and csv not in replaced:
            with atomic_path(gz) as tmp:
                tmp.write_bytes(compressed(csv.read_bytes()))
            replaced.append(csv)
        names.append(named if gz.is_file() else trace)
    return names, replaced


def _keyed_otherwise_before(config_yaml: object) -> bool:
    """Whether a row's key may be one its config no longer has since 2026-12-06: it draws from a
    real source, whose samples the key hashes now, has limits the key no longer hashes, or plans
    with the calibrated cost model, whose coefficients the key hashes now."""
    try:
        config = yaml.safe_load(str(config_yaml)) if isinstance(config_yaml, str) else None
    except yaml.YAMLError:
        return False
    if not isinstance(config, dict):
        return False
    dataset = config.get("dataset")
    real = isinstance(dataset, dict) and dataset.get("loader") in REAL_LOADERS
    balancer = config.get("balancer")
    real = real or (isinstance(balancer, dict) and balancer.get("cost_model") == "calibrated")
    # as the key's JSON writes them: 120.0 was keyed apart from 120
    return real or any(key in config and json.dumps(config[key]) != json.dumps(value) for key, value in GUARDS.items())


def _rekeyed(rows: pd.DataFrame) -> list[str]:
    """Each row's key under its config now, where planning the config again draws the lengths
    the row recorded (and, with the calibrated cost model, predicts the bubble rate it recorded);
    its own key elsewhere (schema 4 -> 5, and rows of real data or calibrated plans since)."""
    lengths = ["samples", "len_mean", "len_p50", "len_p99", "len_max"]
    planned: dict[str, tuple[str, dict[str, float]] | None] = {}
    keys = []
    for _, row in rows.iterrows():
        text = str(row["config"])
        if text not in planned:
            spec = _planned(text) if isinstance(row["config"], str) else None
            planned[text] = None if spec is None else (spec.run_id, {
                **spec.length_stats(),
                **({"predicted_bubble_rate": spec.predicted_bubble_rate()}
                   if spec.config.balancer.cost_model == "calibrated" else {})})
        found = planned[text]
        same = found is not None and all(math.isclose(float(found[1][c]), float(row[c]), rel_tol=1e-9)
                                         for c in (*lengths, "predicted_bubble_rate") if c in found[1])
        keys.append(found[0] if found is not None and same else str(row["run_id"]))
    return keys


def migrate(paths: list[Path]) -> dict[Path, int]:
    """Every table table_paths() finds, migrated: rows changed per table."""
    return {path: migrate_table(path) for path in table_paths(paths)}
