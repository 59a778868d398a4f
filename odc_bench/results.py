"""The results table: one row per run, appended atomically; traces saved beside it.

Appends take an exclusive lock, rewrite the whole table to a temporary file in the same
directory and rename it over the old one, so a reader or a killed writer never sees half a
row. The table is small (one row per run), so rewriting it is cheap.

`python -m odc_bench.results collect DIR... [--out FILE]` merges the tables under some
directories (local runs, SLURM sweeps, simulations) into one tidy table for the figures;
`compare DIR...` prints every series beside the collective baseline (what `make demo` shows)
and `pairs DIR...` reads a control sweep's back-to-back runs pair by pair (odc_bench.pairs).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pandas as pd
import yaml

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


class TableError(ValueError):
    """A runs.csv this code must not append to: the message is one line naming it and the fix."""


def _some(names: Sequence[str], shown: int = 4) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def check_table(path: Path) -> None:
    """Refuse a runs.csv that is not this schema's: appending would misalign or mix rows."""
    if not path.exists():
        return
    fix = "move it away or set results_dir to another folder"
    if not path.is_file():
        raise TableError(f"{path} is not a file; {fix}")
    try:
        table = pd.read_csv(path, dtype={"schema_version": str})
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TableError(f"{path} is not a readable results table ({reason}); {fix}") from None
    if list(table.columns) != COLUMNS:
        missing = [c for c in COLUMNS if c not in table.columns]
        extra = [str(c) for c in table.columns if c not in COLUMNS]
        diff = "; ".join(part for part in (f"missing {_some(missing)}" if missing else "",
                                           f"unexpected {_some(extra)}" if extra else "") if part)
        raise TableError(f"{path} does not have the columns of results schema version {SCHEMA_VERSION} "
                         f"({diff or 'same columns in another order'}); {fix}")
    versions = set(table["schema_version"].dropna())
    if versions - {str(SCHEMA_VERSION)}:
        raise TableError(f"{path} holds rows of schema_version {', '.join(sorted(versions))}, this code writes "
                         f"{SCHEMA_VERSION}; {fix}")


def run_key(config: Mapping) -> str:
    """A stable hash of the resolved config, minus where results go."""
    keyed = {k: v for k, v in config.items() if k not in {"results_dir", "hydra"}}
    blob = json.dumps(keyed, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def process_groups(table: pd.DataFrame) -> pd.Series:
    """The process group each real collective row's FSDP2 ran on ("" for ODC and simulated rows).

    Part of what a series is: FSDP2 over shared memory and over gloo are different baselines
    (docs/odc_engine.md, "A fair baseline on CPU"). Rows written before `engine.backend`
    existed ran on the default group, gloo on CPU.
    """
    def group(row: pd.Series) -> str:
        config = row.get("config")
        if row["engine"] != "collective" or row["backend"] == "sim" or not isinstance(config, str):
            return ""
        return str((yaml.safe_load(config) or {}).get("engine", {}).get("backend", "gloo"))

    if table.empty:
        return pd.Series(dtype=str, index=table.index)
    return table.apply(group, axis=1).astype(str)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(path.suffix + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _stale_temporaries(path: Path) -> list[Path]:
    """Temporary files a writer of `path` killed mid-write left behind (see atomic_path)."""
    return list(path.parent.glob(f".{path.name}.*.tmp"))


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary file beside `path` to write; it replaces `path` only when the block succeeds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        # mkstemp makes the file private; give it the mode a plain open() would (results are shared)
        os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~_umask())
        yield Path(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


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
        for stale in _stale_temporaries(path):  # under the lock no append is live: these are leftovers
            stale.unlink(missing_ok=True)
        check_table(path)
        table = read_table(path)
        new = pd.DataFrame([{c: row.get(c) for c in COLUMNS}], columns=COLUMNS)
        table = new if table.empty else pd.concat([table, new], ignore_index=True)
        atomic_write_text(path, table.to_csv(index=False))


def append_rows(path: Path, rows: Sequence[Mapping], columns: Sequence[str]) -> None:
    """Append rows to a table with its own schema (e.g. primitives.csv), atomically, all or none."""
    for row in rows:
        if set(row) != set(columns):
            raise ValueError(f"row columns {sorted(row)} differ from the table's {sorted(columns)}")
    with _locked(path):
        table = pd.read_csv(path) if path.exists() else pd.DataFrame(columns=columns)
        new = pd.DataFrame([{c: row[c] for c in columns} for row in rows], columns=columns)
        table = new if table.empty else pd.concat([table, new], ignore_index=True)
        atomic_write_text(path, table.to_csv(index=False))


def write_trace(path: Path, events: list[dict]) -> None:
    write_trace_frame(path, pd.DataFrame(events))


def write_trace_frame(path: Path, events: pd.DataFrame) -> None:
    # A trace has one writer, its run (a sweep never runs one config twice at once), so
    # temporaries of the same name were left by a killed attempt at this run.
    for stale in _stale_temporaries(path):
        stale.unlink(missing_ok=True)
    atomic_write_text(path, events.to_csv(index=False))


def completed_keys(path: Path) -> set[str]:
    """Run keys that already have a successful row: a re-run sweep skips them."""
    check_table(path)
    table = read_table(path)
    if table.empty:
        return set()
    return set(table.loc[table["status"] == "ok", "run_id"].astype(str))


def collect(dirs: Sequence[Path], out: Path) -> pd.DataFrame:
    """Merge every runs.csv under `dirs` into one table at `out` (and out.parquet with pyarrow).

    One row per run_id: its latest ok row, or its latest row when it never succeeded (so
    failures stay visible). Trace paths are rewritten relative to `out`'s folder.
    """
    frames = []
    for table_path in sorted({p.resolve() for d in dirs for p in Path(d).rglob("runs.csv")}):
        frame = read_table(table_path)
        if "trace" in frame:
            frame["trace"] = [os.path.relpath(table_path.parent / t, out.parent.resolve()) if isinstance(t, str) else t
                              for t in frame["trace"]]
        frames.append(frame)
    if not frames:
        raise FileNotFoundError(f"no runs.csv under {', '.join(map(str, dirs))}")
    rows = pd.concat([f for f in frames if not f.empty] or frames, ignore_index=True)
    rows["_ok"] = rows["status"] == "ok"
    rows = rows.sort_values(["_ok", "timestamp"], kind="stable").drop_duplicates("run_id", keep="last")
    rows = rows.drop(columns="_ok").sort_values("timestamp", kind="stable").reset_index(drop=True)
    atomic_write_text(out, rows.to_csv(index=False))
    if importlib.util.find_spec("pyarrow") is not None:
        with atomic_path(out.with_suffix(".parquet")) as tmp:
            rows.to_parquet(tmp, index=False)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m odc_bench.results", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    col = commands.add_parser("collect", help="merge runs.csv tables (searched recursively) into one tidy table")
    col.add_argument("dirs", nargs="+", type=Path, metavar="DIR")
    col.add_argument("--out", type=Path, default=Path("results/collected.csv"),
                     help="the merged CSV (default: %(default)s); a .parquet beside it when pyarrow is installed")
    cmp = commands.add_parser("compare", help="print every series of a table beside the collective baseline")
    cmp.add_argument("dirs", nargs="+", type=Path, metavar="DIR")
    par = commands.add_parser("pairs", help="one engine against another, run by run within each results folder: "
                              "the median ratio and its 95%% interval")
    par.add_argument("dirs", nargs="+", type=Path, metavar="DIR")
    par.add_argument("--engine", default="odc", help="the numerator series (default: %(default)s)")
    par.add_argument("--baseline", default="collective",
                     help="the denominator series; collective[shm] names FSDP2's process group (default: %(default)s)")
    args = parser.parse_args(argv)
    missing = [str(d) for d in args.dirs if not d.is_dir()]
    if missing:
        print(f"odc_bench.results: error: not a directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    if args.command == "collect":
        try:
            rows = collect(args.dirs, args.out)
        except FileNotFoundError as e:
            print(f"odc_bench.results: error: {e}; give the folders that hold the results (results_dir)",
                  file=sys.stderr)
            return 2
        ok = int((rows["status"] == "ok").sum())
        print(f"{len(rows)} runs ({ok} ok) -> {args.out}")
        return 0
    tables = {str(p.parent): read_table(p) for d in args.dirs for p in sorted(d.rglob("runs.csv"))}
    if args.command == "compare":
        from odc_bench.compare import comparison, print_comparison

        print_comparison(comparison(pd.concat(tables.values(), ignore_index=True)) if tables else pd.DataFrame())
        return 0
    from odc_bench.pairs import PairingError, paired_ratios, print_pairs

    try:
        pairs = paired_ratios(tables, args.engine, args.baseline)
    except PairingError as e:
        print(f"odc_bench.results: error: {e}", file=sys.stderr)
        return 2
    print_pairs(pairs, args.engine, args.baseline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
