import pytest
import torch

from odc_bench.config.model import ModelConfig
from odc_bench.data.batches import packed_batch
from odc_bench.data.tokens import sample_tokens
from odc_bench.models.qwen2 import Qwen2Model, count_parameters, init_weights
from tests.helpers import run_config

TINY = ModelConfig(name="test", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                   num_kv_heads=2)


def _final_hidden(model: Qwen2Model, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    captured = {}

    def grab(_module, args):
        captured["h"] = args[0]

    handle = model.head.register_forward_pre_hook(grab)
    loss = model(**batch)
    handle.remove()
    return captured["h"], loss


def test_packed_document_masked_attention_equals_each_sequence_alone():
    torch.manual_seed(0)
    model = Qwen2Model(TINY)
    init_weights(model, seed=1)
    docs = [sample_tokens(0, i, n, TINY.vocab_size) for i, n in enumerate([7, 31, 2, 16])]
    packed_h, packed_loss = _final_hidden(model, packed_batch(docs))
    alone = [_final_hidden(model, packed_batch([d])) for d in docs]
    torch.testing.assert_close(packed_h, torch.cat([h for h, _ in alone]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed_loss, sum(loss for _, loss in alone), rtol=1e-5, atol=1e-5)


def test_packing_does_not_leak_across_documents():
    model = Qwen2Model(TINY)
    init_weights(model, seed=1)
    a = sample_tokens(0, 0, 12, TINY.vocab_size)
    h1, _ = _final_hidden(model, packed_batch([a, sample_tokens(0, 1, 9, TINY.vocab_size)]))
    h2, _ = _final_hidden(model, packed_batch([a, sample_tokens(0, 2, 9, TINY.vocab_size)]))
    torch.testing.assert_close(h1[:12], h2[:12])
    assert not torch.allclose(h1[12:], h2[12:])


def test_labels_stop_at_document_ends():
    batch = packed_batch([torch.tensor([1, 2, 3]), torch.tensor([4, 5])])
    assert batch["labels"].tolist() == [2, 3, -100, 5, -100]
    assert batch["position_ids"].tolist() == [0, 1, 2, 0, 1]


# Published totals (safetensors parameter counts of the DeepSeek-R1-Distill-Qwen models).
PUBLISHED = {"qwen2_1p5b": 1_777_088_000, "qwen2_7b": 7_615_616_512, "qwen2_14b": 14_770_033_664,
             "qwen2_32b": 32_763_876_352}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_match_published_models(name):
    cfg = run_config(f"model={name}").model
    assert abs(count_parameters(cfg) / PUBLISHED[name] - 1) < 0.01


def test_init_is_deterministic_and_seeded():
    a, b, c = Qwen2Model(TINY), Qwen2Model(TINY), Qwen2Model(TINY)
    init_weights(a, 3)
    init_weights(b, 3)
    init_weights(c, 4)
    for (n, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters(), strict=True):
        assert torch.equal(pa, pb), n
        if n.endswith("proj.weight"):
            assert not torch.equal(pa, pc), n
