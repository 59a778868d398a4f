"""Activation checkpointing of the decoder's layers on real ranks, as `backend.recompute` sets
it for both backends (the simulator charges the same recomputation: docs/simulator.md,
"Activation checkpointing").

A checkpointed layer is called through torch.utils.checkpoint (non-reentrant) where the model
calls it, not wrapped in another module: the engines' and the trace's hooks stay on the layer
itself, so its recomputed forward runs them again inside backward, where ODC and FSDP2 find the
layer already gathered (ODC's hooks: tests/integration/test_unit_outputs.py; FSDP2 skips its
pre-forward work in backward) and the trace counts the recomputation as backward (run/trace.py).

- full: every layer keeps only its input; backward runs its whole forward again.
- blocks: a share of the layers (`recompute_blocks`), spread evenly, checkpointed as in full.
- op: every layer, keeping the outputs of every other matrix multiply and of attention's
  kernel, as torchtitan's op-level selective checkpointing does; backward recomputes the rest.
  On CPU, where SDPA runs as several operators (models/attention.py), attention is recomputed too.
  Its layers run eagerly: torch.compile's kernels write into tensors it keeps, which torch
  refuses (config/run.py); torchtitan compiles the whole checkpointed block instead, which
  would hide the layer from the hooks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts, noop_context_fn

from odc_bench.config.backend import Checkpointing

ContextFn = Callable[[], Any]

_MATMULS = frozenset({"aten::mm", "aten::addmm"})
# One fused attention kernel's forward, whichever path ran it (attention.py: varlen on CUDA,
# per-document SDPA's flash, efficient or cuDNN kernels on 4-D tensors). torch's varlen custom
# op has had more than one namespace (torch_attn, torch_nn_attention): matched by its own name.
_ATTENTION = frozenset({
    "aten::_flash_attention_forward", "aten::_efficient_attention_forward",
    "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_cudnn_attention", "aten::_scaled_dot_product_flash_attention_for_cpu",
})
_VARLEN = "::_varlen_attn"


def checkpointed_layers(num_layers: int, share: float) -> frozenset[int]:
    """The layers `share` of them checkpoints: the nearest whole number of layers to
    num_layers x share (at least one), spread evenly (a half: every second layer)."""
    count = max(1, min(num_layers, math.floor(num_layers * share + 0.5)))
    return frozenset(i for i in range(num_layers) if (i + 1) * count // num_layers > i * count // num_layers)


def _op_policy() -> Callable[..., CheckpointPolicy]:
    """A policy for one checkpointed call: save every other matrix multiply's output (the
    first, third, ...) and attention's, recompute the rest. The forward and its recomputation
    count their matrix multiplies apart, so both save the same ones."""
    seen = {False: 0, True: 0}

    def policy(ctx: Any, op: Any, *_args: Any, **_kwargs: Any) -> CheckpointPolicy:
        name = op._schema.name
        if name in _ATTENTION or name.endswith(_VARLEN):
            return CheckpointPolicy.MUST_SAVE
        if name in _MATMULS:
            seen[ctx.is_recompute] += 1
            if seen[ctx.is_recompute] % 2 == 1:
                return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _op_contexts() -> Any:
    return create_selective_checkpoint_contexts(_op_policy())


def layer_contexts(checkpointing: Checkpointing, num_layers: int) -> dict[int, ContextFn]:
    """The checkpointed layers, each with the context_fn torch.utils.checkpoint takes."""
    if not checkpointing.recompute:
        return {}
    if checkpointing.recompute_mode == "op":
        return dict.fromkeys(range(num_layers), _op_contexts)
    layers = (range(num_layers) if checkpointing.recompute_mode == "full"
              else checkpointed_layers(num_layers, checkpointing.recompute_blocks))
    return dict.fromkeys(layers, noop_context_fn)


def run_layer(layer: torch.nn.Module, context_fn: ContextFn | None, *args: Any) -> torch.Tensor:
    """The layer's output, through checkpoint when it is checkpointed (`context_fn`)."""
    if context_fn is None:
        return layer(*args)
    # No operator of a layer draws random numbers: saving and restoring the RNG's state around
    # each recomputation would cost host time on CUDA for nothing.
    return checkpoint(layer, *args, use_reentrant=False, context_fn=context_fn, preserve_rng_state=False)
