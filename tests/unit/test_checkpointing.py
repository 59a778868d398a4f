"""Activation checkpointing of the decoder's layers (models/checkpointing.py): which layers each
mode checkpoints, that they recompute in backward and hold less after forward while computing
the same gradients, and that the trace counts a recomputation as its unit's backward."""

from __future__ import annotations

import copy
import gc
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import set_checkpoint_early_stop

from odc_bench.config.backend import LocalBackendConfig
from odc_bench.config.model import ModelConfig
from odc_bench.data.batches import packed_batch
from odc_bench.data.tokens import sample_tokens
from odc_bench.models.checkpointing import checkpointed_layers, layer_contexts
from odc_bench.models.decoder import DecoderModel, init_weights
from odc_bench.run.trace import Recorder, heap_in_use_bytes, instrument
from tests.helpers import run_config

CFG = ModelConfig(name="test", vocab_size=256, hidden_size=64, intermediate_size=192, num_layers=4, num_heads=4,
                  num_kv_heads=2)
MODES = {"none": LocalBackendConfig(), "full": LocalBackendConfig(recompute=True),
         "blocks": LocalBackendConfig(recompute=True, recompute_mode="blocks", recompute_blocks=0.5),
         "op": LocalBackendConfig(recompute=True, recompute_mode="op")}


@pytest.mark.parametrize(("layers", "share", "want"), [
    (4, 0.5, {1, 3}), (4, 1.0, {0, 1, 2, 3}), (4, 0.25, {3}), (3, 0.1, {2}), (8, 0.3, {3, 7}), (8, 0.4, {2, 5, 7}),
    (28, 0.5, set(range(1, 28, 2))),
])
def test_blocks_checkpoint_the_nearest_whole_number_of_layers_spread_evenly(layers, share, want):
    assert checkpointed_layers(layers, share) == want


def _batch() -> dict:
    return packed_batch([sample_tokens(0, i, n, CFG.vocab_size) for i, n in enumerate([300, 41, 170])])


class _Matmuls(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func._schema.name in ("aten::mm", "aten::addmm")
        return func(*args, **(kwargs or {}))


def _train_step(mode: str) -> tuple[dict[str, torch.Tensor], Counter, int, int]:
    """Gradients, forward calls per layer, heap bytes held between forward and backward, and
    matrix multiplies run in backward, for one microbatch with `mode`'s checkpointing."""
    model = DecoderModel(CFG)
    init_weights(model, seed=3)
    model.checkpointed = layer_contexts(MODES[mode], CFG.num_layers)
    calls: Counter = Counter()
    for i, layer in enumerate(model.layers):
        layer.register_forward_pre_hook(lambda _m, _a, i=i: calls.update([i]))
    batch = _batch()
    gc.collect()
    gc.disable()  # no other test's garbage freed in between: the bytes held are the forward's
    try:
        before = heap_in_use_bytes()
        loss = model(**batch)
        held = heap_in_use_bytes() - before
    finally:
        gc.enable()
    with _Matmuls() as matmuls:
        loss.backward()
    return {n: p.grad for n, p in model.named_parameters()}, calls, held, matmuls.count


def test_each_mode_recomputes_its_layers_in_backward_holds_less_and_computes_the_same_gradients():
    steps = {mode: _train_step(mode) for mode in MODES}
    grads, calls, held, matmuls = ({m: s[k] for m, s in steps.items()} for k in range(4))
    assert calls["none"] == dict.fromkeys(range(4), 1)
    assert calls["full"] == calls["op"] == dict.fromkeys(range(4), 2)
    assert calls["blocks"] == {0: 1, 1: 2, 2: 1, 3: 2}
    # What backward computes again: every forward matrix multiply (full), fewer (op: every
    # other one is kept), none without checkpointing.
    assert matmuls["none"] < matmuls["op"] < matmuls["full"]
    assert matmuls["blocks"] < matmuls["full"]
    assert held["full"] < held["op"] < held["none"]
    assert held["full"] < held["blocks"] < held["none"]
    for mode in ("full", "blocks", "op"):
        for name, grad in grads["none"].items():
            torch.testing.assert_close(grads[mode][name], grad, rtol=0, atol=0, msg=f"{mode}: {name}")


@pytest.mark.parametrize("early_stop", [True, False])
def test_a_recomputed_layer_records_one_forward_and_one_backward_span_per_microbatch(early_stop):
    """A recomputation runs the layer's hooks again inside its backward, to its end or, as torch
    does by default, stopped once backward has what it needs: three microbatches each get exactly
    one forward and one backward span per unit, whichever way, as without checkpointing."""
    model = DecoderModel(CFG)
    init_weights(model, seed=3)
    reference = copy.deepcopy(model)
    model.checkpointed = layer_contexts(MODES["full"], CFG.num_layers)
    spans = {}
    for name, net in (("full", model), ("none", reference)):
        recorder = Recorder(rank=0)
        recorder.start()
        recorder.enabled = True
        instrument(recorder, net.named_units())
        with set_checkpoint_early_stop(early_stop):
            for microbatch in range(3):
                recorder.microbatch = microbatch
                net(**_batch()).backward()
        spans[name] = Counter((e["microbatch"], e["unit"], e["kind"]) for e in recorder.events)
    assert spans["full"] == spans["none"]
    assert set(spans["full"].values()) == {1} and len(spans["full"]) == 3 * (1 + 2 * CFG.num_layers + 2)


def test_real_runs_without_checkpointing_keep_their_keys_and_with_it_get_others():
    """Rows and checkpoints of real runs made before the backend had these keys are found by
    the same key: the local backend's record leaves them out while checkpointing is off."""
    plain = run_config().to_dict()["backend"]
    assert plain == {"name": "local"}
    on = run_config("backend.recompute=true").to_dict()["backend"]
    assert on == {"name": "local", "recompute": True, "recompute_mode": "full", "recompute_blocks": 0.5}


def test_op_level_checkpointing_leaves_the_layers_uncompiled_by_default():
    """torch.compile's kernels write into the tensors op-level checkpointing keeps (torch: "Tensor
    cached during selective activation checkpoint has been mutated"): compile=null, which
    compiles on CUDA, leaves them eager under it, and only under it."""
    assert run_config("backend.recompute=true").compiles("cuda")
    assert not run_config("backend.recompute=true", "backend.recompute_mode=op").compiles("cuda")
    assert run_config("backend.recompute=true", "backend.recompute_mode=op", "compile=false").compiles("cuda") is False
    assert not run_config("backend.recompute=true").compiles("cpu")


def test_op_mode_keeps_every_attention_kernels_output_and_every_other_matmuls():
    """The kernels CPU runs never call (varlen under either of the namespaces torch has given
    it, SDPA's fused kernels) are kept by name; the forward and its recomputation count matrix
    multiplies apart, so both keep the same ones."""
    from types import SimpleNamespace

    from torch.utils.checkpoint import CheckpointPolicy

    from odc_bench.models.checkpointing import _op_policy

    def op(name):
        return SimpleNamespace(_schema=SimpleNamespace(name=name))

    policy = _op_policy()
    for recompute in (False, True):
        ctx = SimpleNamespace(is_recompute=recompute)
        for name in ("torch_attn::_varlen_attn", "torch_nn_attention::_varlen_attn",
                     "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_cudnn_attention"):
            assert policy(ctx, op(name)) is CheckpointPolicy.MUST_SAVE, name
        kept = [policy(ctx, op(name)) is CheckpointPolicy.MUST_SAVE for name in ("aten::mm", "aten::addmm") * 3]
        assert kept == [True, False] * 3
        assert policy(ctx, op("aten::mul")) is CheckpointPolicy.PREFER_RECOMPUTE
