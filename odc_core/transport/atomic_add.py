"""dst += src with one atomic add per element: Triton kernels, for device memory that other
processes add into at the same time (cuda_ipc's and nvshmem's accumulate, and their whole
scatter_accumulate as one launch).

Why atomics, not per-source landing slots the owner reduces at the sync: slots cost the owner
world_size accumulators per shard (the whole model's gradients in fp32 on every rank, at 8
ranks) and a reduction pass over them at every sync, where atomic fp32 adds cost nothing in
memory and run near the device's bandwidth (each element is one L2 atomic, no conflicts within
a push). The price is that concurrent pushes sum in whatever order they land: the sum is exact
for every push (no update lost), not bitwise repeatable from run to run, as with NCCL's
reductions of differently ordered inputs.

A whole scatter_accumulate is one launch of a second kernel (SpansAdd), which reads each
owner's destination address from a small table on the device: on an H200 a scatter of one
launch per owner took 44 to 46 µs from 1 to 16 MiB (results/gpu/h200-2026-11-27), its time
set by the host's work per owner, not by its bytes.

Triton is imported on first use: it is on every CUDA machine torch runs on, never needed on CPU.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

_BLOCK = 4096  # elements per program: 16 KiB of fp32 atomics, enough to hide latency


def _require_triton() -> None:
    try:
        import triton  # noqa: F401
    except ImportError as e:
        raise RuntimeError(f"accumulating into CUDA memory needs Triton, which this torch does not have ({e}); "
                           "install the triton that matches your torch") from None


@functools.cache
def _kernel() -> Any:
    _require_triton()
    import triton
    import triton.language as tl

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


@functools.cache
def _spans_kernel() -> Any:
    _require_triton()
    import triton
    import triton.language as tl

    @triton.jit
    def add_spans(addresses, starts, lengths, first_blocks, src, SEGMENTS: tl.constexpr, BLOCK: tl.constexpr):
        # Which destination this program adds into: the last whose first block is at or before it
        # (a handful of owners, so a loop, not a table per block). Their number is a compile-time
        # constant, a kernel per group size: as a run-time value, Triton 3.6's interpreter (torch
        # 2.11's) cannot take it as a loop bound under NumPy 2.5, which the CPU tests run on.
        pid = tl.program_id(0)
        seg = pid * 0  # an int32 from the start: Triton keeps a loop-carried value's type
        for s in range(1, SEGMENTS):
            seg += (pid >= tl.load(first_blocks + s)).to(tl.int32)
        offsets = (pid - tl.load(first_blocks + seg)) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < tl.load(lengths + seg)
        dst = tl.load(addresses + seg).to(tl.pointer_type(tl.float32))
        values = tl.load(src + tl.load(starts + seg) + offsets, mask=mask).to(tl.float32)
        tl.atomic_add(dst + offsets, values, mask=mask, sem="relaxed")

    return add_spans


@dataclass(frozen=True)
class SpansAdd:
    """A scatter_accumulate's destinations as one kernel's table: for each (owner, start, end),
    owner's accumulator[:end - start] += src[start:end], every owner in one launch."""

    destinations: tuple[torch.Tensor, ...]  # kept: the table holds their addresses
    table: torch.Tensor  # int64, on the device, a row each: addresses, starts, lengths, first blocks
    blocks: int
    end: int  # the source elements the spans reach

    @classmethod
    def of(cls, spans: Sequence[tuple[int, int, int]], view: Callable[[int, int], torch.Tensor],
           device: torch.device) -> SpansAdd:
        """view(owner, numel): the first `numel` elements of the owner's accumulator as mapped
        here (the heap's own checks included)."""
        destinations = tuple(view(owner, end - start) for owner, start, end in spans)
        for dst in destinations:
            if dst.dtype != torch.float32:
                raise TypeError(f"atomic accumulation needs an fp32 destination, got {dst.dtype}")
            if not dst.is_contiguous():
                raise ValueError("atomic accumulation needs a contiguous destination")
        lengths = [end - start for _, start, end in spans]
        firsts = [0]
        for n in lengths:
            firsts.append(firsts[-1] + -(-n // _BLOCK))
        table = torch.tensor([[d.data_ptr() for d in destinations], [start for _, start, _ in spans], lengths,
                              firsts[:-1]], dtype=torch.int64).to(device)
        return cls(destinations, table, firsts[-1], max(end for _, _, end in spans))

    def run(self, src: torch.Tensor) -> None:
        """Add the spans of `src` (flat, any float dtype, on the table's device), on the current stream."""
        if src.numel() < self.end:
            raise ValueError(f"the pushes read source elements up to {self.end}; the source has {src.numel()}")
        flat = src.reshape(-1).contiguous()
        _spans_kernel()[(self.blocks,)](self.table[0], self.table[1], self.table[2], self.table[3], flat,
                                        SEGMENTS=self.table.shape[1], BLOCK=_BLOCK)
