"""Data-parallel engines: `collective` (FSDP2) and `odc` (on-demand communication)."""

from __future__ import annotations

from typing import Any

import torch

from odc_core.engine.base import DataParallelEngine

ENGINES = ("collective",)


def make_engine(name: str, device: torch.device, **options: Any) -> DataParallelEngine:
    """Build an engine by name; torch.distributed must already be initialised."""
    if name == "collective":
        from odc_core.engine.fsdp2 import CollectiveEngine

        return CollectiveEngine(device, **options)
    raise ValueError(f"unknown engine {name!r}; choose one of {', '.join(ENGINES)}")


__all__ = ["DataParallelEngine", "ENGINES", "make_engine"]
