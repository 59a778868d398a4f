"""One launcher for a run's ranks on this host: how the ranks start is a strategy (forked
processes, local.py; MPICH's mpiexec, mpiexec.py), everything else is written once here.

The parent hosts the rendezvous store (on a free port the kernel picks, so parallel jobs never
collide), gives every rank the same job, and watches them: the first rank to fail brings the
others down and the run fails with that rank's error instead of hanging (a rank that died
without a word is the root cause of its peers' errors, and the earliest such death is named).
Ranks it had to kill, and ranks that died, cannot remove their shared memory, so the parent
removes the run's leftover segments as soon as every rank is gone, and the files in which
torch's CUDA IPC counted their references to each other's buffers. Ctrl-C waits while ranks
start or are being stopped, then interrupts: a half-started set of ranks, or a half-done
clean-up, would leave processes or shared memory behind.
"""

from __future__ import annotations

import json
import re
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Protocol

import torch
import torch.distributed as dist

from odc_bench.errors import RunFailed
from odc_bench.files import interrupts_deferred
from odc_bench.plan.spec import RunSpec
from odc_bench.run.worker import MINIBATCHES_DONE, RankJob, threads_per_rank
from odc_core.liveness import rank_processes
from odc_core.transport.cuda_ipc import sweep_ipc_counters
from odc_core.transport.shm import sweep_stale_segments

# (minibatches done, minibatches in the run) -> None: how a launcher reports a run's progress.
Progress = Callable[[int, int], None]
Entry = Callable[[int, RankJob], None]
_POLL_S = 0.2


@dataclass
class RankExit:
    rank: int
    status: int  # its exit status as a shell reports it: 128 + N when killed by signal N
    error: str | None  # the last line of its error, when it raised
    ended_at: float  # when it was seen to end (seconds, one clock for every rank of a run)


class RankProcesses(Protocol):
    """A run's started ranks, however they were started."""

    world_size: int

    def exits(self) -> list[RankExit]:
        """The ranks that have ended so far."""
        ...

    def gone(self) -> str | None:
        """Why the process manager itself ended before its ranks, or None (it has none, or it runs)."""
        ...

    def wait(self, timeout_s: float) -> None:
        """Block until a rank may have ended, at most timeout_s."""
        ...

    def stop(self) -> None:
        """Kill every rank still running and wait until each is gone."""
        ...


# (the rank's entry, the job, ranks) -> the started ranks: a launcher's one difference.
Starter = Callable[[Entry, RankJob, int], RankProcesses]


def last_line(text: str) -> str:
    """The exception line of a traceback, its class without the module path."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    last = lines[-1].strip() if lines else text
    return re.sub(r"^(?:\w+\.)+(\w+:)", r"\1", last)


def oom_kills(vmstat: Path = Path("/proc/vmstat")) -> int | None:
    """How many processes the kernel's out-of-memory killer has killed since boot, the host's or
    any cgroup's OOM (Linux 4.13 and later); None where the kernel does not say."""
    try:
        text = vmstat.read_text(encoding="utf-8")
    except OSError:
        return None
    found = re.search(r"^oom_kill (\d+)$", text, flags=re.MULTILINE)
    return int(found.group(1)) if found else None


def failure(failed: list[RankExit], when: str, oom_killed: bool = False) -> str:
    """The run's error: a rank that died without a word is the root cause of its peers' errors,
    and of its peers' deaths after it (MPICH may crash a rank whose peer vanished: the one that
    died first is the cause, whatever the ranks' order). `oom_killed`: the kernel's OOM killer
    killed a process while the ranks ran, which a SIGKILL nobody else sent is the sign of."""
    failed = sorted(failed, key=lambda e: (e.ended_at, e.rank))
    for e in failed:
        if e.error is None and e.status > 128:
            how = signal.Signals(e.status - 128).name
            if how == "SIGKILL" and oom_killed:
                return (f"rank {e.rank} died (killed by SIGKILL from the kernel's out-of-memory killer, which ran "
                        f"while the ranks did: this host or the run's cgroup ran out of memory) {when}; use fewer "
                        f"ranks per host, a smaller model or a lower max_tokens")
            return f"rank {e.rank} died (killed by {how}) {when}"
    for e in failed:
        if e.error is not None:
            return f"rank {e.rank} failed: {e.error}"
    return f"rank {failed[0].rank} exited with status {failed[0].status} {when}"


def watch(ranks: RankProcesses, deadline_s: float | None, progress: Callable[[], str],
          on_tick: Callable[[], None] = lambda: None, tolerate_failures: bool = False) -> list[RankExit]:
    """Every rank's exit once all ended well (or ended at all, with tolerate_failures); RunFailed
    at the first failure, when the process manager died, or past the deadline."""
    started, oom_before = time.monotonic(), oom_kills()
    while True:
        ranks.wait(_POLL_S)
        ended = ranks.exits()
        failed = [e for e in ended if e.status != 0]
        if failed and not tolerate_failures:
            raise RunFailed(failure(failed, progress(), oom_before is not None and (oom_kills() or 0) > oom_before))
        if len(ended) == ranks.world_size:
            return ended
        gone = ranks.gone()
        if gone is not None:
            time.sleep(_POLL_S)  # a rank's exit may still be on its way
            if len(ranks.exits()) < ranks.world_size:
                raise RunFailed(gone)
        on_tick()
        if deadline_s is not None and time.monotonic() - started > deadline_s:
            raise RunFailed(f"run exceeded its deadline of {deadline_s:.0f}s {progress()}")


def launch(spec: RunSpec, start: Starter, entry: Entry, collect_params: bool = False,
           on_progress: Progress | None = None) -> list[dict]:
    """Start world_size ranks with `start`, wait for all of them, and return each rank's result.

    With collect_params, rank 0's result also holds the final unsharded parameters; `entry`
    is the rank's entry point (instrumentation may wrap it; the ranks import it by name). The
    run ends in RunFailed at its first failure or after its deadline (deadline_s), if it has one.
    """
    world, total = spec.world_size, len(spec.minibatches)
    store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=spec.config.timeout_s))

    def minibatches_done() -> int:
        return int(store.add(MINIBATCHES_DONE, 0))

    def tick() -> None:
        if on_progress is not None:
            on_progress(minibatches_done(), total)

    with tempfile.TemporaryDirectory(prefix="odc-run-") as out_dir:
        job = RankJob(spec=spec, store_host="127.0.0.1", store_port=store.port, out_dir=out_dir,
                      job_id=f"{spec.run_id[:8]}-{store.port}", threads=threads_per_rank(spec, world, world),
                      collect_params=collect_params)
        ranks: RankProcesses | None = None
        try:
            with interrupts_deferred():
                ranks = start(entry, job, world)
            watch(ranks, spec.config.deadline_s, lambda: f"after {minibatches_done()} of {total} minibatches", tick)
            tick()  # the last minibatches may have ended after the last poll
        finally:
            with interrupts_deferred():
                if ranks is not None:
                    ranks.stop()
                sweep_stale_segments(job_id=job.job_id)
                sweep_ipc_counters(rank_processes(store, world))
        results = [json.loads((Path(out_dir) / f"rank{r}.json").read_text()) for r in range(world)]
        if collect_params:
            results[0]["params"] = torch.load(Path(out_dir) / "params.pt")
        return results
