"""The shared-memory symmetric heap: one-sided semantics, exactly-once accumulation, timeouts, lifecycle.

Ranks are real processes where the property is about processes (concurrent pushers, a
sleeping owner, SIGKILL); the timeout and bookkeeping checks run ranks as threads of this
process, which share nothing but the store and /dev/shm, like processes.
"""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import resource
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from odc_bench.run.ranks import run_ranks
from odc_core.primitives import ShardLayout, gather
from odc_core.transport.base import PeerTimeout
from odc_core.transport.shm import (
    SHM_DIR,
    ShmHeap,
    list_segments,
    process_start_time,
    segment_creator,
    sweep_stale_segments,
)
from tests.helpers.pushes import push_integers


def job() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


def thread_ranks(world: int, fn, ranks: list[int] | None = None, timeout_s: float = 30) -> list:
    """Run fn(rank, store) for `ranks` (default all) as threads; return results or raised exceptions."""
    store = dist.HashStore()
    out: list = [None] * world

    def run(r: int) -> None:
        try:
            out[r] = fn(r, store)
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            out[r] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in (range(world) if ranks is None else ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
        assert not t.is_alive(), "a rank thread hung"
    return out


# -- one process, ranks as threads -----------------------------------------------------------


def test_allocation_timeout_names_the_missing_peer_and_leaves_no_segment():
    name = job()
    store = dist.HashStore()
    started = time.monotonic()
    with pytest.raises(PeerTimeout, match="rank 1") as info:
        ShmHeap(0, 2, name, store, timeout_s=0.5)
    assert info.value.peer == 1
    assert time.monotonic() - started < 10
    assert not [s for s in list_segments() if name in s]


def test_wait_until_and_barrier_time_out_naming_the_peer():
    name = job()

    def rank(r: int, store: dist.Store):
        with ShmHeap(r, 3, name, store, timeout_s=10) as heap:
            heap.alloc("flags", 2, torch.int64)
            heap.store("flags", 0, 5)
            if r == 2:
                return None  # never calls the barrier below, never sets flag 1
            errors = []
            for call in (lambda: heap.wait_until("flags", 2, 1, 1, timeout_s=0.3),
                         lambda: heap.barrier(timeout_s=0.5)):
                with pytest.raises(PeerTimeout) as info:
                    call()
                errors.append((info.value.peer, str(info.value)))
            heap.wait_until("flags", 2, 0, 5, timeout_s=1)  # already set: returns at once
            return errors

    out = thread_ranks(3, rank)
    for r in (0, 1):
        assert not isinstance(out[r], BaseException), out[r]
        (wait_peer, wait_msg), (barrier_peer, barrier_msg) = out[r]
        assert wait_peer == 2 and "rank 2" in wait_msg and "'flags'[1] >= 1" in wait_msg
        assert barrier_peer == 2 and "rank 2" in barrier_msg and "barrier" in barrier_msg


def test_a_lock_held_elsewhere_times_out_naming_the_owner():
    name = job()
    with ShmHeap(0, 1, name, dist.HashStore(), timeout_s=0.3) as heap:
        x = heap.alloc("x", 16, torch.float32)
        heap.alloc("flags", 1, torch.int64)
        control = next(s for s in list_segments() if name in s and s.endswith("-b0"))
        fd = os.open(SHM_DIR / control, os.O_RDWR)  # another open file: a stuck holder elsewhere
        try:
            whole_file = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, whole_file)
            with pytest.raises(PeerTimeout, match=r"rank 0: lock on 'x'") as info:
                heap.accumulate("x", 0, 0, torch.ones(16))
            assert info.value.peer == 0
            with pytest.raises(PeerTimeout, match="rank 0"):
                heap.fetch_add("flags", 0, 0)
        finally:
            os.close(fd)  # drops the lock
        heap.accumulate("x", 0, 0, torch.ones(16))
        assert torch.equal(x, torch.ones(16)) and heap.fetch_add("flags", 0, 0) == 0


def test_asymmetric_allocation_is_refused():
    name = job()

    def rank(r: int, store: dist.Store):
        with ShmHeap(r, 2, name, store, timeout_s=5) as heap:
            heap.alloc("x", 10 if r == 0 else 11, torch.float32)

    out = thread_ranks(2, rank)
    assert all(isinstance(e, ValueError) and "asymmetric allocation" in str(e) for e in out)


def test_fetch_add_is_atomic_across_threads_and_ranks():
    name, per_thread, threads = job(), 300, 2

    def rank(r: int, store: dist.Store):
        with ShmHeap(r, 2, name, store, timeout_s=10) as heap:
            heap.alloc("counter", 1, torch.int64)
            seen: list[int] = []

            def work() -> None:
                seen.extend(heap.fetch_add("counter", 0, 0, 1) for _ in range(per_thread))

            workers = [threading.Thread(target=work) for _ in range(threads)]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            heap.barrier(10)
            return seen, heap.load("counter", 0, 0)

    out = thread_ranks(2, rank)
    olds = sorted(out[0][0] + out[1][0])
    total = 2 * threads * per_thread
    assert olds == list(range(total)), "every fetch_add must see a distinct old value"
    assert out[0][1] == out[1][1] == total


def test_bad_calls_say_what_is_wrong():
    with ShmHeap(0, 1, job(), dist.HashStore(), timeout_s=5) as heap:
        x = heap.alloc("x", 8, torch.float32)
        assert torch.equal(x, torch.zeros(8)) and heap.heap_bytes == 8 * 4 + 8
        with pytest.raises(TypeError, match="dtypes must match"):
            heap.get(torch.empty(4, dtype=torch.bfloat16), "x", 0)
        with pytest.raises(ValueError, match="outside buffer"):
            heap.get(torch.empty(4), "x", 0, offset=5)
        with pytest.raises(KeyError, match="alloc it first"):
            heap.accumulate("y", 0, 0, torch.ones(1))
        with pytest.raises(TypeError, match="int64"):
            heap.fetch_add("x", 0, 0)
        with pytest.raises(ValueError, match="already allocated"):
            heap.alloc("x", 8, torch.float32)


def test_close_removes_segments_on_normal_exit_and_on_exceptions():
    name = job()
    with ShmHeap(0, 1, name, dist.HashStore()) as heap:
        kept = heap.alloc("x", 1000, torch.float32)
        assert len([s for s in list_segments() if name in s]) == 2  # control buffer + x
    assert not [s for s in list_segments() if name in s]
    assert kept.sum() == 0  # the caller's tensor outlives the name: unmapped when it is freed
    heap.close()  # idempotent

    other = job()
    with pytest.raises(RuntimeError, match="boom"), ShmHeap(0, 1, other, dist.HashStore()) as heap:
        heap.alloc("x", 10, torch.float32)
        raise RuntimeError("boom")
    assert not [s for s in list_segments() if other in s]


def test_sweep_removes_segments_of_dead_creators_even_under_a_reused_pid(tmp_path: Path):
    me, start = os.getpid(), process_start_time(os.getpid())
    dead = subprocess_pid_that_exited()
    alive = f"odc-j-r0-p{me}-t{start}-b0"
    reused = f"odc-j-r0-p{me}-t{start - 1}-b0"  # this pid, but a process that started earlier
    gone = f"odc-j-r1-p{dead}-t1-b0"
    unrelated = "odc-notes.txt"
    for n in (alive, reused, gone, unrelated):
        (tmp_path / n).write_bytes(b"x")
    assert segment_creator(alive) == (me, start)
    assert sorted(sweep_stale_segments(tmp_path)) == sorted([reused, gone])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive, unrelated])


def test_a_jobs_sweep_covers_its_process_groups_segments_and_no_other_jobs(tmp_path: Path):
    """FSDP2's shared-memory group names its heap `<job>.pg<n>`: the launcher's sweep of the job
    after killing its ranks must remove those too, and leave a job whose id merely starts alike."""
    dead = subprocess_pid_that_exited()
    own, group = f"odc-j_1-r0-p{dead}-t1-b0", f"odc-j_1.pg3-r1-p{dead}-t1-b2"
    other, longer = f"odc-k_1-r0-p{dead}-t1-b0", f"odc-j_12-r0-p{dead}-t1-b0"
    for n in (own, group, other, longer):
        (tmp_path / n).write_bytes(b"x")
    assert sorted(sweep_stale_segments(tmp_path, job_id="j-1")) == sorted([own, group])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([other, longer])


def subprocess_pid_that_exited() -> int:
    p = multiprocessing.get_context("fork").Process(target=int)
    p.start()
    p.join()
    return p.pid


# -- real processes ---------------------------------------------------------------------------


def _push_integers(rank: int, world: int, store: dist.Store, name: str, numel: int, pushes: int) -> dict:
    """Two threads push random integer-valued slices into rank 0's buffer; return what they pushed."""
    torch.set_num_threads(1)
    with ShmHeap(rank, world, name, store, timeout_s=30, chunk_bytes=16384) as heap:
        return push_integers(heap, numel, pushes)


@pytest.mark.slow
def test_concurrent_pushes_into_one_owner_land_exactly_once():
    world, numel, pushes = 3, 65536, 1000
    out = run_ranks(_push_integers, world, job(), numel, pushes, timeout_s=90)
    total = sum(r["expected"] for r in out)
    assert all(r["count"] == world * 2 * pushes for r in out)
    assert total.abs().max() < 2**24  # integer sums stay exact in fp32
    assert torch.equal(out[0]["acc"], total)


def _sleepy_owner(rank: int, world: int, store: dist.Store, name: str, sleep_s: float, gathers: int) -> dict:
    torch.set_num_threads(1)
    layout = ShardLayout(3 * 65536 + 1, world)
    with ShmHeap(rank, world, name, store, timeout_s=30) as heap:
        shard = heap.alloc("p", layout.shard_numel, torch.float32)
        shard.copy_(torch.arange(layout.shard_numel) + rank * layout.shard_numel)
        heap.barrier(30)
        if rank == 0:
            time.sleep(sleep_s)
            woke = time.monotonic()
            heap.barrier(30)
            return dict(woke=woke)
        out = torch.empty(layout.numel)
        started = time.monotonic()
        for _ in range(gathers):
            gather(heap, "p", out, layout)
        done = time.monotonic()
        correct = torch.equal(out, torch.arange(layout.numel, dtype=torch.float32))
        heap.barrier(30)
        return dict(started=started, done=done, correct=correct)


@pytest.mark.slow
def test_a_sleeping_owner_does_not_delay_peers_that_gather_from_it():
    sleep_s, gathers = 3.0, 100
    out = run_ranks(_sleepy_owner, 3, job(), sleep_s, gathers, timeout_s=60)
    for peer in out[1:]:
        assert peer["correct"]
        assert peer["done"] < out[0]["woke"], "a gather waited for the sleeping owner"
        assert (peer["done"] - peer["started"]) < 0.5 * sleep_s


def _hold_a_heap(name: str, ready) -> None:
    heap = ShmHeap(0, 1, name, dist.HashStore())
    heap.alloc("x", 4096, torch.float32)
    ready.set()
    time.sleep(600)


@pytest.mark.slow
def test_a_sigkilled_rank_leaves_no_segment_after_the_next_start():
    name = job()
    ctx = multiprocessing.get_context("forkserver")
    ready = ctx.Event()
    proc = ctx.Process(target=_hold_a_heap, args=(name, ready))
    proc.start()
    try:
        assert ready.wait(30), "the child did not allocate its heap"
        left = [s for s in list_segments() if name in s]
        assert len(left) == 2 and all(segment_creator(s)[0] == proc.pid for s in left)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        assert proc.exitcode == -signal.SIGKILL
        # Nothing ran on the way out; but a heap another pytest worker starts now sweeps them, as
        # the start below does (the suite failed once on that race).
        assert [s for s in list_segments() if name in s] in (left, [])
        with ShmHeap(0, 1, job(), dist.HashStore()):
            pass
        assert not [s for s in list_segments() if name in s]
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()


_MANY_SEGMENTS = """
import resource, sys, uuid
import torch, torch.distributed as dist
from odc_core.transport.shm import ShmHeap, list_segments
soft, hard = int(sys.argv[1]), int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
name = uuid.uuid4().hex[:12]
try:
    with ShmHeap(0, 1, name, dist.HashStore(), timeout_s=10) as heap:
        for i in range(3 * soft):
            heap.alloc(f"b{i}", 8, torch.float32)
        print("mapped", resource.getrlimit(resource.RLIMIT_NOFILE)[0])
except OSError as e:
    print(e)
print("left", sum(name in s for s in list_segments()))
"""


@pytest.mark.parametrize("limited", ["soft", "hard"])
def test_more_segments_than_descriptors_take_the_hard_limit_and_past_it_fail_in_one_line(limited):
    """Python's mmap keeps a descriptor per mapping before 3.13: a heap of many units on many
    ranks of one host ran out at a soft limit of 1024 with a bare 'Too many open files'."""
    limits = ("150", str(resource.getrlimit(resource.RLIMIT_NOFILE)[1]) if limited == "soft" else "150")
    out = subprocess.run([sys.executable, "-c", _MANY_SEGMENTS, *limits], capture_output=True, text=True,
                         timeout=120).stdout.splitlines()
    assert out[-1] == "left 0"
    if limited == "soft" or sys.version_info >= (3, 13):
        assert out[0].startswith("mapped "), out
    else:
        assert out[0].startswith("[Errno 24] cannot map shared-memory segment odc-") and len(out) == 2, out
        assert "this process has 150 file descriptors (ulimit -n, hard limit)" in out[0]


_FILL = """
import sys
from pathlib import Path
import torch, torch.distributed as dist
from odc_core.transport.shm import ShmHeap
folder, numel = Path(sys.argv[1]), int(sys.argv[2])
try:
    with ShmHeap(0, 1, "full", dist.HashStore(), timeout_s=10, directory=folder) as heap:
        heap.alloc("w", numel, torch.float32).fill_(1.0)
        print("filled")
except OSError as e:
    print(e)
print("left", len(list(folder.iterdir())))
"""


def test_a_heap_larger_than_its_shared_memory_fails_in_one_line_and_leaves_no_segment(tmpfs):
    """Segments were only truncated to size, so the first write past the room the tmpfs had
    killed the rank with SIGBUS (a run's row said `rank 1 died (killed by SIGBUS)`), its
    segments left behind."""
    small_tmpfs = tmpfs("8m")
    fits = subprocess.run([sys.executable, "-c", _FILL, str(small_tmpfs), str(1 << 20)], capture_output=True,
                          text=True, timeout=60)
    assert fits.stdout.split("\n")[:2] == ["filled", "left 0"], fits.stderr
    full = subprocess.run([sys.executable, "-c", _FILL, str(small_tmpfs), str(4 << 20)], capture_output=True,
                          text=True, timeout=60)
    assert full.returncode == 0, full.stderr  # not killed by SIGBUS
    assert full.stdout.splitlines() == [
        f"[Errno 28] shared memory is full: a segment of 16.0 MiB does not fit in {small_tmpfs}, which has 8.0 MiB "
        "free of 8.0 MiB; give it more room (docker run --shm-size, or a larger tmpfs), or run fewer ranks per host "
        "or a smaller model",
        "left 0"]


def test_ranks_whose_segments_land_in_different_shared_memories_are_refused_in_one_line(tmp_path):
    """Ranks of a multi-node torchrun on the shm transport: a peer's segment name arrived but its
    file was on another host, and the error blamed the peer for having exited."""
    elsewhere = tmp_path / "other-host-shm"
    elsewhere.mkdir()
    name = job()
    folders = [SHM_DIR, elsewhere]
    out = thread_ranks(2, lambda r, store: ShmHeap(r, 2, name, store, timeout_s=10, directory=folders[r]))
    for rank, error in enumerate(out):
        assert isinstance(error, RuntimeError), error
        peer = 1 - rank
        assert str(error) == (
            f"ranks {rank} and {peer} share no memory: rank {rank}'s segments are in {folders[rank]} on "
            f"{socket.gethostname()}, rank {peer}'s in {folders[peer]} on {socket.gethostname()}; the shm transport "
            "holds ranks of one host: across hosts use transport=mpi (CPU ranks) or nvshmem (one GPU each)")
    assert not [s for s in list_segments() if name in s] and not list(elsewhere.iterdir())
    job_id = job()
    same = [SHM_DIR, SHM_DIR / "."]  # the same memory, spelt otherwise: accepted
    heaps = thread_ranks(2, lambda r, store: ShmHeap(r, 2, job_id, store, timeout_s=10, directory=same[r]))
    assert all(isinstance(h, ShmHeap) for h in heaps), heaps
    for h in heaps:
        h.close()
