"""dst += src with one atomic add per element: a Triton kernel, for device memory that other
processes add into at the same time (cuda_ipc's and nvshmem's accumulate).

Why atomics, not per-source landing slots the owner reduces at the sync: slots cost the owner
world_size accumulators per shard (the whole model's gradients in fp32 on every rank, at 8
ranks) and a reduction pass over them at every sync, where atomic fp32 adds cost nothing in
memory and run near the device's bandwidth (each element is one L2 atomic, no conflicts within
a push). The price is that concurrent pushes sum in whatever order they land: the sum is exact
for every push (no update lost), not bitwise repeatable from run to run, as with NCCL's
reductions of differently ordered inputs.

Triton is imported on first use: it is on every CUDA machine torch runs on, never needed on CPU.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

_BLOCK = 4096  # elements per program: 16 KiB of fp32 atomics, enough to hide latency


@functools.cache
def _kernel() -> Any:
    try:
        import triton
        import triton.language as tl
    except ImportError as e:
        raise RuntimeError(f"accumulating into CUDA memory needs Triton, which this torch does not have ({e}); "
                           "install the triton that matches your torch") from None

    @triton.jit
    def add(dst, src, n, BLOCK: tl.constexpr):
        # int64: program_id is int32, and a shard past 2**31 elements would wrap its offsets.
        offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        values = tl.load(src + offsets, mask=mask).to(tl.float32)
        tl.atomic_add(dst + offsets, values, mask=mask, sem="relaxed")

    return add


def atomic_add_(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst += src elementwise with atomic adds, on the current CUDA stream. dst: a contiguous fp32
    CUDA tensor (it may live in a peer's mapped memory); src: as many elements, any float dtype,
    on this process's device."""
    if dst.dtype != torch.float32:
        raise TypeError(f"atomic accumulation needs an fp32 destination, got {dst.dtype}")
    if dst.numel() != src.numel():
        raise ValueError(f"destination has {dst.numel()} elements, source {src.numel()}")
    if not dst.is_contiguous():
        raise ValueError("atomic accumulation needs a contiguous destination")
    n = dst.numel()
    if n:
        flat = src.reshape(-1).contiguous()
        _kernel()[(-(-n // _BLOCK),)](dst, flat, n, BLOCK=_BLOCK)
