"""Which data-parallel engine runs and its options (conf/engine/*.yaml), and what the harness
shows and simulates of each engine: a presentation record per engine of odc_core's registry,
the one list of engines."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from odc_bench.config.fields import as_dict, build, section
from odc_bench.errors import ConfigError
from odc_core.engine import registry as runtime
from odc_core.engine.registry import EngineOptions, OdcOptions


@dataclass(frozen=True)
class EngineRecord:
    """An engine as figures, tables and the simulator see it; `runtime` is how it is built and run."""

    name: str
    label: str  # how figures and tables name it
    # The simulator's timeline for it ("collective": a barrier per position; "odc": ranks run
    # alone between minibatch barriers), or None when the simulator does not model it.
    simulated_as: str | None
    # The paper's baseline: comparisons and figures report speedups against it.
    baseline: bool = False
    # An option whose value tells two series of this engine apart (FSDP2 on shared memory and
    # on gloo are different baselines; ODC at different staleness), and its values in the order
    # a comparison prefers one to stand for the engine (the fairest first; the last is what rows
    # written before the option existed ran with).
    series_option: str | None = None
    series_preference: tuple[str, ...] = ()
    # Whether simulated rows differ by it too (not where it picks a transport, which the
    # simulator's hardware profile stands for).
    series_option_simulated: bool = False
    # How a figure's legend writes a value of it ("{}" for a name such as shm; "s={}" says what
    # a bare number means).
    series_pretty: str = "{}"
    # Options of real runs the simulator's timeline does not model: with backend=sim a value
    # other than the default is refused, where it was simulated as the default. (A transport or
    # process group is the hardware profile's to stand for, as a real run's resolved config,
    # simulated again by the studies, names one.)
    unsimulated: tuple[str, ...] = ()

    @property
    def runtime(self) -> runtime.EngineSpec:
        return runtime.ENGINES[self.name]

    @property
    def options(self) -> type[EngineOptions]:
        return self.runtime.options

    @property
    def equal_microbatch_counts(self) -> bool:
        return self.runtime.equal_microbatch_counts


# How the harness shows the engines it knows; an engine odc_core runs without a record here is
# shown by its name and not simulated.
PRESENTATION: dict[str, EngineRecord] = {
    "collective": EngineRecord("collective", "Collective", simulated_as="collective", baseline=True,
                               series_option="backend", series_preference=("shm", "nccl", "gloo"),
                               unsimulated=("reshard_after_forward",)),
    "odc": EngineRecord("odc", "ODC", simulated_as="odc", series_option="staleness", series_preference=("0",),
                        series_option_simulated=True, series_pretty="s={}",
                        unsimulated=("prefetch",)),
}


def engine_records(engines: Mapping[str, runtime.EngineSpec]) -> dict[str, EngineRecord]:
    """A record for every engine odc_core runs: its presentation, or its name, not simulated."""
    return {name: PRESENTATION.get(name) or EngineRecord(name, name, simulated_as=None) for name in engines}


# One registry, odc_core's: the harness's records are keyed by the engines it runs.
ENGINES = engine_records(runtime.ENGINES)


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineConfig:
    name: str
    options: EngineOptions  # the engine's own options class (EngineSpec.options)

    @property
    def spec(self) -> EngineRecord:
        return ENGINES[self.name]

    @property
    def staleness(self) -> int:
        """How many minibatches ranks may run apart (stale-synchronous ODC); 0 for every other engine."""
        return self.options.staleness if isinstance(self.options, OdcOptions) else 0

    def for_device(self, device_type: str) -> EngineConfig:
        """The options as they run on the device; ConfigError when it cannot run them."""
        try:
            return EngineConfig(name=self.name, options=self.options.for_device(device_type))
        except ValueError as e:
            raise ConfigError(str(e)) from None

    def to_dict(self) -> dict[str, Any]:
        """As in the YAML: the name beside the options. ranks_per_node is left out while unset, so
        that runs recorded before the key existed keep their run keys."""
        options = {k: v for k, v in as_dict(self.options).items() if not (k == "ranks_per_node" and v is None)}
        return {"name": self.name, **options}


def engine_config(values: Mapping[str, Any]) -> EngineConfig:
    """engine.* as composed: `name` picks the engine, every other key is one of its options."""
    name = section(values, "engine").get("name")
    if not isinstance(name, str) or name not in ENGINES:
        raise ConfigError(f"unknown engine {name!r}; choose one of {', '.join(ENGINES)}")
    options = build(ENGINES[name].options, {k: v for k, v in values.items() if k != "name"}, "engine.")
    return EngineConfig(name=name, options=options)
