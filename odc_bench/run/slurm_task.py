"""One rank of a run as a task of a SLURM job that submitit started (odc_bench/cli/slurm.py submits it).

`run_task`, called inside each task: the torch.distributed environment comes from submitit's
JobEnvironment (global rank, local rank, world size, the
first node as master). Device selection is left alone: CUDA_VISIBLE_DEVICES is not touched
and a rank picks cuda:local_rank among the devices it sees. Rank 0 hosts the rendezvous
store on a port the kernel picks and publishes it in the job's folder (which submitit
requires to be shared between nodes); every rank leaves its result or its error there, and
rank 0 gathers them and writes the run's row. Nobody watches the ranks from outside, so each
notices a dead peer through its own timeouts and heartbeats (odc_core/liveness.py); when
rank 0 is the one that died, the first surviving rank to claim the report writes the row.

SLURM ending an attempt is not the run failing. Before it kills a job it requeues (a
preemption) or cancels, SLURM sends every task SIGTERM, KillWait seconds ahead (submitit only
logs it); before the time limit it sends SIGUSR2, on which submitit's rank 0 requeues the job
and exits. The tasks then die one by one, and a survivor sees a peer vanish. A task signalled so
(`_Ending`) records no row for that: the requeued attempt resumes from the newest checkpoint
and writes the run's one row (a cancelled run has none; a re-run resumes it).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from odc_bench.errors import RunFailed
from odc_bench.files import atomic_write_text
from odc_bench.plan.spec import RunSpec

if TYPE_CHECKING:
    import submitit


def in_task() -> bool:
    """Whether this process is a task of a SLURM job that submitit started (one rank of a run)."""
    return os.environ.get("SUBMITIT_EXECUTOR") == "slurm" and "SLURM_PROCID" in os.environ


def task_rank() -> int:
    """This task's global rank (0 outside a SLURM task)."""
    return int(os.environ.get("SLURM_PROCID", "0"))


def _wait_for_file(candidates: Sequence[Path], timeout_s: float, what: str) -> Path:
    deadline = time.monotonic() + timeout_s
    while True:
        for path in candidates:
            if path.exists():
                return path
        if time.monotonic() > deadline:
            raise RunFailed(f"waited {timeout_s:.0f}s for {what} ({candidates[0].parent}); it never arrived")
        time.sleep(0.1)


def _export_torch_env(env: submitit.JobEnvironment, port: int) -> None:
    """torch.distributed's env:// variables, for code that reads them; devices are left alone."""
    os.environ.update(MASTER_ADDR=env.hostnames[0], MASTER_PORT=str(port), RANK=str(env.global_rank),
                      WORLD_SIZE=str(env.num_tasks), LOCAL_RANK=str(env.local_rank),
                      LOCAL_WORLD_SIZE=str(env.num_tasks // env.num_nodes))


def _job_id(spec: RunSpec, slurm_job: str, attempt: str) -> str:
    """The id naming one attempt's shared memory: the run, the SLURM job, restart and repeat."""
    return f"{spec.run_id[:8]}-{slurm_job}-{attempt}"


class _Ending:
    """Whether SLURM has signalled this task that the attempt is ending (module docstring): the
    signals' handlers are wrapped to note it, and the handlers they had (submitit's) still run."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR2)
    # A peer's death can reach a task before the signal sent to both does: wait this long for it.
    GRACE_S = 1.0

    def __init__(self) -> None:
        self.signum: int | None = None

    @contextlib.contextmanager
    def watching(self) -> Iterator[_Ending]:
        if threading.current_thread() is not threading.main_thread():  # only there can handlers change
            yield self
            return
        previous = {s: signal.getsignal(s) for s in self.SIGNALS}
        for s, handler in previous.items():
            signal.signal(s, functools.partial(self._note, handler))
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _note(self, previous: object, signum: int, frame: object) -> None:
        self.signum = signum
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:  # what the signal would have done: end the process
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def explains(self, error: BaseException | None = None) -> bool:
        """Whether a failure is the attempt ending: a peer gone (`error` a PeerLost, or another
        rank's error: None) in a task SLURM signalled, by now or within GRACE_S."""
        from odc_core.liveness import PeerLost

        if error is not None and not isinstance(error, PeerLost):
            return False
        deadline = time.monotonic() + self.GRACE_S
        while self.signum is None and time.monotonic() < deadline:
            time.sleep(0.05)  # the signal's handler runs between these sleeps
        return self.signum is not None


def run_task(spec: RunSpec, repeat_index: int = 0) -> list[dict] | None:
    """Run this task's rank; rank 0 returns every rank's result, the other ranks None (and every
    rank None when SLURM is ending the attempt: module docstring)."""
    with _Ending().watching() as ending:
        return _run_task(spec, repeat_index, ending)


def _run_task(spec: RunSpec, repeat_index: int, ending: _Ending) -> list[dict] | None:
    """Run this task's rank; rank 0 returns every rank's result, the other ranks None.

    The job's time limit (hydra.launcher.timeout_min) bounds the run here, not deadline_s.
    `repeat_index` tells the repeats of one job apart (each meets its peers in a folder of its own).
    """
    # Imported here: every run asks in_task(), and only a SLURM task needs torch and submitit.
    import submitit
    import torch.distributed as dist

    from odc_bench.run.worker import RankJob, run_rank, threads_per_rank
    from odc_core.liveness import PeerLost
    from odc_core.transport.mpi import NETWORK_ONLY_ENV
    from odc_core.transport.shm import sweep_stale_segments

    env = submitit.JobEnvironment()
    world, rank, local_rank = env.num_tasks, env.global_rank, env.local_rank
    if world != spec.world_size:
        raise RunFailed(f"the SLURM job has {world} tasks but world_size={spec.world_size}; "
                        f"set hydra.launcher.nodes x tasks_per_node = world_size")
    timeout_s = spec.config.timeout_s
    # One exchange folder per attempt: a requeued job must not find the last attempt's store address.
    restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    shared = Path(env.paths.folder) / f"ranks.{restarts}.{repeat_index}"
    if local_rank == 0:  # SLURM killed the earlier attempts' ranks (a requeue): their segments go now
        for attempt in range(restarts):
            sweep_stale_segments(job_id=_job_id(spec, env.job_id, f"{attempt}.{repeat_index}"))
    shared.mkdir(parents=True, exist_ok=True)
    if rank == 0:  # the store lives as long as this function, past every rank's end
        store = dist.TCPStore(env.hostnames[0], 0, world, is_master=True, wait_for_workers=False,
                              timeout=timedelta(seconds=timeout_s))
        host, port = env.hostnames[0], store.port
        atomic_write_text(shared / "store.json", json.dumps(dict(host=host, port=port, run_id=spec.run_id)))
    else:
        found = _wait_for_file([shared / "store.json"], timeout_s, "rank 0 to publish its store address")
        info = json.loads(found.read_text())
        if info["run_id"] != spec.run_id:
            raise RunFailed(f"rank {rank} resolved run {spec.run_id} but rank 0 runs {info['run_id']}")
        host, port = info["host"], int(info["port"])
    _export_torch_env(env, port)
    if getattr(spec.config.engine.options, "mpi_network_only", False):
        os.environ.update(NETWORK_ONLY_ENV)  # before the heap starts MPI
    job = RankJob(spec=spec, store_host=host, store_port=port, out_dir=str(shared),
                  job_id=_job_id(spec, env.job_id, shared.name.removeprefix("ranks.")),
                  threads=threads_per_rank(spec, world // env.num_nodes, 1), store_rank=0)
    try:
        run_rank(rank, job, local_rank)
    except Exception as e:  # reported through the shared folder: rank 0 names the failing rank
        atomic_write_text(shared / f"rank{rank}.error", in_words(e))
        if ending.explains(e):
            return None
        rank0_lost = isinstance(e, PeerLost) and 0 in e.peers
        if (rank != 0 and not rank0_lost) or not _claim_report(shared):
            return None
        raise RunFailed(_first_error(shared) if rank == 0 else f"rank {rank} failed: {in_words(e)}") from None
    if rank != 0:
        atomic_write_text(shared / f"rank{rank}.done", "")
        return None
    for r in range(1, world):
        got = _wait_for_file([shared / f"rank{r}.done", shared / f"rank{r}.error"], timeout_s, f"rank {r} to finish")
        if got.suffix == ".error":
            if ending.explains():
                return None
            raise RunFailed(f"rank {r} failed: {got.read_text()}")
    results = [json.loads((shared / f"rank{r}.json").read_text()) for r in range(world)]
    shutil.rmtree(shared, ignore_errors=True)
    return results


def in_words(error: Exception) -> str:
    """A rank's error in one line; submitit's refusal to requeue, raised from its time-limit
    handler into the run, in the words of this launcher's settings."""
    from submitit.core.utils import UncompletedJobError

    from odc_core.liveness import one_line

    if isinstance(error, UncompletedJobError):
        return (f"SLURM warned that the job's time limit was near (hydra.launcher.signal_delay_s ahead of "
                f"timeout_min) after its last requeue (hydra.launcher.max_num_timeout), and submitit ended the run "
                f"({one_line(error)}); raise timeout_min, or set checkpoint.every and raise max_num_timeout")
    if isinstance(error, subprocess.CalledProcessError) and list(error.cmd)[:2] == ["scontrol", "requeue"]:
        # SLURM's warning and its time-out at one check (a limit lowered below the job's run time).
        return (f"SLURM ended the job (its time limit, or a cancel) while submitit requeued it at SLURM's warning "
                f"({one_line(error)}); run the sweep again to resume from the newest checkpoint")
    return one_line(error)


def _claim_report(shared: Path) -> bool:
    """Whether this rank writes the failed run's row: the first to create the claim file does."""
    try:
        (shared / "report").open("x").close()
        return True
    except FileExistsError:
        return False


def _first_error(shared: Path) -> str:
    """The root cause among the ranks' errors: the earliest one (peers of a failed rank fail later,
    when their waits on it time out or its connections close)."""
    time.sleep(1.0)  # ranks failing together all get to write their errors
    errors = sorted(shared.glob("rank*.error"), key=lambda p: p.stat().st_mtime)
    if not errors:
        return "rank 0 failed"
    return f"rank {errors[0].stem.removeprefix('rank')} failed: {errors[0].read_text()}"
