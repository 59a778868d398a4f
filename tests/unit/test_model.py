from dataclasses import replace

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from odc_bench.config.model import FAMILIES, ModelConfig
from odc_bench.data.batches import packed_batch
from odc_bench.data.tokens import sample_tokens
from odc_bench.models.decoder import DecoderModel, build_model, count_parameters, init_weights, rope_tables
from odc_bench.models.flops import layer_forward_flops, layer_linear_params
from tests.helpers import run_config

TINY = ModelConfig(name="test", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                   num_kv_heads=2)


def _final_hidden(model: DecoderModel, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    captured = {}

    def grab(_module, args):
        captured["h"] = args[0]

    handle = model.head.register_forward_pre_hook(grab)
    loss = model(**batch)
    handle.remove()
    return captured["h"], loss


def test_packed_document_masked_attention_equals_each_sequence_alone():
    torch.manual_seed(0)
    model = DecoderModel(TINY)
    init_weights(model, seed=1)
    docs = [sample_tokens(0, i, n, TINY.vocab_size) for i, n in enumerate([7, 31, 2, 16])]
    packed_h, packed_loss = _final_hidden(model, packed_batch(docs))
    alone = [_final_hidden(model, packed_batch([d])) for d in docs]
    torch.testing.assert_close(packed_h, torch.cat([h for h, _ in alone]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed_loss, sum(loss for _, loss in alone), rtol=1e-5, atol=1e-5)


def test_packing_does_not_leak_across_documents():
    model = DecoderModel(TINY)
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


# Published totals: safetensors parameter counts of the DeepSeek-R1-Distill-Qwen models and of
# meta-llama/Llama-2-7b-hf and meta-llama/Llama-3.1-8B (https://huggingface.co/api/models/NAME,
# safetensors.total; Llama 2's includes 2,048 rotary buffer entries the checkpoint stores), and
# MPT-7B's NumParams in llm-foundry's benchmark table (results/published/points.csv), and Qwen3-8B's
# "Number of Parameters: 8.2B" in its model card (huggingface.co/Qwen/Qwen3-8B, "Model Overview").
PUBLISHED = {"qwen2_1p5b": 1_777_088_000, "qwen2_7b": 7_615_616_512, "qwen2_14b": 14_770_033_664,
             "qwen2_32b": 32_763_876_352, "llama2_7b": 6_738_417_664, "llama3_8b": 8_030_261_248,
             "mpt_7b": 6_658_859_008, "qwen3_8b": 8_200_000_000}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_match_published_models(name):
    cfg = run_config(f"model={name}").model
    assert abs(count_parameters(cfg) / PUBLISHED[name] - 1) < 0.01


def test_init_is_deterministic_and_seeded():
    a, b, c = DecoderModel(TINY), DecoderModel(TINY), DecoderModel(TINY)
    init_weights(a, 3)
    init_weights(b, 3)
    init_weights(c, 4)
    for (n, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters(), strict=True):
        assert torch.equal(pa, pb), n
        if n.endswith("proj.weight"):
            assert not torch.equal(pa, pc), n


@pytest.mark.parametrize("head_dim", [None, 24], ids=["width-over-heads", "head_dim"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_builds_the_layers_its_record_names_and_trains(family, head_dim):
    cfg = replace(TINY, family=family, head_dim=head_dim)
    model = DecoderModel(cfg)
    init_weights(model, seed=0)
    names = {name.split("layers.0.", 1)[1] for name, _ in model.named_parameters() if name.startswith("layers.0.")}
    assert ("self_attn.q_proj.bias" in names) == FAMILIES[family].qkv_bias
    assert ("mlp.gate_proj.weight" in names) == FAMILIES[family].gated_mlp
    assert ("self_attn.q_norm.weight" in names) == ("self_attn.k_norm.weight" in names) == FAMILIES[family].qk_norm
    docs = [sample_tokens(0, i, n, cfg.vocab_size) for i, n in enumerate([7, 5])]
    loss = model(**packed_batch(docs))
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    assert sum(p.numel() for p in model.parameters()) == count_parameters(cfg)
    assert model.layers[0].self_attn.o_proj.weight.shape == (cfg.hidden_size, cfg.num_heads * (head_dim or 16))


@pytest.mark.parametrize("head_dim", [None, 24], ids=["width-over-heads", "head_dim"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_flops_model_counts_what_a_layers_forward_multiplies(family, head_dim):
    """torch's FLOP counter on one layer: its matrix multiplies are the FLOPs model's linear part,
    and its attention (the CPU kernel computes every document's whole square) twice the causal
    count."""
    cfg = replace(TINY, family=family, head_dim=head_dim, num_layers=1)
    model = DecoderModel(cfg)
    lens = [37, 21]
    with FlopCounterMode(display=False) as counter:
        model(**packed_batch([sample_tokens(0, i, n, cfg.vocab_size) for i, n in enumerate(lens)]))
    ops = {str(op): n for op, n in counter.get_flop_counts()["DecoderModel.layers.0"].items()}
    linear = 2 * layer_linear_params(cfg) * sum(lens)
    assert ops.pop("aten.mm") + ops.pop("aten.addmm", 0) == linear
    assert ops == {"aten.bmm": 2 * (layer_forward_flops(cfg, lens) - linear)}


def _separate(layer, fused: str, names: list[str]) -> torch.Tensor:
    """The separate projections' weights (or gradients, `fused` ending in .grad) stacked as a fused one stacks them."""
    module = layer.self_attn if fused.startswith("qkv") else layer.mlp
    weights = [getattr(module, n).weight for n in names]
    return torch.cat([w.grad for w in weights] if fused.endswith(".grad") else weights)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_fused_projections_start_from_and_train_like_the_separate_ones(family):
    cfg = replace(TINY, family=family)
    separate = build_model(cfg, seed=5, device=torch.device("cpu"))  # the CPU default
    fused = build_model(cfg, seed=5, device=torch.device("cpu"), fused=True)
    kinds = [("qkv_proj", ["q_proj", "k_proj", "v_proj"])]
    if FAMILIES[family].gated_mlp:
        kinds.append(("gate_up_proj", ["gate_proj", "up_proj"]))
    fused_names = {f"layers.{i}.{'self_attn' if f == 'qkv_proj' else 'mlp'}.{f}.weight"
                   for i in range(cfg.num_layers) for f, _ in kinds}
    assert fused_names <= dict(fused.named_parameters()).keys()
    assert not any("q_proj" in n or "gate_proj" in n for n, _ in fused.named_parameters())
    assert any("q_proj" in n for n, _ in separate.named_parameters())
    for a, b in zip(separate.layers, fused.layers, strict=True):
        for f, parts in kinds:
            module = b.self_attn if f == "qkv_proj" else b.mlp
            assert torch.equal(getattr(module, f).weight, _separate(a, f, parts))
    # Every other parameter is the same, by name.
    others = dict(separate.named_parameters())
    for name, p in fused.named_parameters():
        if name not in fused_names and not name.endswith("qkv_proj.bias"):
            assert torch.equal(p, others[name]), name
    docs = [sample_tokens(0, i, n, cfg.vocab_size) for i, n in enumerate([9, 4, 13])]
    losses = [model(**packed_batch(docs)) for model in (separate, fused)]
    for loss in losses:
        loss.backward()
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-5)
    for a, b in zip(separate.layers, fused.layers, strict=True):
        for f, parts in kinds:
            module = b.self_attn if f == "qkv_proj" else b.mlp
            torch.testing.assert_close(getattr(module, f).weight.grad, _separate(a, f + ".grad", parts),
                                       rtol=1e-4, atol=1e-6)


def test_rope_tables_on_cpu_do_not_depend_on_torchs_first_cos_and_sin(monkeypatch):
    """torch's CPU cos and sin can return less accurate values on their first call in a process
    (docs/reliability.md). With a stand-in whose first call of each is off, the tables come out
    the same from call to call, and as float64 math gives them from the same fp32 angles."""
    def off_on_first_call(real):
        calls = []

        def op(self):
            calls.append(1)
            return real(self) + (1e-4 if len(calls) == 1 else 0)
        return op

    monkeypatch.setattr(torch.Tensor, "cos", off_on_first_call(torch.Tensor.cos))
    monkeypatch.setattr(torch.Tensor, "sin", off_on_first_call(torch.Tensor.sin))
    positions = torch.arange(1 << 15)
    first, second = rope_tables(positions, 16, 1e4, torch.float32), rope_tables(positions, 16, 1e4, torch.float32)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    monkeypatch.undo()
    angles = (positions.float()[:, None] * (1.0 / 1e4 ** (torch.arange(0, 16, 2).float() / 16))).double()
    torch.testing.assert_close(first[0][:, :8].double(), angles.cos(), rtol=0, atol=1e-7)
    torch.testing.assert_close(first[1][:, 8:].double(), angles.sin(), rtol=0, atol=1e-7)
