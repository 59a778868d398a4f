"""Run one job's ranks as real processes on this host.

The parent hosts the rendezvous store (on a free port the kernel picks, so parallel jobs
never collide) and watches its ranks: the first rank to fail brings the others down and the
run fails with that rank's error instead of hanging.
"""

from __future__ import annotations

import json
import multiprocessing
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as tmp

from odc_bench import progress
from odc_bench.config import RunSpec
from odc_bench.worker import MINIBATCHES_DONE, RankJob, rank_entry

# Ranks fork from a server that has imported torch and the worker once, so a sweep pays
# torch's import time once instead of once per rank per run.
multiprocessing.set_forkserver_preload(["torch", "odc_bench.worker"])


class RunFailed(RuntimeError):
    """A rank failed or the run outlived its deadline; the message names the rank."""


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else text


def run_local(spec: RunSpec, deadline_s: float | None = None, collect_params: bool = False,
              entry: Callable[[int, RankJob], None] = rank_entry) -> list[dict]:
    """Start world_size ranks, wait for all of them, and return each rank's result.

    With collect_params, rank 0's result also holds the final unsharded parameters; `entry`
    lets instrumentation wrap the rank's entry point (it must be importable by the ranks).
    """
    world = spec.world_size
    store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=float(spec.config["timeout_s"])))
    with tempfile.TemporaryDirectory(prefix="odc-run-") as out_dir:
        job = RankJob(spec=spec, store_host="127.0.0.1", store_port=store.port, out_dir=out_dir,
                      job_id=f"{spec.run_id[:8]}-{store.port}", collect_params=collect_params)
        ctx = tmp.start_processes(entry, args=(job,), nprocs=world, join=False, start_method="forkserver")
        started = time.monotonic()
        bar = progress.current()

        def show_minibatches() -> None:
            if bar is not None and bar.enabled:
                bar.run_minibatches(int(store.add(MINIBATCHES_DONE, 0)), len(spec.minibatches))

        try:
            while not ctx.join(timeout=0.2):
                show_minibatches()
                if deadline_s is not None and time.monotonic() - started > deadline_s:
                    raise RunFailed(f"run exceeded its deadline of {deadline_s:.0f}s")
            show_minibatches()
        except tmp.ProcessRaisedException as e:
            raise RunFailed(f"rank {e.error_index} failed: {_last_line(str(e))}") from None
        except tmp.ProcessExitedException as e:
            raise RunFailed(f"rank {e.error_index} died ({_last_line(str(e))})") from None
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                p.join()
        results = [json.loads((Path(out_dir) / f"rank{r}.json").read_text()) for r in range(world)]
        if collect_params:
            results[0]["params"] = torch.load(Path(out_dir) / "params.pt")
        return results
