"""One conformance suite for every registered transport (odc_core/transport/registry.py): the
symmetric-heap protocol (transport/base.py) checked the same way on each, with real processes.

A transport added to the registry is picked up here without a change: its ranks start as local
processes unless LAUNCHERS says otherwise (MPI's under mpiexec). Each transport's ranks run
every check in one start (`_conform`), and the tests below read what they saw.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist

from odc_bench.run.mpiexec import run_mpi_ranks
from odc_bench.run.ranks import run_ranks
from odc_core.primitives import ShardLayout, gather, scatter_accumulate
from odc_core.transport.base import PeerTimeout
from odc_core.transport.registry import TRANSPORTS, make_heap
from tests.helpers.mpi import MISSING as MPI_MISSING
from tests.helpers.pushes import push_integers

pytestmark = pytest.mark.slow

WORLD = 3
SIZES = (1, 2, 1000, 3 * 4000 + 2)  # smaller than the world, not divisible by it, many elements
# How a transport's ranks start, and why they cannot here (None: they can).
LAUNCHERS: dict[str, tuple[Any, str | None]] = {
    "mpi": (run_mpi_ranks, MPI_MISSING and f"transport mpi: {MPI_MISSING}"),
    "nvshmem": (run_ranks, None if torch.cuda.device_count() >= WORLD else
                f"transport nvshmem takes one GPU per rank: {WORLD} ranks, {torch.cuda.device_count()} GPU(s) here "
                "(tests/integration/test_gpu_odc.py checks what one GPU allows)"),
}


def _conform(rank: int, world: int, store: dist.Store, transport: str, device: str, job: str) -> dict:
    torch.set_num_threads(1)
    if device == "cuda":  # ranks share the GPUs there are (all of them one, on a one-GPU machine)
        torch.cuda.set_device(rank % torch.cuda.device_count())
    # The heap's tensors go in and out as CPU tensors here: every transport takes them, and the
    # expected values come from gloo on the host.
    dist.init_process_group("gloo", store=dist.PrefixStore("gloo", store), rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    seen: dict[str, Any] = {"gathers": [], "pushes": []}
    heap = make_heap(transport, device, rank, world, job, dist.PrefixStore("heap", store), 30.0)
    try:
        fresh = heap.alloc("fresh", 7, torch.float32)
        seen["zero_filled"] = bool((fresh == 0).all())
        seen["device"] = fresh.device.type
        for dtype in (torch.float32, torch.bfloat16):
            for numel in SIZES:
                layout, tag = ShardLayout(numel, world), f"{dtype}/{numel}"
                g = torch.Generator().manual_seed(1000 * rank + numel)
                shard = heap.alloc(f"p/{tag}", layout.shard_numel, dtype)
                shard.copy_(torch.randn(layout.shard_numel, generator=g).to(dtype))
                heap.alloc(f"g/{tag}", layout.shard_numel, torch.float32)
                grad = torch.randn(numel, generator=g).to(dtype)
                heap.barrier(30)
                ours = torch.empty(layout.padded_numel, dtype=dtype)
                gather(heap, f"p/{tag}", ours, layout)
                scatter_accumulate(heap, f"g/{tag}", grad, layout)
                heap.quiet()
                heap.barrier(30)
                theirs = torch.empty(layout.padded_numel, dtype=dtype)
                dist.all_gather_into_tensor(theirs, shard.cpu().clone())
                padded = torch.zeros(layout.padded_numel)
                padded[:numel] = grad.float()
                reduced = torch.empty(layout.shard_numel)
                dist.reduce_scatter_tensor(reduced, padded)
                mine = torch.empty(layout.shard_numel)
                heap.get(mine, f"g/{tag}", rank)
                seen["gathers"].append((tag, torch.equal(ours, theirs)))
                seen["pushes"].append((tag, mine, reduced))
        seen["exactly_once"] = push_integers(heap, 4096, 200)
        # Flags: a peer's store() is seen by load() and ends wait_until(); a flag that never
        # rises ends in PeerTimeout naming its owner.
        heap.alloc("flags", 2, torch.int64)
        heap.barrier(30)
        heap.store("flags", 0, 10 + rank)
        heap.barrier(30)
        seen["loads"] = [heap.load("flags", peer, 0) for peer in range(world)]
        heap.wait_until("flags", (rank + 1) % world, 0, 10, 5.0)
        t0 = time.monotonic()
        try:
            heap.wait_until("flags", (rank + 1) % world, 1, 1, 0.5)
            seen["timeout"] = None
        except PeerTimeout as e:
            seen["timeout"] = (e.peer, str(e), time.monotonic() - t0)
        seen["heap_bytes"] = heap.heap_bytes
        heap.barrier(30)
    finally:
        heap.close()
        heap.close()  # idempotent
        dist.destroy_process_group()
    return seen


@pytest.fixture(scope="module", params=sorted(TRANSPORTS))
def conformed(request) -> tuple[str, list[dict]]:
    name = request.param
    launch, missing = LAUNCHERS.get(name, (run_ranks, None))
    if missing:
        pytest.skip(missing)
    device = TRANSPORTS[name].devices[0]
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip(f"transport {name} holds CUDA tensors and this machine has no CUDA device")
    return name, launch(_conform, WORLD, name, device, f"c{uuid.uuid4().hex[:10]}", timeout_s=120)


def test_alloc_is_zero_filled_and_heap_bytes_count_own_buffers(conformed) -> None:
    name, ranks = conformed
    assert all(r["zero_filled"] for r in ranks)
    assert {r["device"] for r in ranks} == set(TRANSPORTS[name].devices)
    # Every rank owns the same buffers: at least the fp32 and bf16 shards, gradients and flags.
    least = sum(ShardLayout(n, WORLD).shard_numel * (4 + 2 + 4 + 4) for n in SIZES)
    assert all(r["heap_bytes"] >= least for r in ranks)


def test_gather_equals_all_gather_and_pushes_equal_reduce_scatter(conformed) -> None:
    _, ranks = conformed
    for r in ranks:
        assert len(r["gathers"]) == 2 * len(SIZES)
        assert all(same for _, same in r["gathers"]), [tag for tag, same in r["gathers"] if not same]
        for tag, mine, reduced in r["pushes"]:
            torch.testing.assert_close(mine, reduced, msg=tag)  # summation order differs from gloo's


def test_concurrent_pushes_land_exactly_once_and_fetch_add_is_atomic(conformed) -> None:
    _, ranks = conformed
    total = sum(r["exactly_once"]["expected"] for r in ranks)
    assert torch.equal(ranks[0]["exactly_once"]["acc"], total)
    olds = sorted(old for r in ranks for old in r["exactly_once"]["olds"])
    assert olds == list(range(WORLD * 2 * 200))  # every fetch_add saw a distinct old value


def test_flags_are_seen_by_peers_and_a_flag_that_never_rises_times_out_naming_its_owner(conformed) -> None:
    _, ranks = conformed
    for rank, r in enumerate(ranks):
        assert r["loads"] == [10 + peer for peer in range(WORLD)]
        peer, message, waited = r["timeout"]
        assert peer == (rank + 1) % WORLD and f"rank {peer}" in message
        assert 0.4 < waited < 5.0


def test_every_registered_transport_is_in_this_suite() -> None:
    unknown = set(LAUNCHERS) - set(TRANSPORTS)
    assert not unknown, f"LAUNCHERS names transports that are not registered: {unknown}"
