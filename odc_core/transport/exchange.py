"""What every heap does at allocation: publish a value through the run's store and read every
peer's, naming the peer that never published."""

from __future__ import annotations

import time
from datetime import timedelta

import torch.distributed as dist

from odc_core.transport.base import PeerTimeout


def rotated(rank: int, world_size: int) -> list[int]:
    """Every rank in rotated order starting after `rank` (and ending with it), so ranks start on
    different peers instead of all on rank 0."""
    return [(rank + i) % world_size for i in range(1, world_size + 1)]


def exchange(store: dist.Store, key: str, rank: int, world_size: int, value: str, what: str,
             timeout_s: float) -> list[tuple[int, str]]:
    """Publish `value` under key/<rank> and return every other rank's, in rotated order;
    PeerTimeout names the first peer whose value did not come within timeout_s."""
    store.set(f"{key}/{rank}", value)
    deadline = time.monotonic() + timeout_s
    values = []
    for peer in rotated(rank, world_size)[:-1]:
        try:
            store.wait([f"{key}/{peer}"], timedelta(seconds=max(deadline - time.monotonic(), 1e-3)))
        except RuntimeError:  # DistStoreError: the store's own timeout
            raise PeerTimeout(peer, what, timeout_s) from None
        values.append((peer, store.get(f"{key}/{peer}").decode()))
    return values
