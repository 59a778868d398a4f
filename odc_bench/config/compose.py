"""The command line's config, composed by Hydra: the group files (odc_bench/conf) and the
sweep files (sweeps/NAME.yaml, offered as `sweep=NAME`)."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Sequence
from pathlib import Path

from hydra import compose, initialize_config_module
from hydra.core.config_store import ConfigStore
from hydra.errors import MissingConfigException
from omegaconf import DictConfig, ListConfig, OmegaConf

from odc_bench.config.run import RunConfig, load
from odc_bench.provenance import REPO_ROOT

SWEEPS_DIR = Path(os.environ.get("ODC_SWEEPS_DIR", REPO_ROOT / "sweeps"))
CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
_ABSENT = object()


def register_sweeps(directory: Path = SWEEPS_DIR) -> None:
    """Expose each sweeps/NAME.yaml as the config option `sweep=NAME` (package _global_)."""
    store = ConfigStore.instance()
    for path in sorted(directory.glob("*.yaml")):
        stat = path.stat()
        store.store(group="sweep", name=path.stem, node=_sweep_file(path, stat.st_mtime_ns, stat.st_size),
                    package="_global_")


@functools.lru_cache(maxsize=256)
def _sweep_file(path: Path, mtime_ns: int, size: int) -> DictConfig | ListConfig:
    """A sweep file's config, parsed once per version of the file: every composition registers
    the sweeps again, and parsing the YAML is what that costs. The store keeps a copy of its own."""
    return OmegaConf.load(path)


def compose_config(overrides: Sequence[str] = (), hydra: bool = False) -> DictConfig:
    """The config `python -m odc_bench OVERRIDES` runs (one run: sweeps are not expanded);
    with `hydra`, Hydra's own section too."""
    register_sweeps()
    with initialize_config_module("odc_bench.conf", version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra)


def compose_run(overrides: Sequence[str] = ()) -> RunConfig:
    """The typed config of the run `python -m odc_bench OVERRIDES` asks for."""
    return load(compose_config(overrides))


def hydra_error_line(error: Exception) -> str:
    """Hydra's or OmegaConf's error about a command line, in one line saying what to do."""
    unknown_key = re.match(r"Could not override '([^']+)'", str(error))
    if unknown_key:
        key = unknown_key.group(1)
        group, owners = options_with_key(key)
        if owners:
            return (f"config key {key!r} belongs to {', '.join(f'{group}={o}' for o in owners)}, not to the "
                    f"{group} chosen; choose {'one of those' if len(owners) > 1 else f'{group}={owners[0]}'} "
                    f"or leave {key} out")
        return (f"unknown config key {key!r}; check its spelling "
                f"(`python -m odc_bench --cfg job` prints every key)")
    if isinstance(error, MissingConfigException) and error.options:
        missing = (error.missing_cfg_file or "").rsplit("/", 1)
        if len(missing) == 2:
            return (f"unknown {missing[0]} option {missing[1]!r}; choose one of {', '.join(sorted(error.options))}")
    first = str(error).strip().splitlines()
    text = " ".join(line.strip() for line in first[:2] if line.strip())
    return text or type(error).__name__


def options_with_key(key: str) -> tuple[str, list[str]]:
    """For a key GROUP.REST (engine.staleness): the group and those of its options
    (odc_bench/conf/GROUP/*.yaml) that have REST, so a key set on the wrong option is named as such."""
    group, _, rest = key.partition(".")
    folder = CONF_DIR / group
    if not rest or not folder.is_dir():
        return group, []
    return group, sorted(path.stem for path in folder.glob("*.yaml")
                         if OmegaConf.select(OmegaConf.load(path), rest, default=_ABSENT) is not _ABSENT)
