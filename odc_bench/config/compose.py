"""The command line's config, composed by Hydra: the group files (odc_bench/conf) and the
sweep files (sweeps/NAME.yaml, offered as `sweep=NAME`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from hydra import compose, initialize_config_module
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from odc_bench.config.run import RunConfig, load
from odc_bench.provenance import REPO_ROOT

SWEEPS_DIR = Path(os.environ.get("ODC_SWEEPS_DIR", REPO_ROOT / "sweeps"))


def register_sweeps(directory: Path = SWEEPS_DIR) -> None:
    """Expose each sweeps/NAME.yaml as the config option `sweep=NAME` (package _global_)."""
    store = ConfigStore.instance()
    for path in sorted(directory.glob("*.yaml")):
        store.store(group="sweep", name=path.stem, node=OmegaConf.load(path), package="_global_")


def compose_config(overrides: Sequence[str] = (), hydra: bool = False) -> DictConfig:
    """The config `python -m odc_bench OVERRIDES` runs (one run: sweeps are not expanded);
    with `hydra`, Hydra's own section too."""
    register_sweeps()
    with initialize_config_module("odc_bench.conf", version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra)


def compose_run(overrides: Sequence[str] = ()) -> RunConfig:
    """The typed config of the run `python -m odc_bench OVERRIDES` asks for."""
    return load(compose_config(overrides))
