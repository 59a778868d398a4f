"""A user's model from its Hugging Face config.json: the what-if and the calibration read its shape.

The configs here are written in the keys and with the extras a downloaded config.json carries (a
byte-order mark, rope scaling, lists of end tokens, keys the harness ignores), holding the shapes
of the harness's own model configs, so that the model read from the file must be that config's
model under another name.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from odc_bench.calibrate import cluster_profile as cc
from odc_bench.cli.precheck import precheck
from odc_bench.config.compose import compose_run
from odc_bench.config.model_file import model_file_overrides
from odc_bench.errors import ConfigError
from odc_bench.plan.spec import Planner
from odc_bench.results.table import read_table
from odc_bench.whatif.answer import compose_config
from odc_bench.whatif.question import Question, Series
from tests.helpers import REPO, run_cli

pytest.importorskip("transformers", reason="reading a Hugging Face config needs transformers: pip install "
                                           "'odc-bench[hf]'")

EXTRAS = {"architectures": ["LlamaForCausalLM"], "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
          "hidden_act": "silu", "max_position_embeddings": 131072, "torch_dtype": "bfloat16", "use_cache": True,
          "transformers_version": "4.43.0.dev0", "attention_dropout": 0.0, "initializer_range": 0.02}


def _model(overrides: list[str]):
    return compose_config(["backend=sim", *overrides]).model


def hf_config(name: str, model_type: str, **extra) -> dict:
    """The harness model config `name` in a Hugging Face config's keys."""
    m = _model([f"model={name}"])
    return {"model_type": model_type, "hidden_size": m.hidden_size, "intermediate_size": m.intermediate_size,
            "num_hidden_layers": m.num_layers, "num_attention_heads": m.num_heads,
            "num_key_value_heads": m.num_kv_heads, "vocab_size": m.vocab_size, "rms_norm_eps": m.rms_eps,
            "rope_theta": m.rope_theta, "tie_word_embeddings": m.tie_embeddings, **EXTRAS, **extra}


def write(folder: Path, config: dict | str, bom: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    text = config if isinstance(config, str) else json.dumps(config, indent=2)
    (folder / "config.json").write_bytes(("\ufeff" if bom else "").encode() + text.encode())
    return folder


LLAMA3_ROPE = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192, "rope_type": "llama3"}


@pytest.mark.parametrize(("name", "model_type", "extra"), [
    ("llama3_8b", "llama", {"rope_scaling": LLAMA3_ROPE, "attention_bias": False, "mlp_bias": False}),
    ("llama2_7b", "llama", {}),
    # Qwen2 configs state a window that use_sliding_window leaves off.
    ("qwen2_7b", "qwen2", {"sliding_window": 131072, "use_sliding_window": False, "max_window_layers": 28}),
    ("qwen2_1p5b", "qwen2", {"sliding_window": 32768, "use_sliding_window": False}),
    ("llama3_8b", "mistral", {"sliding_window": None}),
    ("qwen3_8b", "qwen3", {"head_dim": 128, "sliding_window": None, "use_sliding_window": False,
                           "max_window_layers": 36, "attention_bias": False}),
])
def test_a_config_json_gives_the_model_config_of_its_shape(tmp_path, name, model_type, extra):
    folder = write(tmp_path / "My Model v1", hf_config(name, model_type, **extra))
    read = _model(model_file_overrides(str(folder)))
    assert read.name == "My-Model-v1", "the folder names it, in characters a command line takes"
    assert read == replace(_model([f"model={name}"]), name=read.name)
    assert _model(model_file_overrides(str(folder / "config.json"))) == read, "the file itself names it as well"


# mistralai/Mistral-Nemo-Base-2407's config.json (as quoted in kevinstephano/thunder_model_blocks,
# thunder_model_blocks/mistral/mistral_config.py): 32 heads of 128 channels on a width of 5120.
MISTRAL_NEMO = {"model_type": "mistral", "architectures": ["MistralForCausalLM"], "head_dim": 128, "hidden_size": 5120,
                "intermediate_size": 14336, "max_position_embeddings": 128000, "num_attention_heads": 32,
                "num_hidden_layers": 40, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
                "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 131072}


# Qwen/Qwen3-0.6B's config.json (https://huggingface.co/Qwen/Qwen3-0.6B/raw/main/config.json, as
# quoted in public code): 16 heads of 128 on a width of 1024, q and k normalised, tied embeddings.
QWEN3_0P6B = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "head_dim": 128,
              "hidden_size": 1024, "intermediate_size": 3072, "max_position_embeddings": 40960,
              "max_window_layers": 28, "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
              "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
              "tie_word_embeddings": True, "use_sliding_window": False, "vocab_size": 151936}


@pytest.mark.parametrize(("name", "config", "widths"), [
    ("Mistral-Nemo-Base-2407", MISTRAL_NEMO, (128, 4096, 5120)),
    ("Qwen3-0.6B", QWEN3_0P6B, (128, 2048, 1024)),
])
def test_heads_narrower_or_wider_than_the_width_are_read_and_counted_as_transformers_builds_them(
        tmp_path, name, config, widths):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from odc_bench.models.decoder import count_parameters

    read = _model(model_file_overrides(str(write(tmp_path / name, config))))
    assert (read.head_dim, read.attention_width, read.hidden_size) == widths
    with torch.device("meta"):
        theirs = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    assert count_parameters(read) == sum(p.numel() for p in theirs.parameters())
    stated = hf_config("llama3_8b", "llama", head_dim=128)  # 4096 / 32: the width's share, stated
    assert _model(model_file_overrides(str(write(tmp_path / "llama3_8b", stated)))) == _model(["model=llama3_8b"])


def _transformers_name(name: str) -> str:
    """The harness decoder's parameter name as transformers' decoders name it."""
    renamed = {"head.norm.weight": "model.norm.weight", "head.lm_head.weight": "lm_head.weight"}
    return renamed.get(name) or "model." + name.removeprefix("embed.")


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3"])
def test_the_decoder_computes_the_loss_transformers_computes_with_the_same_weights(model_type):
    """Each family the reader takes, with heads narrower than the width's share and norms and
    biases drawn away from their initial values: one document's mean next-token loss."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from odc_bench.config.hf_model import HF_FAMILIES
    from odc_bench.config.model import ModelConfig
    from odc_bench.data.batches import packed_batch
    from odc_bench.data.tokens import sample_tokens
    from odc_bench.models.decoder import DecoderModel

    torch.manual_seed(0)
    shape = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_heads=4, num_kv_heads=2, head_dim=12)
    ours = DecoderModel(ModelConfig(name="t", family=HF_FAMILIES[model_type], num_layers=2, rms_eps=1e-6, **shape))
    with torch.no_grad():
        for name, p in ours.named_parameters():
            p.copy_(torch.rand_like(p) + 0.5 if name.endswith("norm.weight") else torch.randn_like(p) * 0.1)
    config = AutoConfig.for_model(model_type, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                  rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                                  **{k: v for k, v in shape.items() if not k.startswith("num_")})
    theirs = AutoModelForCausalLM.from_config(config, attn_implementation="eager").float()
    theirs.load_state_dict({_transformers_name(n): p for n, p in ours.named_parameters()}, strict=True)
    ids = sample_tokens(0, 0, 23, 100)
    tokens = torch.as_tensor(ids).long()[None]
    with torch.no_grad():
        summed, mean = ours(**packed_batch([ids])), theirs(input_ids=tokens, labels=tokens).loss
    assert float(summed) / 22 == pytest.approx(float(mean), rel=1e-5)


def test_what_the_file_leaves_out_takes_its_model_types_defaults(tmp_path):
    config = hf_config("llama2_7b", "llama")
    del config["num_key_value_heads"], config["tie_word_embeddings"]
    read = _model(model_file_overrides(str(write(tmp_path / "m", config))))
    assert read.num_kv_heads == read.num_heads, "no key-value heads stated: as many as query heads"
    assert read.tie_embeddings is False, "LlamaConfig does not tie by default (PretrainedConfig would)"


@pytest.mark.parametrize(("config", "message"), [
    (hf_config("qwen2_7b", "qwen3_moe", num_experts=64), "model_type 'qwen3_moe' is not one the harness simulates"),
    (hf_config("llama3_8b", "mistral", sliding_window=4096),
     "sliding-window attention (4096 tokens) is not simulated"),
    (hf_config("qwen2_7b", "qwen2", sliding_window=4096, use_sliding_window=True),
     "sliding-window attention (4096 tokens) is not simulated"),
    (hf_config("llama3_8b", "llama", num_key_value_heads=5),
     "config.json: model: num_heads 32 must divide by num_kv_heads 5"),
    ('{"model_type": "llama", ', "cannot read"),
    (hf_config("llama3_8b", "llama", hidden_size="4096"), "transformers cannot build a llama config from it"),
    ('["llama"]', "has no model_type"),
    ({"tokenizer_class": "PreTrainedTokenizerFast"}, "has no model_type"),
])
def test_a_config_it_cannot_simulate_is_refused_in_one_line(tmp_path, config, message):
    folder = write(tmp_path / "m", config)
    with pytest.raises(ConfigError) as refused:
        model_file_overrides(str(folder))
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_the_whatif_on_a_model_folder_is_the_whatif_on_its_config(tmp_path):
    folder = write(tmp_path / "Llama-3.1-8B", hf_config("llama3_8b", "llama", rope_scaling=LLAMA3_ROPE))
    ask = dict(lengths="longalign", hardware="h100", nodes=2, minibatch_sizes=(2,), num_minibatches=2)
    mine, stock = Question(model=str(folder), **ask), Question(model="llama3_8b", **ask)
    assert mine.model_name == "Llama-3.1-8B"
    collective = Series("collective", "lb_micro")
    a, b = (compose_config(q.run(collective, 2)) for q in (mine, stock))
    assert a == replace(b, model=replace(b.model, name="Llama-3.1-8B"))


def test_the_runs_file_names_a_model_folder_beside_it(tmp_path):
    write(tmp_path / "Llama-3.1-8B", hf_config("llama3_8b", "llama"), bom=False)
    (tmp_path / "runs.csv").write_text("model,lengths,gpus,gpus_per_node,minibatch_size,tokens_per_s_per_gpu\n"
                                       "Llama-3.1-8B,longalign,8,8,2,1500\nllama3_8b,swe_smith,8,8,2,2500\n")
    mine, stock = (r.spec.config.model for r in cc.read_runs(tmp_path / "runs.csv", "h100"))
    assert mine == replace(stock, name="Llama-3.1-8B")
    # Beside it too, a folder and a lengths file named as a model config and a profile: the bare
    # names stay the config and the profile, as the what-if reads them; ./ names the files.
    write(tmp_path / "qwen2_7b", hf_config("tiny", "qwen2"), bom=False)
    (tmp_path / "longalign").write_text("".join(f"{n}\n" for n in range(300, 364)))
    (tmp_path / "runs.csv").write_text("model,lengths,gpus,gpus_per_node,minibatch_size,tokens_per_s_per_gpu\n"
                                       "qwen2_7b,longalign,8,8,2,1500\n./qwen2_7b,./longalign,8,8,2,2500\n")
    named, beside = (r.spec for r in cc.read_runs(tmp_path / "runs.csv", "h100"))
    assert named.config.model == _model(["model=qwen2_7b"]) and named.config.dataset.loader == "profile"
    assert beside.config.model == replace(_model(["model=tiny"]), name="qwen2_7b")
    assert beside.config.dataset.path == str(tmp_path / "longalign")


def test_model_equals_a_folder_or_its_config_json_in_the_harness_as_in_the_whatif(tmp_path):
    folder = write(tmp_path / "Llama-3.1-8B", hf_config("llama3_8b", "llama", rope_scaling=LLAMA3_ROPE))
    read = compose_run(["backend=sim", *model_file_overrides(str(folder))])  # what the what-if's commands run
    assert compose_run(["backend=sim", f"model={folder}"]) == read
    assert compose_run(["backend=sim", f"model={folder / 'config.json'}"]) == read
    assert read.model == replace(_model(["model=llama3_8b"]), name="Llama-3.1-8B")


def test_a_path_is_the_folder_it_names_even_where_a_model_config_has_its_name(tmp_path, monkeypatch):
    """Hydra's package source read model=./qwen2_7b as model/./qwen2_7b.yaml, the stock config: the
    folder beside it went unread. A bare name stays the config option's."""
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "qwen2_7b", hf_config("tiny", "qwen2"))
    folder = compose_run(["backend=sim", f"model={tmp_path / 'qwen2_7b'}"]).model
    assert folder == replace(_model(["model=tiny"]), name="qwen2_7b")
    for path in ("./qwen2_7b", "qwen2_7b/", "./qwen2_7b/config.json", "../" + tmp_path.name + "/qwen2_7b"):
        assert compose_run(["backend=sim", f"model={path}"]).model == folder, path
    assert _model(["model=qwen2_7b"]).num_layers == 28, "the stock qwen2_7b"
    for missing in ("./tiny", "./qwen2_7b.json"):
        with pytest.raises(ConfigError, match=f"^model={missing}: no model config, and no Hugging Face model folder"):
            precheck([f"model={missing}", "backend=sim"], Planner())


def test_a_model_path_the_harness_cannot_use_is_one_line(tmp_path):
    with pytest.raises(ConfigError) as nothing:
        precheck([f"model={tmp_path / 'nowhere'}", "backend=sim"], Planner())
    assert str(nothing.value).startswith(f"model={tmp_path / 'nowhere'}: no model config, and no Hugging Face model "
                                         f"folder")
    folder = write(tmp_path / "m", hf_config("qwen2_7b", "qwen3_moe", num_experts=64))
    with pytest.raises(ConfigError) as qwen3:
        precheck([f"model={folder}", "backend=sim"], Planner())
    assert "model_type 'qwen3_moe' is not one the harness simulates" in str(qwen3.value)
    assert "\n" not in str(nothing.value) + str(qwen3.value)


@pytest.mark.slow
def test_a_sweep_takes_a_model_folder_beside_a_model_config(tmp_path):
    folder = write(tmp_path / "Qwen2-1.5B", hf_config("qwen2_1p5b", "qwen2"))
    done = run_cli("-m", f"model=qwen2_1p5b,{folder}", "backend=sim", "backend/hardware=h100", "world_size=8",
                   "num_minibatches=2", "warmup_minibatches=0", "backend.write_trace=false",
                   f"results_dir={tmp_path / 'res'}", f"hydra.sweep.dir={tmp_path / 'multirun'}")
    assert done.returncode == 0, done.stderr
    rows = read_table(tmp_path / "res" / "runs.csv")
    assert sorted(rows["model"]) == ["Qwen2-1.5B", "qwen2_1p5b"] and (rows["status"] == "ok").all()
    assert rows["samples_per_s"].nunique() == 1, "the same shape under another name runs the same"
    qwen3 = write(tmp_path / "Qwen3-30B-A3B", hf_config("qwen2_7b", "qwen3_moe", num_experts=64))
    later = run_cli("-m", f"model=qwen2_1p5b,{qwen3}", "backend=sim", f"results_dir={tmp_path / 'res2'}",
                    f"hydra.sweep.dir={tmp_path / 'multirun2'}")
    lines = later.stderr.strip().splitlines()
    assert later.returncode == 2 and len(lines) == 1 and "model_type 'qwen3_moe' is not one" in lines[0], later.stderr
    assert not (tmp_path / "res2").exists() and not (tmp_path / "multirun2").exists(), "nothing ran"


def test_a_model_section_of_the_harness_as_a_yaml_file_is_read_by_its_path(tmp_path, monkeypatch):
    """`model=./mine.yaml` and `--model ./mine.yaml`: a copy of a stock model file, edited, read
    without a config folder (it was "no model config, and no Hugging Face model folder"); named
    by its `name:`, or its file's name without one; a file named as a stock config is the file."""
    tiny = (REPO / "odc_bench" / "conf" / "model" / "tiny.yaml").read_text(encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    mine_yaml = tiny.replace("name: tiny", "name: mine").replace("num_layers: 4", "num_layers: 3")
    (tmp_path / "mine.yaml").write_text(mine_yaml)
    (tmp_path / "tiny.yaml").write_text(tiny.replace("num_layers: 4", "num_layers: 2"))
    (tmp_path / "unnamed.yml").write_text("\n".join(line for line in tiny.splitlines() if not line.startswith("name:")))
    stock = _model(["model=tiny"])
    mine = compose_run(["backend=sim", "model=./mine.yaml"]).model
    assert mine == replace(stock, name="mine", num_layers=3)
    assert compose_run(["backend=sim", f"model={tmp_path / 'mine.yaml'}"]).model == mine
    assert compose_run(["backend=sim", *model_file_overrides("mine.yaml")]).model == mine, "the what-if's commands"
    assert compose_run(["backend=sim", "model=./tiny.yaml"]).model == replace(stock, num_layers=2)
    assert compose_run(["backend=sim", "model=./unnamed.yml"]).model == replace(stock, name="unnamed")
    question = Question(model="./mine.yaml", lengths="longalign", hardware="h100", nodes=1, minibatch_sizes=(2,))
    assert question.model_name == "mine"
    (tmp_path / "bad.yaml").write_text(tiny.replace("num_layers: 4", "num_layers: 4\nlayers: 9"))
    with pytest.raises(ConfigError, match=r"bad\.yaml: unknown config key 'model\.layers'"):
        compose_run(["backend=sim", "model=./bad.yaml"])
