"""Which attention kernel runs, and the varlen call through each of torch's signatures, checked on
CPU against per-document SDPA with stand-ins that have each signature, and one that has this
torch's own (the real kernel is CUDA only: tests/integration/test_gpu.py compares it on a GPU)."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

from odc_bench.data.batches import packed_batch
from odc_bench.models import attention, decoder
from odc_bench.models.attention import Documents, choose_kernel, flash_takes, per_document, varlen
from tests.helpers import run_config


def _reference(q, k, v, cu_q, max_q) -> torch.Tensor:
    """What a varlen kernel computes, from the offsets alone (no document lengths)."""
    bounds = cu_q.tolist()
    assert max_q == max(b - a for a, b in zip(bounds, bounds[1:], strict=False))
    outs = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        outs.append(F.scaled_dot_product_attention(q[a:b].transpose(0, 1), k[a:b].transpose(0, 1),
                                                   v[a:b].transpose(0, 1), is_causal=True).transpose(0, 1))
    return torch.cat(outs)


def varlen_210(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
    """torch 2.10's signature: causal by a flag, no GQA (kv heads must be repeated)."""
    assert is_causal and key.shape[1] == query.shape[1]
    return _reference(query, key, value, cu_seq_q, max_q)


def varlen_211(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
               window_size=(-1, -1)):
    """torch 2.11's (the lent GPU machine's): causal as window (-1, 0), still no GQA."""
    assert window_size == (-1, 0) and key.shape[1] == query.shape[1]
    return _reference(query, key, value, cu_seq_q, max_q)


def varlen_213(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
               window_size=(-1, -1), enable_gqa=False):
    """torch 2.12's and 2.13's: causal as window (-1, 0), GQA by its own argument."""
    assert window_size == (-1, 0)
    if key.shape[1] != query.shape[1]:
        assert enable_gqa
        group = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
    return _reference(query, key, value, cu_seq_q, max_q)


@pytest.mark.parametrize(("device", "dtype", "available", "head_size", "kernel"), [
    ("cuda", torch.bfloat16, True, 128, "varlen"),
    ("cuda", torch.float16, True, 64, "varlen"),
    ("cuda", torch.bfloat16, True, 256, "varlen"),
    ("cuda", torch.bfloat16, True, 80, "varlen"),
    ("cuda", torch.float32, True, 128, "sdpa_per_doc"),  # flash kernels take no fp32
    ("cuda", torch.bfloat16, False, 128, "sdpa_per_doc"),  # a torch without varlen
    ("cpu", torch.bfloat16, True, 128, "sdpa_per_doc"),  # CPU keeps its kernel and numbers
    ("cuda", torch.bfloat16, True, 264, "sdpa_per_doc"),  # the flash kernel's heads end at 256
    ("cuda", torch.bfloat16, True, 12, "sdpa_per_doc"),  # ... and are whole multiples of 8
])
def test_the_kernel_follows_device_dtype_torch_and_head_size(device, dtype, available, head_size, kernel):
    assert choose_kernel(device, dtype, available, head_size) == kernel


@pytest.mark.parametrize("fn", [varlen_210, varlen_211, varlen_213])
def test_varlen_through_each_signature_equals_per_document_sdpa(fn):
    torch.manual_seed(0)
    lengths = [5, 1, 12, 7]
    q = torch.randn(sum(lengths), 4, 8, requires_grad=True)
    k = torch.randn(sum(lengths), 2, 8, requires_grad=True)  # GQA: 2 q heads per kv head
    v = torch.randn(sum(lengths), 2, 8, requires_grad=True)
    docs = Documents.of(lengths, torch.device("cpu"), "varlen")
    assert docs.offsets.tolist() == [0, 5, 6, 18, 25] and docs.longest == 12
    got = varlen(fn, q, k, v, docs)
    grads = torch.autograd.grad(got.square().sum(), (q, k, v))
    want = per_document(q, k, v, Documents.of(lengths, torch.device("cpu"), "sdpa_per_doc"))
    torch.testing.assert_close(got, want)
    for g, w in zip(grads, torch.autograd.grad(want.square().sum(), (q, k, v)), strict=True):
        torch.testing.assert_close(g, w)


def test_the_call_binds_to_this_torchs_own_varlen_signature():
    """The adapter's arguments bind to the signature of the varlen_attn this torch ships (so a
    signature torch changes again fails here, on CPU, not first on a GPU), asking for causal
    attention and for GQA where that signature can take it."""
    real = attention.varlen_function()
    if real is None:
        pytest.skip("this torch has no torch.nn.attention.varlen")
    signature = inspect.signature(real)

    def stand_in(*args, **kwargs):
        given = signature.bind(*args, **kwargs)
        given.apply_defaults()
        a = given.arguments
        assert a.get("is_causal") is True or tuple(a.get("window_size", ())) == (-1, 0)
        q, k, v = a["query"], a["key"], a["value"]
        if k.shape[1] != q.shape[1]:
            assert a["enable_gqa"] is True
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return _reference(q, k, v, a["cu_seq_q"], a["max_q"])

    stand_in.__signature__ = signature  # type: ignore[attr-defined]
    torch.manual_seed(1)
    lengths = [3, 10, 4]
    q, k, v = torch.randn(17, 6, 8), torch.randn(17, 2, 8), torch.randn(17, 2, 8)
    got = varlen(stand_in, q, k, v, Documents.of(lengths, torch.device("cpu"), "varlen"))
    torch.testing.assert_close(got, per_document(q, k, v, Documents.of(lengths, torch.device("cpu"), "sdpa_per_doc")))


def test_the_decoder_on_the_varlen_path_matches_its_per_document_path(monkeypatch):
    """The whole model with the varlen kernel (a stand-in with torch 2.13's signature) gives the
    per-document loss and gradients, and records the kernel that ran."""
    cfg = run_config("model.num_layers=2").model
    batch = packed_batch([torch.randint(0, cfg.vocab_size, (n,)) for n in (9, 3, 14)])
    runs = {}
    for kernel in ("sdpa_per_doc", "varlen"):
        monkeypatch.setattr(decoder, "kernel_for", lambda _x, _head_size, kernel=kernel: kernel)
        monkeypatch.setattr(attention, "varlen_function", lambda: varlen_213)
        model = decoder.build_model(cfg, 0, torch.device("cpu"))
        loss = model(**batch)
        loss.backward()
        runs[kernel] = (loss.detach(), {n: p.grad for n, p in model.named_parameters()}, model.attention_kernels)
    (loss_a, grads_a, used_a), (loss_b, grads_b, used_b) = runs["sdpa_per_doc"], runs["varlen"]
    torch.testing.assert_close(loss_b, loss_a)
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], msg=name)
    assert used_a == {"sdpa_per_doc"} and used_b == {"varlen"}


def flash_varlen_213(query, key, value, *args, **kwargs):
    """varlen_213 refusing the head sizes torch's flash kernel refuses (attention.py's docstring)."""
    if not flash_takes(query.shape[-1]):
        raise RuntimeError(f"the flash kernel takes no heads of {query.shape[-1]}")
    return varlen_213(query, key, value, *args, **kwargs)


@pytest.mark.parametrize(("head_dim", "kernel"), [(16, "varlen"), (12, "sdpa_per_doc"), (264, "sdpa_per_doc")])
def test_the_decoder_gives_the_varlen_kernel_only_heads_it_takes(monkeypatch, head_dim, kernel):
    """Where varlen would run (CUDA, 16-bit: stood in for on CPU), a model whose heads the flash
    kernel refuses runs per-document SDPA, to the same loss, and records it."""
    cfg = run_config("model.num_layers=1", f"model.head_dim={head_dim}").model
    batch = packed_batch([torch.randint(0, cfg.vocab_size, (n,)) for n in (9, 3, 14)])
    monkeypatch.setattr(decoder, "kernel_for",
                        lambda _x, head_size: choose_kernel("cuda", torch.bfloat16, True, head_size))
    monkeypatch.setattr(attention, "varlen_function", lambda: flash_varlen_213)
    model = decoder.build_model(cfg, 0, torch.device("cpu"))
    loss = model(**batch)
    loss.backward()
    assert model.attention_kernels == {kernel}
    monkeypatch.setattr(decoder, "kernel_for", lambda _x, _head_size: "sdpa_per_doc")
    torch.testing.assert_close(model(**batch), loss)
