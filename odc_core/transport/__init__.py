"""Symmetric-heap transports: one protocol (base.py), one implementation per kind of memory."""

from __future__ import annotations

import torch
import torch.distributed as dist

from odc_core.transport.base import PeerTimeout, SymmetricHeap


def make_heap(device: torch.device, rank: int, world_size: int, job_id: str, store: dist.Store,
              timeout_s: float) -> SymmetricHeap:
    """The transport for `device`: POSIX shared memory for CPU ranks of one host."""
    if device.type == "cpu":
        from odc_core.transport.shm import ShmHeap

        return ShmHeap(rank, world_size, job_id, store, timeout_s=timeout_s)
    raise NotImplementedError(f"no symmetric-heap transport for {device.type} devices yet")


__all__ = ["PeerTimeout", "SymmetricHeap", "make_heap"]
