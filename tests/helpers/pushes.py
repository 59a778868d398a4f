"""Concurrent pushes into one owner, for the transports' exactly-once tests."""

from __future__ import annotations

import threading

import torch

from odc_core.transport.base import SymmetricHeap


def push_integers(heap: SymmetricHeap, numel: int, pushes: int, bf16_every_other: bool = False) -> dict:
    """Two threads of this rank push random integer-valued slices into rank 0's `acc` buffer
    (every other one as bf16 with `bf16_every_other`: small integers are exact in bf16), each
    followed by a fetch_add on rank 0's `count`. Returns what they pushed (`expected`), rank 0's
    buffer (`acc`), the counter's values the fetch_adds saw (`olds`) and its final value."""
    acc = heap.alloc("acc", numel, torch.float32)
    heap.alloc("count", 1, torch.int64)
    heap.barrier(30)
    sums: list[torch.Tensor] = []
    olds: list[int] = []

    def push(seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        mine = torch.zeros(numel)
        for i in range(pushes):
            lo = int(torch.randint(0, numel - 1, (1,), generator=g))
            hi = int(torch.randint(lo + 1, min(numel, lo + numel // 2) + 1, (1,), generator=g))
            src = torch.randint(-8, 9, (hi - lo,), generator=g).float()
            heap.accumulate("acc", 0, lo, src.bfloat16() if bf16_every_other and i % 2 else src)
            olds.append(heap.fetch_add("count", 0, 0, 1))
            mine[lo:hi] += src
        sums.append(mine)  # summed after the threads are joined: two add_ into one tensor would race

    threads = [threading.Thread(target=push, args=(1000 * heap.rank + t,)) for t in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    heap.barrier(30)
    return dict(expected=sum(sums, torch.zeros(numel)), acc=acc.to("cpu", copy=True) if heap.rank == 0 else None,
                olds=olds,
                count=heap.load("count", 0, 0))
