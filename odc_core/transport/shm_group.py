"""A torch.distributed process group whose all-gather and reduce-scatter run over /dev/shm.

Why it exists: on one CPU host the collective baseline (FSDP2) would otherwise move its
per-unit all-gathers and reduce-scatters over gloo (TCP loopback, milliseconds per call),
while the ODC engine moves the same bytes through shared memory (a fraction of that). The
paper compares NCCL collectives with one-sided operations over the same links; to compare
like with like here, FSDP2 runs unmodified on this group, whose collectives use the same
shared memory as ODC (ShmHeap), so the remaining difference between the engines is the
synchronisation: every collective here is a barrier, as NCCL's are.

Protocol, per collective with sequence number s (the same on every rank: all ranks issue
the same collectives in the same order, which is what a process group requires anyway):
each rank copies its input into its own slot s % 2, publishes s as its arrival count, waits
until every peer's arrival count reaches s, then reads what it needs straight out of the
peers' slots (all-gather: every slot; reduce-scatter: its own shard of every slot, summed in
rank order, so the result does not depend on who computes it). No departure flag is needed:
a rank publishes arrival s + 1 only after it finished reading the slots of s, so once a rank
has completed s + 1 nobody reads its slot s % 2 any more and call s + 2 may overwrite it.

Slots grow when a larger call arrives: every rank sees the same call, so every rank opens a
new heap (sized for that call, in 64 KiB steps) at the same point and closes the old one.
A training step's calls repeat, so the slots settle after the first step at twice the
largest collective's input (a reduce-scatter's: one unit's unsharded gradient). Waits poll
the arrival flags, yielding the core at first and then sleeping at most 200 us, so a
barrier's latency stays well below the transfers it guards; every wait has a timeout and
raises PeerTimeout naming a rank that did not arrive.

Python callers (torch.distributed's all_gather_single, reduce_scatter_single, which FSDP2
calls; before torch 2.13 all_gather_into_tensor and reduce_scatter_tensor, which call the
_base forms) reach the overrides below directly; C++ callers reach them through torch's Python
process-group trampoline, which in torch 2.13 forwards the coalesced forms (DTensor's
full_tensor() gathers through all_gather_single_coalesced) but not the single ones. What
reaches no override here (barrier, broadcast, all_reduce, object collectives, a C++ call of
the single forms) runs on an inner gloo backend built from the same store.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future  # type: ignore[attr-defined]
from torch.futures import Future

from odc_core.transport.base import PeerTimeout
from odc_core.transport.shm import ShmHeap

BACKEND = "odc_shm"
_ARRIVED = "pg/arrived"
_SLOTS = ("pg/slot0", "pg/slot1")
_SLOT_STEP = 1 << 16  # slot sizes are multiples of this
_SPIN_S = 200e-6  # yield the core, polling, this long before sleeping between polls
_MAX_SLEEP_S = 200e-6


@dataclass(frozen=True)
class ShmGroupOptions:
    """What new_group passes to the group's constructor (as pg_options)."""

    job_id: str
    timeout_s: float


def _completed(result: object) -> dist.Work:
    """Collectives here finish before they return; their Work is already done."""
    future: Future = Future()
    future.set_result(result)
    return _create_work_from_future(future)


class _Slots:
    """Two byte slots and an arrival counter per rank on a ShmHeap, replaced when too small."""

    def __init__(self, rank: int, world_size: int, job_id: str, store: dist.Store, timeout_s: float) -> None:
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        self._job_id, self._store = job_id, store
        self.heap: ShmHeap | None = None
        self.capacity = 0
        self._generation = 0
        self._views: list[list[torch.Tensor]] = []  # [slot][rank]: every rank's slot, as mapped here

    def ensure(self, nbytes: int) -> None:
        if nbytes <= self.capacity:
            return
        capacity = -(-nbytes // _SLOT_STEP) * _SLOT_STEP
        self._generation += 1
        # A job id of its own per generation: the old heap's segment names are still taken.
        tag = f"{self._job_id}.pg{self._generation}"
        heap = ShmHeap(self.rank, self.world_size, tag, dist.PrefixStore(tag, self._store), self.timeout_s)
        try:
            heap.alloc(_ARRIVED, 1, torch.int64)
            for name in _SLOTS:
                heap.alloc(name, capacity, torch.uint8)
        except BaseException:
            heap.close()
            raise
        # Every rank has mapped the new heap (alloc returns only then), so nobody reads the
        # old one any more: its segments can go.
        self.close()
        self.heap, self.capacity = heap, capacity
        self._views = [[heap.view(name, r) for r in range(self.world_size)] for name in _SLOTS]

    def slot(self, seq: int, rank: int, nbytes: int, dtype: torch.dtype) -> torch.Tensor:
        return self._views[seq % 2][rank][:nbytes].view(dtype)

    def close(self) -> None:
        self._views = []
        if self.heap is not None:
            self.heap.close()
            self.heap, self.capacity = None, 0


class ShmProcessGroup(dist.ProcessGroup):
    """all_gather_single and reduce_scatter_single (and their coalesced and deprecated forms)
    over shared memory with barrier semantics; every other operation on gloo.

    Create it through torch.distributed so that DeviceMesh and DTensor can find it by name:
    `new_shm_group(job_id, timeout_s)`.
    """

    def __init__(self, store: dist.Store, rank: int, world_size: int, timeout: timedelta,
                 options: ShmGroupOptions) -> None:
        super().__init__(rank, world_size)  # type: ignore[call-arg]  # the Python trampoline's constructor
        self._rank, self._world_size = rank, world_size
        self.timeout_s = float(options.timeout_s)
        self._gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo", store), rank, world_size, timeout)
        # Operations without a Python override here dispatch to this backend.
        self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, self._gloo)
        self._slots = _Slots(rank, world_size, options.job_id, dist.PrefixStore("shm", store), self.timeout_s)
        self._seq = 0

    def getBackendName(self) -> str:  # noqa: N802 (the C++ name torch looks up)
        return BACKEND

    @property
    def heap_bytes(self) -> int:
        """Shared memory this rank owns for the collectives' slots."""
        return 0 if self._slots.heap is None else self._slots.heap.heap_bytes

    # -- the collectives FSDP2 uses -----------------------------------------------------

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,
                          opts: object | None = None) -> dist.Work:
        self._all_gather(output, input)
        return _completed([output])

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,
                              opts: dist.ReduceScatterOptions | None = None) -> dist.Work:
        self._reduce_scatter(output, input, dist.ReduceOp.SUM if opts is None else opts.reduceOp)
        return _completed([output])

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                    opts: object | None = None) -> dist.Work:
        for output, input in zip(outputs, inputs, strict=True):
            self._all_gather(output, input)
        return _completed(outputs)

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: dist.ReduceScatterOptions | None = None) -> dist.Work:
        op = dist.ReduceOp.SUM if opts is None else opts.reduceOp
        for output, input in zip(outputs, inputs, strict=True):
            self._reduce_scatter(output, input, op)
        return _completed(outputs)

    # The names torch 2.13 deprecated; Python callers and the C++ trampoline may still use them.
    # Their stubs name the arguments differently; the calls are positional.
    _allgather_base = all_gather_single
    _reduce_scatter_base = reduce_scatter_single  # type: ignore[assignment]
    allgather_into_tensor_coalesced = all_gather_single_coalesced  # type: ignore[assignment]
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced  # type: ignore[assignment]

    def shutdown(self) -> None:
        self._slots.close()
        self._gloo.shutdown()

    # -- implementation -----------------------------------------------------------------

    def _check(self, what: str, output: torch.Tensor, input: torch.Tensor, out_numel: int) -> None:
        if output.dtype != input.dtype:
            raise TypeError(f"{what}: output is {output.dtype}, input {input.dtype}; they must match")
        if output.device.type != "cpu" or input.device.type != "cpu":
            raise ValueError(f"{what} over shared memory needs CPU tensors, got {output.device} and {input.device}")
        if not output.is_contiguous():
            raise ValueError(f"{what} needs a contiguous output tensor")
        if output.numel() != out_numel:
            raise ValueError(f"{what}: output has {output.numel()} elements, needs {out_numel} "
                             f"(input {input.numel()}, world size {self._world_size})")

    def _arrive(self, input: torch.Tensor, what: str) -> int:
        """Copy input into this rank's next slot, publish arrival, wait for every peer's."""
        nbytes = input.numel() * input.element_size()
        self._slots.ensure(nbytes)
        seq = self._seq + 1
        self._slots.slot(seq, self._rank, nbytes, input.dtype).view(input.shape).copy_(input)
        heap = self._slots.heap
        assert heap is not None, "ensure() opened the heap"
        heap.store(_ARRIVED, 0, seq)
        pending = [(self._rank + i) % self._world_size for i in range(1, self._world_size)]
        started = time.monotonic()
        delay = 10e-6
        while pending:
            pending = [peer for peer in pending if heap.load(_ARRIVED, peer, 0) < seq]
            if not pending:
                break
            waited = time.monotonic() - started
            if waited > self.timeout_s:
                # Where the peer got to: alive and short of this collective, it waits in another
                # call, as when ranks run different units (a branch one rank takes): FSDP2 needs
                # every rank to run every unit's collectives, in one order.
                reached = heap.load(_ARRIVED, pending[0], 0)
                raise PeerTimeout(pending[0], f"arrival at {what} #{seq} (it reached #{reached} of this group's "
                                              f"collectives; every rank must run the same collectives, the same "
                                              f"units, in the same order)", self.timeout_s)
            if waited < _SPIN_S:
                os.sched_yield()
            else:
                time.sleep(delay)
                delay = min(2 * delay, _MAX_SLEEP_S)
        self._seq = seq
        return seq

    def _all_gather(self, output: torch.Tensor, input: torch.Tensor) -> None:
        n = input.numel()
        self._check("all_gather", output, input, n * self._world_size)
        seq = self._arrive(input, "all_gather")
        flat = output.view(-1)
        nbytes = n * input.element_size()
        for r in range(self._world_size):
            part = input.reshape(-1) if r == self._rank else self._slots.slot(seq, r, nbytes, input.dtype)
            flat[r * n:(r + 1) * n].copy_(part)

    def _reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, op: object) -> None:
        kind = getattr(op, "op", op)  # options hold a ReduceOp; callers may pass its RedOpType
        if kind not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            raise ValueError(f"reduce_scatter over shared memory supports SUM and AVG, not {kind}")
        n = output.numel()
        self._check("reduce_scatter", output, input, input.numel() // self._world_size)
        if input.numel() != n * self._world_size:
            raise ValueError(f"reduce_scatter: input has {input.numel()} elements, needs {n * self._world_size}")
        seq = self._arrive(input, "reduce_scatter")
        size = input.element_size()
        lo = self._rank * n
        # Summed in rank order on every rank, so each shard is the same whichever rank computes it.
        shards = [self._slots.slot(seq, r, input.numel() * size, input.dtype)[lo:lo + n]
                  for r in range(self._world_size)]
        out = output.view(-1)
        if self._world_size == 1:
            out.copy_(shards[0])
        else:
            torch.add(shards[0], shards[1], out=out)
            for shard in shards[2:]:
                out.add_(shard)
        if kind == dist.ReduceOp.AVG:
            out.div_(self._world_size)


def _create(backend_options: dist.distributed_c10d._DistributedBackendOptions,
            options: ShmGroupOptions) -> ShmProcessGroup:
    return ShmProcessGroup(backend_options.store, backend_options.group_rank, backend_options.group_size,
                           backend_options.timeout, options)


def new_shm_group(job_id: str, timeout_s: float, ranks: list[int] | None = None) -> ShmProcessGroup:
    """Collective over every rank of the default group: a ShmProcessGroup spanning them all (or
    `ranks`), registered with torch.distributed (a name, ranks, a store prefix) like any
    new_group. Groups alive at once need job ids of their own: the ids name their segments."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
    return dist.new_group(ranks, backend=BACKEND, timeout=timedelta(seconds=timeout_s),
                          pg_options=ShmGroupOptions(job_id, timeout_s))
