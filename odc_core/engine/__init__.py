"""Data-parallel engines: `collective` (FSDP2) and `odc` (on-demand communication)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from odc_core.engine.base import DataParallelEngine

ENGINES = ("collective", "odc")


def make_engine(name: str, device: torch.device, *, store: dist.Store, job_id: str, timeout_s: float,
                **options: Any) -> DataParallelEngine:
    """Build an engine by name; torch.distributed must already be initialised.

    `store` and `job_id` let the ODC engine set up its symmetric heap (segment names are
    unique per job); the collective engine needs neither.
    """
    if name == "collective":
        from odc_core.engine.fsdp2 import CollectiveEngine

        return CollectiveEngine(device, **options)
    if name == "odc":
        from odc_core.engine.odc import OdcEngine
        from odc_core.transport import make_heap

        heap = make_heap(device, dist.get_rank(), dist.get_world_size(), job_id, store, timeout_s)
        return OdcEngine(device, heap, timeout_s=timeout_s, **options)
    raise ValueError(f"unknown engine {name!r}; choose one of {', '.join(ENGINES)}")


__all__ = ["DataParallelEngine", "ENGINES", "make_engine"]
