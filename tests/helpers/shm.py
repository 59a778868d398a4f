"""/dev/shm on a shared host: what this test process's runs left there, told apart from the
segments of runs other sessions have going at the same time."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Collection
from pathlib import Path

from odc_core.transport.shm import SHM_DIR, creator_alive, list_segments, segment_creator

# A run whose rank just died has its launcher or its peers remove the rank's segments a moment later.
GRACE_S = 5.0
# Set by tests/suite.py in the two pytest processes it runs side by side: "slurm" for the SLURM
# tests, "main" for all the others. Each kills ranks on purpose (SIGKILL, a SLURM requeue) and
# checks its own runs' segments; a killed rank's segments wait a few seconds for its peers, its
# launcher or its job's next attempt to remove them, and a check in the other process during
# that window would count them as that process's leak. So each leaves the other's alone: a SLURM
# task's heap is named <run>_<SLURM job>_<attempt> (run/slurm_task.py's _job_id), and only the
# SLURM tests start SLURM tasks (test_reliability's stand-ins take a job id that is not a number).
PART = "ODC_TESTS_PART"
_SLURM_TASK = re.compile(r"^odc-[0-9a-f]{8}_\d+_")


def _other_parts(name: str) -> bool:
    """A segment of the pytest process running beside this one (tests/suite.py)."""
    part = os.environ.get(PART)
    return part is not None and (_SLURM_TASK.match(name) is not None) == (part == "main")


def descends_from(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
        except OSError:
            return False
        pid = int(stat[stat.rindex(")") + 2:].split()[1])
    return False


def _elsewhere(name: str) -> bool:
    """An odc segment of a run going on outside this process."""
    if _other_parts(name):
        return True
    creator = segment_creator(name)
    return creator is not None and creator_alive(name) and not descends_from(creator[0], os.getpid())


def _settled(left: Callable[[], Collection[str]]) -> set[str]:
    """left(), asked again for up to GRACE_S while it is not empty."""
    deadline = time.monotonic() + GRACE_S
    while (found := set(left())) and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


def leaked_segments() -> set[str]:
    """odc segments whose creator is dead, or still running under this process: a leak."""
    return _settled(lambda: [name for name in list_segments() if not _elsewhere(name)])


def left_behind(before: Collection[str]) -> set[str]:
    """What /dev/shm holds that it did not hold `before`, less other sessions' live runs' segments."""
    return _settled(lambda: [name for name in os.listdir(SHM_DIR) if name not in before and not _elsewhere(name)])
