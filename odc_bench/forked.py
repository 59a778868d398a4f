"""Calls spread over processes forked from this one: the what-if's series, and the plans of a
large run's minibatches, computed side by side.

Forked, a worker starts with everything this process has imported and loaded (a dataset's
lengths included) and costs a few milliseconds; a spawned one would import the harness again
(about half a second). Workers leave Ctrl-C to this process, which stops the pool: each
worker ends the call in hand and exits; none outlives this process (on Linux the kernel stops
it should this one be killed). A worker's own calls to in_processes run in it, one after the
other: the cores are busy already. A fork copies only the calling thread; the calls here plan
and simulate, and wait on no lock that another thread of this process (a display's, a
library's pool) could have held at the fork."""

from __future__ import annotations

import ctypes
import gc
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_in_worker = False


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity: taskset, a SLURM allocation)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def in_processes(fn: Callable[..., T], calls: list[tuple[Any, ...]], workers: int,
                 meanwhile: Callable[[], object] | None = None) -> list[T]:
    """fn(*args) for each args in `calls`, in up to `workers` forked processes, the results in
    the calls' order; `meanwhile` runs here once, while they work. The first call's exception
    (in that order) is raised here once no worker runs any more. With no workers, or in a
    worker, the calls run here (after `meanwhile`)."""
    if workers < 1 or not calls or _in_worker:
        if meanwhile is not None:
            meanwhile()
        return [fn(*args) for args in calls]
    pool = ProcessPoolExecutor(max_workers=min(workers, len(calls)), mp_context=multiprocessing.get_context("fork"),
                               initializer=_worker_start, initargs=(os.getpid(),))
    # Frozen, the objects the workers inherit are left out of their collections, which would
    # otherwise write to every one of them and so copy the pages they share with this process.
    gc.freeze()
    # Ctrl-C is held while the workers fork. A blocked signal stays blocked in a forked process,
    # so the workers never take it (they leave it to this process); and this process gets a
    # Ctrl-C pressed meanwhile once they have started, not inside the fork's own handlers,
    # which swallowed it (the command then ran on to its end).
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        try:
            futures = [pool.submit(fn, *args) for args in calls]  # the workers fork at the first
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            gc.unfreeze()
        if meanwhile is not None:
            meanwhile()
        return [f.result() for f in futures]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _worker_start(parent: int) -> None:
    global _in_worker
    _in_worker = True
    if sys.platform == "linux":
        # A worker waits for calls on a pipe this process writes; were this one killed, it would wait forever.
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # this process died before the request was made
        os._exit(1)
