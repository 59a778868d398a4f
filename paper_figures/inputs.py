"""Find and read the results tables the figures are drawn from.

A results root (default `results/`) holds one folder per experiment (`cpu/`, `sim_paper/`,
`primitives_cpu/`, ...), which may keep its runs in subfolders (one per sweep run, as
`cpu_balanced/run_a/`). Every `runs.csv` and `primitives.csv` below the root is read and its
rows tagged with `source`, the experiment folder's name. A source is one coherent experiment
(one machine, one backend), so figures that plot absolute numbers draw each source separately
instead of mixing paper-scale simulation with CPU runs: one set of figures per experiment.

`local/` directly under the root is the scratch output of ad-hoc runs (not committed) and is
left out, unless the root is that folder itself. The root may also be one table, such as the
one `python -m odc_bench.results collect` writes: it is then the one source. Repeats of a
config (its rows' `attempt`) are kept, and figures average them. Runs of engines the engine registry does not
know (diagnostics since retired) are left out with a note. Real datasets' lengths for Fig. 7 are
`*.npy` files in a `lengths/` folder anywhere below the root, or given on the command line in any
format the what-if reads (odc_bench.data.real.read_lengths), each named for its data.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from odc_bench.data.real import UnusedFieldError, source_name
from odc_bench.data.real import read_lengths as read_source
from odc_bench.results.series import in_layout, known_engines, layouts, with_workload
from odc_bench.results.table import read_csv, repeated_header, text_in_numbers

SCRATCH = "local"
# Columns the figures cannot do without; a table lacking any is left out with a note.
RUN_COLUMNS = ["run_id", "status", "backend", "engine", "balancer", "model", "dataset", "world_size",
               "minibatch_size", "max_tokens", "packing_ratio", "length_scale", "samples_per_s"]
PRIMITIVE_COLUMNS = ["op", "transport", "world_size", "size_bytes", "bandwidth_gbps"]


class Skip(Exception):
    """A figure (or one source's version of it) cannot be drawn: the message says why."""


@dataclass
class Inputs:
    root: Path
    runs: pd.DataFrame = field(default_factory=pd.DataFrame)
    primitives: pd.DataFrame = field(default_factory=pd.DataFrame)
    lengths: dict[str, np.ndarray] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _source_name(root: Path, folder: Path) -> str:
    """The experiment a table belongs to: its first folder below the root (the root's own name
    for a table at the root; a collected table's name when the root is that table)."""
    if root.is_file():
        return root.stem
    rel = folder.relative_to(root)
    return rel.parts[0] if rel.parts else root.resolve().name


def _tables(root: Path, filename: str) -> list[Path]:
    if root.is_file():  # one table, what `python -m odc_bench.results collect` wrote
        return [root] if filename == "runs.csv" else []
    found = []
    for path in sorted(root.rglob(filename)):
        rel = path.relative_to(root)
        if len(rel.parts) > 1 and rel.parts[0] == SCRATCH:
            continue
        found.append(path)
    return found


def _read(path: Path, required: list[str], notes: list[str]) -> pd.DataFrame | None:
    table = read_csv(path)  # as the harness reads it: a model named 0007 stays 0007, one named NA stays NA
    missing = [c for c in required if c not in table]
    if missing:
        notes.append(f"{path} left out: it lacks the column(s) {', '.join(missing)}")
        return None
    if (text := repeated_header(table) or text_in_numbers(table)) is not None:
        notes.append(f"{path} left out: {text}")
        return None
    return table if not table.empty else None


def read_runs(root: Path, notes: list[str]) -> pd.DataFrame:
    """Every successful run row below `root`, with `source` and `table_dir` (to find traces)."""
    frames = []
    for path in _tables(root, "runs.csv"):
        table = _read(path, RUN_COLUMNS, notes)
        if table is None:
            continue
        failed = int((table["status"] != "ok").sum())
        if failed:
            notes.append(f"{path}: {failed} failed run(s) left out")
        # Repeats of one config (one run key, several attempts) are kept: figures average them.
        keys = ["run_id", "attempt"] if "attempt" in table else ["run_id"]
        table = table[table["status"] == "ok"].drop_duplicates(keys, keep="last")
        table, other = known_engines(table)
        if other:
            notes.append(f"{path}: runs of engine(s) {', '.join(other)} left out (not an engine of this harness)")
        frames.append(with_workload(table).assign(source=_source_name(root, path.parent), table_dir=str(path.parent)))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def read_primitives(root: Path, notes: list[str]) -> pd.DataFrame:
    frames = []
    for path in _tables(root, "primitives.csv"):
        table = _read(path, PRIMITIVE_COLUMNS, notes)
        if table is not None:
            frames.append(table.assign(source=_source_name(root, path.parent)))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


@dataclass(frozen=True)
class LengthsFormat:
    """How to read a lengths source that is not bare counts: the what-if's --field, --tokenizer, --text-field."""

    field: str | None = None
    tokenizer: str | None = None
    text_field: str | None = None


def read_lengths(root: Path, extra: list[Path] = (), fmt: LengthsFormat = LengthsFormat()) -> dict[str, np.ndarray]:
    """Each real dataset's usable lengths by the data's name: caches in `lengths/` folders below the root, and
    `extra` sources in any format the what-if reads (DataError when one cannot be read)."""
    files = (sorted(root.rglob("lengths/*.npy")) if root.is_dir() else []) + list(extra)
    return {source_name(p): _read_source(p, fmt) for p in files}


def _read_source(path: Path, fmt: LengthsFormat) -> np.ndarray:
    try:
        return read_source(path, field=fmt.field, tokenizer=fmt.tokenizer, text_field=fmt.text_field)
    except UnusedFieldError:
        # One --field serves every --lengths file: it names the key of those of objects, not this one's.
        return read_source(path, tokenizer=fmt.tokenizer, text_field=fmt.text_field)


def load(root: Path, lengths_files: list[Path] = (), fmt: LengthsFormat = LengthsFormat()) -> Inputs:
    root = Path(root)
    inputs = Inputs(root=root, lengths=read_lengths(root, list(lengths_files), fmt))
    if not root.exists():
        inputs.notes.append(f"results root {root} does not exist: only figures that need no results render")
        return inputs
    if root.is_dir() and any((root / SCRATCH).rglob("*.csv")):
        inputs.notes.append(f"left out {root / SCRATCH}/ (scratch output of ad-hoc runs); "
                            f"pass --results {root / SCRATCH} to draw it")
    inputs.runs = read_runs(root, inputs.notes)
    inputs.primitives = read_primitives(root, inputs.notes)
    return inputs


def by_source(table: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """One table per source; a source that mixes backends (real and simulated) is split by
    backend, one that mixes shard layouts (series.layouts: full, hybrid sharding,
    topology-aware fetch) by layout, each with its baselines (series.in_layout), and one that
    mixes workloads told apart by their configs alone (series.DERIVED: activation checkpointing
    modes, the overrides such as the simulated hardware) by them."""
    out: dict[str, pd.DataFrame] = {}
    for source, part in table.groupby("source", sort=True):
        backends = part["backend"].dropna().unique() if "backend" in part else []
        parts = {f"{source}-{b}": sub for b, sub in part.groupby("backend", sort=True)} if len(backends) > 1 \
            else {str(source): part}
        for name, sub in parts.items():
            present = sorted(set(layouts(sub)))
            split = ({f"{name}-{value or 'full'}": sub[in_layout(sub, value)] for value in present}
                     if len(present) > 1 else {name: sub})
            for named, rows in split.items():
                out.update(_by_derived(named, with_workload(rows)))
    return out


def _by_derived(name: str, rows: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """`rows` split by checkpointing mode (`-recompute-full`, `-no-recompute`) and overrides
    (`-backend-hardware-h100`), each named by what tells it apart."""
    modes, overrides = rows["checkpointing"].nunique() > 1, rows["overrides"].nunique() > 1
    if not (modes or overrides):
        return {name: rows}
    out = {}
    for (mode, override), sub in rows.groupby(["checkpointing", "overrides"], sort=True):
        parts = [f"recompute-{mode.replace(' ', '-')}" if mode else "no-recompute"] if modes else []
        parts += [re.sub(r"[^A-Za-z0-9.]+", "-", override).strip("-") or "default"] if overrides else []
        out[f"{name}-{'-'.join(parts)}"] = sub
    return out


def trace_path(row: pd.Series) -> Path | None:
    """Where the run's event trace is, or None when the row names none or the file is missing."""
    trace = row.get("trace")
    if not isinstance(trace, str) or not trace:
        return None
    path = Path(row["table_dir"]) / trace
    return path if path.exists() else None


# The columns of every event trace, real or simulated (results/README.md, "Traces"), that the figures read.
TRACE_COLUMNS = ("rank", "minibatch", "microbatch", "kind", "t0", "t1")


def read_trace(row: pd.Series) -> pd.DataFrame:
    path = trace_path(row)
    if path is None:
        raise Skip(f"run {row.get('run_id')} has no trace file")
    fix = "copy it again, or remove it to draw without it"
    try:
        events = pd.read_csv(path)
    except (OSError, EOFError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        # A copy cut short (EOFError), a file of another kind under the trace's name (BadGzipFile):
        # said with the file, where it ended the command in a traceback.
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise Skip(f"run {row.get('run_id')}'s trace {path} cannot be read ({reason}); {fix}") from None
    missing = [c for c in TRACE_COLUMNS if c not in events]
    if missing:
        raise Skip(f"run {row.get('run_id')}'s trace {path} is not an event trace (no {', '.join(missing)} column); "
                   f"{fix}")
    return events


def with_traces(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs whose trace file exists."""
    if runs.empty:
        return runs
    return runs[runs.apply(lambda r: trace_path(r) is not None, axis=1)]


# What a figure of runs needs, as its skip names it: a runs.csv whose rows all failed holds none.
NO_RUNS = "successful runs (rows of runs.csv with status ok)"


def per_source(table: pd.DataFrame, name: str, draw, what: str) -> dict[str, object]:
    """Apply `draw` to each source's rows; a source it cannot draw becomes a Skip with the reason."""
    if table.empty:
        raise Skip(f"no {what} found below the results root")
    out: dict[str, object] = {}
    for source, part in by_source(table).items():
        try:
            out[f"{name}-{source}"] = draw(part)
        except Skip as skip:
            out[f"{name}-{source}"] = skip
    return out
