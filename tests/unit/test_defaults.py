"""One source of defaults: every key a config group's YAML states (odc_bench/conf) has the value
of its dataclass's default, and the YAML states every field that has one, so that the YAML (what
a command line composes) and the dataclasses (what the library and the tests build) cannot part."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from odc_bench.balancers.registry import BALANCERS
from odc_bench.config.backend import GpuHardwareConfig, LocalBackendConfig, SimBackendConfig
from odc_bench.config.compose import CONF_DIR
from odc_bench.config.engine import ENGINES as ENGINE_RECORDS
from odc_bench.config.engine import PRESENTATION, engine_records
from odc_bench.config.run import CheckpointConfig, OptimConfig, PrimitivesConfig
from odc_core.engine import registry
from odc_core.engine.registry import ENGINES


def _defaults(cls: type) -> dict:
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def _load(path: str, *keys: str) -> dict:
    values = yaml.safe_load((CONF_DIR / path).read_text()) or {}
    for key in keys:
        values = values.get(key) or {}
    return values


def _sections() -> list[tuple[str, dict, type, set[str]]]:
    """(name, the YAML's values, the dataclass, keys the YAML leaves to other files)."""
    sections = [("config.yaml optim", _load("config.yaml", "optim"), OptimConfig, set()),
                ("config.yaml checkpoint", _load("config.yaml", "checkpoint"), CheckpointConfig, set()),
                ("task/primitives.yaml", _load("task/primitives.yaml", "primitives"), PrimitivesConfig, set()),
                ("backend/sim.yaml", _load("backend/sim.yaml"), SimBackendConfig, {"hardware", "defaults"}),
                ("backend/local.yaml", _load("backend/local.yaml"), LocalBackendConfig, set())]
    sections += [(f"engine/{name}.yaml", _load(f"engine/{name}.yaml"), spec.options, {"name"})
                 for name, spec in ENGINES.items()]
    sections += [(f"balancer/{name}.yaml options", _load(f"balancer/{name}.yaml", "options"), spec.options, set())
                 for name, spec in BALANCERS.items()]
    return sections


@pytest.mark.parametrize(("name", "values", "cls", "elsewhere"), _sections(), ids=lambda v: v if isinstance(v, str)
                         else "")
def test_the_yaml_states_every_default_and_each_is_the_dataclasss(name, values, cls, elsewhere):
    defaults = _defaults(cls)
    stated = {k: v for k, v in values.items() if k not in elsewhere}
    assert set(stated) == set(defaults) - elsewhere, f"{name}: keys differ from {cls.__name__}'s defaults"
    for key, value in stated.items():
        default = list(defaults[key]) if isinstance(defaults[key], tuple) else defaults[key]
        assert value == default, f"{name}: {key} is {value!r} there and {default!r} in {cls.__name__}"


def test_the_harness_keys_its_engine_records_by_odc_cores_registry():
    """An engine added to odc_core runs in the harness without a record of its own (shown by its
    name, not simulated): one list of engines, odc_core's."""
    runtime = {**registry.ENGINES, "mine": registry.EngineSpec("mine", "my.module", registry.OdcOptions, False)}
    records = engine_records(runtime)
    assert list(records) == list(runtime)
    assert records["mine"].label == "mine" and records["mine"].simulated_as is None
    assert records["odc"] is PRESENTATION["odc"] and list(ENGINE_RECORDS) == list(registry.ENGINES)


@pytest.mark.parametrize("path", sorted(p.name for p in (CONF_DIR / "backend" / "hardware").glob("*.yaml")
                                        if _load(f"backend/hardware/{p.name}").get("kind") == "gpu"))
def test_every_gpu_profile_states_every_setting_so_each_can_be_set(path):
    """A key a profile's file leaves out cannot be set on the command line for that profile
    (`backend.hardware.compute_calibration=PATH` was an unknown key on a100, h100 and h200)."""
    stated = set(_load(f"backend/hardware/{path}"))
    assert stated == {f.name for f in dataclasses.fields(GpuHardwareConfig)}, path
