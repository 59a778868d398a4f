"""The measurement behind the heap's accumulation design: byte-range locks vs staging slots.

`python -m odc_bench.bench_accumulate [world_size ...]`: ranks 1..N-1 push integer-valued
gradients into rank 0's accumulator at once. Two designs:

- locks: each pusher calls ShmHeap.accumulate, i.e. locks a chunk of the owner's
  accumulator and adds into it itself.
- staging: each pusher copies a chunk into one of `depth` slots in its own segment and
  bumps a request counter; a service thread on the owner adds the slot into the accumulator
  and acknowledges, which frees the slot (the paper's daemon design, with several slots in
  flight per client instead of one, and no device sync).

Reported per design: push throughput (bytes landed per second, over all pushers: wall
time, so noisy on a shared host), CPU seconds per GiB landed spent by the pushers and by
the owner (thread CPU time: what the owner's own compute would lose to the design, and
robust to other load on the host), and whether the sum is exact.
"""

from __future__ import annotations

import sys
import time
import uuid

import torch
import torch.distributed as dist

from odc_bench.launch.ranks import run_ranks
from odc_core.transport.shm import ShmHeap

PUSH_BYTES = 32 << 20
ROUNDS = 4
CHUNK_BYTES = 1 << 20
DEPTH = 4
TIMEOUT_S = 120.0
REPEATS = 3


def _serve(heap: ShmHeap, acc: torch.Tensor, clients: list[int], total: int) -> None:
    """The staging design's accumulation service: apply every published slot, acknowledge it."""
    chunk = CHUNK_BYTES // 4
    chunks_per_push = PUSH_BYTES // CHUNK_BYTES
    applied = dict.fromkeys(clients, 0)
    delay = 1e-5
    while min(applied.values()) < total:
        progressed = False
        for c in clients:
            published = heap.load("req", c, 0)
            slots = heap.view("slots", c)
            while applied[c] < published:
                j = applied[c]
                k, off = j % DEPTH, (j % chunks_per_push) * chunk
                acc[off:off + chunk].add_(slots[k * chunk:(k + 1) * chunk])
                applied[c] += 1
                heap.store("ack", c, applied[c])
                progressed = True
        if progressed:
            delay = 1e-5
        else:
            time.sleep(delay)
            delay = min(2 * delay, 1e-3)


def rank_main(rank: int, world: int, store: dist.Store, design: str, job: str) -> dict:
    torch.set_num_threads(1)
    numel, chunk = PUSH_BYTES // 4, CHUNK_BYTES // 4
    chunks_per_push = PUSH_BYTES // CHUNK_BYTES
    total = ROUNDS * chunks_per_push
    with ShmHeap(rank, world, job, store, timeout_s=TIMEOUT_S, chunk_bytes=CHUNK_BYTES) as heap:
        acc = heap.alloc("acc", numel, torch.float32)
        slots = heap.alloc("slots", DEPTH * chunk, torch.float32)
        heap.alloc("req", 1, torch.int64)
        heap.alloc("ack", world, torch.int64)
        heap.alloc("finished", 1, torch.int64)
        src = torch.randint(-4, 5, (numel,)).float()
        if rank == 0:
            heap.barrier(TIMEOUT_S)
            cpu = time.thread_time()
            if design == "staging":
                _serve(heap, acc, list(range(1, world)), total)
            else:
                heap.wait_until("finished", 0, 0, world - 1, TIMEOUT_S)
            cpu = time.thread_time() - cpu if design == "staging" else 0.0
            heap.barrier(TIMEOUT_S)
            return dict(acc=acc.clone(), cpu=cpu)
        heap.barrier(TIMEOUT_S)
        started, cpu = time.perf_counter(), time.thread_time()
        if design == "locks":
            for _ in range(ROUNDS):
                heap.accumulate("acc", 0, 0, src)
        else:
            for j in range(total):
                k, off = j % DEPTH, (j % chunks_per_push) * chunk
                if j >= DEPTH:
                    heap.wait_until("ack", 0, rank, j - DEPTH + 1, TIMEOUT_S)
                slots[k * chunk:(k + 1) * chunk].copy_(src[off:off + chunk])
                heap.store("req", 0, j + 1)
            heap.wait_until("ack", 0, rank, total, TIMEOUT_S)
        elapsed, cpu = time.perf_counter() - started, time.thread_time() - cpu
        heap.fetch_add("finished", 0, 0, 1)
        heap.barrier(TIMEOUT_S)
        return dict(src=src, seconds=elapsed, cpu=cpu)


def measure(world: int, design: str) -> dict:
    out = run_ranks(rank_main, world, design, f"acc{uuid.uuid4().hex[:8]}", timeout_s=600)
    expected = ROUNDS * sum(r["src"] for r in out[1:])
    landed = (world - 1) * ROUNDS * PUSH_BYTES
    return dict(world=world, design=design, push_gbps=landed / max(r["seconds"] for r in out[1:]) / 1e9,
                pusher_cpu=sum(r["cpu"] for r in out[1:]) / (landed / 2**30),
                owner_cpu=out[0]["cpu"] / (landed / 2**30),
                exact=bool(torch.equal(out[0]["acc"], expected)))


def main(worlds: list[int]) -> None:
    print("world design   push GB/s  pusher CPU s/GiB  owner CPU s/GiB  exact")
    for world in worlds:
        for design in ("locks", "staging") * REPEATS:  # interleaved
            r = measure(world, design)
            print(f"{r['world']:5d} {r['design']:8s} {r['push_gbps']:9.2f}  {r['pusher_cpu']:16.3f}  "
                  f"{r['owner_cpu']:15.3f}  {r['exact']}")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [2, 3, 4])
