"""Heartbeats through the run's store, so that a failing rank can name the peer that died.

A collective that loses a peer fails in the transport's words ("Read error [127.0.0.1]:41013:
Connection reset by peer"), and a one-sided wait knows which peer it waited for but not
whether that peer died or is itself waiting on one that did. So every rank bumps a counter
in the store a few times per timeout, from a thread of its own that only needs the GIL for
a moment. A rank that fails records why; before it gives up it watches its peers' counters
for a few beats, and a peer whose counter stands still without a recorded failure or a
clean finish died (SIGKILL, out of memory, a lost node): the error names it.

No launcher is needed for any of this, so ranks started by SLURM, with nobody watching
them, still fail with the dead rank's number within their timeout.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import torch.distributed as dist

from odc_core.transport.base import PeerTimeout

PREFIX = "liveness"


def rank_processes(store: dist.Store, world_size: int) -> list[tuple[str, int]]:
    """(host, pid) of every rank that reached `store` (Liveness.rendezvous), by rank; ranks that
    never did are left out."""
    keys = [f"{PREFIX}/up/{rank}" for rank in range(world_size)]
    host_pids = (store.get(key).decode().split() for key in keys if store.check([key]))
    return [(host, int(pid)) for host, pid in host_pids]


class PeerLost(RuntimeError):
    """A peer stopped beating without saying why: the message names it and the error it caused here."""

    def __init__(self, peers: list[int], message: str) -> None:
        super().__init__(message)
        self.peers = peers


def one_line(error: BaseException) -> str:
    """The first line of an error, without gloo's source location and boilerplate advice."""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    text = re.sub(r"^\[[^\]]+\.(?:cc|cpp|h|hpp):\d+\]\s*", "", lines[0] if lines else "")
    text = text.split(". This is typically caused by", 1)[0]
    return f"{type(error).__name__}: {text}" if not isinstance(error, PeerTimeout | PeerLost) else text


class Liveness:
    """This rank's heartbeat and its judgement of its peers'.

    `store` is used from the calling thread only, `beat_store` (a second connection to the
    same store) by the heartbeat thread: a store client serialises its requests, so a long
    wait on one must not hold up the beats. `store_rank` is the rank whose process hosts
    the store (None: a launcher outside the ranks); when the store stops answering, it is
    the one that is gone. `on_store_lost` is called, from the heartbeat thread, the moment a
    beat finds the store gone: a rank busy waiting on a flag in shared memory would otherwise
    learn it only at its timeout.
    """

    def __init__(self, store: dist.Store, beat_store: dist.Store, rank: int, world_size: int, timeout_s: float,
                 store_rank: int | None = None, on_store_lost: Callable[[], None] | None = None) -> None:
        self.store, self.rank, self.world_size, self.store_rank = store, rank, world_size, store_rank
        self._on_store_lost = on_store_lost
        self.timeout_s = float(timeout_s)
        # A few beats per timeout; judging a peer takes three beats, so it adds little to a timeout.
        self.period = min(1.0, max(0.05, self.timeout_s / 10))
        self.window = 3 * self.period
        self._beat_store = beat_store
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="odc-heartbeat", daemon=True)
        self._thread.start()

    def _key(self, kind: str, rank: int) -> str:
        return f"{PREFIX}/{kind}/{rank}"

    def _beat(self) -> None:
        key = self._key("beat", self.rank)
        while True:
            try:
                self._beat_store.add(key, 1)
            except RuntimeError:  # the store is gone: the main thread finds out on its next request
                if self._on_store_lost is not None and not self._stop.is_set():
                    self._on_store_lost()
                return
            if self._stop.wait(self.period):
                return

    def rendezvous(self) -> None:
        """Wait for every peer to reach the store; PeerTimeout names the first that does not."""
        # Which process this rank is, for a launcher that sweeps after it (rank_processes).
        self.store.set(self._key("up", self.rank), f"{socket.gethostname()} {os.getpid()}")
        deadline = time.monotonic() + self.timeout_s
        for peer in range(self.world_size):
            remaining = max(deadline - time.monotonic(), 1e-3)
            try:
                self.store.wait([self._key("up", peer)], timedelta(seconds=remaining))
            except RuntimeError:
                raise PeerTimeout(peer, "rendezvous (the rank never reached the run's store)", self.timeout_s) from None

    def stop(self, finished: bool) -> None:
        """Stop beating; a rank that `finished` says so, and peers judging it later do not blame it."""
        self._stop.set()
        self._thread.join()
        if finished:
            with contextlib.suppress(RuntimeError):  # the store went first: nobody is left to judge this rank
                self.store.set(self._key("done", self.rank), "1")

    def explain(self, error: BaseException) -> BaseException:
        """The error to raise for `error`: a PeerLost naming the dead peers, when some are.

        Records this rank's failure first, so that peers judging it do not blame it; then
        watches the peers' beats for up to `window` seconds (less when every peer is seen
        alive or accounted for sooner). Returns `error` itself when nobody is missing.
        """
        cause = one_line(error)
        try:
            self.store.set(self._key("failed", self.rank), cause)
            lost = self._silent_peers()
        except RuntimeError:
            owner = "the launcher" if self.store_rank is None else f"rank {self.store_rank}"
            peers = [] if self.store_rank is None else [self.store_rank]
            return PeerLost(peers, f"{owner} is gone (it hosts the run's store, which stopped answering): {cause}")
        if not lost:
            return error
        who = f"rank {lost[0]} is" if len(lost) == 1 else f"ranks {', '.join(map(str, lost))} are"
        return PeerLost(lost, f"{who} gone (no heartbeat for {self.window:.1f}s): {cause}")

    def _silent_peers(self) -> list[int]:
        peers = [p for p in range(self.world_size) if p != self.rank]
        first = {p: self.store.add(self._key("beat", p), 0) for p in peers}
        deadline = time.monotonic() + self.window
        while True:
            pending = [p for p in peers if self.store.add(self._key("beat", p), 0) == first[p]
                       and not self.store.check([self._key("failed", p)])
                       and not self.store.check([self._key("done", p)])]
            if not pending or time.monotonic() >= deadline:
                return pending
            time.sleep(self.period / 4)
