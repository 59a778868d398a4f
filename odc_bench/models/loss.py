"""The loss head's summed cross-entropy a chunk of tokens at a time, as long-context trainers
run it on GPUs: the logits of at most `chunk` tokens exist at once.

The whole microbatch's logits are what a long document cannot afford: at 64K tokens and a
152K vocabulary they are 20 GB in bf16, as much again for their gradient. So each chunk's
logits are computed, turned into the chunk's loss and the loss's gradient with respect to them
(`loss_and_grad`, compiled on CUDA so that the fp32 math fuses into two kernels over bf16
logits), and folded into the gradients of the head's input and weight at once (two GEMMs), in
the forward pass; the backward pass only scales them. That holds a chunk's logits and their
gradient in the compute dtype, which is what the memory estimate counts for the loss
(models/memory.py, LOSS_CHUNK_TOKENS), and costs no recomputation: the head's three GEMMs run
in its forward instead of one there and two in its backward. The weight's gradient is
accumulated over chunks in the compute dtype, as the unchunked GEMM's output would be.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

IGNORE = -100  # labels of tokens without a next token (data/batches.py): no loss

LossAndGrad = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def loss_and_grad(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The summed cross-entropy of (tokens, vocab) logits against labels (IGNORE: none), in fp32
    (or wider, as given), and its gradient with respect to the logits, in the logits' dtype."""
    z = logits.to(torch.promote_types(logits.dtype, torch.float32))
    lse = torch.logsumexp(z, dim=-1)
    valid = labels != IGNORE
    target = torch.where(valid, labels, 0)
    loss = torch.where(valid, lse - z.gather(1, target[:, None]).squeeze(1), 0.0).sum()
    one_hot = torch.arange(z.shape[1], device=z.device)[None, :] == target[:, None]
    grad = torch.where(valid[:, None], torch.exp(z - lse[:, None]) - one_hot.to(z.dtype), 0.0)
    return loss, grad.to(logits.dtype)


class _ChunkedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk: int,
                math: LossAndGrad) -> torch.Tensor:
        total = torch.zeros((), dtype=torch.promote_types(x.dtype, torch.float32), device=x.device)
        grad_x = torch.empty_like(x)
        grad_w: torch.Tensor | None = None
        for start in range(0, x.shape[0], chunk):
            xs = x[start:start + chunk]
            # The chunk's labels as a tensor of their own: a view would let compiled math guard on
            # its base's size, so a microbatch of one chunk and a longer one would each compile it.
            loss, grad = math(xs @ weight.t(), labels[start:start + chunk].clone())
            total += loss
            torch.mm(grad, weight, out=grad_x[start:start + chunk])
            grad_w = grad.t() @ xs if grad_w is None else grad_w.addmm_(grad.t(), xs)
            del grad  # before the next chunk's logits: one chunk's logits and gradient at a time
        if grad_w is None:  # no tokens
            grad_w = torch.zeros_like(weight)
        ctx.save_for_backward(grad_x, grad_w)
        return total

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad_x, grad_w = ctx.saved_tensors
        scale = grad_out.to(grad_x.dtype)
        return grad_x * scale, grad_w * scale, None, None, None


def chunked_cross_entropy(x: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk: int,
                          math: LossAndGrad = loss_and_grad) -> torch.Tensor:
    """sum over tokens of cross_entropy(x @ weight.T, labels), ignoring IGNORE labels, `chunk`
    tokens at a time. x: (tokens, hidden); weight: (vocab, hidden); labels: (tokens,)."""
    if chunk < 1:
        raise ValueError(f"a loss chunk holds at least one token, got {chunk}")
    loss: torch.Tensor = _ChunkedCrossEntropy.apply(x, weight, labels, chunk, math)
    return loss
