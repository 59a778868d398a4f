"""`model=PATH`: a model's own file (model_file.py: a Hugging Face model folder or config.json, or
a model section of this harness written as a YAML file) as an option of Hydra's model group.

Hydra looks an option up as `model/<value>` in each config source of its search path; these
sources answer for a value that names such a file or folder with the model section
model_file.model_file_shape reads from it (the what-if's reader: one reader for both). Two of
them, as a value can be a path or a bare name:
- a value only a path can be (`./qwen2_7b`, `~/m`, `/abs/m`, `x.json`, `x.yaml`), or a relative path
  with a `/` that names a model's folder, is answered first, before any config option is looked
  up: Hydra's package source would otherwise find the stock option in some
  (`model/./qwen2_7b.yaml` is the stock qwen2_7b.yaml, so `model=./qwen2_7b` ran the stock 7B
  model, not the folder); a value only a path can be that holds no model config is one line;
- a bare name (a folder in the working directory) is answered last: a config option of the
  same name wins (`model=qwen2_7b` is the stock one; `model=./qwen2_7b` the folder).
Being Hydra plugins (hydra_plugins/odc_bench_plugins), they are found wherever Hydra composes:
a single run, every job of a sweep, a SLURM node composing its job.
"""

from __future__ import annotations

from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.object_type import ObjectType
from hydra.plugins.config_source import ConfigResult, ConfigSource
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import OmegaConf

from odc_bench.config.compose import no_model_line
from odc_bench.config.model_file import is_model_file, model_file_shape
from odc_bench.errors import ConfigError

SCHEME, PATH_SCHEME = "hfmodel", "hfpath"
GROUP = "model/"


def _model_path(config_path: str) -> str | None:
    """The path a `model/<value>` lookup names, or None for another group."""
    return config_path[len(GROUP):] if config_path.startswith(GROUP) else None


def only_a_path(value: str) -> bool:
    """Whether a model= value can only be a path, never the name of a config option (which may
    hold a /: model=llama/7b is DIR/model/llama/7b.yaml of a user's config folder)."""
    return value.startswith((".", "~", "/")) or value.endswith((".json", ".yaml", ".yml"))


class HfModelSource(ConfigSource):
    """The model group's options that are bare names of Hugging Face model folders (module docstring)."""

    @staticmethod
    def scheme() -> str:
        return SCHEME

    def load_config(self, config_path: str) -> ConfigResult:
        path = _model_path(config_path)
        assert path is not None
        return ConfigResult(config=OmegaConf.create(model_file_shape(path)), path=f"{SCHEME}://",
                            provider=self.provider, header={"package": "model"})

    def is_group(self, config_path: str) -> bool:
        return False

    def is_config(self, config_path: str) -> bool:
        path = _model_path(config_path)
        return path is not None and path != "" and is_model_file(path)

    def available(self) -> bool:
        return True

    def list(self, config_path: str, results_filter: ObjectType | None) -> list[str]:
        return []  # any folder can be one: Hydra's lists of options name the stock ones


class HfPathSource(HfModelSource):
    """The model group's options that can only be paths (module docstring)."""

    @staticmethod
    def scheme() -> str:
        return PATH_SCHEME

    def load_config(self, config_path: str) -> ConfigResult:
        path = _model_path(config_path)
        assert path is not None
        if not is_model_file(path):
            raise ConfigError(no_model_line(path))
        return super().load_config(config_path)

    def is_config(self, config_path: str) -> bool:
        path = _model_path(config_path)
        return path is not None and (only_a_path(path) or ("/" in path and is_model_file(path)))


class HfModelSearchPath(SearchPathPlugin):
    """Puts HfPathSource first on Hydra's search path and HfModelSource after the package's configs."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        search_path.prepend(provider="odc_bench-hf-path", path=f"{PATH_SCHEME}://")
        search_path.append(provider="odc_bench-hf-model", path=f"{SCHEME}://")
