"""The loss taken a chunk of tokens at a time (models/loss.py), as the decoder runs it on CUDA,
against the whole microbatch's logits, as it runs on CPU: the same loss and the same gradients,
on CPU (the code is the same on both; only its compilation is CUDA's, tests/integration/test_gpu.py)."""

from dataclasses import replace

import pytest
import torch

from odc_bench.data.batches import packed_batch
from odc_bench.data.tokens import sample_tokens
from odc_bench.models.decoder import DecoderModel, init_weights
from odc_bench.models.loss import IGNORE, chunked_cross_entropy, loss_and_grad
from tests.unit.test_model import TINY


def _whole(x, weight, labels):
    # In the inputs' dtype widened to fp32 at least, as the chunked loss computes (fp64 here): a
    # reference cast down to fp32 differs by fp32's rounding, which fp64's tolerance does not allow
    # (whether it showed depended on the CPU's kernels).
    logits = x @ weight.t()
    return torch.nn.functional.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), labels,
                                             ignore_index=IGNORE, reduction="sum")


@pytest.mark.parametrize("chunk", [1, 4, 7, 20, 64])
def test_chunked_loss_and_gradients_equal_the_whole_logits(chunk):
    """20 tokens in chunks that divide them, do not, or exceed them; ignored labels, a run of them
    filling whole chunks, in fp32 and fp64 weights' dtype as given."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(20, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 50, (20,), generator=gen)
    labels[[0, 8, 9, 10, 11, 19]] = IGNORE
    got = chunked_cross_entropy(x, weight, labels, chunk)
    want = _whole(x, weight, labels)
    torch.testing.assert_close(got, want.to(got.dtype))
    upstream = torch.tensor(0.37, dtype=torch.float64)  # the backward scales by its incoming gradient
    for g, w in zip(torch.autograd.grad(got * upstream, (x, weight)), torch.autograd.grad(want * upstream, (x, weight)),
                    strict=True):
        torch.testing.assert_close(g, w)


def test_no_tokens_and_no_labelled_tokens_give_zero_loss_and_zero_gradients():
    weight = torch.randn(10, 4, requires_grad=True)
    for n in (0, 5):
        x = torch.randn(n, 4, requires_grad=True)
        loss = chunked_cross_entropy(x, weight, torch.full((n,), IGNORE), 2)
        gx, gw = torch.autograd.grad(loss, (x, weight))
        assert loss.item() == 0 and not gx.any() and not gw.any()


def test_the_chunks_math_is_the_loss_and_its_gradient_in_the_logits_dtype():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 30, generator=gen).to(torch.bfloat16).requires_grad_()
    labels = torch.tensor([3, IGNORE, 0, 29, 7, IGNORE])
    loss, grad = loss_and_grad(logits.detach(), labels)
    want = torch.nn.functional.cross_entropy(logits.float(), labels, ignore_index=IGNORE, reduction="sum")
    assert loss.dtype == torch.float32 and grad.dtype == torch.bfloat16
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(grad, torch.autograd.grad(want, logits)[0])


@pytest.mark.parametrize("tied", [False, True])
def test_a_decoder_with_a_chunked_loss_trains_as_the_whole_logits_one(tied):
    """The whole model, tied embeddings too (the head's weight is the embedding's, whose gradient
    sums both uses): loss and every parameter's gradient agree."""
    cfg = replace(TINY, tie_embeddings=tied)
    models = [DecoderModel(cfg), DecoderModel(cfg, loss_chunk=5)]
    for m in models:
        init_weights(m, seed=3)
    docs = [sample_tokens(0, i, n, cfg.vocab_size) for i, n in enumerate([9, 3, 14])]
    batch = packed_batch(docs)
    losses = [m(**batch) for m in models]
    torch.testing.assert_close(losses[1], losses[0])
    for loss in losses:
        loss.backward()
    whole, chunked = (dict(m.named_parameters()) for m in models)
    assert whole.keys() == chunked.keys()
    for name in whole:
        torch.testing.assert_close(chunked[name].grad, whole[name].grad, rtol=1e-4, atol=1e-6, msg=name)


def test_a_chunk_holds_at_least_one_token():
    with pytest.raises(ValueError, match="at least one token"):
        chunked_cross_entropy(torch.zeros(2, 3), torch.zeros(4, 3), torch.zeros(2, dtype=torch.long), 0)


@pytest.mark.usefixtures("cpu_compile")
def test_the_compiled_chunk_math_compiles_once_for_microbatches_of_one_chunk_and_of_several():
    # The H200's compute profile compiled it twice: the first microbatch fit in one chunk, so its
    # labels' base had the logits' row count, a size Dynamo then held the next ones to.
    torch._dynamo.reset()
    math = torch.compile(loss_and_grad, dynamic=True)
    weight = torch.randn(32, 8)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for tokens in (40, 45, 150, 70):  # one chunk, one, three, two
            x = torch.randn(tokens, 8)
            labels = torch.randint(0, 32, (tokens,))
            got = chunked_cross_entropy(x, weight, labels, 64, math)
            assert torch.allclose(got, chunked_cross_entropy(x, weight, labels, 64)), tokens
