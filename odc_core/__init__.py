"""The runtime the paper proposes: symmetric-heap transports, ODC primitives, and two
data-parallel engines (on-demand and collective) behind one interface. No Hydra, no pandas.

The public API is what __all__ lists (docs/use_odc.md shows it in a training loop). Names load
on first use, so that importing odc_core.engine.registry, as config checks do, loads no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from odc_core.engine.agreement import RanksDifferWarning
    from odc_core.engine.base import (
        DataParallelEngine,
        EngineContext,
        MixedPrecision,
        OptimizerFactory,
        ParamGroups,
        SchedulerFactory,
    )
    from odc_core.engine.build import engine_context, make_engine
    from odc_core.engine.odc.engine import NoBackwardWarning
    from odc_core.engine.registry import CollectiveOptions, EngineOptions, OdcOptions
    from odc_core.state import get_state_dict, set_state_dict
    from odc_core.transport.base import PeerTimeout

_WHERE = {
    "make_engine": "odc_core.engine.build",
    "OdcOptions": "odc_core.engine.registry",
    "CollectiveOptions": "odc_core.engine.registry",
    "EngineOptions": "odc_core.engine.registry",
    "engine_context": "odc_core.engine.build",
    "EngineContext": "odc_core.engine.base",
    "DataParallelEngine": "odc_core.engine.base",
    "MixedPrecision": "odc_core.engine.base",
    "OptimizerFactory": "odc_core.engine.base",
    "ParamGroups": "odc_core.engine.base",
    "SchedulerFactory": "odc_core.engine.base",
    "PeerTimeout": "odc_core.transport.base",
    "RanksDifferWarning": "odc_core.engine.agreement",
    "NoBackwardWarning": "odc_core.engine.odc.engine",
    "get_state_dict": "odc_core.state",
    "set_state_dict": "odc_core.state",
}
__all__ = ["CollectiveOptions", "DataParallelEngine", "EngineContext", "EngineOptions", "MixedPrecision",
           "NoBackwardWarning", "OdcOptions", "OptimizerFactory", "ParamGroups", "PeerTimeout", "RanksDifferWarning",
           "SchedulerFactory", "engine_context", "get_state_dict", "make_engine", "set_state_dict"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'odc_core' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
