"""A run's ranks under MPICH's mpiexec on this host, for the MPI transport (run/launch.py does
the rest, as for forked ranks).

The MPI transport needs its ranks started by an MPI process manager (odc_core/transport/mpi.py).
mpiexec starts each rank as `sh -c 'python -m odc_bench.run.mpiexec DIR; echo $? > ...'`:
the shell outlives the rank and records its exit status (128 + the signal for a killed
rank), which mpiexec itself reports only for the job. Each rank records its pid; on the way
out the parent kills mpiexec's process group and every rank pid still there, so nothing is
orphaned whatever happened. The rank side runs `fn(rank, *args)` from the call the parent
pickled into DIR and saves its return value or its error there.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import odc_bench
from odc_bench.errors import ConfigError
from odc_bench.plan.spec import RunSpec
from odc_bench.run.launch import Entry, Progress, RankExit, last_line, launch, watch
from odc_bench.run.worker import RankJob, rank_entry
from odc_core.transport.mpi import NETWORK_ONLY_ENV, STACK_ENV
from odc_core.transport.shm import process_start_time

REPO = Path(odc_bench.__file__).resolve().parents[1]
_POLL_S = 0.2


def uses_mpi(spec: RunSpec) -> bool:
    """Whether the run's ranks need an MPI process manager (engine.transport=mpi)."""
    return getattr(spec.config.engine.options, "transport", None) == "mpi"


def mpiexec_path() -> str:
    """MPICH's mpiexec (the one beside this interpreter first); ConfigError when there is none."""
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    found = shutil.which("mpiexec", path=search)
    probe = subprocess.run([found, "-info"], capture_output=True, text=True, timeout=30) if found else None
    if found is None or probe is None or probe.returncode != 0 or "HYDRA" not in probe.stdout:
        raise ConfigError("engine.transport=mpi runs its ranks under MPICH's mpiexec (hydra), which is not installed "
                          "here; pip install 'odc-bench[mpi]' (mpi4py and the mpich wheel)")
    return found


def rank_env(network_only: bool) -> dict[str, str]:
    """The ranks' environment: the MPI stack, loopback only, MPI off shared memory if asked."""
    env = dict(os.environ, **STACK_ENV, FI_TCP_IFACE="lo", ODC_MPI_HOST="127.0.0.1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    if network_only:
        env.update(NETWORK_ONLY_ENV)
    return env


class MpiexecRanks:
    """world_size ranks under one mpiexec, their files in `folder`."""

    def __init__(self, folder: Path, world_size: int, fn: Callable[..., Any], args: tuple, network_only: bool) -> None:
        self.folder, self.world_size = folder, world_size
        (folder / "call.pkl").write_bytes(pickle.dumps((fn, args)))
        # The shell ignores SIGUSR1, hydra's notice to survivors that a rank ended, and so does the rank.
        entry = (f"trap '' USR1; {shlex.quote(sys.executable)} -m odc_bench.run.mpiexec \"$0\"; "
                 "echo $? > \"$0/rank$PMI_RANK.status\"")
        command = [mpiexec_path(), "-disable-auto-cleanup", "-n", str(world_size), "sh", "-c", entry, str(folder)]
        self.log = (folder / "mpiexec.log").open("wb")
        self.proc = subprocess.Popen(command, cwd=REPO, env=rank_env(network_only), stdin=subprocess.DEVNULL,
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def exits(self) -> list[RankExit]:
        """The ranks that have ended so far."""
        out = []
        for r in range(self.world_size):
            status_file = self.folder / f"rank{r}.status"
            try:
                status, ended_at = int(status_file.read_text()), status_file.stat().st_mtime_ns / 1e9
            except (OSError, ValueError):  # not ended, or its shell is still writing
                continue
            error_file = self.folder / f"rank{r}.error"
            out.append(RankExit(r, status, last_line(error_file.read_text()) if error_file.exists() else None,
                                ended_at))
        return out

    def wait(self, timeout_s: float) -> None:
        time.sleep(timeout_s)  # the ranks' status files are polled

    def gone(self) -> str | None:
        """mpiexec's own failure (it ended before its ranks), in its last line; None while it runs."""
        if self.proc.poll() is None:
            return None
        lines = [ln for ln in (self.folder / "mpiexec.log").read_text(errors="replace").splitlines() if ln.strip()]
        return f"mpiexec exited with status {self.proc.returncode}: {lines[-1].strip() if lines else 'no output'}"

    def stop(self) -> None:
        """Kill whatever is left, and wait until it is gone: mpiexec's process group, then every
        rank still running (a rank's pid counts only with the start time it recorded: pids are reused)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        ranks = [tuple(map(int, f.read_text().split())) for f in self.folder.glob("rank*.pid")]
        left = [pid for pid, start in ranks if process_start_time(pid) == start]
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10.0
        while any(process_start_time(pid) is not None for pid in left) and time.monotonic() < deadline:
            time.sleep(0.01)  # SIGKILL lands asynchronously; a killed orphan ends as a zombie of init
        self.log.close()


def run_mpi_ranks(fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 60.0,
                  network_only: bool = True, tolerate_failures: bool = False) -> list[Any]:
    """Run fn(rank, world_size, store, *args) on world_size ranks under mpiexec; results by rank.

    The MPI counterpart of run/ranks.py's run_ranks, for benchmarks and tests of the transport:
    `fn` must be importable by name. RunFailed names the first rank to fail; with
    tolerate_failures every rank runs to its end and a failed rank's result is its RankExit.
    """
    store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=timeout_s))
    with tempfile.TemporaryDirectory(prefix="odc-mpi-") as folder:
        ranks = MpiexecRanks(Path(folder), world_size, _with_store,
                             (fn, world_size, store.port, timeout_s, args), network_only)
        try:
            exits = {e.rank: e for e in watch(ranks, timeout_s, lambda: "", tolerate_failures=tolerate_failures)}
        finally:
            ranks.stop()
        results = [Path(folder) / f"rank{r}.pt" for r in range(world_size)]
        return [exits[r] if exits[r].status != 0 else torch.load(f, weights_only=False) if f.exists() else None
                for r, f in enumerate(results)]


def _with_store(rank: int, fn: Callable[..., Any], world_size: int, port: int, timeout_s: float, args: tuple) -> Any:
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=timedelta(seconds=timeout_s))
    return fn(rank, world_size, store, *args)


def run_mpi(spec: RunSpec, collect_params: bool = False, entry: Entry = rank_entry,
            on_progress: Progress | None = None) -> list[dict]:
    """run/local.py's run_local with the ranks under mpiexec (engine.transport=mpi)."""
    network_only = bool(getattr(spec.config.engine.options, "mpi_network_only", False))

    def start(entry: Entry, job: RankJob, world_size: int) -> MpiexecRanks:
        return MpiexecRanks(Path(job.out_dir), world_size, entry, (job,), network_only)

    return launch(spec, start, entry, collect_params, on_progress)


def _rank_main(folder: Path) -> None:
    """One rank, started by mpiexec: run the pickled call, leave its result or its error in `folder`."""
    rank = int(os.environ["PMI_RANK"])
    (folder / f"rank{rank}.pid").write_text(f"{os.getpid()} {process_start_time(os.getpid())}")
    fn, args = pickle.loads((folder / "call.pkl").read_bytes())
    try:
        result = fn(rank, *args)
        if result is not None:
            torch.save(result, folder / f"rank{rank}.pt")
    except BaseException:
        (folder / f"rank{rank}.error").write_text(traceback.format_exc())
        sys.stdout.flush()
        os._exit(1)  # not sys.exit: MPI's exit handlers could wait on a peer that failed


if __name__ == "__main__":
    _rank_main(Path(sys.argv[1]))
