"""A rank SIGTERMed mid-minibatch, as torchrun and torch.multiprocessing stop a failed rank's
peers, removes its shared-memory segments before it dies (odc_core/transport/sigterm.py): here
one rank is terminated inside a minibatch and the launcher then SIGTERMs the other, which waits
for it; neither leaves a segment of the job, nor a file of torch's CUDA IPC under its pid."""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from odc_bench.run.ranks import RanksFailed, run_ranks
from odc_core import engine_context, make_engine
from odc_core.transport.shm import SHM_DIR, list_segments, of_job

pytestmark = pytest.mark.slow


def _terminated(rank: int, world: int, store: dist.Store, engine_name: str, folder: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank, world_size=world,
                            timeout=timedelta(seconds=30))
    ctx = engine_context(timeout_s=30.0)
    (Path(folder) / f"rank{rank}").write_text(f"{ctx.job_id} {os.getpid()}")
    (SHM_DIR / f"torch_{os.getpid()}_0_0").touch()  # a stand-in for torch's CUDA IPC count file
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))
    engine = make_engine(engine_name, ctx)
    engine.wrap(model, [model[0], model[2]])
    engine.configure_optimizer(partial(torch.optim.SGD, lr=0.1))
    engine.begin_minibatch()
    model(torch.randn(2, 8)).sum().backward()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGTERM)
    if engine_name == "odc":
        engine.finish_minibatch()  # waits for rank 1's gradients until the launcher SIGTERMs it
    else:
        # Still computing when SIGTERMed: in a collective, gloo would see rank 1's socket close and
        # raise first (an exception's exit closes the engine's heaps at exit).
        time.sleep(60)


@pytest.mark.parametrize("engine_name", ["odc", "collective"])
def test_sigtermed_ranks_leave_no_segment(engine_name, tmp_path):
    with pytest.raises(RanksFailed, match="signal SIGTERM"):
        run_ranks(_terminated, 2, engine_name, str(tmp_path), timeout_s=60)
    ranks = [(tmp_path / f"rank{r}").read_text().split() for r in range(2)]
    jobs = {job for job, _ in ranks}
    assert len(jobs) == 1
    job = jobs.pop()
    assert [s for s in list_segments() if of_job(s, job)] == []
    assert [p.name for _, pid in ranks for p in SHM_DIR.glob(f"torch_{pid}_*")] == [], "run_ranks swept them"
