"""Merging the runs.csv tables under some folders (local runs, SLURM sweeps, simulations) into
one tidy table for the figures: `python -m odc_bench.results collect DIR... [--out FILE]`.

A merged table is itself a results table (the same schema), so every results command and the
figures read it as they read a folder's."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from odc_bench.errors import TableError
from odc_bench.files import atomic_paths
from odc_bench.results.table import check_table, read_table, table_paths


def tables_under(paths: Sequence[Path]) -> list[Path]:
    """table_paths(paths), each checked to be a table of this schema."""
    found = table_paths(paths)
    for path in found:
        check_table(path)
    return found


def merged(tables: Sequence[Path], relative_to: Path | None = None, notes: list[str] | None = None) -> pd.DataFrame:
    """The rows of the tables, every repeat kept, ordered by time, then run and host; a run's
    `attempt` is its place among the run's rows across all of them. Trace paths are rewritten
    relative to `relative_to` (else made absolute). A row found again in another table is kept
    once (without_copies)."""
    frames = []
    for table_path in tables:
        frame = read_table(table_path)
        base = relative_to.resolve() if relative_to is not None else None
        frame["trace"] = [(os.path.relpath(table_path.parent / t, base) if base is not None
                           else str(table_path.parent / t)) if isinstance(t, str) and t else t
                          for t in frame["trace"]]
        frames.append(frame)
    frames = without_copies(frames, tables, notes)
    rows = pd.concat([f for f in frames if not f.empty] or frames, ignore_index=True)
    rows = rows.sort_values(["timestamp", "run_id", "host", "attempt"], kind="stable").reset_index(drop=True)
    rows["attempt"] = rows.groupby("run_id").cumcount()
    return rows


def without_copies(frames: Sequence[pd.DataFrame], tables: Sequence[Path],
                   notes: list[str] | None = None) -> list[pd.DataFrame]:
    """The tables' rows (`frames`, read from `tables`) without those an earlier table holds too: a
    copy of a results folder beside it, or a collected table given with the folders it came from,
    is one measurement, not a repeat. Rows are equal in every column but the trace's path and the
    attempt (a collected table numbers attempts across its folders). A table's own equal rows (the
    repeats of a simulated run, deterministic, within one second) stay as many as the table that
    has most of them holds. Each table that lost rows is named in `notes`."""
    if not frames:
        return []
    rows = pd.concat([f.assign(_table=i) for i, f in enumerate(frames)], ignore_index=True)
    same = [c for c in rows.columns if c not in ("trace", "attempt", "_table")]
    # The n-th of a table's rows equal to one another matches the n-th of another table's.
    nth = rows.groupby([*same, "_table"], dropna=False, sort=False).cumcount()
    copies = rows.assign(_nth=nth).duplicated([*same, "_nth"])
    kept = []
    for i, frame in enumerate(frames):
        mine = copies[rows["_table"] == i].to_numpy()
        if mine.any() and notes is not None:
            notes.append(f"{int(mine.sum())} row(s) of {tables[i]} are also in another table (a copy): each counted "
                         f"once")
        kept.append(frame.loc[~mine])
    return kept


def collect(paths: Sequence[Path], out: Path, notes: list[str] | None = None) -> pd.DataFrame:
    """Merge every runs.csv under `paths` into one table at `out` and out.parquet beside it,
    every row kept (repeats and failures too; a row found again in another table once, said in
    `notes`). TableError for a table that is not this schema's."""
    if out.suffix == ".parquet":
        raise TableError(f"--out {out} names the .parquet; give the CSV's path (the .parquet goes beside it)")
    rows = merged(tables_under(paths), relative_to=out.parent, notes=notes)
    # Together or not at all: a Ctrl-C between the two would leave an earlier collect's rows in one.
    with atomic_paths(out, out.with_suffix(".parquet")) as (csv, parquet):
        csv.write_text(rows.to_csv(index=False))
        rows.to_parquet(parquet, index=False)
    return rows
