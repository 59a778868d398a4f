"""gather and scatter_accumulate against the gloo collectives they replace, on real processes."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from odc_bench.run.ranks import run_ranks
from odc_core.primitives import ShardLayout, gather, scatter_accumulate
from odc_core.transport.shm import ShmHeap

# Sizes not divisible by 3 (and smaller than the world), and one spanning many 4 KiB chunks.
SIZES = (1, 2, 1000, 3 * 40_000 + 2)
DTYPES = (torch.float32, torch.bfloat16)
# torch 2.13 renamed the tensor collectives (*_single); older releases only have the old names.
all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def test_shard_layout_pads_the_last_shards():
    layout = ShardLayout(10, 4)
    assert (layout.shard_numel, layout.padded_numel) == (3, 12)
    assert [layout.bounds(r) for r in range(4)] == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert ShardLayout(5, 4).bounds(3) == (5, 5)  # all padding
    with pytest.raises(ValueError, match="numel >= 1"):
        ShardLayout(0, 2)


class _RecordingHeap:
    """Enough of a heap for gather and scatter_accumulate to run in one process: what each get
    and accumulate would touch, and on which rank."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.touched: list[tuple[str, int, int]] = []

    def get(self, out: torch.Tensor, name: str, peer: int, offset: int = 0) -> None:
        self.touched.append(("get", peer, out.numel()))
        out.fill_(peer)

    def accumulate(self, name: str, peer: int, offset: int, src: torch.Tensor) -> None:
        self.touched.append(("add", peer, src.numel()))


def test_an_owner_group_touches_only_its_ranks_in_rotated_order():
    heap = _RecordingHeap(rank=3, world_size=4)
    layout = ShardLayout(10, 2)  # shard i on owners[i]: rank 2 holds [0, 5), rank 3 [5, 10)
    out = torch.empty(10)
    gather(heap, "p", out, layout, owners=(2, 3))  # type: ignore[arg-type]
    scatter_accumulate(heap, "g", torch.ones(10), layout, owners=(2, 3))  # type: ignore[arg-type]
    assert heap.touched == [("get", 2, 5), ("get", 3, 5), ("add", 2, 5), ("add", 3, 5)]
    assert out.tolist() == [2.0] * 5 + [3.0] * 5
    with pytest.raises(ValueError, match="layout is for 2 owners, there are 3"):
        gather(heap, "p", out, layout, owners=(1, 2, 3))  # type: ignore[arg-type]
    full = _RecordingHeap(rank=1, world_size=4)  # no group: every rank, from rank + 1 on
    gather(full, "p", torch.empty(12), ShardLayout(10, 4))  # type: ignore[arg-type]
    assert [peer for _, peer, _ in full.touched] == [2, 3, 0, 1]


def _compare(rank: int, world: int, store: dist.Store, name: str) -> list[tuple]:
    """Per case: the primitives' results and gloo's, on the same random inputs."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.PrefixStore("gloo", store), rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    cases = []
    try:
        with ShmHeap(rank, world, name, store, timeout_s=60, chunk_bytes=4096) as heap:
            for dtype in DTYPES:
                for numel in SIZES:
                    layout = ShardLayout(numel, world)
                    g = torch.Generator().manual_seed(1000 * rank + numel)
                    tag = f"{dtype}/{numel}"
                    shard = heap.alloc(f"params/{tag}", layout.shard_numel, dtype)
                    shard.copy_(torch.randn(layout.shard_numel, generator=g).to(dtype))
                    acc = heap.alloc(f"grads/{tag}", layout.shard_numel, dtype)
                    acc32 = heap.alloc(f"grads32/{tag}", layout.shard_numel, torch.float32)
                    grad = torch.randn(numel, generator=g).to(dtype)
                    heap.barrier(60)

                    ours = torch.empty(numel, dtype=dtype)
                    gather(heap, f"params/{tag}", ours, layout)
                    ours_padded = torch.empty(layout.padded_numel, dtype=dtype)
                    gather(heap, f"params/{tag}", ours_padded, layout)
                    scatter_accumulate(heap, f"grads/{tag}", grad, layout)
                    padded_grad = torch.zeros(layout.padded_numel, dtype=dtype)
                    padded_grad[:numel] = grad
                    scatter_accumulate(heap, f"grads32/{tag}", padded_grad, layout)
                    scatter_accumulate(heap, f"grads32/{tag}", grad, layout)  # accumulates on top

                    theirs = torch.empty(layout.padded_numel, dtype=dtype)
                    all_gather(theirs, shard.clone())
                    reduced = torch.empty(layout.shard_numel, dtype=dtype)
                    reduce_scatter(reduced, padded_grad.clone())
                    reduced32 = torch.empty(layout.shard_numel)
                    reduce_scatter(reduced32, padded_grad.float())
                    heap.barrier(60)  # every push has landed
                    cases.append((tag, ours, ours_padded, theirs, acc.clone(), reduced, acc32.clone(), reduced32))
            heap.barrier(60)
    finally:
        dist.destroy_process_group()
    return cases


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_primitives_equal_gloo_collectives(world: int):
    out = run_ranks(_compare, world, f"t{uuid.uuid4().hex[:10]}", timeout_s=90)
    for rank_cases in out:
        assert len(rank_cases) == len(DTYPES) * len(SIZES)
        for tag, ours, ours_padded, theirs, acc, reduced, acc32, reduced32 in rank_cases:
            numel = ours.numel()
            assert torch.equal(ours, theirs[:numel]), tag
            assert torch.equal(ours_padded, theirs), tag
            # Summation order differs from gloo's: equal up to rounding. bf16 sums round after
            # every add, so near-zero sums of N(0, 1) values differ by a few bf16 ulps of the
            # partial sums: an absolute tolerance, not a relative one.
            tol = dict(rtol=1.6e-2, atol=5e-2) if acc.dtype == torch.bfloat16 else {}
            torch.testing.assert_close(acc, reduced, msg=tag, **tol)
            # bf16 gradients into an fp32 accumulator: the fp32 sum of the same values, twice.
            torch.testing.assert_close(acc32, 2 * reduced32, msg=tag)
