"""Fixtures every test may use; shared helper functions live in tests/helpers."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from odc_bench.config.compose import register_sweeps

# `sweep=NAME` composes in every test, as on the command line.
register_sweeps()


@pytest.fixture
def results_dir(tmp_path: Path) -> Path:
    return tmp_path / "results"


@pytest.fixture
def one_rank_group():
    """torch.distributed's default group of this one process (gloo), its store yielded: an engine
    built in the test's own process."""
    import torch.distributed as dist

    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield store
    finally:
        dist.destroy_process_group()


def _descends_from(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat[stat.rindex(")") + 2:].split()[1])
    return False


@pytest.fixture(scope="session", autouse=True)
def no_shared_memory_left_behind():
    """After the suite, no odc-* segment may remain in /dev/shm.

    The host is shared: segments whose creator is still running outside this session belong
    to someone else's run and are ignored. A segment whose creator is dead, or still running
    under this session, is a leak, unless it goes within a few seconds: another run on the host
    whose rank just died has its launcher or its peers remove the rank's segments a moment later.
    """
    from odc_core.transport.shm import creator_alive, list_segments, segment_creator

    def leaked() -> list[str]:
        return [name for name in list_segments()
                if not creator_alive(name) or _descends_from(segment_creator(name)[0], os.getpid())]

    yield
    deadline = time.monotonic() + 5
    while (left := leaked()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"shared-memory segments left in /dev/shm: {left}"
