"""A model given by its own file: `model=PATH`, the what-if's `--model` and the calibration's runs
file take a Hugging Face model folder or config.json (hf_model.py), or a model section of this
harness written as a file (a copy of a conf/model/*.yaml, edited): a user's own shape without a
config folder of their own (`--config-dir`, which reads such a file as `model=NAME`).

Either becomes the model section's fields, which the printed commands carry as `model.*`
settings, so a row can be rerun without the file.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from odc_bench.config.fields import build, require
from odc_bench.config.hf_model import hf_model_name, hf_model_shape, is_hf_model
from odc_bench.config.model import ModelConfig
from odc_bench.errors import ConfigError
from odc_bench.files import text_encoding

YAML_SUFFIXES = (".yaml", ".yml")


def is_yaml_model(value: str) -> bool:
    """Whether `value` names a YAML file: a model section of this harness's, if it reads as one."""
    path = Path(value).expanduser()
    return path.suffix in YAML_SUFFIXES and path.is_file()


def is_model_file(value: str) -> bool:
    """Whether `value` names a model's own file (module docstring)."""
    return is_yaml_model(value) or is_hf_model(value)


def _yaml_shape(value: str) -> dict[str, object]:
    path = Path(value).expanduser()
    try:
        data = yaml.safe_load(path.read_text(encoding=text_encoding(path)))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"{path} cannot be read as a model config ({str(e).splitlines()[0]}); give a copy of one "
                          f"of odc_bench/conf/model/*.yaml, or a Hugging Face model folder or config.json") from None
    held = "nothing" if data is None else f"a {type(data).__name__}"
    require(isinstance(data, dict), f"{path} holds {held} at its top, "
                                    f"not a model config's settings by name (key: value, as odc_bench/conf/model/"
                                    f"*.yaml); fix the file")
    # A name of its own where the file gives none: a copy that keeps a stock file's name keeps it.
    data = {"name": path.stem, **data}
    try:
        model = build(ModelConfig, data, "model.")
    except ConfigError as e:  # a key or value the model section does not take: say which file gave it
        raise ConfigError(f"{path}: {e}") from None
    return {k: v for k, v in dataclasses.asdict(model).items() if v is not None}


def model_file_shape(value: str) -> dict[str, object]:
    """Every field of the model section that `value`'s file describes; ConfigError, one line, for
    a file that cannot be read as a model or describes one the harness does not take."""
    return _yaml_shape(value) if is_yaml_model(value) else hf_model_shape(value)


def model_file_name(value: str) -> str:
    """The model's name in rows and titles."""
    return str(_yaml_shape(value)["name"]) if is_yaml_model(value) else hf_model_name(value)


def model_file_overrides(value: str) -> list[str]:
    """The `python -m odc_bench` settings of the model `value`'s file describes, which rerun
    without the file (the what-if's printed commands); ConfigError as model_file_shape."""
    # `tiny` is only the base the settings replace, field by field: every field of the shape is set.
    return ["model=tiny", *(f"model.{key}={_setting(v)}" for key, v in model_file_shape(value).items())]


def _setting(value: object) -> str:
    """A value as a command line gives it: floats whole (repr), booleans as YAML writes them."""
    return repr(value) if isinstance(value, float) else str(value).lower() if isinstance(value, bool) else str(value)
