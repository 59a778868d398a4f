"""A run's ranks as processes forked on this host (run/launch.py does the rest).

Ranks fork from a server that has already imported the rank's code (torch with it, preloaded
as run/__init__.py sets it), so a rank starts in a fraction of the time.
"""

from __future__ import annotations

import contextlib
import multiprocessing.connection
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import pickle
import signal
import threading
import time
from pathlib import Path

import torch.multiprocessing as tmp

from odc_bench.errors import ConfigError
from odc_bench.files import tmpdir_too_long
from odc_bench.plan.spec import RunSpec
from odc_bench.run.launch import Entry, Progress, RankExit, last_line, launch
from odc_bench.run.worker import RankJob, rank_entry
from odc_core.transport.shm import process_start_time

# How long stop() waits for a killed rank to be gone: the kernel frees a large process's memory first.
_GONE_S = 10.0


def _start_forkserver() -> None:
    """Start the fork server (once per process) with Ctrl-C blocked. A blocked signal stays
    blocked across fork and exec, so neither the server, while it imports torch, nor any rank it
    forks can be interrupted by the terminal's Ctrl-C: the parent alone handles it, stops the ranks
    and removes their shared memory.

    Only this thread blocks it, and only while the server is spawned; the parent's handler stays.
    Ignoring the signal instead (SIG_IGN is inherited too) lost a Ctrl-C pressed during the spawn:
    the command then ran on to its end. Blocked, it is handled by another thread or on unblocking.
    ConfigError where the temporary folder is too long for the server's socket (files.py)."""
    if (too_long := tmpdir_too_long()) is not None:
        raise ConfigError(too_long)
    if threading.current_thread() is not threading.main_thread():
        multiprocessing.forkserver.ensure_running()
        return
    # The resource tracker, started with the server when neither runs yet, unblocks SIGINT after
    # its own spawn: started first, it is left alone below.
    multiprocessing.resource_tracker.ensure_running()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


class ForkedRanks:
    """world_size ranks forked from the fork server."""

    def __init__(self, entry: Entry, job: RankJob, world_size: int) -> None:
        self.world_size = world_size
        _start_forkserver()
        self.ctx = tmp.start_processes(entry, args=(job,), nprocs=world_size, join=False, start_method="forkserver")
        self._ended: dict[int, float] = {}  # when each rank was first seen to have ended
        self._started = [(p.pid, process_start_time(p.pid)) for p in self.ctx.processes]

    def exits(self) -> list[RankExit]:
        out = []
        for rank, p in enumerate(self.ctx.processes):
            if p.exitcode is None:
                continue
            ended_at = self._ended.setdefault(rank, time.monotonic())
            error = None
            if p.exitcode > 0:  # a rank that raised left its traceback
                try:
                    with open(self.ctx.error_files[rank], "rb") as f:
                        error = last_line(pickle.load(f))
                except (OSError, EOFError, pickle.UnpicklingError):
                    pass
            out.append(RankExit(rank, 128 - p.exitcode if p.exitcode < 0 else p.exitcode, error, ended_at))
        return out

    def gone(self) -> str | None:
        return None  # no process manager between this process and its ranks

    def wait(self, timeout_s: float) -> None:
        running = [p.sentinel for p in self.ctx.processes if p.exitcode is None]
        multiprocessing.connection.wait(running, timeout=timeout_s)

    def stop(self) -> None:
        for p in self.ctx.processes:
            if p.is_alive():
                p.kill()
            p.join()
        # A rank's exit pipe is the fork server's: it closes when the server ends too (a terminal's
        # hangup kills the server with the ranks), and a rank may then still be dying, or running.
        # Its segments may be swept only once it is gone.
        deadline = time.monotonic() + _GONE_S
        for pid, start in self._started:
            if start is not None and process_start_time(pid) == start:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            while process_start_time(pid) == start and start is not None and time.monotonic() < deadline:
                time.sleep(0.01)
        for error_file in self.ctx.error_files:  # a rank's traceback, if it raised
            Path(error_file).unlink(missing_ok=True)


def run_local(spec: RunSpec, collect_params: bool = False, entry: Entry = rank_entry,
              on_progress: Progress | None = None) -> list[dict]:
    """Start world_size forked ranks, wait for all of them, and return each rank's result
    (launch() says the rest)."""
    return launch(spec, ForkedRanks, entry, collect_params, on_progress)
