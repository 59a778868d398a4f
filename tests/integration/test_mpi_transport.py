"""The MPI symmetric heap: the primitives against gloo, exactly-once accumulation, passive
target, timeouts and a SIGKILLed peer.

Every rank is a real process started by MPICH's mpiexec (odc_bench/run/mpiexec.py) around a
TCPStore hosted here, on MPI's network path (no shared memory inside MPI, loopback only): the
path ranks on different hosts take.
"""

from __future__ import annotations

import os
import resource
import signal
import time
import uuid
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from odc_bench.run.launch import RankExit
from odc_bench.run.mpiexec import run_mpi_ranks
from odc_core.primitives import ShardLayout, gather, scatter_accumulate
from odc_core.transport.base import PeerTimeout
from tests.helpers.mpi import requires_mpi
from tests.helpers.processes import descendants
from tests.helpers.pushes import push_integers
from tests.helpers.shm import left_behind

pytestmark = [pytest.mark.slow, pytest.mark.mpi, requires_mpi]


def run(fn, world: int, *args, timeout_s: float = 90) -> list:
    return run_mpi_ranks(fn, world, *args, timeout_s=timeout_s)


SIZES = (1, 2, 1000, 3 * 40_000 + 2)  # not divisible by 3, smaller than the world, many elements
all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def job() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


def heap(rank: int, world: int, store: dist.Store, name: str, timeout_s: float = 30):
    from odc_core.transport.mpi import MpiHeap

    torch.set_num_threads(1)
    return MpiHeap(rank, world, name, store, timeout_s=timeout_s)


def _compare(rank: int, world: int, store: dist.Store, name: str) -> list[tuple]:
    dist.init_process_group("gloo", store=dist.PrefixStore("gloo", store), rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    cases = []
    try:
        with heap(rank, world, store, name) as h:
            for dtype in (torch.float32, torch.bfloat16):
                for numel in SIZES:
                    layout = ShardLayout(numel, world)
                    g = torch.Generator().manual_seed(1000 * rank + numel)
                    tag = f"{dtype}/{numel}"
                    shard = h.alloc(f"params/{tag}", layout.shard_numel, dtype)
                    shard.copy_(torch.randn(layout.shard_numel, generator=g).to(dtype))
                    acc = h.alloc(f"grads/{tag}", layout.shard_numel, torch.float32)
                    grad = torch.randn(numel, generator=g).to(dtype)
                    h.barrier(60)

                    ours = torch.empty(numel, dtype=dtype)
                    gather(h, f"params/{tag}", ours, layout)
                    ours_padded = torch.empty(layout.padded_numel, dtype=dtype)
                    gather(h, f"params/{tag}", ours_padded, layout)
                    scatter_accumulate(h, f"grads/{tag}", grad, layout)  # bf16 converts to fp32 on the way
                    padded_grad = torch.zeros(layout.padded_numel, dtype=dtype)
                    padded_grad[:numel] = grad
                    scatter_accumulate(h, f"grads/{tag}", padded_grad, layout)

                    h.barrier(60)  # every push has landed, and nobody waits on a rank that is in gloo
                    theirs = torch.empty(layout.padded_numel, dtype=dtype)
                    all_gather(theirs, shard.clone())
                    reduced = torch.empty(layout.shard_numel)
                    reduce_scatter(reduced, padded_grad.float())
                    cases.append((tag, ours, ours_padded, theirs, acc.clone(), reduced))
    finally:
        dist.destroy_process_group()
    return cases


def test_primitives_equal_gloo_collectives():
    world = 3
    out = run(_compare, world, job())
    for rank_cases in out:
        assert len(rank_cases) == 2 * len(SIZES)
        for tag, ours, ours_padded, theirs, acc, reduced in rank_cases:
            assert torch.equal(ours, theirs[:ours.numel()]), tag
            assert torch.equal(ours_padded, theirs), tag
            torch.testing.assert_close(acc, 2 * reduced, msg=tag)  # summation order differs from gloo's


def _push_integers(rank: int, world: int, store: dist.Store, name: str, numel: int, pushes: int) -> dict:
    """Two threads push random integer-valued slices (fp32 and bf16) into rank 0's buffer."""
    with heap(rank, world, store, name) as h:
        return push_integers(h, numel, pushes, bf16_every_other=True)


def test_concurrent_pushes_into_one_owner_land_exactly_once():
    world, numel, pushes = 3, 8192, 500  # 3000 pushes and as many fetch_adds
    out = run(_push_integers, world, job(), numel, pushes)
    total = sum(r["expected"] for r in out)
    assert all(r["count"] == world * 2 * pushes for r in out)
    assert sorted(sum((r["olds"] for r in out), [])) == list(range(world * 2 * pushes)), "fetch_add must be atomic"
    assert total.abs().max() < 2**24  # integer sums stay exact in fp32
    assert torch.equal(out[0]["acc"], total)


def _sleepy_owner(rank: int, world: int, store: dist.Store, name: str, sleep_s: float, gathers: int) -> dict:
    layout = ShardLayout(3 * 65536 + 1, world)
    with heap(rank, world, store, name) as h:
        shard = h.alloc("p", layout.shard_numel, torch.float32)
        shard.copy_(torch.arange(layout.shard_numel) + rank * layout.shard_numel)
        h.barrier(30)
        if rank == 0:
            before = resource.getrusage(resource.RUSAGE_SELF)
            time.sleep(sleep_s)  # outside MPI: only the heap's progress thread serves the gathers
            woke = time.monotonic()
            after = resource.getrusage(resource.RUSAGE_SELF)
            h.barrier(30)
            cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
            return dict(woke=woke, cpu_s=cpu)
        out = torch.empty(layout.numel)
        started = time.monotonic()
        for _ in range(gathers):
            gather(h, "p", out, layout)
        done = time.monotonic()
        correct = torch.equal(out, torch.arange(layout.numel, dtype=torch.float32))
        h.barrier(30)
        return dict(started=started, done=done, correct=correct)


def test_a_sleeping_owner_does_not_delay_peers_that_gather_from_it_nor_burn_a_core():
    """The heap's progress thread serves the owner's windows and sleeps between polls; MPICH's
    own (MPIR_CVAR_ASYNC_PROGRESS) would keep a core busy all the while (docs/transport.md)."""
    sleep_s, gathers = 3.0, 20
    out = run(_sleepy_owner, 3, job(), sleep_s, gathers)
    for peer in out[1:]:
        assert peer["correct"]
        assert peer["done"] < out[0]["woke"], "a gather waited for the sleeping owner"
        assert peer["done"] - peer["started"] < 0.5 * sleep_s
    assert out[0]["cpu_s"] < 0.25 * sleep_s, f"the sleeping owner used {out[0]['cpu_s']:.2f}s of CPU"


def _bookkeeping(rank: int, world: int, store: dist.Store, name: str) -> dict:
    seen: dict = {}
    with pytest.raises(RuntimeError, match="process manager"):
        heap(rank, world + 1, store, f"{name}-bigger")
    with heap(rank, world, store, name, timeout_s=10) as h:
        x = h.alloc("x", 8, torch.float32)
        h.alloc("flags", 2, torch.int64)
        seen["zero"] = torch.equal(x, torch.zeros(8))
        seen["heap_bytes"] = h.heap_bytes
        for call, kind in ((lambda: h.get(torch.empty(4, dtype=torch.bfloat16), "x", 0), TypeError),
                           (lambda: h.get(torch.empty(4), "x", 0, offset=5), ValueError),
                           (lambda: h.accumulate("y", 0, 0, torch.ones(1)), KeyError),
                           (lambda: h.fetch_add("x", 0, 0), TypeError)):
            with pytest.raises(kind) as info:
                call()
            seen.setdefault("errors", []).append(str(info.value))
        h.alloc("b", 4, torch.bfloat16)
        with pytest.raises(TypeError, match="float32"):
            h.accumulate("b", 0, 0, torch.ones(4, dtype=torch.bfloat16))
        h.barrier(10)
        if rank == 1:  # stays away while rank 0 waits for it, then keeps the barrier rank 0 gave up on
            h.wait_until("flags", 0, 1, 1, timeout_s=10)
            h.barrier(10)
        else:
            for call in (lambda: h.wait_until("flags", 1, 1, 1, timeout_s=0.3), lambda: h.barrier(0.5)):
                with pytest.raises(PeerTimeout) as info:
                    call()
                seen.setdefault("timeouts", []).append((info.value.peer, str(info.value)))
            h.store("flags", 1, 1)
        h.store("flags", 0, 5 + rank)
        h.wait_until("flags", 1 - rank, 0, 5 + (1 - rank), timeout_s=10)
        with pytest.raises(ValueError, match="asymmetric allocation"):
            h.alloc("z", 10 + rank, torch.float32)
        if rank == 0:
            h.timeout_s, started = 0.5, time.monotonic()
            with pytest.raises(PeerTimeout) as info:  # rank 1 never allocates it
                h.alloc("late", 8, torch.float32)
            seen["late"] = (info.value.peer, str(info.value), time.monotonic() - started)
            h.timeout_s = 10
    h.close()  # idempotent
    seen["kept"] = x.sum().item()  # tensors outlive the heap
    return seen


def test_bookkeeping_bad_calls_and_timeouts_name_the_peer():
    out = run(_bookkeeping, 2, job())
    for seen in out:
        assert seen["zero"] and seen["heap_bytes"] == 8 + 8 * 4 + 2 * 8
        assert ["dtypes must match" in seen["errors"][0], "outside buffer" in seen["errors"][1],
                "alloc it first" in seen["errors"][2], "int64" in seen["errors"][3]] == [True] * 4
        assert seen["kept"] == 0
    late_peer, late_msg, waited = out[0]["late"]
    assert late_peer == 1 and "allocation of 'late'" in late_msg and waited < 5
    (wait_peer, wait_msg), (barrier_peer, barrier_msg) = out[0]["timeouts"]
    assert wait_peer == 1 and "rank 1" in wait_msg and "'flags'[1] >= 1" in wait_msg
    assert barrier_peer == 1 and "rank 1" in barrier_msg and "barrier" in barrier_msg


def _victim_or_survivor(rank: int, world: int, store: dist.Store, name: str) -> dict:
    h = heap(rank, world, store, name, timeout_s=20)
    h.alloc("p", 1024, torch.float32)
    h.barrier(20)
    # MPI is fail-stop: an operation in flight to a rank when it dies aborts the caller. So the
    # victim dies once its peers have left the barrier, and they look at it only after that.
    if rank == world - 1:
        store.wait([f"{name}/left/{r}" for r in range(world - 1)])
        os.kill(os.getpid(), signal.SIGKILL)
    store.set(f"{name}/left/{rank}", "1")
    time.sleep(1.0)  # the progress thread polls MPI while the victim dies
    outcomes = []
    for call in (lambda: h.barrier(20), lambda: h.get(torch.empty(8), "p", world - 1),
                 lambda: h.accumulate("p", world - 1, 0, torch.ones(8))):
        started = time.monotonic()
        try:
            call()
            outcomes.append(("returned", time.monotonic() - started))
        except PeerTimeout as e:
            outcomes.append((e.peer, str(e), time.monotonic() - started))
    h.close()
    # A survivor that exits closes its links: a slower survivor would take it for dead too.
    store.set(f"{name}/done/{rank}", "1")
    store.wait([f"{name}/done/{r}" for r in range(world - 1)])
    return dict(outcomes=outcomes)


def test_a_sigkilled_rank_is_named_by_its_peers_and_nothing_is_left_behind():
    world = 3
    shm_before = set(os.listdir("/dev/shm"))
    children_before = set(descendants(os.getpid()))
    results = run_mpi_ranks(_victim_or_survivor, world, job(), timeout_s=60, tolerate_failures=True)
    victim = results[-1]
    assert isinstance(victim, RankExit) and victim.status == 128 + signal.SIGKILL and victim.error is None
    for rank, result in enumerate(results[:-1]):
        assert not isinstance(result, RankExit), f"rank {rank} failed: {result}"
        for peer, message, waited in result["outcomes"]:
            assert peer == world - 1 and f"rank {world - 1}" in message and "gone" in message, message
            assert waited < 5
    assert set(descendants(os.getpid())) <= children_before, "a process was left"
    assert not left_behind(shm_before), "nothing left in /dev/shm"


