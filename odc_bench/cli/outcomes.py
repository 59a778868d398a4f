"""A sweep's jobs by outcome (ok, failed, skipped) and the lines that close the sweep: the
local sweeper's (sweeper.py) and the SLURM launcher's (slurm.py) alike."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Sequence
from typing import Any

from hydra.core.utils import JobReturn, JobStatus

from odc_bench.errors import CombinationError


def outcome_of(job_return: JobReturn) -> str:
    if job_return.status != JobStatus.COMPLETED:
        return "failed"
    rows = job_return.return_value
    if rows is None:
        return "skipped"
    return "ok" if all(r.get("status", "ok") == "ok" for r in _rows(job_return)) else "failed"


def _rows(job_return: JobReturn) -> list[dict]:
    """The rows a completed job returned: a training run's row, its repeats' rows, or
    task=primitives' rows."""
    rows = job_return.return_value
    return [rows] if isinstance(rows, dict) else list(rows or [])


def measurements(rows: list[dict]) -> bool:
    """Whether a job's rows are task=primitives' measurements (one per op and size, no status)
    rather than training runs' rows."""
    return bool(rows) and not all("status" in row for row in rows)


def run_counts(job_returns: Sequence[JobReturn]) -> dict[str, int]:
    """Runs executed by outcome, each repeat one run; a job that raised counts as one failed run,
    a task=primitives job as one run, however many measurements it wrote."""
    counts = {"ok": 0, "failed": 0}
    for r in job_returns:
        if r.status != JobStatus.COMPLETED:
            counts["failed"] += 1
            continue
        rows = _rows(r)
        for row in rows[:1] if measurements(rows) else rows:
            counts["ok" if row.get("status", "ok") == "ok" else "failed"] += 1
    return counts


def _error_of(job_return: JobReturn) -> str:
    """A failed job's error in one line: its row's, or the exception it raised."""
    if job_return.status != JobStatus.COMPLETED:
        raw: Any = job_return._return_value  # the exception (return_value would raise it)
        return f"{type(raw).__name__}: {str(raw).strip().splitlines()[-1] if str(raw).strip() else ''}"
    return next((str(r.get("error", "")) for r in _rows(job_return) if r.get("status", "ok") != "ok"), "")


def print_summary(job_returns: Sequence[JobReturn], cannot_run: Sequence[tuple[list[str], CombinationError]],
                  configs: int | None = None) -> int:
    """The sweep's last lines: its runs by outcome (each repeat counted), each failure with its
    error; the number of jobs with a failed run. `configs`: how many configs the jobs ran (fewer
    than the jobs when repeats ran in rounds, a job per round)."""
    outcomes = [outcome_of(r) for r in job_returns]
    counts = {k: outcomes.count(k) for k in ("ok", "failed", "skipped")}
    runs = run_counts(job_returns)
    jobs = len(job_returns) if configs is None else configs
    configs = jobs + len(cannot_run)
    # A config of repeat=N runs N times: then the outcomes count runs and the configs stand apart.
    rounds = jobs < len(job_returns)  # a job per round: a skipped job is one run already there
    repeated = rounds or sum(runs.values()) > jobs - counts["skipped"]
    parts = [f"{runs['ok']} ok", f"{runs['failed']} failed"]
    if counts["skipped"]:
        word = "run" if rounds else "config"
        configs_word = f" {word}{'s' * (counts['skipped'] != 1)}" if repeated else ""
        parts.append(f"{counts['skipped']}{configs_word} already done or under way (skipped)")
    if cannot_run:
        parts.append(f"{len(cannot_run)} combination{'s' * (len(cannot_run) > 1)} that cannot run (skipped)")
    rows = [row for r in job_returns if r.status == JobStatus.COMPLETED for row in _rows(r)]
    requeues = sum(int(row.get("requeues") or 0) for row in rows)
    resumed = sum(1 for row in rows if row.get("resumed_from"))
    if requeues:
        parts.append(f"{requeues} requeue{'s' * (requeues != 1)} by SLURM")
    if resumed:
        parts.append(f"{resumed} resumed from a checkpoint")
    if repeated:
        executed = sum(runs.values())
        head = f"sweep of {configs} config{'s' * (configs != 1)}, {executed} runs with their repeats"
    else:
        head = f"sweep of {configs} run{'s' * (configs != 1)}"
    print(f"odc_bench: {head}: {', '.join(parts)}")
    for r, outcome in zip(job_returns, outcomes, strict=True):
        if outcome == "failed":
            if r.status != JobStatus.COMPLETED and isinstance(r._return_value, BaseException):
                traceback.print_exception(r._return_value, file=sys.stderr)
            print(f"odc_bench: failed: {' '.join(r.overrides or []) or 'the run'}: {_error_of(r)}", file=sys.stderr)
    return counts["failed"]
