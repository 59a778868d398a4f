"""The engines, one record each: what the harness needs to know about an engine lives here.

Config checks, the simulator, comparisons and figures all read these records, so adding an
engine is its module (with a `build(ctx, options)` function), its options class
(options.py), one entry below and one config file (odc_bench/conf/engine/NAME.yaml). A record
names its module rather than importing it: reading a results table or drawing a figure then
never imports torch.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from odc_core.engine.options import CollectiveOptions, EngineOptions, OdcOptions

if TYPE_CHECKING:
    from odc_core.engine.base import DataParallelEngine, EngineContext


@dataclass(frozen=True)
class EngineSpec:
    name: str
    label: str  # how figures and tables name it
    module: str  # the engine's module: build(ctx, options) -> DataParallelEngine
    # The engine's options with their defaults: the fields are its config keys.
    options: type[EngineOptions]
    # Every rank must run the same number of microbatches: the engine synchronises per unit.
    equal_microbatch_counts: bool
    # The simulator's timeline for it ("collective": a barrier per position; "odc": ranks run
    # alone between minibatch barriers), or None when the simulator does not model it.
    simulated_as: str | None
    # The paper's baseline: comparisons and figures report speedups against it.
    baseline: bool = False
    # An option whose value tells two series of this engine apart (FSDP2 on shared memory and
    # on gloo are different baselines), and its values in the order a comparison prefers one to
    # stand for the engine (the fairest first).
    series_option: str | None = None
    series_preference: tuple[str, ...] = ()


ENGINES: dict[str, EngineSpec] = {
    "collective": EngineSpec("collective", "Collective", "odc_core.engine.fsdp2", CollectiveOptions,
                             equal_microbatch_counts=True, simulated_as="collective", baseline=True,
                             series_option="backend", series_preference=("shm", "nccl", "gloo")),
    "odc": EngineSpec("odc", "ODC", "odc_core.engine.odc", OdcOptions, equal_microbatch_counts=False,
                      simulated_as="odc"),
}


def engine_spec(name: str) -> EngineSpec:
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; choose one of {', '.join(ENGINES)}")
    return ENGINES[name]


def make_engine(name: str, ctx: EngineContext, options: EngineOptions) -> DataParallelEngine:
    """Build an engine; torch.distributed must already be initialised."""
    engine: DataParallelEngine = importlib.import_module(engine_spec(name).module).build(ctx, options)
    return engine
