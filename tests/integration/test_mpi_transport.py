"""The MPI symmetric heap: the primitives against gloo, exactly-once accumulation, passive
target, timeouts and a SIGKILLed peer.

Every rank is a real process started by MPICH's mpiexec (hydra), as the transport requires
(odc_core/transport/mpi.py), around a TCPStore hosted here; ranks talk over MPICH's TCP path
on loopback only (network_only, FI_SOCKETS_IFACE=lo): the path a cluster's ranks take.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from odc_core.primitives import ShardLayout, gather, scatter_accumulate
from odc_core.transport.base import PeerTimeout

REPO = Path(__file__).resolve().parents[1]
MPIEXEC = shutil.which("mpiexec", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
_RANK_ENV = "ODC_MPI_TEST"  # set in rank processes: "<store port>:<output folder>"


def _mpi_library() -> str:
    """The MPI library mpi4py finds, asked in a subprocess: loading MPI here would leave it in
    the test process, which other tests fork."""
    probe = "import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; print(MPI.Get_library_version())"
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return ""
    return done.stdout if done.returncode == 0 else ""


_LIBRARY = "" if _RANK_ENV in os.environ else _mpi_library()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(_RANK_ENV not in os.environ and not (_LIBRARY and MPIEXEC),
                       reason="needs mpi4py, an MPI library and its mpiexec: pip install mpi4py 'mpich>=4.3,<5'"),
    pytest.mark.skipif(bool(_LIBRARY) and not _LIBRARY.startswith("MPICH"),
                       reason=f"the tests drive MPICH's mpiexec and settings, found {_LIBRARY[:40]!r}"),
]


def mpi_ranks(fn, world: int, *args, timeout_s: float = 90, flags: tuple[str, ...] = ()) -> tuple[list, str]:
    """Run fn(rank, world, store, *args) on `world` ranks under mpiexec; return each rank's
    result (None for a rank that left none) and mpiexec's output."""
    store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=timeout_s))
    with tempfile.TemporaryDirectory(prefix="odc-mpi-") as out:
        torch.save((fn.__name__, args), Path(out) / "call.pt")
        env = dict(os.environ, **{_RANK_ENV: f"{store.port}:{out}"},
                   PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        entry = "import tests.test_mpi_transport as t; t._rank_main()"
        try:
            done = subprocess.run([MPIEXEC, *flags, "-n", str(world), sys.executable, "-c", entry], cwd=REPO, env=env,
                                  capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"ranks still running after {timeout_s:.0f}s:\n{e.stdout}\n{e.stderr}")
        results = [torch.load(f, weights_only=False) if (f := Path(out) / f"rank{r}.pt").exists() else None
                   for r in range(world)]
    return results, done.stdout + done.stderr


def _rank_main() -> None:
    port, out = os.environ[_RANK_ENV].split(":", 1)
    rank, world = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
    name, args = torch.load(Path(out) / "call.pt", weights_only=False)
    store = dist.TCPStore("127.0.0.1", int(port), world, is_master=False, timeout=timedelta(seconds=60))
    result = globals()[name](rank, world, store, *args)
    torch.save(result, Path(out) / f"rank{rank}.pt")


def run(fn, world: int, *args, timeout_s: float = 90) -> list:
    results, output = mpi_ranks(fn, world, *args, timeout_s=timeout_s)
    assert all(r is not None for r in results), f"a rank failed:\n{output[-4000:]}"
    return results


SIZES = (1, 2, 1000, 3 * 40_000 + 2)  # not divisible by 3, smaller than the world, many elements
all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def job() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


def heap(rank: int, world: int, store: dist.Store, name: str, timeout_s: float = 30, progress_thread: bool = True):
    from odc_core.transport.mpi import MpiHeap

    os.environ.setdefault("FI_SOCKETS_IFACE", "lo")  # loopback only, before MPI starts
    torch.set_num_threads(1)
    return MpiHeap(rank, world, name, store, timeout_s=timeout_s, network_only=True, progress_thread=progress_thread)


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
        acc = h.alloc("acc", numel, torch.float32)
        h.alloc("count", 1, torch.int64)
        h.barrier(30)
        expected = torch.zeros(numel)
        olds: list[int] = []

        def push(seed: int) -> None:
            g = torch.Generator().manual_seed(seed)
            mine = torch.zeros(numel)
            for i in range(pushes):
                lo = int(torch.randint(0, numel - 1, (1,), generator=g))
                hi = int(torch.randint(lo + 1, min(numel, lo + numel // 2) + 1, (1,), generator=g))
                src = torch.randint(-8, 9, (hi - lo,), generator=g).float()
                h.accumulate("acc", 0, lo, src.bfloat16() if i % 2 else src)  # small integers are exact in bf16
                olds.append(h.fetch_add("count", 0, 0, 1))
                mine[lo:hi] += src
            expected.add_(mine)  # after the threads are joined: no race on `expected`

        threads = [threading.Thread(target=push, args=(1000 * rank + t,)) for t in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        h.barrier(30)
        return dict(expected=expected, acc=acc.clone() if rank == 0 else None, olds=olds,
                    count=h.load("count", 0, 0))


def test_concurrent_pushes_into_one_owner_land_exactly_once():
    world, numel, pushes = 3, 8192, 400
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
            time.sleep(sleep_s)  # outside MPI: no progress from this process's own threads
            woke = time.monotonic()
            h.barrier(30)
            return dict(woke=woke)
        out = torch.empty(layout.numel)
        started = time.monotonic()
        for _ in range(gathers):
            gather(h, "p", out, layout)
        done = time.monotonic()
        correct = torch.equal(out, torch.arange(layout.numel, dtype=torch.float32))
        h.barrier(30)
        return dict(started=started, done=done, correct=correct)


def test_a_sleeping_owner_does_not_delay_peers_that_gather_from_it():
    """Only with MPICH's progress thread: without it, ofi/sockets under mpiexec completes a
    window's first get or accumulate only once the owner enters MPI (docs/transport.md)."""
    sleep_s, gathers = 3.0, 20
    out = run(_sleepy_owner, 3, job(), sleep_s, gathers)
    for peer in out[1:]:
        assert peer["correct"]
        assert peer["done"] < out[0]["woke"], "a gather waited for the sleeping owner"
        assert peer["done"] - peer["started"] < 0.5 * sleep_s


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
    # No progress thread: it would poll the dead rank's connection and abort this process.
    h = heap(rank, world, store, name, timeout_s=20, progress_thread=False)
    h.alloc("p", 1024, torch.float32)
    h.barrier(20)
    # MPI is fail-stop: an operation in flight to a rank when it dies aborts the caller. So the
    # victim dies once its peers have left the barrier, and they look at it only after that.
    if rank == world - 1:
        store.wait([f"{name}/left/{r}" for r in range(world - 1)])
        os.kill(os.getpid(), signal.SIGKILL)
    store.set(f"{name}/left/{rank}", "1")
    time.sleep(1.0)
    started = time.monotonic()
    try:
        h.barrier(20)
        outcome = "returned"
    except PeerTimeout as e:
        outcome = (e.peer, str(e))
    waited = time.monotonic() - started
    h.close()
    # A survivor that exits closes its links: a slower survivor would take it for dead too.
    store.set(f"{name}/done/{rank}", "1")
    store.wait([f"{name}/done/{r}" for r in range(world - 1)])
    return dict(outcome=outcome, waited=waited)


@pytest.mark.xfail(reason="not reliable on MPICH 4.3 ofi/sockets: without a progress thread a survivor's op can wait "
                   "on a peer outside MPI, with one the thread polls the dead rank and aborts (docs/transport.md)",
                   strict=False)
def test_a_sigkilled_rank_is_named_by_its_peers_and_nothing_is_left_behind():
    world = 3
    shm_before = set(os.listdir("/dev/shm"))
    # Hydra kills every rank when one dies unless told not to: the survivors must say who died.
    results, output = mpi_ranks(_victim_or_survivor, world, job(), flags=("-disable-auto-cleanup",), timeout_s=60)
    assert results[-1] is None and "signal 9" in output.lower().replace("signal: 9", "signal 9"), output[-2000:]
    for rank, result in enumerate(results[:-1]):
        assert result is not None, f"rank {rank} failed:\n{output[-4000:]}"
        peer, message = result["outcome"]
        assert peer == world - 1 and f"rank {world - 1}" in message and "gone" in message, message
        assert result["waited"] < 5
    assert not [p for p in _descendants(os.getpid()) if "multiprocessing" not in _cmdline(p)], "a process was left"
    assert set(os.listdir("/dev/shm")) <= shm_before


def _descendants(pid: int) -> list[int]:
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(c) for c in (task / "children").read_text().split()]
    return children + [d for c in children for d in _descendants(c)]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def _smoke(rank, world, store, name):
    from odc_core.transport.mpi import MpiHeap
    with MpiHeap(rank, world, name, store, timeout_s=30) as h:
        x = h.alloc("x", 10, torch.float32)
        h.barrier(30)
        h.accumulate("x", 0, 0, torch.ones(10))
        h.barrier(30)
        return float(x.sum())
