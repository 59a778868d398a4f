"""Calls spread over processes forked from this one: the what-if's series, and the plans and ODC
timeline of a large run's minibatches, computed side by side; and a helper forked early that
readies a module for a later call (the what-if's figure).

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
from importlib import import_module
from multiprocessing.connection import Connection
from typing import Any, TypeVar

T = TypeVar("T")
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
# How long closing a helper waits for the call in hand to end before stopping it.
_CALL_ENDS_S = 30.0
_in_worker = False


def usable_cpus() -> int:
    """The CPUs this process may use: those it may run on (its affinity: taskset, a SLURM
    allocation), and in a container no more than its CPU quota (`docker run --cpus=2` shows
    every core of the host): joblib's count, which reads both. A count of the host's cores
    there gave each rank threads for them all, which ran far slower (docs/reliability.md)."""
    from joblib import cpu_count  # slow to import: only where a count is needed

    return cpu_count()


def cpu_share(ranks_on_host: int, ranks_in_task: int | None = None) -> int:
    """CPU threads for each rank: inside a SLURM job, the task's CPUs (SLURM_CPUS_PER_TASK, set by
    -c; its affinity may span the node) shared by the ranks the task runs (one in a task per rank;
    all of them, `ranks_in_task` defaulting to `ranks_on_host`, where a process inside a task starts
    its ranks itself, as a local run does); else the CPUs this process may use shared by the host's
    ranks. Each rank of a local run took all the task's CPUs before: 4 ranks of `sbatch -c 8` ran
    32 threads on 8 CPUs."""
    task = int(os.environ.get("SLURM_CPUS_PER_TASK") or 0)
    if task:
        return max(1, task // (ranks_in_task or ranks_on_host))
    return max(1, usable_cpus() // ranks_on_host)


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


def first_here(fn: Callable[..., T], calls: list[tuple[Any, ...]], workers: int,
               meanwhile: Callable[[], object] | None = None) -> list[T]:
    """in_processes, but the first call runs here (after `meanwhile`) while the workers run the
    others: its result is not sent back, and its arguments need not pickle. `calls` is not empty."""
    here: list[T] = []

    def mine() -> None:
        if meanwhile is not None:
            meanwhile()
        here.append(fn(*calls[0]))

    rest = in_processes(fn, calls[1:], workers, meanwhile=mine)
    return [*here, *rest]


def _worker_start(parent: int) -> None:
    global _in_worker
    _in_worker = True
    if sys.platform == "linux":
        # A worker waits for calls on a pipe this process writes; were this one killed, it would wait forever.
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # this process died before the request was made
        os._exit(1)


class HelperGone(RuntimeError):
    """The helper process is not there any more (killed, or stopped by its parent)."""


class Helper:
    """One process forked now to run calls later, ready: it imports `module` at once, on a core
    this process leaves idle while it imports its own modules and reads its input, and then runs
    the module's functions this process names, one call at a time. Made before this process
    imports much, the fork is cheap and the helper imports only what the calls need.

    Like the workers above, it leaves Ctrl-C to this process and does not outlive it: it is
    stopped at this process's exit (a daemon) and, on Linux, by the kernel should this one be
    killed."""

    def __init__(self, module: str) -> None:
        context = multiprocessing.get_context("fork")
        self._conn, theirs = context.Pipe()
        self._process = context.Process(target=_serve, args=(theirs, self._conn, os.getpid(), module), daemon=True,
                                        name=f"helper of {module}")
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # see in_processes
        try:
            self._process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        theirs.close()
        self._busy = False

    def call(self, function: str, *args: Any) -> Any:
        """module.function(*args) in the helper, once the module has loaded there; the call's
        exception (or the module's, if it could not load) is raised here. HelperGone if the
        helper has ended. A Ctrl-C during the call reaches the caller once the helper has ended
        (close): the caller's clean-up then sees all that the call wrote."""
        self._busy = True
        try:
            self._conn.send((function, args))
            ok, value = self._conn.recv()
        except (EOFError, OSError) as e:
            raise HelperGone(f"the helper process ({self._process.name}) has ended") from e
        except KeyboardInterrupt:
            self.close()
            raise
        self._busy = False
        if not ok:
            raise value
        return value

    def close(self) -> None:
        """End the helper: at once if no call is under way (it is loading its module or waiting,
        and has written nothing); else once the call in hand ends, as a call in this process
        would on Ctrl-C, leaving no half-written file behind."""
        self._conn.close()
        if self._busy:
            self._process.join(_CALL_ENDS_S)
        if self._process.is_alive():
            # SIGKILL: a SIGTERM that this process's own parent ignores is ignored here too.
            self._process.kill()
        self._process.join()


def _serve(conn: Connection, parents_end: Connection, parent: int, module: str) -> None:
    # The fork copied the parent's end of the pipe too: closed here, the pipe ends when the parent closes it.
    parents_end.close()
    _worker_start(parent)
    loaded, failed = None, None
    try:
        loaded = import_module(module)
    except Exception as e:  # raised at the first call, where the caller can act on it
        failed = e
    while True:
        try:
            function, args = conn.recv()
        except EOFError:  # the parent closed its end
            return
        try:
            if failed is not None:
                raise failed
            reply: tuple[bool, Any] = (True, getattr(loaded, function)(*args))
        except Exception as e:
            reply = (False, e)
        try:
            conn.send(reply)
        except OSError:  # the parent has closed its end: nothing to answer
            return
        except Exception as e:  # a result or an exception that does not pickle
            conn.send((False, RuntimeError(f"{module}.{function}: {e}")))
