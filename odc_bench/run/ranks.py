"""Run a function on N local rank processes around one TCPStore and collect what each returns.

For benchmarks and tests of the communication layer, which need real processes but not the
training job's RunSpec (run/local.py runs those).
"""

from __future__ import annotations

import socket
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as tmp

from odc_bench.files import interrupts_deferred
from odc_core.transport.cuda_ipc import sweep_ipc_counters
from odc_core.transport.shm import sweep_stale_segments

# fn(rank, world_size, store, *args) -> a picklable result
RankFn = Callable[..., Any]


class RanksFailed(RuntimeError):
    """A rank raised, died or outlived the deadline; the message names the rank."""


def _entry(rank: int, fn: RankFn, world_size: int, port: int, timeout_s: float, out_dir: str, args: tuple) -> None:
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=timedelta(seconds=timeout_s))
    result = fn(rank, world_size, store, *args)
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")


def run_ranks(fn: RankFn, world_size: int, *args: Any, timeout_s: float = 60.0,
              start_method: str = "forkserver") -> list[Any]:
    """Run fn(rank, world_size, store, *args) on world_size fresh processes; return results by rank.

    `fn` must be importable by name (a module-level function). The first rank to fail kills
    the others, and the error names it, so a broken rank never hangs its peers' caller.
    """
    store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=timeout_s))
    with tempfile.TemporaryDirectory(prefix="odc-ranks-") as out_dir:
        ctx: tmp.ProcessContext | None = None
        try:
            with interrupts_deferred():  # a Ctrl-C mid-start would orphan the ranks already started
                ctx = tmp.start_processes(_entry, args=(fn, world_size, store.port, timeout_s, out_dir, args),
                                          nprocs=world_size, join=False, start_method=start_method)
            started = time.monotonic()
            while not ctx.join(timeout=0.1):
                if time.monotonic() - started > timeout_s:
                    raise RanksFailed(f"ranks still running after {timeout_s:.0f}s")
        except tmp.ProcessRaisedException as e:
            raise RanksFailed(f"rank {e.error_index} failed:\n{e}") from None
        except tmp.ProcessExitedException as e:
            raise RanksFailed(f"rank {e.error_index} died: {e}") from None
        finally:
            with interrupts_deferred():
                processes = ctx.processes if ctx is not None else []
                for p in processes:
                    if p.is_alive():
                        p.kill()
                    p.join()
                # Every rank is gone: what a killed one left of its shared memory (fn's heaps and
                # process groups, under job ids this function does not know: every dead
                # creator's) and of torch's CUDA IPC counts can go.
                sweep_stale_segments()
                sweep_ipc_counters((socket.gethostname(), p.pid) for p in processes)
        return [torch.load(Path(out_dir) / f"rank{r}.pt", weights_only=False) for r in range(world_size)]
