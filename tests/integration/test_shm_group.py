"""The shared-memory process group against gloo, on real processes: same results, barrier
semantics, timeouts naming the missing rank."""

from __future__ import annotations

import re
import time
import uuid
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from odc_bench.run.ranks import run_ranks
from odc_core.transport.base import PeerTimeout
from odc_core.transport.shm_group import ShmProcessGroup, new_shm_group

pytestmark = pytest.mark.slow

# Elements per rank: uneven, below the world size, and one call that outgrows the slots
# (64 KiB after the first calls) after smaller ones, then small ones again in the grown slots.
SIZES = (1, 7, 1000, 40_003, 5)
DTYPES = (torch.float32, torch.bfloat16)
OPS = (dist.ReduceOp.SUM, dist.ReduceOp.AVG)
# The calls FSDP2 makes: the _single forms from torch 2.13 on; all_gather_into_tensor and
# reduce_scatter_tensor before (the lent GPU machine's 2.11), which reach the group's
# _allgather_base and _reduce_scatter_base.
ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _init(rank: int, world: int, store: dist.Store, job: str, timeout_s: float) -> ShmProcessGroup:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.PrefixStore("world", store), rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    return new_shm_group(job, timeout_s)


def _compare(rank: int, world: int, store: dist.Store, job: str) -> list[tuple]:
    """Per case: the shm group's result and gloo's (the default group), on the same inputs."""
    shm = _init(rank, world, store, job, 60)
    cases = []
    try:
        for dtype in DTYPES:
            for n in SIZES:
                g = torch.Generator().manual_seed(1000 * rank + n)
                x = torch.randn(n, generator=g).to(dtype)
                ours, theirs = torch.empty(n * world, dtype=dtype), torch.empty(n * world, dtype=dtype)
                ALL_GATHER(ours, x, group=shm)
                ALL_GATHER(theirs, x)
                cases.append(("all_gather", dtype, n, ours, theirs))
                y = torch.randn(n * world, generator=g).to(dtype)
                for op in OPS:
                    ours, theirs = torch.empty(n, dtype=dtype), torch.empty(n, dtype=dtype)
                    REDUCE_SCATTER(ours, y, op=op, group=shm)
                    REDUCE_SCATTER(theirs, y.clone(), op=op)
                    cases.append((f"reduce_scatter {op}", dtype, n, ours, theirs))
        # The coalesced forms, which C++ callers (DTensor.full_tensor's functional all-gather) reach.
        xs = [torch.randn(n, generator=g) for n in (3, 11)]
        outs = [torch.empty(x.numel() * world) for x in xs]
        shm.all_gather_single_coalesced(outs, xs).wait()
        for x, out in zip(xs, outs, strict=True):
            theirs = torch.empty_like(out)
            ALL_GATHER(theirs, x)
            cases.append(("all_gather coalesced", x.dtype, x.numel(), out, theirs))
        ys = [torch.randn(n * world, generator=g) for n in (2, 9)]
        outs = [torch.empty(y.numel() // world) for y in ys]
        opts = dist.ReduceScatterOptions()
        opts.reduceOp = dist.ReduceOp.SUM
        shm.reduce_scatter_single_coalesced(outs, ys, opts).wait()
        for y, out in zip(ys, outs, strict=True):
            theirs = torch.empty_like(out)
            REDUCE_SCATTER(theirs, y)
            cases.append(("reduce_scatter coalesced", y.dtype, out.numel(), out, theirs))
        cases.append(("heap_bytes", None, shm.heap_bytes, None, None))
    finally:
        dist.destroy_process_group()
    return cases


@pytest.mark.parametrize("world", [2, 3])
def test_all_gather_and_reduce_scatter_equal_gloo(world: int):
    out = run_ranks(_compare, world, f"g{uuid.uuid4().hex[:10]}", timeout_s=120)
    for rank_cases in out:
        *cases, (_, _, heap_bytes, _, _) = rank_cases
        assert len(cases) == len(DTYPES) * len(SIZES) * (1 + len(OPS)) + 4
        for what, dtype, n, ours, theirs in cases:
            tag = f"{what} {dtype} n={n}"
            if what.startswith("all_gather"):
                assert torch.equal(ours, theirs), tag
            else:  # summation order may differ from gloo's: equal up to rounding
                tol = dict(rtol=1.6e-2, atol=5e-2) if dtype == torch.bfloat16 else {}
                torch.testing.assert_close(ours, theirs, msg=tag, **tol)
        # Two slots, grown once to the largest call (a reduce-scatter input of 40_003 x world fp32).
        assert heap_bytes >= 2 * 40_003 * world * 4


def _late_and_missing(rank: int, world: int, store: dist.Store, job: str) -> dict:
    """Rank 1 arrives 0.5 s late at the first collective; rank 2 never arrives at the second."""
    shm = _init(rank, world, store, job, timeout_s=1.5)
    result: dict = {}
    try:
        if rank == 1:
            time.sleep(0.5)
        started = time.monotonic()
        out = torch.empty(world)
        ALL_GATHER(out, torch.tensor([float(rank)]), group=shm)
        result["first_s"], result["first"] = time.monotonic() - started, out
        if rank == 2:
            store.wait(["peers-gave-up/0", "peers-gave-up/1"], timedelta(seconds=30))
        else:
            try:
                REDUCE_SCATTER(torch.empty(1), torch.ones(world), group=shm)
            except PeerTimeout as e:
                result["error"], result["peer"] = str(e), e.peer
            store.set(f"peers-gave-up/{rank}", "1")
    finally:
        dist.destroy_process_group()
    return result


def test_a_late_rank_holds_everyone_and_a_missing_one_is_named():
    results = run_ranks(_late_and_missing, 3, f"t{uuid.uuid4().hex[:10]}", timeout_s=60)
    for rank, r in enumerate(results):
        assert torch.equal(r["first"], torch.tensor([0.0, 1.0, 2.0]))
        if rank != 1:  # a barrier: nobody completes before the last contribution arrived
            assert r["first_s"] >= 0.4
    for r in results[:2]:
        assert r["peer"] == 2 and "rank 2" in r["error"] and "reduce_scatter" in r["error"]
        # where the missing rank got to: one collective short of this one
        assert re.search(r"reduce_scatter #(\d+) \(it reached #(\d+) of this group's collectives; every rank must run "
                         r"the same collectives", r["error"]), r["error"]
        waited, reached = map(int, re.search(r"#(\d+) \(it reached #(\d+)", r["error"]).groups())
        assert reached == waited - 1
    assert "error" not in results[2]


def _unsupported_op(rank: int, world: int, store: dist.Store, job: str) -> str:
    shm = _init(rank, world, store, job, 60)
    try:
        REDUCE_SCATTER(torch.empty(1), torch.ones(world), op=dist.ReduceOp.MAX, group=shm)
    except ValueError as e:
        return str(e)
    finally:
        dist.destroy_process_group()
    return "no error"


def test_an_unsupported_reduction_is_refused_before_anyone_waits():
    messages = run_ranks(_unsupported_op, 2, f"u{uuid.uuid4().hex[:10]}", timeout_s=60)
    assert all("supports SUM and AVG" in m for m in messages)
