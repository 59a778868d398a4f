"""Causal attention over a packed microbatch, documents kept apart: which kernel runs, and how.

- `varlen`: one call of torch's variable-length flash kernel (torch.nn.attention.varlen) over
  the whole microbatch, as torchtitan and verl run packed documents. CUDA only, 16-bit only
  (flash kernels take no fp32). Its signature has changed at each release: torch 2.10 asks
  for causal by `is_causal`, 2.11 by `window_size=(-1, 0)`, and neither takes GQA (kv heads
  are repeated); 2.12 added `enable_gqa`. The call reads which one this torch has.
- `sdpa_per_doc`: one scaled_dot_product_attention call per document. On CUDA its inputs are
  4-D (1, heads, tokens, dim), the shape SDPA's efficient and flash kernels take; 3-D inputs
  there fall to its math kernel, whose s x s scores run out of memory at 16K tokens. On CPU the
  call stays as it has always been (3-D), so CPU runs keep their numbers.

Either way compute grows with the sum of squared document lengths, not the packed length's
square. The kernel is chosen once per microbatch from the hidden states' device and dtype and
the head size, and carried by its Documents to every layer; the model records which ran.
varlen_attn hands its inputs to the flash kernel unpadded, and that kernel refuses a head size
over 256 or not a multiple of 8 (pytorch's flash_api.cpp, mha_varlen_fwd): such heads go to
per-document SDPA, which pads them itself, rather than fail inside the first forward.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

KERNELS = ("sdpa_per_doc", "varlen")


@dataclass(frozen=True)
class Documents:
    """Where a packed microbatch's documents lie and the kernel that attends within them: their
    lengths, and for the varlen kernel their cumulative offsets on the device and the longest
    length (built once per microbatch, shared by every layer)."""

    lengths: tuple[int, ...]
    kernel: str = "sdpa_per_doc"
    offsets: torch.Tensor | None = None  # int32, len(lengths) + 1, on the tokens' device
    longest: int = 0

    @classmethod
    def of(cls, lengths: Sequence[int], device: torch.device, kernel: str) -> Documents:
        lengths = tuple(int(n) for n in lengths)
        if kernel != "varlen":
            return cls(lengths, kernel)
        offsets = torch.zeros(len(lengths) + 1, dtype=torch.int32)
        offsets[1:] = torch.tensor(lengths, dtype=torch.int32).cumsum(0)
        if device.type == "cuda":  # from pinned memory: a pageable copy would wait for the stream
            offsets = offsets.pin_memory()
        return cls(lengths, kernel, offsets.to(device, non_blocking=True), max(lengths))


@functools.cache
def varlen_function() -> Callable[..., Any] | None:
    """torch's varlen_attn, or None where this torch has none."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


FLASH_MAX_HEAD_SIZE = 256
FLASH_HEAD_SIZE_MULTIPLE = 8


def flash_takes(head_size: int) -> bool:
    """Whether the varlen flash kernel takes heads of `head_size` channels (module docstring)."""
    return head_size <= FLASH_MAX_HEAD_SIZE and head_size % FLASH_HEAD_SIZE_MULTIPLE == 0


def choose_kernel(device_type: str, dtype: torch.dtype, varlen_available: bool, head_size: int) -> str:
    """varlen on CUDA in 16-bit where torch has it and the flash kernel takes the head size;
    per-document SDPA everywhere else."""
    if (device_type == "cuda" and dtype in (torch.bfloat16, torch.float16) and varlen_available
            and flash_takes(head_size)):
        return "varlen"
    return "sdpa_per_doc"


def kernel_for(x: torch.Tensor, head_size: int) -> str:
    return choose_kernel(x.device.type, x.dtype, varlen_function() is not None, head_size)


@functools.cache
def _parameters(fn: Callable[..., Any]) -> frozenset[str]:
    """fn's parameter names, read once: every layer of every microbatch asks."""
    return frozenset(inspect.signature(fn).parameters)


def varlen(fn: Callable[..., Any], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           docs: Documents) -> torch.Tensor:
    """One varlen call over the microbatch, through whichever signature `fn` has. q: (tokens,
    heads, dim); k, v: (tokens, kv heads, dim)."""
    assert docs.offsets is not None, "Documents.of(..., kernel='varlen') gives the offsets"
    params = _parameters(fn)
    kwargs: dict[str, Any] = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
    if k.shape[1] != q.shape[1]:
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        else:
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    out = fn(q, k, v, docs.offsets, docs.offsets, docs.longest, docs.longest, **kwargs)
    return out[0] if isinstance(out, tuple) else out


def per_document(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs: Documents) -> torch.Tensor:
    """One causal SDPA call per document; 4-D on CUDA (module docstring)."""
    outs = []
    for qd, kd, vd in zip(q.split(docs.lengths), k.split(docs.lengths), v.split(docs.lengths), strict=True):
        if q.is_cuda:
            o = F.scaled_dot_product_attention(qd.transpose(0, 1)[None], kd.transpose(0, 1)[None],
                                               vd.transpose(0, 1)[None], is_causal=True, enable_gqa=True)[0]
        else:
            o = F.scaled_dot_product_attention(qd.transpose(0, 1), kd.transpose(0, 1), vd.transpose(0, 1),
                                               is_causal=True, enable_gqa=True)
        outs.append(o.transpose(0, 1))
    return torch.cat(outs)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs: Documents) -> torch.Tensor:
    """Causal attention within each document with the documents' kernel; (tokens, heads, dim)."""
    if docs.kernel == "varlen":
        fn = varlen_function()
        if fn is None:
            raise RuntimeError("attention kernel varlen needs torch.nn.attention.varlen (torch >= 2.10)")
        return varlen(fn, q, k, v, docs)
    return per_document(q, k, v, docs)
