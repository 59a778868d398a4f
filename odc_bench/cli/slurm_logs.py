"""Why a SLURM job ended without a result, read from SLURM's own lines in its log.

The driver never asks sacct (clusters without accounting have none), but slurmstepd writes why
it ended a job into the job's stderr, in lines such as
    slurmstepd: error: *** JOB 503 ON node CANCELLED AT 2026-12-07T22:42:06 DUE TO TIME LIMIT ***
    slurmstepd: error: Detected 1 oom-kill event(s) in StepId=706.0. ...
and a job that died so ends in "left the queue without a result": these say why, and what to change.
"""

from __future__ import annotations

import re
from pathlib import Path

_CANCELLED = re.compile(r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT \S+(?: DUE TO (?P<why>[A-Z_ ]+?))? \*\*\*")
_OOM = re.compile(r"Detected \d+ oom-kill event")
# Attempts SLURM ended and started again: a later attempt's own end is what counts.
_REQUEUED = ("JOB REQUEUE",)
_ADVICE = {
    "TIME LIMIT": "SLURM cancelled it at its time limit: raise hydra.launcher.timeout_min, or set checkpoint.every "
                  "so that the requeues before it (hydra.launcher.max_num_timeout) resume the run",
    "PREEMPTION": "SLURM preempted it",
    "NODE FAILURE": "its node failed",
}


def why_it_ended(log: str) -> str:
    """A clause saying why SLURM ended the job whose log this is ('' when the log does not say)."""
    if _OOM.search(log):
        return "SLURM killed a task out of memory: raise hydra.launcher.mem_gb"
    ends = [m for m in _CANCELLED.finditer(log) if m.group("why") not in _REQUEUED]
    if not ends:
        return ""
    why = ends[-1].group("why")
    if why is None:
        return "it was cancelled (scancel)"
    return _ADVICE.get(why, f"SLURM cancelled it ({why.lower()})")


def read_why_it_ended(stderr: Path) -> str:
    """why_it_ended of a job's stderr file, '' when it cannot be read."""
    try:
        return why_it_ended(stderr.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return ""
