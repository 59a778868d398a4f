"""Data-parallel engines: `collective` (FSDP2) and `odc` (on-demand communication), plus
`odc_lockstep`, a diagnostic: ODC with its ranks held in step at every unit, as FSDP2's
collectives hold them, to measure what holding ranks in step costs (docs/odc_engine.md)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from odc_core.engine.base import DataParallelEngine

ENGINES = ("collective", "odc", "odc_lockstep")
# Engines whose ranks meet at every unit, so every rank must run as many microbatches.
LOCKSTEP_ENGINES = ("collective", "odc_lockstep")
# Process groups the collective engine's FSDP2 can run on; `auto` is shm on CPU, nccl on CUDA.
COLLECTIVE_BACKENDS = ("auto", "shm", "gloo", "nccl")


def collective_backend(backend: str, device_type: str) -> str:
    """The process group a collective run uses; ValueError (one line) for one the device cannot use."""
    if backend not in COLLECTIVE_BACKENDS:
        raise ValueError(f"engine.backend must be one of {', '.join(COLLECTIVE_BACKENDS)}, got {backend!r}")
    if backend == "auto":
        return "nccl" if device_type == "cuda" else "shm"
    if (backend == "nccl") != (device_type == "cuda"):
        fit = "nccl" if device_type == "cuda" else "shm or gloo"
        raise ValueError(f"engine.backend={backend} cannot run on {device_type} tensors; use {fit} or auto")
    return backend


def make_engine(name: str, device: torch.device, *, store: dist.Store, job_id: str, timeout_s: float,
                **options: Any) -> DataParallelEngine:
    """Build an engine by name; torch.distributed must already be initialised.

    `store` and `job_id` let the ODC engine set up its symmetric heap (segment names are
    unique per job); the collective engine's shared-memory process group takes the job id
    for its segments and the default group's store.
    """
    if name == "collective":
        from odc_core.engine.fsdp2 import CollectiveEngine

        return CollectiveEngine(device, job_id=job_id, timeout_s=timeout_s, **options)
    if name in ("odc", "odc_lockstep"):
        from odc_core.engine.odc import OdcEngine
        from odc_core.transport import make_heap

        heap = make_heap(device, dist.get_rank(), dist.get_world_size(), job_id, store, timeout_s)
        return OdcEngine(device, heap, timeout_s=timeout_s, lockstep=name == "odc_lockstep", **options)
    raise ValueError(f"unknown engine {name!r}; choose one of {', '.join(ENGINES)}")


__all__ = ["COLLECTIVE_BACKENDS", "DataParallelEngine", "ENGINES", "LOCKSTEP_ENGINES", "collective_backend",
           "make_engine"]
