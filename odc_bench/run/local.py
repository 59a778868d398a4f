"""Run one job's ranks as real processes on this host.

The parent hosts the rendezvous store (on a free port the kernel picks, so parallel jobs
never collide) and watches its ranks: the first rank to fail brings the others down and the
run fails with that rank's error instead of hanging. Ranks it had to kill, and ranks that
died, cannot remove their shared memory, so the parent removes the run's leftover segments
as soon as every rank is gone.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import pickle
import re
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as tmp

from odc_bench.errors import RunFailed
from odc_bench.plan.spec import RunSpec
from odc_bench.run.worker import MINIBATCHES_DONE, RankJob, rank_entry, threads_per_rank
from odc_core.transport.shm import sweep_stale_segments


def _start_forkserver() -> None:
    """Start the fork server (once per process) with Ctrl-C blocked. A blocked signal stays
    blocked across fork and exec, so neither the server, while it imports torch, nor any rank it
    forks can be interrupted by the terminal's Ctrl-C: the parent alone handles it, stops the ranks
    and removes their shared memory.

    Only this thread blocks it, and only while the server is spawned; the parent's handler stays.
    Ignoring the signal instead (SIG_IGN is inherited too) lost a Ctrl-C pressed during the spawn:
    the command then ran on to its end. Blocked, it is handled by another thread or on unblocking."""
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

# (minibatches done, minibatches in the run) -> None: how a launcher reports a run's progress.
Progress = Callable[[int, int], None]


def _last_line(text: str) -> str:
    """The exception line of a traceback, its class without the module path."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    last = lines[-1].strip() if lines else text
    return re.sub(r"^(?:\w+\.)+(\w+:)", r"\1", last)


def _failure(ctx: tmp.ProcessContext, failed: list[int], done: int, total: int) -> str:
    """The run's error: a rank that died without a word is the root cause of its peers' errors."""
    when = f"after {done} of {total} minibatches"
    for rank in failed:
        code = ctx.processes[rank].exitcode
        if code < 0:
            return f"rank {rank} died (killed by {signal.Signals(-code).name}) {when}"
    rank = failed[0]
    try:
        with open(ctx.error_files[rank], "rb") as f:
            return f"rank {rank} failed: {_last_line(pickle.load(f))}"
    except (OSError, EOFError, pickle.UnpicklingError):
        return f"rank {rank} exited with status {ctx.processes[rank].exitcode} {when}"


@contextlib.contextmanager
def _sigint_held() -> Iterator[None]:
    """Ctrl-C waits while ranks start or are being cleaned up, then interrupts (KeyboardInterrupt)
    once the block is done: a half-started set of ranks, or a half-done clean-up, would leave
    processes or shared memory behind."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread gets signals
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


def run_local(spec: RunSpec, collect_params: bool = False, entry: Callable[[int, RankJob], None] = rank_entry,
              on_progress: Progress | None = None) -> list[dict]:
    """Start world_size ranks, wait for all of them, and return each rank's result.

    With collect_params, rank 0's result also holds the final unsharded parameters; `entry`
    lets instrumentation wrap the rank's entry point (it must be importable by the ranks).
    The run ends in RunFailed after its deadline (deadline_s), if it has one.
    """
    world = spec.world_size
    deadline_s = spec.config.deadline_s
    store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=spec.config.timeout_s))
    total = len(spec.minibatches)

    def minibatches_done() -> int:
        return int(store.add(MINIBATCHES_DONE, 0))

    with tempfile.TemporaryDirectory(prefix="odc-run-") as out_dir:
        job = RankJob(spec=spec, store_host="127.0.0.1", store_port=store.port, out_dir=out_dir,
                      job_id=f"{spec.run_id[:8]}-{store.port}", threads=threads_per_rank(spec, world),
                      collect_params=collect_params)
        ctx: tmp.ProcessContext | None = None
        try:
            with _sigint_held():
                _start_forkserver()
                ctx = tmp.start_processes(entry, args=(job,), nprocs=world, join=False, start_method="forkserver")
            started = time.monotonic()
            while True:
                running = [p.sentinel for p in ctx.processes if p.exitcode is None]
                multiprocessing.connection.wait(running, timeout=0.2)
                failed = [r for r, p in enumerate(ctx.processes) if p.exitcode not in (None, 0)]
                if failed:
                    raise RunFailed(_failure(ctx, failed, minibatches_done(), total))
                if on_progress is not None:
                    on_progress(minibatches_done(), total)
                if all(p.exitcode == 0 for p in ctx.processes):
                    break
                if deadline_s is not None and time.monotonic() - started > deadline_s:
                    raise RunFailed(f"run exceeded its deadline of {deadline_s:.0f}s "
                                    f"after {minibatches_done()} of {total} minibatches")
        finally:
            with _sigint_held():
                for p in ctx.processes if ctx is not None else ():
                    if p.is_alive():
                        p.kill()
                    p.join()
                sweep_stale_segments(job_id=job.job_id)
                for error_file in ctx.error_files if ctx is not None else ():  # a rank's traceback, if it raised
                    Path(error_file).unlink(missing_ok=True)
        results = [json.loads((Path(out_dir) / f"rank{r}.json").read_text()) for r in range(world)]
        if collect_params:
            results[0]["params"] = torch.load(Path(out_dir) / "params.pt")
        return results
