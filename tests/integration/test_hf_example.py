"""examples/hf_train.py: transformers' Qwen2, Llama and Qwen3, tied and untied, trained by ODC (uneven
microbatch counts, one rank with none) and by FSDP2 on 2 CPU ranks, against one process."""

import importlib.util
import itertools
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import torchrun

pytest.importorskip("transformers", reason="the example needs transformers: pip install 'odc-bench[hf]'")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hf_train.py"
MODELS, TIES, ENGINES = ["qwen2", "llama", "qwen3"], ["tied", "untied"], ["odc", "collective"]


def _example():
    spec = importlib.util.spec_from_file_location("hf_train", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hf")
    variants = ["--model", *MODELS, "--tied", *TIES, "--out", str(out)]
    subprocess.run([sys.executable, str(EXAMPLE), "--reference", *variants], check=True, timeout=300)
    torchrun(str(EXAMPLE), "--engine", *ENGINES, "--export", *variants, timeout=600)
    return out


@pytest.mark.slow
def test_the_example_plans_uneven_counts_and_a_rank_with_none() -> None:
    hf = _example()
    from odc_bench.balancers import balance

    counts = [[len(p) for p in balance(lengths, 2, hf.MAX_TOKENS, "lb_mini")] for lengths in hf.MINIBATCHES]
    assert any(len(set(c)) > 1 for c in counts)
    assert any(0 in c for c in counts)


@pytest.mark.slow
@pytest.mark.parametrize(("model", "tied", "engine"), list(itertools.product(MODELS, TIES, ENGINES)))
def test_two_ranks_match_one_process(trained: Path, model: str, tied: str, engine: str) -> None:
    ranks = torch.load(trained / f"{model}-{tied}-{engine}.pt")
    one = torch.load(trained / f"{model}-{tied}-reference.pt")
    assert sorted(ranks) == sorted(one)
    # Tied: one tensor for both embeddings (named once), as in the model the example built.
    assert ("lm_head.weight" in one) == (tied == "untied")
    initial = dict(_example().build(model, tied == "tied").named_parameters())
    moved = max((one[n] - initial[n].detach()).abs().max().item() for n in one)
    assert moved > 1e-3  # training changed the parameters: the comparison below can fail
    # The example's eps (1e-4, its comment says why) keeps fp32 order noise from flipping steps
    # of size lr (3e-3): a difference of 1e-5 is an engine's, not the noise's.
    worst = max((ranks[n] - one[n]).abs().max().item() for n in one)
    assert worst < 1e-5, f"{engine} on 2 ranks differs from one process by {worst:.2e}"


@pytest.mark.slow
@pytest.mark.parametrize("tied", TIES)
def test_a_trained_model_exports_a_folder_from_pretrained_loads(trained: Path, tied: str) -> None:
    from transformers import AutoModelForCausalLM

    params = torch.load(trained / f"llama-{tied}-odc.pt")
    loaded = AutoModelForCausalLM.from_pretrained(trained / f"llama-{tied}-odc-hf")
    mine = dict(loaded.named_parameters())
    assert sorted(mine) == sorted(params)
    assert all(torch.equal(mine[n].detach(), params[n]) for n in params)
    assert (loaded.lm_head.weight is loaded.model.embed_tokens.weight) == (tied == "tied")
