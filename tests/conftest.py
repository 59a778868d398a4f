"""Fixtures every test may use; shared helper functions live in tests/helpers."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# A suite started in the background by a script (`make test &`) has SIGINT ignored, as bash
# leaves it for background commands without job control, and so would every process a test
# starts: the tests of what Ctrl-C does would then send it to nobody. They get Python's own.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The commands the tests start write to stdout as they do for users, buffered where it is not a
# terminal: a machine whose environment sets PYTHONUNBUFFERED (CI's does) hid a run that went on
# to write its row after its reader had gone.
os.environ.pop("PYTHONUNBUFFERED", None)


@pytest.fixture(scope="session")
def cpu_compile() -> None:
    """Skips a test that torch.compiles on CPU where torch cannot build or load that code: a clone
    under a folder with a space, whose .venv holds torch, or a noexec temporary folder
    (plan/device.py cpu_compile_problem)."""
    from odc_bench.plan.device import cpu_compile_problem

    problem = cpu_compile_problem()
    if problem is not None:
        pytest.skip(f"torch.compile cannot build code for CPU here: {problem[0]}")


@pytest.fixture
def results_dir(tmp_path: Path) -> Path:
    return tmp_path / "results"


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """tmpfs(size): a fresh folder holding a tmpfs of that size ("8m", "64k"), a file system that
    fills up for real (a container's /dev/shm is 64 MiB unless started with --shm-size); mounting
    one needs root, which CI has, so the test is skipped where it is not."""
    mounted: list[Path] = []

    def mount(size: str, options: str = "") -> Path:  # options: more of mount's, "noexec"
        folder = tmp_path / f"tmpfs{len(mounted)}"
        folder.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}" + (f",{options}" if options else ""),
                               "tmpfs", str(folder)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"mounting a tmpfs needs root: {done.stderr.strip()}")
        mounted.append(folder)
        return folder

    try:
        yield mount
    finally:
        for folder in mounted:
            subprocess.run(["umount", "-l", str(folder)], check=True)


@pytest.fixture
def sigkill_window() -> Iterator[None]:
    """Held by a test that OOM-kills a rank and by the tests that assert a plain SIGKILL's words:
    the launcher reads the OOM killer's count host-wide (/proc/vmstat), so such tests in the two
    pytest-xdist workers must not overlap. One file per user: another user's, in the shared and
    sticky temporary folder, cannot be opened for writing."""
    with open(Path(tempfile.gettempdir()) / f"odc-tests-sigkill-{os.getuid()}.lock", "a", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


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


def pytest_sessionfinish(session: pytest.Session) -> None:
    """After the suite, no odc-* segment may remain in /dev/shm.

    The host is shared: segments whose creator is still running outside this session belong
    to someone else's run and are ignored. A segment whose creator is dead, or still running
    under this session, is a leak, unless it goes within a few seconds (tests/helpers/shm.py).
    Under pytest-xdist (tests/suite.py) the controller checks, once every worker is done: a
    worker done early would count a rank another worker's test just killed, whose segments
    that test's run removes a moment later.
    """
    if hasattr(session.config, "workerinput"):
        return
    from tests.helpers.shm import leaked_segments

    leaked = leaked_segments()
    if leaked:
        writer = session.config.get_terminal_writer()
        writer.line()
        writer.line(f"shared-memory segments left in /dev/shm: {sorted(leaked)}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
