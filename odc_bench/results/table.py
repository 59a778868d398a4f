"""The results table: one row per run, appended atomically; traces saved beside it, gzipped.

Appends take an exclusive lock, rewrite the whole table to a temporary file in the same
directory and rename it over the old one, so a reader or a killed writer never sees half a
row. The table is small (one row per run), so rewriting it is cheap.
"""

from __future__ import annotations

import gzip
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.csv as pa_csv

from odc_bench.config.fields import require
from odc_bench.errors import ConfigError, TableError
from odc_bench.files import (
    atomic_path,
    atomic_write_text,
    filesystem_of,
    folder_problem,
    locked,
    locks_fail,
    stale_temporaries,
)
from odc_bench.record.schema import COLUMNS, SCHEMA_VERSION, TEXT_COLUMNS


def some_of(names: Sequence[str], shown: int = 4) -> str:
    """The first `shown` names, and how many more: a list in a one-line error."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def table_paths(paths: Sequence[Path]) -> list[Path]:
    """Every runs.csv below the folders, and the tables named (a merged table may have any name),
    each once, in one order whatever the arguments' order; TableError when there is none."""
    found = {(p if p.is_file() else q).resolve() for p in map(Path, paths)
             for q in ([p] if p.is_file() else p.rglob("runs.csv"))}
    if not found:
        raise TableError(f"no runs.csv under {', '.join(map(str, paths))}; give the folders that hold the "
                         f"results (results_dir) or a table that `results collect` wrote")
    return sorted(found)


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
    earlier = {str(v) for v in range(1, SCHEMA_VERSION)}
    older = set(table["schema_version"].dropna()) & earlier if "schema_version" in table else set()
    if older:
        raise TableError(f"{path} holds rows of results schema {', '.join(sorted(older))}, this code writes "
                         f"{SCHEMA_VERSION}; bring it to this schema with `python -m odc_bench.results migrate "
                         f"{path}`, or {fix}")
    if list(table.columns) != COLUMNS:
        missing = [c for c in COLUMNS if c not in table.columns]
        extra = [str(c) for c in table.columns if c not in COLUMNS]
        diff = "; ".join(part for part in (f"missing {some_of(missing)}" if missing else "",
                                           f"unexpected {some_of(extra)}" if extra else "") if part)
        # A spreadsheet's edits: a column added (which migrate refuses to drop), or the columns
        # reordered (which migrate puts back in order).
        undo = ("remove the column(s) it added (keep them in a file of your own), or " if extra and not missing else
                f"put them back in order with `python -m odc_bench.results migrate {path}`, or " if not diff else "")
        raise TableError(f"{path} does not have the columns of results schema version {SCHEMA_VERSION} "
                         f"({diff or 'same columns in another order'}); {undo}{fix}")
    if (header := repeated_header(table)) is not None:
        raise TableError(f"{path}: {header}")
    versions = set(table["schema_version"].dropna())
    if versions - {str(SCHEMA_VERSION)}:
        raise TableError(f"{path} holds rows of schema_version {', '.join(sorted(versions))}, this code writes "
                         f"{SCHEMA_VERSION}; {fix}")
    if (text := text_in_numbers(table)) is not None:
        raise TableError(f"{path}: {text}; correct or remove that row, or {fix}")


def repeated_header(table: pd.DataFrame) -> str | None:
    """Where the table holds its header again as a row, as tables joined with `cat` do, said with
    what to do, or None: read on, that row was one of a schema named "schema_version"."""
    header = pd.Series(table.columns.astype(str), index=table.columns)
    rows = table.index[table.astype(str).eq(header, axis=1).all(axis=1)]
    if not len(rows):
        return None
    return (f"it holds its header again as its row {int(rows[0]) + 1} (after the header), as tables joined with cat "
            f"do; merge tables with `python -m odc_bench.results collect DIR... --out FILE`, or remove that line")


def text_in_numbers(table: pd.DataFrame) -> str | None:
    """Where a column of numbers holds text (a table edited by hand, a cell cut short), said with
    its row's run_id, or None: read on, it failed the results commands in a TypeError traceback."""
    for column in (c for c in COLUMNS if c not in TEXT_COLUMNS and c in table):
        values = table[column]
        if pd.api.types.is_numeric_dtype(values):
            continue
        bad = values[pd.to_numeric(values, errors="coerce").isna() & values.notna()]
        if not bad.empty:
            run = table.loc[bad.index[0], "run_id"] if "run_id" in table else bad.index[0]
            return f"the row of run {run} holds {bad.iloc[0]!r} in column {column}, which holds numbers"
    return None


def check_results_dir(results_dir: Path) -> None:
    """Refuse a results folder that cannot take a run's row, before any rank starts.

    A table of another schema is refused rather than appended to: pandas would align the
    columns it can and leave the rest empty, and the figures would read garbage.
    """
    problem = folder_problem(results_dir)
    if problem is not None:
        raise ConfigError(f"results_dir {results_dir} {problem[0]}; set results_dir to {problem[1]}")
    # Commands and SLURM tasks append to one table, and a run is claimed against a second command
    # running it, under file locks: without them rows would be lost, so no run starts.
    if (why := locks_fail(results_dir)) is not None:
        fs = filesystem_of(results_dir)
        on = f" on {fs[0]} ({fs[1]})" if fs is not None else ""
        raise ConfigError(f"results_dir {results_dir} is{on} where file locks fail ({why}), which the harness "
                          f"takes to keep the writers of one results table apart; set results_dir to a folder on a "
                          f"file system with locks (a local disk, Lustre mounted with -o flock, NFS with its lock "
                          f"daemon)")
    traces = results_dir / "traces"
    require(not traces.exists() or traces.is_dir(), f"{traces} is not a directory; move it away or set "
            f"results_dir to another folder")
    check_table(results_dir / "runs.csv")


# Every text column read as text (record/schema.py): pandas would read text that looks like a number
# as one ("310e538" is inf, "0123456" loses its 0), and append_row would write it back so.
TEXT_DTYPES = dict.fromkeys(TEXT_COLUMNS, str)


def read_csv(path: Path, dtype: Mapping[str, object] = TEXT_DTYPES) -> pd.DataFrame:
    """A results table as it was written: the `dtype` columns as text, in which only an empty
    cell is missing. pandas takes NA, null, None, nan and its other missing-value words for
    missing in every column, so a model or dataset named NA read as missing, and an append or a
    migration wrote it back empty; the numeric columns keep pandas' words."""
    from pandas._libs.parsers import STR_NA_VALUES  # pandas' own list of those words

    header = pd.read_csv(path, nrows=0).columns
    missing = {c: [""] if c in dtype else sorted(STR_NA_VALUES) for c in header}
    return pd.read_csv(path, dtype=dtype, keep_default_na=False, na_values=missing)


def read_table(path: Path) -> pd.DataFrame:
    if not path.exists():
        return pd.DataFrame(columns=COLUMNS)
    return read_csv(path)


def append_row(path: Path, row: Mapping) -> int:
    """Append one run's row to the table at `path` (a runs.csv), atomically; return its attempt:
    how many rows of the same run (the same run_id) the table held before it."""
    unknown = set(row) - set(COLUMNS)
    if unknown:
        raise ValueError(f"row has columns outside the schema: {sorted(unknown)}")
    with locked(path):
        for stale in stale_temporaries(path):  # under the lock no append is live: these are leftovers
            stale.unlink(missing_ok=True)
        check_table(path)
        table = read_table(path)
        attempt = int((table["run_id"].astype(str) == str(row["run_id"])).sum()) if not table.empty else 0
        new = pd.DataFrame([{**{c: row.get(c) for c in COLUMNS}, "attempt": attempt}], columns=COLUMNS)
        table = new if table.empty else pd.concat([table, new], ignore_index=True)
        atomic_write_text(path, table.to_csv(index=False))
    return attempt


def append_rows(path: Path, rows: Sequence[Mapping], columns: Sequence[str]) -> None:
    """Append rows to a table with its own schema (e.g. primitives.csv), atomically, all or none."""
    for row in rows:
        if set(row) != set(columns):
            raise ValueError(f"row columns {sorted(row)} differ from the table's {sorted(columns)}")
    with locked(path):
        # Read as text, every column: the rows already there are written back as they were (a
        # commit hash of digits keeps its leading zero, a run_id like 1e23... stays an id).
        table = (pd.read_csv(path, dtype=str, keep_default_na=False) if path.exists()
                 else pd.DataFrame(columns=columns))
        new = pd.DataFrame([{c: row[c] for c in columns} for row in rows], columns=columns)
        table = new if table.empty else pd.concat([table, new], ignore_index=True)
        atomic_write_text(path, table.to_csv(index=False))


# A trace is a CSV stored gzipped (traces/<run_id>.csv.gz), so that committed results stay small
# (results/README.md); pandas reads it as a CSV by its name, so every reader of a row's `trace`
# path reads it unchanged.
TRACE_SUFFIX = ".csv.gz"


# Level 6: as small as 9 on traces (their nanosecond times are what does not compress) and four
# times as fast.
GZIP_LEVEL = 6


def compressed(csv: bytes) -> bytes:
    """A CSV's bytes gzipped without a timestamp or file name, so the same trace gives the same
    file (a committed trace written again is no change)."""
    return gzip.compress(csv, compresslevel=GZIP_LEVEL, mtime=0)


def write_trace(path: Path, events: pd.DataFrame) -> None:
    """The run's events at `path` (a TRACE_SUFFIX name), atomically, gzipped as compressed() does.

    Arrow's CSV writer, not pandas': a simulated run at paper scale has millions of events, and
    pandas spent most of such a run formatting their times (docs/simulator.md, "Speed"). Its CSV
    reads back into the same frame; it quotes text and writes whole floats without ".0"."""
    # A trace has one writer, its run (a sweep never runs one config twice at once), so
    # temporaries of the same name were left by a killed attempt at this run.
    for stale in stale_temporaries(path):
        stale.unlink(missing_ok=True)
    # Arrow wants one type a column; a column of Python objects is written as pandas would, as text.
    text = {c: "string" for c in events.columns if events[c].dtype == object}
    table = pa.Table.from_pandas(events.astype(text), preserve_index=False)
    with atomic_path(path) as tmp, open(tmp, "wb") as raw, \
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=GZIP_LEVEL, mtime=0) as out:
        pa_csv.write_csv(table, out, write_options=pa_csv.WriteOptions(quoting_style="needed"))


def ok_runs(path: Path) -> dict[str, int]:
    """How many successful rows each run key has: a re-run sweep runs a config only until it
    has `repeat` of them."""
    check_table(path)
    table = read_table(path)
    if table.empty:
        return {}
    return {str(k): int(n) for k, n in table.loc[table["status"] == "ok", "run_id"].value_counts().items()}
