"""Run one job's ranks as real processes on this host.

The parent hosts the rendezvous store (on a free port the kernel picks, so parallel jobs
never collide) and watches its ranks: the first rank to fail brings the others down and the
run fails with that rank's error instead of hanging. Ranks it had to kill, and ranks that
died, cannot remove their shared memory, so the parent removes the run's leftover segments
as soon as every rank is gone.
"""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.connection
import pickle
import re
import signal
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as tmp

from odc_bench.errors import RunFailed
from odc_bench.plan.spec import RunSpec
from odc_bench.run.worker import MINIBATCHES_DONE, RankJob, rank_entry, threads_per_rank
from odc_core.transport.shm import sweep_stale_segments

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
        ctx = tmp.start_processes(entry, args=(job,), nprocs=world, join=False, start_method="forkserver")
        started = time.monotonic()
        try:
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
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                p.join()
            sweep_stale_segments(job_id=job.job_id)
            for error_file in ctx.error_files:  # a rank that raised left its traceback here
                Path(error_file).unlink(missing_ok=True)
        results = [json.loads((Path(out_dir) / f"rank{r}.json").read_text()) for r in range(world)]
        if collect_params:
            results[0]["params"] = torch.load(Path(out_dir) / "params.pt")
        return results
