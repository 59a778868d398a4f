"""Which data-parallel engine runs and its options (conf/engine/*.yaml; odc_core's engine registry)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from odc_bench.config.fields import as_dict, build
from odc_bench.errors import ConfigError
from odc_core.engine.registry import ENGINES, EngineOptions, EngineSpec, OdcOptions


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineConfig:
    name: str
    options: EngineOptions  # the engine's own options class (EngineSpec.options)

    @property
    def spec(self) -> EngineSpec:
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
    name = values.get("name")
    if not isinstance(name, str) or name not in ENGINES:
        raise ConfigError(f"unknown engine {name!r}; choose one of {', '.join(ENGINES)}")
    options = build(ENGINES[name].options, {k: v for k, v in values.items() if k != "name"}, "engine.")
    return EngineConfig(name=name, options=options)
