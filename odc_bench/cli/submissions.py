"""Which runs of a results folder are queued or running on SLURM: `<results_dir>/slurm_jobs.json`.

The SLURM driver records every job it submits here (run key -> job id, log folder, when) and
removes the record when the job's result is in, when it cancels the job, or when a later
command finds the job gone from the queue. A resumed sweep reads it so that a run already
queued or running, by this command or an earlier one that was interrupted and left its jobs,
is not submitted twice. Written like the results table: under a lock, atomically.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from odc_bench.files import atomic_write_text, locked

FILE = "slurm_jobs.json"


def path_of(results_dir: Path) -> Path:
    return results_dir / FILE


def read(results_dir: Path) -> dict[str, dict[str, Any]]:
    """run key -> {job_id, logs, submitted, overrides}; empty when nothing is recorded (or the
    file is unreadable: it only ever saves a duplicate submission)."""
    try:
        data = json.loads(path_of(results_dir).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): v for k, v in data.items() if isinstance(v, dict) and "job_id" in v} \
        if isinstance(data, dict) else {}


def update(results_dir: Path, add: Mapping[str, Mapping[str, Any]] = {}, remove: Iterable[str] = ()) -> None:
    """Record submitted jobs and forget finished ones, in one locked rewrite."""
    path = path_of(results_dir)
    removed = set(remove)
    if not add and not removed:
        return
    with locked(path):
        records = read(results_dir)
        for run_id in removed:
            records.pop(run_id, None)
        records.update({k: dict(v) for k, v in add.items()})
        if records:
            atomic_write_text(path, json.dumps(records, indent=1, sort_keys=True))
        else:
            path.unlink(missing_ok=True)


def record(job_id: str, logs: Path, overrides: Iterable[str]) -> dict[str, Any]:
    return dict(job_id=job_id, logs=str(logs), overrides=list(overrides),
                submitted=time.strftime("%Y-%m-%dT%H:%M:%S"))
