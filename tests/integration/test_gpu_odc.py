"""ODC on GPUs: the CUDA IPC heap under the engine, ranks sharing one GPU (the only multi-rank
case a one-GPU machine can run), and what one GPU allows NVSHMEM. On a machine without CUDA
these skip, saying why; the conformance suite (test_transport_conformance.py) runs cuda_ipc
wherever CUDA is present."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import timedelta
from functools import partial

import pytest
import torch
import torch.distributed as dist
from torch.distributed import _symmetric_memory as symm_mem

from odc_bench.jobs.train import execute
from odc_bench.plan.spec import resolve
from odc_bench.run.local import run_local
from odc_bench.run.ranks import RanksFailed, run_ranks
from odc_core.transport.registry import make_heap
from odc_core.transport.shm import process_start_time
from tests.helpers import run_config
from tests.helpers.reference import relative_error, train_single_process
from tests.integration.test_reliability import _segments_of, ipc_counters_of, killing_entry

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine: ODC on "
                                 "GPUs is checked on the lent GPU machine (make gpu-check)"),
              pytest.mark.gpu]

SMALL = ("device=cuda", "engine=odc", "model.num_layers=2", "world_size=2", "minibatch_size=2",
         "warmup_minibatches=0", "dataset.length_scale=0.005", "num_minibatches=3", "timeout_s=30")


def _uneven(spec):
    """Rank 1 idles in minibatch 0, rank 0 in minibatch 2; minibatch 1 splits 3 to 1."""
    splits = [([0, 1, 2, 3], []), ([0, 1, 2], [3]), ([], [0, 1, 2, 3])]
    return replace(spec, minibatches=[replace(mb, plan=[[[i] for i in mine], [[i] for i in theirs]])
                                      for mb, (mine, theirs) in zip(spec.minibatches, splits, strict=True)])


# What these tests check is the engine: their ranks run the decoder eagerly (compile=false),
# where each rank of each run would otherwise compile its layers anew within gpu-check's six
# minutes. The first keeps the compiled layers, as runs on a GPU have them.
EAGER = "compile=false"


@pytest.mark.parametrize("staleness", [0, 1])
def test_two_ranks_sharing_the_gpu_match_one_process_with_uneven_counts(staleness):
    spec = _uneven(resolve(run_config(*SMALL, f"engine.staleness={staleness}", *([EAGER] if staleness else []))))
    assert spec.config.engine.options.transport == "cuda_ipc", "auto picks the CUDA heap on GPUs"
    results = run_local(spec, collect_params=True)
    reference, _ = train_single_process(spec, staleness=staleness, device=torch.device("cuda"))
    # At staleness 0 the ranks' layers are compiled (compile_dense) and the reference's eager:
    # the same sums in other orders, which AdamW turns into small steps where gradients are near zero.
    assert relative_error(results[0]["params"], reference) < 1e-4
    assert all(r["heap_bytes"] > 0 for r in results)


def test_bf16_on_the_gpu_stays_near_fp32():
    runs = {p: run_local(resolve(run_config(*SMALL, EAGER, f"precision={p}")), collect_params=True)[0]["params"]
            for p in ("fp32", "bf16")}
    assert relative_error(runs["bf16"], runs["fp32"]) < 1e-2


def test_a_dead_rank_on_the_gpu_fails_the_run_by_name_and_leaves_nothing(results_dir, tmp_path):
    spec = resolve(run_config(*SMALL, EAGER, "timeout_s=5", "seed=0"))
    row = execute(spec, results_dir, launch=partial(run_local, entry=partial(killing_entry, str(tmp_path))))
    assert row["status"] == "failed" and row["error"].startswith("rank 1 died (killed by SIGKILL)"), row["error"]
    ranks = [(tmp_path / f"rank{r}").read_text().split() for r in range(2)]
    assert _segments_of(ranks[0][2]) == [] and ipc_counters_of(ranks) == []
    # No rank process is left, so no IPC mapping either: a mapping lives as long as its process.
    assert all(process_start_time(int(pid)) != int(start) for pid, start, _ in ranks)


def _nvshmem_rank(rank: int, world: int, store: dist.Store) -> dict:
    torch.cuda.set_device(0)
    dist.init_process_group("cpu:gloo,cuda:nccl", store=dist.PrefixStore("pg", store), rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    try:
        heap = make_heap("nvshmem", "cuda", rank, world, f"n{uuid.uuid4().hex[:6]}", dist.PrefixStore("h", store),
                         30.0)
        try:
            data = heap.alloc("data", 1000, torch.float32)
            data.copy_(torch.arange(1000.0))
            heap.alloc("flags", 2, torch.int64)
            heap.barrier(30)
            out = torch.empty(10, device="cuda")
            heap.get(out, "data", 0, offset=5)
            heap.accumulate("data", 0, 0, torch.ones(1000, device="cuda"))
            heap.store("flags", 1, 7)
            heap.quiet()
            return {"got": out.cpu(), "after": data.cpu(), "flag": heap.load("flags", 0, 1),
                    "old": heap.fetch_add("flags", 0, 0, 3), "now": heap.load("flags", 0, 0)}
        finally:
            heap.close()
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not torch.cuda.is_available() or not symm_mem.is_nvshmem_available(),
                    reason="this torch or machine has no NVSHMEM")
def test_nvshmem_runs_one_rank_per_gpu_and_refuses_two_on_one():
    (one,) = run_ranks(_nvshmem_rank, 1, timeout_s=30)  # within gpu-check's step for NVSHMEM
    assert torch.equal(one["got"], torch.arange(5.0, 15.0))
    assert torch.equal(one["after"], torch.arange(1000.0) + 1)
    assert (one["flag"], one["old"], one["now"]) == (7, 0, 3)
    with pytest.raises(RanksFailed, match="share one GPU"):
        run_ranks(_nvshmem_rank, 2, timeout_s=30)
