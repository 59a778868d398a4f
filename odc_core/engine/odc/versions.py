"""The version-flag protocol: which version of the parameters a minibatch reads, when an
owner steps, and the one synchronisation per minibatch (or none, stale-synchronous).

Version v is the parameters after v optimizer steps; minibatch k computes on version
max(0, k - s) for the engine's staleness s, and step k applies minibatch k's gradients to
version k, giving version k + 1. Each owner keeps s + 1 slots of its master shard (version v
in slot v mod (s + 1)) and of its accumulator (minibatch k pushes into slot k mod (s + 1)), so
no gather reads a slot a step is writing and no push lands in another minibatch's sum
(docs/staleness.md has the argument).

Two int64 flags per rank:
- DONE = k + 1 once the rank has pushed all its gradients of minibatch k (finish).
- VERSION = v + 1 once the rank's shard of version v is in its slot (and, for v >= 1, the
  accumulator of minibatch v - 1 is zeroed for minibatch v + s). A gatherer waits for an
  owner's VERSION before its first read of a minibatch; nothing else waits.
Step k runs on each owner once every rank's DONE >= k + 1. With s = 0 the rank runs it
itself in finish, after waiting for every DONE (the minibatch's one barrier); a fast rank then
starts minibatch k + 1 as soon as the owners it reads from have stepped. With s >= 1 no worker
waits at finish: the owner serves its steps in order from inside its own training, at every
unit's forward and after every unit's push, and all the while it waits for anything, so a step
is applied within one unit's compute of its last push landing, not at the owner's next
minibatch boundary. Not on a server thread of its own: where a rank has one core (CPU ranks),
such a thread's polling and its optimizer step take the GIL and the core from the rank's
compute (docs/staleness.md measured it). Pushes of minibatch k cannot reach an accumulator
slot before the step that frees it either: a rank pushes a unit's gradients only after
gathering that unit from the same owners, which waited for the version that step published.

Publishing a flag is a release (SymmetricHeap.store): everything this rank wrote before it,
on the host or on its device, is visible to a peer that has seen the flag.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable

import torch
import torch.distributed as dist

from odc_core.engine.base import OptimizerStep, configured, reduction_device
from odc_core.engine.odc.unit import FlatUnit
from odc_core.transport.base import PeerTimeout, SymmetricHeap

FLAGS = "odc/flags"
VERSION, DONE = 0, 1
CLAIMS = "odc/claims"  # rank 0's work counter for run-time balancing (dynamic)
# A wait looks up between slices whether the engine is closing, and every _CLOSED_CHECK_S whether
# the peer it waits for closed its engine (one store lookup: only waits that last look).
_WAIT_SLICE_S = 0.2
_CLOSED_CHECK_S = 1.0
# A worker with steps of its own due polls between 10 us and 1 ms, as the transports' waits do.
POLL_FIRST_S, POLL_LAST_S = 1e-5, 1e-3

Emit = Callable[..., None]  # (kind, t0, **info): a span from t0 to now into the trace


class Versions:
    """One rank's side of the protocol: its flags, the owners' flags it has seen, and the
    steps it owes as an owner."""

    def __init__(self, heap: SymmetricHeap, peers: tuple[int, ...], staleness: int, timeout_s: float,
                 emit: Emit, now: Callable[[], float],
                 closed: Callable[[int, str], str | None] = lambda peer, what: None) -> None:
        if staleness < 0:
            raise ValueError(f"staleness must be >= 0, got {staleness}")
        self.heap = heap
        self.peers = peers  # the ranks whose flags this rank reads: its shard group
        self.staleness = staleness
        self.slots = staleness + 1
        self.timeout_s = timeout_s
        self._emit, self._now = emit, now
        # closed(peer, what): the error of a wait for `what` where the peer closed its engine; else None.
        self._closed = closed
        self.minibatch = -1
        self.inside = False  # between begin() and finish(): a forward then computes minibatch `minibatch`
        self.units: list[FlatUnit] = []
        self.step_rule: OptimizerStep | None = None
        # Hybrid sharding: this rank and its replicas on the other nodes.
        self.replicas: dist.ProcessGroup | None = None
        self.replica_count = 1
        self._ready = [0] * heap.world_size  # highest VERSION seen per owner
        # The owner's side of stale-synchronous ODC: minibatches finished here whose steps are
        # not applied yet, oldest first, and the highest DONE seen of each rank.
        self._unstepped: deque[int] = deque()
        self._done_seen = [0] * heap.world_size
        self.closing = threading.Event()
        # What broke this rank's protocol (finish_minibatch, a step or a drain raised): close()
        # then tells the peers instead of waiting for steps that will not come.
        self.failed: BaseException | None = None

    def allocate(self) -> None:
        """The flags, collectively; every rank calls it once its shards are allocated."""
        self.heap.alloc(FLAGS, 2, torch.int64)
        self.heap.alloc(CLAIMS, 1, torch.int64)

    def publish_initial(self) -> None:
        """Version 0, the initial weights, is in slot 0 (after a barrier: every shard is set)."""
        self.heap.store(FLAGS, VERSION, 1)

    def read_version(self, minibatch: int) -> int:
        """The version minibatch `minibatch` computes on."""
        return max(0, minibatch - self.staleness)

    @property
    def gathered_version(self) -> int:
        """The version a forward gathers now: its minibatch's inside one; between minibatches (an
        evaluation), the one the next minibatch computes on, after the steps before it (with
        staleness 0, the newest: the owners may still be applying the step of the minibatch
        just finished, in place, which a read of its own version would race)."""
        return self.read_version(self.minibatch if self.inside else self.minibatch + 1)

    @property
    def accumulator_slot(self) -> int:
        """The slot the current minibatch's pushes go into."""
        return self.minibatch % self.slots

    @property
    def newest_slot(self) -> int:
        """The slot of the newest version once every step begun is applied."""
        return (self.minibatch + 1) % self.slots

    # ---- the minibatch -------------------------------------------------------------------
    def begin(self) -> None:
        """Nothing here waits for a peer: the first gather from an owner waits for its version."""
        self.serve()
        self.minibatch += 1
        self.inside = True

    def finish(self) -> float | None:
        """This rank's gradients of the minibatch have landed; its step is applied here (s = 0,
        after the one barrier) or queued for this owner to serve (s >= 1). Returns the step's
        gradient norm before clipping (when it clips, s = 0)."""
        k = self.minibatch
        self.inside = False
        t0 = self._now()
        self.heap.quiet()
        self.heap.store(FLAGS, DONE, k + 1)
        if self.staleness:
            self._unstepped.append(k)
            self._emit("sync", t0)
            self.serve()
            return None
        for peer in self.peers:
            self.wait(peer, DONE, k + 1, f"its gradients of minibatch {k}")
        if self.replicas is not None:
            self._reduce_replicas(k)
        self._emit("sync", t0)
        return self._step(k)

    def drain(self, traced: bool = True) -> None:
        """Wait until every owner has applied the step of every minibatch begun so far (this
        rank's own steps included, which it applies here as their pushes land); `traced`: the
        wait is a "sync" span of the trace (stale-synchronous ODC)."""
        try:
            self._drain(traced)
        except BaseException as e:  # a peer gone or late: close() must not wait for it again
            self.failed = self.failed or e
            raise

    def _drain(self, traced: bool) -> None:
        t0 = self._now()
        while self._unstepped:
            k = self._unstepped[0]
            for peer in self.peers:
                self.wait(peer, DONE, k + 1, f"its gradients of minibatch {k} (for step {k})", serve=True)
            self.serve()
        for owner in self.peers:
            self.wait(owner, VERSION, self.minibatch + 2, f"step {self.minibatch} of its shards", serve=True)
        if self.staleness and traced:  # synchronous, the barrier was the wait: a trace as before
            self._emit("sync", t0)

    def await_owners(self, unit: str, serve: bool) -> bool:
        """Make sure every owner has published the version the current minibatch reads: at
        once when already seen, else by waiting (`serve`: this rank's due steps meanwhile).
        Returns whether it had to wait."""
        version = self.gathered_version
        waited = False
        for owner in self.peers:
            if self._ready[owner] < version + 1:
                t0 = self._now()
                self.wait(owner, VERSION, version + 1, f"version {version} of its shards", serve)
                self._ready[owner] = version + 1
                self._emit("wait", t0, unit=unit, peer=owner)
                waited = True
        return waited

    def owners_ready(self) -> bool:
        """Whether every owner's version for the current minibatch is known to be published,
        without waiting (one flag read per owner not seen yet)."""
        version = self.gathered_version
        for owner in self.peers:
            if self._ready[owner] < version + 1:
                if self.heap.load(FLAGS, owner, VERSION) < version + 1:
                    return False
                # Acquire (returns at once): the owner's shard is visible from here on.
                self.heap.wait_until(FLAGS, owner, VERSION, version + 1, self.timeout_s)
                self._ready[owner] = version + 1
        return True

    # ---- the owner's steps ---------------------------------------------------------------
    def due(self) -> bool:
        return bool(self._unstepped)

    def serve(self) -> None:
        """Apply, oldest first, each step of this owner whose pushes have all landed (s >= 1).

        Called by the worker only (at unit boundaries and inside its waits), never by a
        prefetch: steps are applied one at a time, in order, by one thread."""
        while self._unstepped and self._landed(self._unstepped[0]):
            k = self._unstepped.popleft()
            for peer in self.peers:  # acquire: each rank's pushes before its DONE are visible here
                self.heap.wait_until(FLAGS, peer, DONE, k + 1, self.timeout_s)
            self._step(k)

    def _landed(self, k: int) -> bool:
        """Whether every rank has pushed its gradients of minibatch k. Reads a flag only until
        the first rank that has not (usually one read: the flags only grow)."""
        for peer in self.peers:
            if self._done_seen[peer] < k + 1:
                self._done_seen[peer] = self.heap.load(FLAGS, peer, DONE)
                if self._done_seen[peer] < k + 1:
                    return False
        return True

    def _step(self, k: int) -> float | None:
        """Version k + 1 = AdamW(version k, minibatch k's gradients), written into its own slot;
        then minibatch k's accumulator slot is zeroed for minibatch k + s + 1 and the version
        published. The slot version k + 1 takes held version k - s, which only minibatch k read."""
        try:
            return self._apply_step(k)
        except BaseException as e:
            self.failed = self.failed or e
            raise

    def _apply_step(self, k: int) -> float | None:
        step = configured(self.step_rule, "the step")
        t0 = self._now()
        now, new = k % self.slots, (k + 1) % self.slots
        for unit in self.units:
            if new != now:
                unit.master[new].copy_(unit.master[now])
            unit.point(new, now)
        norm = step.apply(self.clip)
        for unit in self.units:
            unit.acc[now].zero_()
            if unit.shadow is not None:
                unit.shadow[new].copy_(unit.master[new])
        self.heap.store(FLAGS, VERSION, k + 2)
        self._emit("optimizer", t0, minibatch=k, microbatch=-1)
        return norm

    def clip(self, max_norm: float) -> float:
        """Scale the minibatch's gradients to a global norm of at most max_norm. Each owner holds
        the full sum of its shards' gradients, so the squared norm is the sum of the owners'
        parts: one all-reduce of a scalar (every rank steps at the same barrier when s = 0).
        With hybrid sharding every node holds the whole gradient once, so the sum counts it once
        per node. Returns the norm before clipping."""
        shards = [piece.param for u in self.units for piece in u.pieces if not piece.frozen]
        parts = [g.grad.double().square().sum() for g in shards]  # type: ignore[union-attr]
        # A rank whose shards hold frozen parameters only adds nothing.
        on = self.units[0].acc[0].device
        square = (torch.stack(parts).sum() if parts else torch.zeros((), dtype=torch.float64, device=on)).reshape(1)
        square = square.to(reduction_device(square.device))
        dist.all_reduce(square)
        total = (square[0] / self.replica_count).sqrt().float()
        torch.nn.utils.clip_grads_with_norm_(shards, max_norm, total)
        return float(total)

    def _reduce_replicas(self, k: int) -> None:
        """Sum this owner's accumulated shards with its replicas' (hybrid sharding), in place.

        A collective, not one-sided pushes: here, once per minibatch, every replica needs the
        same sum at the same point, which is what an all-reduce is built for (bandwidth-optimal
        across the slow links between nodes, and one result on every replica, so their AdamW
        steps stay equal bit for bit), while pushes would need a second accumulator per shard
        and a second round of flags. One call per unit, straight on the heap's accumulator: no
        copy of the owned shards (models/memory.py counts none), and the calls come once per
        minibatch, not per microbatch."""
        for unit in self.units:
            dist.all_reduce(unit.acc[k % self.slots], group=self.replicas)

    # ---- waiting -------------------------------------------------------------------------
    def wait(self, peer: int, index: int, at_least: int, what: str, serve: bool = False) -> None:
        """Until peer's flag reaches `at_least`. PeerTimeout names the peer when its flag has
        not moved for timeout_s (with staleness a peer may be up to s + 1 minibatches behind,
        so progress, not the whole wait, is what is timed); the engine closing ends the wait at
        once. With `serve` (the worker's waits) this rank's due steps are applied meanwhile: a
        peer may be waiting for one of them while this rank waits for it. A peer that closed its
        engine (its loop ran fewer minibatches, or failed) ends the wait within a second, saying
        when and why (`closed`), where it ran out the whole timeout."""
        seen, deadline, delay = -1, 0.0, POLL_FIRST_S
        looked = time.monotonic()
        while (value := self.heap.load(FLAGS, peer, index)) < at_least:
            if value != seen:
                seen, deadline = value, time.monotonic() + self.timeout_s
            if self.closing.is_set():
                raise RuntimeError(f"the engine closed while waiting for rank {peer}: {what}")
            if time.monotonic() - looked >= _CLOSED_CHECK_S:
                looked = time.monotonic()
                # The flag again: a peer publishes before it closes, and may have done both since.
                if (error := self._closed(peer, what)) is not None and self.heap.load(FLAGS, peer, index) < at_least:
                    raise RuntimeError(error)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise PeerTimeout(peer, what, self.timeout_s)
            if serve and self._unstepped:
                self.serve()
                time.sleep(delay)
                delay = min(delay * 2, POLL_LAST_S)
                continue
            # A slice, not the timeout: then look at the engine and the deadline again.
            with contextlib.suppress(PeerTimeout):
                self.heap.wait_until(FLAGS, peer, index, value + 1, min(remaining, _WAIT_SLICE_S))
        # Acquire (returns at once): what the peer wrote before its flag is visible from here on.
        self.heap.wait_until(FLAGS, peer, index, at_least, self.timeout_s)

    def claim(self) -> int:
        """Take the next ticket of the run's shared work counter: one atomic add on rank 0's
        heap, which rank 0 takes no part in."""
        if self.staleness:
            raise RuntimeError("run-time claims need every rank in the same minibatch; staleness > 0 cannot "
                               "promise it (use a static plan)")
        return self.heap.fetch_add(CLAIMS, 0, 0, 1)
