"""Moving a unit's bytes: gathering its parameters from their owners, now or ahead of need,
and pushing its gradients into the owners' accumulators.

A prefetch gathers the unit the worker will need next while the current one computes. On CPU
(Fetcher) it runs on a thread of its own (the copies are the CPU's to do); the worker thread
alone applies optimizer steps (versions.py), so a prefetch that must wait for an owner's
version makes the worker serve its own due steps while it waits. On CUDA (StreamFetcher) the
device does the copies: gathers and pushes are enqueued on a side stream and the compute
stream waits on an event, so no thread is needed; a prefetch whose owners have not published
their version yet is left to the gather at the unit's forward, which waits for them.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures

import torch

from odc_core.engine.odc.unit import FlatUnit, Storage, buffer_name
from odc_core.engine.odc.versions import POLL_FIRST_S, POLL_LAST_S, Emit, Versions
from odc_core.primitives import gather, scatter_accumulate
from odc_core.transport.base import SymmetricHeap


class Fetcher:
    """Gathers and pushes for one rank; `owners` is the shard group (None: every rank)."""

    def __init__(self, heap: SymmetricHeap, versions: Versions, owners: tuple[int, ...] | None, prefetch: bool,
                 emit: Emit, now: Callable[[], float]) -> None:
        self.heap, self.versions, self.owners = heap, versions, owners
        self._emit, self._now = emit, now
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="odc-prefetch") if prefetch else None

    def ensure(self, unit: FlatUnit) -> None:
        """The unit is GATHERED on return: its prefetch waited for, or gathered here."""
        if unit.pending is not None:
            t0 = self._now()
            self._prefetched(unit)
            unit.pending = None
            self._emit("prefetch_wait", t0, unit=unit.name)
        if unit.storage is not Storage.GATHERED:
            t0 = self._now()
            self._gather(unit, serve=True)
            self._emit("gather", t0, unit=unit.name)

    def prefetch(self, unit: FlatUnit) -> None:
        if self._pool is None or unit.storage is not Storage.SHARDED:
            return
        unit.storage = Storage.FETCHING
        unit.pending = self._pool.submit(self._gather, unit)

    def _prefetched(self, unit: FlatUnit) -> None:
        """Wait for a prefetch, applying this rank's due steps meanwhile (the prefetch may be
        waiting for a peer that waits for one of them)."""
        pending: Future = unit.pending
        delay = POLL_FIRST_S
        while self.versions.due() and not pending.done():
            self.versions.serve()
            wait_futures([pending], timeout=delay)
            delay = min(delay * 2, POLL_LAST_S)
        pending.result()

    def _gather(self, unit: FlatUnit, serve: bool = False) -> None:
        out = unit.materialize()
        self.versions.await_owners(unit.name, serve)
        slot = self.versions.gathered_version % self.versions.slots
        gather(self.heap, unit.gather_source(slot), out, unit.layout, self.owners)
        unit.storage = Storage.GATHERED

    def push(self, unit: FlatUnit) -> None:
        """Add the unit's flat gradient into its owners' accumulators of this minibatch."""
        assert unit.grad is not None, "the unit's backward gave it a flat gradient"
        t0 = self._now()
        scatter_accumulate(self.heap, buffer_name("acc", unit.name, self.versions.accumulator_slot), unit.grad,
                           unit.layout, self.owners)
        self._emit("push", t0, unit=unit.name)

    def close(self) -> None:
        if self._pool is not None:
            # After a failure a queued gather would only wait out its timeout on a dead peer.
            self._pool.shutdown(wait=True, cancel_futures=True)


class StreamFetcher(Fetcher):
    """Fetcher for CUDA ranks: gathers and pushes on a side stream of this rank's device.

    Memory: a unit's flat buffer and gradient are allocated on the compute stream. The side
    stream first waits for the work the compute stream has queued (a block the allocator hands
    out may still be read by it), and a pushed gradient is recorded on the side stream so that
    it is not reused before the push has read it."""

    def __init__(self, heap: SymmetricHeap, versions: Versions, owners: tuple[int, ...] | None, prefetch: bool,
                 emit: Emit, now: Callable[[], float], device: torch.device) -> None:
        super().__init__(heap, versions, owners, False, emit, now)
        self.prefetching = prefetch
        self.stream = torch.cuda.Stream(device)

    def _prefetched(self, unit: FlatUnit) -> None:
        """The compute stream waits for the prefetch's copies; the host does not."""
        torch.cuda.current_stream().wait_event(unit.pending)
        unit.storage = Storage.GATHERED

    def prefetch(self, unit: FlatUnit) -> None:
        if not self.prefetching or unit.storage is not Storage.SHARDED or not self.versions.owners_ready():
            return
        out = unit.materialize()
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            slot = self.versions.gathered_version % self.versions.slots
            gather(self.heap, unit.gather_source(slot), out, unit.layout, self.owners)
            unit.pending = self.stream.record_event()
        unit.storage = Storage.FETCHING

    def push(self, unit: FlatUnit) -> None:
        assert unit.grad is not None, "the unit's backward gave it a flat gradient"
        t0 = self._now()
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            scatter_accumulate(self.heap, buffer_name("acc", unit.name, self.versions.accumulator_slot), unit.grad,
                               unit.layout, self.owners)
        unit.grad.record_stream(self.stream)
        self._emit("push", t0, unit=unit.name)


def make_fetcher(device: torch.device, heap: SymmetricHeap, versions: Versions, owners: tuple[int, ...] | None,
                 prefetch: bool, emit: Emit, now: Callable[[], float]) -> Fetcher:
    """The fetcher for the device's kind: a side stream on CUDA, a prefetch thread elsewhere."""
    if device.type == "cuda":
        return StreamFetcher(heap, versions, owners, prefetch, emit, now, device)
    return Fetcher(heap, versions, owners, prefetch, emit, now)
