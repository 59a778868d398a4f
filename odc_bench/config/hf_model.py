"""A user's own model, from its Hugging Face config: the harness settings of its shape.

The what-if (`--model`) and the calibration's runs file (`model`) take a model folder, or its
config.json, beside the harness's model configs: the file most users have of the model they
train. transformers' AutoConfig reads it, so that what the file leaves out takes the defaults the
model itself would get (no key-value heads stated: as many as query heads; the rope base of its
type). The shape then becomes `model.*` overrides of the harness, which the printed commands
carry, so a row can be rerun without the file.

Only what the simulator models passes: the decoder types whose layers are one of the families
of config/model.py (heads of any size: a stated head_dim) with full causal attention. A sliding
window is refused rather than simulated as full attention: for samples longer than the window
the attention cost would be wrong, and the lengths are not known here. Biases a llama-type
config adds (attention_bias, mlp_bias) are left out: a few vectors per layer, which move neither
the FLOPs nor the memory the simulator counts by a measurable amount; so is a rope scaling
(Llama 3.1's), which changes the rotary frequencies and no cost.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from odc_bench.config.fields import require
from odc_bench.config.model import ModelConfig
from odc_bench.errors import ConfigError

# Hugging Face model_type -> the harness's family (config/model.py FAMILIES).
HF_FAMILIES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
CONFIG_FILE = "config.json"


def is_hf_model(value: str) -> bool:
    """Whether `value` names a model folder holding a config.json, or a .json file."""
    path = Path(value).expanduser()
    return (path.is_dir() and (path / CONFIG_FILE).is_file()) or (path.is_file() and path.suffix == ".json")


def config_file(value: str) -> Path:
    path = Path(value).expanduser()
    return path / CONFIG_FILE if path.is_dir() else path


def hf_model_name(value: str) -> str:
    """The model's name in rows and titles: its folder's (or a file not named config.json: the
    file's), in characters a file name and a command line take as they are."""
    file = config_file(value).resolve()
    name = file.parent.name if file.name == CONFIG_FILE else file.stem
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "model"


def _read(file: Path) -> dict:
    try:
        data = json.loads(file.read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"cannot read {file} as a Hugging Face config ({str(e).splitlines()[0]}); give the "
                          f"model's folder or its config.json") from None
    require(isinstance(data, dict) and isinstance(data.get("model_type"), str),
            f"{file} has no model_type: it is not a Hugging Face model config; give the model's folder or its "
            f"config.json")
    return data


def hf_model_shape(value: str) -> dict[str, object]:
    """Every field of the model section (config/model.py) that `value`'s config describes;
    ConfigError, one line, for a file it cannot read or a model it does not simulate."""
    file = config_file(value)
    data = _read(file)
    model_type = data.pop("model_type")
    require(model_type in HF_FAMILIES,
            f"{file}: model_type {model_type!r} is not one the harness simulates ({', '.join(HF_FAMILIES)}); "
            f"for another dense decoder give the nearest model config and its shape as model.KEY=VALUE settings "
            f"(docs/whatif.md)")
    try:
        from transformers import AutoConfig
    except ImportError:
        raise ConfigError("reading a Hugging Face config needs transformers: pip install 'odc-bench[hf]'") from None
    try:
        hf = AutoConfig.for_model(model_type, **data)
    except Exception as e:  # transformers validates with error types of its own, and of huggingface_hub
        why = " ".join(line.strip() for line in str(e).splitlines()) or type(e).__name__
        raise ConfigError(f"{file}: transformers cannot build a {model_type} config from it ({why})") from None
    hidden, heads = int(hf.hidden_size), int(hf.num_attention_heads)
    kv_heads = int(getattr(hf, "num_key_value_heads", None) or heads)
    head_dim = getattr(hf, "head_dim", None)
    window = getattr(hf, "sliding_window", None)
    if model_type in ("qwen2", "qwen3") and not getattr(hf, "use_sliding_window", False):
        window = None  # Qwen2 and Qwen3 state a window that only use_sliding_window turns on
    require(window is None,
            f"{file}: sliding-window attention ({window} tokens) is not simulated (the simulator's attention is full "
            f"causal); for samples of at most {window} tokens the two are one: set sliding_window to null in a copy")
    rope = getattr(hf, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(hf, "rope_theta", None))
    shape = {"name": hf_model_name(value), "family": HF_FAMILIES[model_type], "vocab_size": int(hf.vocab_size),
             "hidden_size": hidden, "intermediate_size": int(hf.intermediate_size),
             "num_layers": int(hf.num_hidden_layers), "num_heads": heads, "num_kv_heads": kv_heads,
             "rms_eps": float(hf.rms_norm_eps), "tie_embeddings": bool(hf.tie_word_embeddings)}
    if head_dim is not None:
        shape["head_dim"] = int(head_dim)
    if theta is not None:
        shape["rope_theta"] = float(theta)
    try:
        model = ModelConfig(**shape)  # type: ignore[arg-type]
    except ConfigError as e:  # a shape the harness's model cannot take: say which file gave it
        raise ConfigError(f"{file}: {e}") from None
    if model.head_dim is None:  # the width's share stated (Llama 3's 128 of 4096 / 32): no setting to print
        shape.pop("head_dim", None)
    return shape
