"""The baseline's GPU path: runs on a CUDA device when one is present; everywhere else these
skip, saying why. ODC on GPUs: test_gpu_odc.py."""

import pytest
import torch

from odc_bench.models.attention import Documents, per_document, varlen, varlen_function
from odc_bench.plan.spec import resolve
from odc_bench.record.metrics import events_frame
from odc_bench.run.local import run_local
from tests.helpers import run_config

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(),
                               reason="no CUDA device on this machine: GPU runs are checked on the lent GPU machine")
pytestmark = [needs_gpu, pytest.mark.gpu]


def test_collective_engine_trains_on_one_gpu_with_nccl_timed_on_the_device():
    spec = resolve(run_config("device=cuda", "world_size=1", "num_minibatches=2", "warmup_minibatches=0",
                              "precision=bf16"))
    result = run_local(spec)[0]
    events = events_frame([result])
    spans = events[events["kind"].isin(["fwd", "bwd"])]
    assert len(spans) and (spans["t1"] >= spans["t0"]).all()
    # Device time: the units' spans lie inside their minibatch, which is resolved against the
    # same anchors, and the varlen kernel ran (bf16 on CUDA).
    for k, mb in events[events["kind"] == "minibatch"].groupby("minibatch"):
        inside = spans[spans["minibatch"] == k]
        assert inside["t0"].min() >= mb["t0"].min() - 1e-3 and inside["t1"].max() <= mb["t1"].max() + 1e-3
    assert result["attention"] == ("varlen" if varlen_function() is not None else "sdpa_per_doc")
    assert result["peak_bytes"] > 0


@pytest.mark.skipif(varlen_function() is None, reason="this torch has no torch.nn.attention.varlen")
def test_varlen_matches_per_document_sdpa_forward_and_gradients():
    torch.manual_seed(0)
    lengths = [300, 7, 1024, 129]
    shape = (sum(lengths), 8, 64)
    q = torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(shape[0], 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(shape[0], 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    got = varlen(varlen_function(), q, k, v, Documents.of(lengths, q.device, "varlen"))
    want = per_document(q, k, v, Documents.of(lengths, q.device, "sdpa_per_doc"))
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    upstream = torch.randn_like(got)
    for g, w in zip(torch.autograd.grad(got, (q, k, v), upstream), torch.autograd.grad(want, (q, k, v), upstream),
                    strict=True):
        torch.testing.assert_close(g, w, atol=5e-2, rtol=5e-2)


def test_the_compiled_chunked_loss_matches_the_whole_logits_and_holds_a_chunk():
    """qwen2_1p5b's head at 16K tokens in bf16: the loss a chunk at a time (compiled, as
    compile_dense runs it) against the whole microbatch's fp32 logits: the same loss and
    gradients to bf16's precision, in at most half the memory, and within what the memory
    estimate counts for it (a chunk's logits and their gradient, the head's input gradient, and
    the weight's gradient) with a quarter to spare."""
    from odc_bench.models.decoder import Head
    from odc_bench.models.loss import loss_and_grad
    from odc_bench.models.memory import LOSS_CHUNK_TOKENS

    cfg = run_config("model=qwen2_1p5b").model
    tokens = 16384
    torch.manual_seed(0)
    whole = Head(cfg).to("cuda", torch.bfloat16)
    chunked = Head(cfg, loss_chunk=LOSS_CHUNK_TOKENS).to("cuda", torch.bfloat16)
    chunked.load_state_dict(whole.state_dict())
    chunked.chunk_math = torch.compile(loss_and_grad, dynamic=True)
    x0 = torch.randn(tokens, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
    labels = torch.randint(0, cfg.vocab_size, (tokens,), device="cuda")
    labels[::97] = -100
    results = []
    for head in (whole, chunked, chunked):  # the chunked one twice: the first compiles
        x = x0.clone().requires_grad_()
        head.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        loss = head(x, labels)
        loss.backward()
        torch.cuda.synchronize()
        results.append((loss.detach().float(), x.grad, head.lm_head.weight.grad.clone(),
                        torch.cuda.max_memory_allocated() - base))
    (want, want_x, want_w, whole_peak), _, (got, got_x, got_w, chunk_peak) = results
    torch.testing.assert_close(got, want, rtol=2e-3, atol=0)
    torch.testing.assert_close(got_x.float(), want_x.float(), rtol=5e-2, atol=5e-3)
    torch.testing.assert_close(got_w.float(), want_w.float(), rtol=5e-2, atol=5e-2)
    counted = (LOSS_CHUNK_TOKENS * cfg.vocab_size * 4 + tokens * cfg.hidden_size * 2 * 2
               + cfg.vocab_size * cfg.hidden_size * 2 * 2)
    assert chunk_peak <= whole_peak / 2, (chunk_peak, whole_peak)
    assert chunk_peak <= 1.25 * counted, (chunk_peak, counted)


def test_a_microbatch_and_its_document_offsets_reach_the_gpu_without_waiting_for_queued_work():
    """The host runs ahead of the device across microbatches: moving the next microbatch does not
    wait for the kernels already queued (half a second of them or more here)."""
    import time

    from odc_bench.data.batches import on_device, packed_batch

    cuda = torch.device("cuda")
    docs = [torch.arange(1, 300), torch.arange(7)]
    on_device(packed_batch(docs), cuda)  # pinned blocks allocated once (the allocation may synchronise)
    Documents.of([299, 7], cuda, "varlen")
    torch.cuda.synchronize()
    torch.cuda._sleep(1_000_000_000)  # a billion cycles: half a second or more at clocks up to 2 GHz
    t0 = time.perf_counter()
    batch = on_device(packed_batch(docs), cuda)
    offsets = Documents.of([299, 7], cuda, "varlen").offsets
    host_s = time.perf_counter() - t0
    torch.cuda.synchronize()
    assert host_s < 0.25, f"moving a microbatch waited {host_s:.2f} s for the queued work"
    for key, value in packed_batch(docs).items():
        assert torch.equal(batch[key].cpu(), value) if torch.is_tensor(value) else batch[key] == value
    assert offsets is not None and offsets.tolist() == [0, 299, 306]


@pytest.mark.skipif(varlen_function() is None, reason="this torch has no torch.nn.attention.varlen")
def test_every_checkpointing_mode_trains_as_without_it_and_op_mode_keeps_the_varlen_output():
    """On CUDA in bf16 (varlen attention, fused projections): the gradients of each
    backend.recompute_mode are those without checkpointing, full recomputes every layer's
    attention in backward and op recomputes none (it keeps the varlen op's output, whatever
    namespace this torch gives the op)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from odc_bench.config.backend import LocalBackendConfig
    from odc_bench.data.batches import on_device, packed_batch
    from odc_bench.data.tokens import sample_tokens
    from odc_bench.models.checkpointing import layer_contexts
    from odc_bench.models.decoder import build_model

    class Attention(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.calls += func._schema.name.endswith("::_varlen_attn")
            return func(*args, **(kwargs or {}))

    cfg = run_config("model=tiny").model
    batch = on_device(packed_batch([sample_tokens(0, i, n, cfg.vocab_size) for i, n in enumerate([700, 90, 300])]),
                      torch.device("cuda"))
    modes = {"none": LocalBackendConfig(), "full": LocalBackendConfig(recompute=True),
             "op": LocalBackendConfig(recompute=True, recompute_mode="op")}
    grads, recomputed = {}, {}
    for mode, checkpointing in modes.items():
        model = build_model(cfg, 0, torch.device("cuda")).to(torch.bfloat16)
        model.checkpointed = layer_contexts(checkpointing, cfg.num_layers)
        loss = model(**batch)
        with Attention() as attention:
            loss.backward()
        assert model.attention_kernels == {"varlen"}
        grads[mode] = {n: p.grad.float() for n, p in model.named_parameters()}
        recomputed[mode] = attention.calls
    assert recomputed == {"none": 0, "full": cfg.num_layers, "op": 0}
    for mode in ("full", "op"):
        for name, grad in grads["none"].items():
            torch.testing.assert_close(grads[mode][name], grad, atol=1e-3, rtol=1e-2, msg=f"{mode}: {name}")


@pytest.mark.skipif(varlen_function() is None, reason="this torch has no torch.nn.attention.varlen")
def test_heads_the_flash_kernel_refuses_run_per_document_sdpa_in_bf16():
    """The varlen call refuses heads of 12 channels (the flash kernel takes multiples of 8 up to
    256: attention.py); the decoder with such heads runs per-document SDPA instead, forward and
    backward in bf16, and records that kernel."""
    from odc_bench.data.batches import on_device, packed_batch
    from odc_bench.data.tokens import sample_tokens
    from odc_bench.models.decoder import build_model

    q = torch.randn(16, 2, 12, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError):
        varlen(varlen_function(), q, q, q, Documents.of([16], q.device, "varlen"))
    cfg = run_config("model=tiny", "model.head_dim=12", "model.num_layers=1").model
    batch = on_device(packed_batch([sample_tokens(0, i, n, cfg.vocab_size) for i, n in enumerate([300, 90])]),
                      torch.device("cuda"))
    model = build_model(cfg, 0, torch.device("cuda")).to(torch.bfloat16)
    loss = model(**batch)
    loss.backward()
    assert model.attention_kernels == {"sdpa_per_doc"}
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters())
