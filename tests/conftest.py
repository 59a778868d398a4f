"""Fixtures every test may use; shared helper functions live in tests/helpers."""

from __future__ import annotations

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


@pytest.fixture(scope="session", autouse=True)
def no_shared_memory_left_behind():
    """After the suite, no odc-* segment may remain in /dev/shm.

    The host is shared: segments whose creator is still running outside this session belong
    to someone else's run and are ignored. A segment whose creator is dead, or still running
    under this session, is a leak, unless it goes within a few seconds (tests/helpers/shm.py).
    """
    from tests.helpers.shm import leaked_segments

    yield
    leaked = leaked_segments()
    assert not leaked, f"shared-memory segments left in /dev/shm: {sorted(leaked)}"
