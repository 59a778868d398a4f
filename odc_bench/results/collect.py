"""Merging the runs.csv tables under some folders (local runs, SLURM sweeps, simulations) into
one tidy table for the figures: `python -m odc_bench.results collect DIR... [--out FILE]`."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from odc_bench.files import atomic_path, atomic_write_text
from odc_bench.results.table import read_table


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
