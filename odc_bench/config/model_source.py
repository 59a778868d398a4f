"""`model=PATH`: a Hugging Face model folder or config.json as an option of Hydra's model group.

Hydra looks an option up as `model/<value>` in each config source of its search path; this
source answers for a value that names a model folder holding a config.json, or such a file, with
the model section hf_model.hf_model_shape reads from it (the what-if's reader: one reader for
both). A stock option of the same name wins (the package's configs come first in the search
path). Being a Hydra plugin (hydra_plugins/odc_bench_plugins), it is found wherever Hydra
composes: a single run, every job of a sweep, a SLURM node composing its job.
"""

from __future__ import annotations

from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.object_type import ObjectType
from hydra.plugins.config_source import ConfigResult, ConfigSource
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import OmegaConf

from odc_bench.config.hf_model import hf_model_shape, is_hf_model

SCHEME = "hfmodel"
GROUP = "model/"


def _model_path(config_path: str) -> str | None:
    """The path a `model/<value>` lookup names, or None for another group."""
    return config_path[len(GROUP):] if config_path.startswith(GROUP) else None


class HfModelSource(ConfigSource):
    """The model group's options that are paths to Hugging Face model configs."""

    @staticmethod
    def scheme() -> str:
        return SCHEME

    def load_config(self, config_path: str) -> ConfigResult:
        path = _model_path(config_path)
        assert path is not None
        return ConfigResult(config=OmegaConf.create(hf_model_shape(path)), path=f"{SCHEME}://",
                            provider=self.provider, header={"package": "model"})

    def is_group(self, config_path: str) -> bool:
        return False

    def is_config(self, config_path: str) -> bool:
        path = _model_path(config_path)
        return path is not None and path != "" and is_hf_model(path)

    def available(self) -> bool:
        return True

    def list(self, config_path: str, results_filter: ObjectType | None) -> list[str]:
        return []  # any folder can be one: Hydra's lists of options name the stock ones


class HfModelSearchPath(SearchPathPlugin):
    """Puts HfModelSource on Hydra's search path, after the package's configs."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        search_path.append(provider="odc_bench-hf-model", path=f"{SCHEME}://")
