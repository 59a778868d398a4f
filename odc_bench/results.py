"""The results table: one row per run, appended atomically; traces saved beside it.

Appends take an exclusive lock, rewrite the whole table to a temporary file in the same
directory and rename it over the old one, so a reader or a killed writer never sees half a
row. The table is small (one row per run), so rewriting it is cheap.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import pandas as pd

SCHEMA_VERSION = 1

# The tidy columns every row has, in order; the full resolved config rides along as JSON.
COLUMNS = [
    "run_id", "schema_version", "status", "error", "timestamp", "commit", "host",
    "backend", "engine", "balancer", "cost_model", "model", "dataset", "world_size", "minibatch_size",
    "num_minibatches", "warmup_minibatches", "max_tokens", "packing_ratio", "length_scale",
    "precision", "seed", "samples_per_s", "tokens_per_s", "bubble_rate", "predicted_bubble_rate",
    "compute_s", "sync_s", "peak_mem_mb", "heap_mb", "wall_s", "loss_first", "loss_last",
    "trace", "config",
]


def run_key(config: Mapping) -> str:
    """A stable hash of the resolved config, minus where results go."""
    keyed = {k: v for k, v in config.items() if k not in {"results_dir", "hydra"}}
    blob = json.dumps(keyed, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(path.suffix + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def read_table(path: Path) -> pd.DataFrame:
    if not path.exists():
        return pd.DataFrame(columns=COLUMNS)
    return pd.read_csv(path)


def append_row(path: Path, row: Mapping) -> None:
    """Append one run's row to the table at `path` (a runs.csv), atomically."""
    unknown = set(row) - set(COLUMNS)
    if unknown:
        raise ValueError(f"row has columns outside the schema: {sorted(unknown)}")
    with _locked(path):
        table = read_table(path)
        new = pd.DataFrame([{c: row.get(c) for c in COLUMNS}], columns=COLUMNS)
        table = new if table.empty else pd.concat([table, new], ignore_index=True)
        atomic_write_text(path, table.to_csv(index=False))


def write_trace(path: Path, events: list[dict]) -> None:
    write_trace_frame(path, pd.DataFrame(events))


def write_trace_frame(path: Path, events: pd.DataFrame) -> None:
    atomic_write_text(path, events.to_csv(index=False))


def completed_keys(path: Path) -> set[str]:
    """Run keys that already have a successful row: a re-run sweep skips them."""
    table = read_table(path)
    if table.empty:
        return set()
    return set(table.loc[table["status"] == "ok", "run_id"].astype(str))
