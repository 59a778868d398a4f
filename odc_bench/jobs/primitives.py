"""The primitives microbenchmark (`python -m odc_bench task=primitives world_size=N`).

Bandwidth of gather and scatter_accumulate on a symmetric heap (primitives.transport: shared
memory, or MPI windows on MPI's network path with the ranks under mpiexec) against the gloo
collectives they replace, with the memcpy rate as the limit, at every size of a range.

Ranks are not lock-stepped: per size, one barrier starts the one-sided ops (memcpy, gather,
scatter_accumulate) and one the collectives; after it every rank runs on at its own pace. A
one-sided op therefore shows what a rank gets while its peers do the same; a collective
synchronises the ranks by itself.

Timing: the ops take turns (rounds); in its turn an op runs back to back for about turn_s
(a call count estimated from its warm-up calls), and the turn's time over its calls is one
sample. An op's seconds is the median
of its samples over all ranks and rounds: with one-sided ops every rank's rate is its own,
and pooling is less noisy than any one rank's few rounds. Turns, not single calls, because
with more ranks than cores (or other work on the host) a call of a few milliseconds is either
never or entirely preempted, which makes per-call medians bimodal; a turn spans many time
slices, and alternating turns puts every op under the same background load.

memcpy is measured the same way (every rank copying at once, one thread each, in turn with
the one-sided ops), so it shares the cores and memory exactly as the ops do.

On GPUs (primitives.transport=cuda_ipc) every tensor is on the rank's device, memcpy is a device
copy, and a turn is timed from a synchronised device to a synchronised device, so it measures
the copies, not their launches. The collectives run on NCCL where every rank has a GPU of its
own; ranks sharing one (a one-GPU machine) measure the one-sided ops and the copy only.
"""

from __future__ import annotations

import contextlib
import json
import socket
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from rich.console import Console
from rich.table import Table

from odc_bench.config.fields import as_dict, require
from odc_bench.config.run import RunConfig
from odc_bench.errors import RunFailed
from odc_bench.plan.identity import run_key
from odc_bench.provenance import git_commit
from odc_bench.results.table import append_rows
from odc_bench.run.mpiexec import mpiexec_path, run_mpi_ranks
from odc_bench.run.ranks import RanksFailed, run_ranks
from odc_bench.sizes import size_label
from odc_core.primitives import ShardLayout, gather, scatter_accumulate
from odc_core.transport.base import SymmetricHeap
from odc_core.transport.registry import TRANSPORTS, make_heap
from odc_core.transport.shm import ShmHeap

COLUMNS = [
    "run_id", "timestamp", "commit", "host", "op", "transport", "world_size", "size_bytes", "dtype",
    "iterations", "seconds", "bandwidth_gbps", "memcpy_gbps", "ratio_to_memcpy",
]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# op -> transport, in the order each size runs them (replacement next to what it replaces);
# HEAP stands for the plan's heap transport.
HEAP = "heap"
OPS = {"memcpy": "local", "gather": HEAP, "all_gather": "gloo", "scatter_accumulate": HEAP,
       "reduce_scatter": "gloo"}
# torch 2.13 renamed the tensor collectives (*_single); older releases only have the old names.
all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
LOCAL_OPS = ("memcpy", "gather", "scatter_accumulate")
COLLECTIVES = ("all_gather", "reduce_scatter")


@dataclass(frozen=True)
class Plan:
    world_size: int
    sizes: list[int]
    dtype: str
    rounds: int
    turn_s: float
    warmup: int
    chunk_bytes: int
    timeout_s: float
    transport: str = "shm"

    @property
    def device(self) -> str:
        return TRANSPORTS[self.transport].devices[0]


def plan_from_config(config: RunConfig) -> Plan:
    """The primitives section (task=primitives) expanded into a plan; ConfigError when it cannot run."""
    p = config.primitives
    require(p is not None, "the primitives section is missing; run with task=primitives")
    assert p is not None
    # It ran this host's real ranks, world_size of them (backend=sim world_size=64 started 64 here).
    require(not config.simulated, "task=primitives measures this host's transports with real ranks; backend=sim has "
                                  "no model of them to run (the simulator's bandwidths are backend.hardware's: "
                                  "docs/simulator.md); leave backend out")
    itemsize = DTYPES[p.dtype].itemsize
    world = config.world_size
    require(p.transport != "cuda_ipc" or torch.cuda.is_available(),
            "primitives.transport=cuda_ipc measures GPU memory and this machine has no CUDA device; use shm or mpi")
    require(p.min_bytes >= world * itemsize, f"primitives.min_bytes ({p.min_bytes}) must hold at least one "
                                             f"{p.dtype} element per rank ({world * itemsize} bytes)")
    sizes, size = [], p.min_bytes
    while size <= p.max_bytes:
        sizes.append(size - size % itemsize)
        size *= p.step
    return Plan(world, sizes, p.dtype, p.rounds, p.turn_s, p.warmup_calls, p.chunk_bytes, config.timeout_s,
                p.transport)


def _warm_up(op: Callable[[], object], warmup: int, sync: Callable[[], None]) -> float:
    """Run `warmup` calls (first touches, allocator); return the median seconds per call."""
    times = []
    for _ in range(warmup):
        sync()
        t0 = time.perf_counter()
        op()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _timed(ops: dict[str, Callable[[], object]], calls: dict[str, int], rounds: int,
           barrier: Callable[[], None], sync: Callable[[], None]) -> dict[str, list[float]]:
    """Per op, `rounds` samples of the mean seconds per call over a turn of calls[op] calls."""
    barrier()  # one start line; nothing couples the ranks after it
    samples: dict[str, list[float]] = {name: [] for name in ops}
    for _ in range(rounds):
        for name, op in ops.items():
            sync()
            t0 = time.perf_counter()
            for _ in range(calls[name]):
                op()
            sync()
            samples[name].append((time.perf_counter() - t0) / calls[name])
    return samples


def _rank_ops(heap: SymmetricHeap, size: int, dtype: torch.dtype, device: torch.device,
              collectives: bool) -> dict[str, Callable[[], object]]:
    """The ops for one size, over freshly allocated heap buffers and local tensors."""
    numel = size // dtype.itemsize
    layout = ShardLayout(numel, heap.world_size)
    shard = heap.alloc("params", layout.shard_numel, dtype)
    heap.alloc("grads", layout.shard_numel, torch.float32 if dtype == torch.bfloat16 else dtype)
    shard.copy_(torch.randn(layout.shard_numel).to(dtype))
    full = torch.randn(layout.padded_numel).to(device, dtype)
    out = torch.empty(layout.padded_numel, dtype=dtype, device=device)
    piece = torch.empty(layout.shard_numel, dtype=dtype, device=device)
    ops: dict[str, Callable[[], object]] = {
        "memcpy": lambda: out.copy_(full),
        "gather": lambda: gather(heap, "params", out, layout),
        "scatter_accumulate": lambda: scatter_accumulate(heap, "grads", full, layout),
    }
    if collectives:
        ops.update(all_gather=lambda: all_gather(out, shard), reduce_scatter=lambda: reduce_scatter(piece, full))
    return ops


def _heap(plan: Plan, rank: int, world: int, job: str, store: dist.Store) -> Any:
    """This size's heap on the plan's transport (a context manager that closes it)."""
    if plan.transport == "shm":
        return ShmHeap(rank, world, job, store, timeout_s=plan.timeout_s, chunk_bytes=plan.chunk_bytes)
    return contextlib.closing(make_heap(plan.transport, plan.device, rank, world, job, store, plan.timeout_s))


def bench_rank(rank: int, world: int, store: dist.Store, plan: Plan, job: str) -> dict:
    """Per (op, size): this rank's samples of seconds per call, and its calls per turn."""
    torch.set_num_threads(1)
    timeout = timedelta(seconds=plan.timeout_s)
    device, sync, collectives = torch.device("cpu"), _nothing, True
    if plan.device == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        sync, collectives = torch.cuda.synchronize, world <= torch.cuda.device_count()
    dist.init_process_group("cpu:gloo,cuda:nccl" if plan.device == "cuda" else "gloo",
                            store=dist.PrefixStore("gloo", store), rank=rank, world_size=world, timeout=timeout)
    dtype = DTYPES[plan.dtype]
    samples: dict[tuple[str, int], list[float]] = {}
    calls: dict[tuple[str, int], int] = {}
    try:
        for size in plan.sizes:
            # One heap per size, so each size's buffers are freed before the next is allocated.
            with _heap(plan, rank, world, f"{job}.{size}", store) as heap:
                ops = _rank_ops(heap, size, dtype, device, collectives)
                turn = {op: max(1, round(plan.turn_s / _warm_up(fn, plan.warmup, sync))) for op, fn in ops.items()}
                # Every rank must make the same number of collective calls: rank 0's estimate counts.
                key = f"{job}/calls/{size}"
                if rank == 0:
                    store.set(key, json.dumps({op: turn[op] for op in COLLECTIVES if op in ops}))
                turn.update(json.loads(store.get(key)))
                barrier = partial(heap.barrier, plan.timeout_s)
                # The collectives synchronise the ranks at every call: timed in their own rounds,
                # so they never pace the one-sided ops.
                for group in (LOCAL_OPS, COLLECTIVES):
                    timed = _timed({op: ops[op] for op in group if op in ops}, turn, plan.rounds, barrier, sync)
                    samples.update({(op, size): t for op, t in timed.items()})
                calls.update({(op, size): n for op, n in turn.items()})
                heap.barrier(plan.timeout_s)  # no rank unmaps a size's buffers while a peer still pushes
    finally:
        dist.destroy_process_group()
    return dict(samples=samples, calls=calls)


def _nothing() -> None:
    """A CPU op is complete when it returns: nothing to wait for."""


def summarize(plan: Plan, per_rank: list[dict]) -> list[dict]:
    """One row per op and size: the median seconds per call over ranks and rounds, and its ratio to memcpy."""
    rows = []
    measured = [op for op in OPS if (op, plan.sizes[0]) in per_rank[0]["samples"]]
    for size in plan.sizes:
        seconds = {op: statistics.median(t for r in per_rank for t in r["samples"][op, size]) for op in measured}
        memcpy_gbps = size / seconds["memcpy"] / 1e9
        for op, transport in ((op, OPS[op]) for op in measured):
            if op in COLLECTIVES and plan.device == "cuda":
                transport = "nccl"
            transport = plan.transport if transport == HEAP else transport
            gbps = size / seconds[op] / 1e9
            calls = statistics.median_low(r["calls"][op, size] for r in per_rank)
            rows.append(dict(op=op, transport=transport, world_size=plan.world_size, size_bytes=size,
                             dtype=plan.dtype, iterations=calls * plan.rounds, seconds=seconds[op],
                             bandwidth_gbps=gbps, memcpy_gbps=memcpy_gbps, ratio_to_memcpy=gbps / memcpy_gbps))
    return rows


def print_rows(rows: list[dict]) -> None:
    heap = next(r["transport"] for r in rows if r["op"] == "gather")
    table = Table(title=f"primitives on {heap}, {rows[0]['world_size']} ranks, {rows[0]['dtype']}: "
                        "GB/s (ratio to memcpy)")
    table.add_column("size")
    ops = [op for op in OPS if any(r["op"] == op for r in rows)]
    for op in ops:
        table.add_column(op, justify="right")
    for size in sorted({r["size_bytes"] for r in rows}):
        cells = {r["op"]: f"{r['bandwidth_gbps']:.3g} ({r['ratio_to_memcpy']:.2f})" for r in rows
                 if r["size_bytes"] == size}
        table.add_row(size_label(size), *(cells[op] for op in ops))
    Console(width=120).print(table)


def run_primitives(config: RunConfig) -> list[dict]:
    """The task=primitives job: measure, append the rows to primitives.csv, print them.

    ConfigError (bad input) before anything runs; exit status 1 when a rank fails."""
    plan = plan_from_config(config)
    assert config.primitives is not None
    run_id = run_key(dict(task=config.task, world_size=config.world_size, primitives=as_dict(config.primitives),
                          timeout_s=config.timeout_s))
    job = f"bench{uuid.uuid4().hex[:8]}"
    # MPI's ranks must be started by its process manager, and take its network path (no shared memory).
    launch = run_mpi_ranks if plan.transport == "mpi" else run_ranks
    if plan.transport == "mpi":
        mpiexec_path()
    try:
        per_rank = launch(bench_rank, plan.world_size, plan, job, timeout_s=config.deadline_s or 3600.0)
    except (RanksFailed, RunFailed) as e:
        print(f"odc_bench: primitives benchmark failed: {e}", file=sys.stderr)
        sys.exit(1)
    stamp = dict(run_id=run_id, timestamp=time.strftime("%Y-%m-%dT%H:%M:%S"), commit=git_commit(),
                 host=socket.gethostname())
    rows = [dict(stamp, **row) for row in summarize(plan, per_rank)]
    append_rows(Path(config.results_dir) / "primitives.csv", rows, COLUMNS)
    print_rows(rows)
    return rows
