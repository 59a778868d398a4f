"""gather and scatter_accumulate: the ODC replacements for all-gather and reduce-scatter.

Both are one-sided: a rank that calls them touches its peers' heap buffers and never waits
for a peer to take part, so ranks that run different amounts of work between minibatch
synchronisations do not wait on each other. Peers are visited in rotated order starting at
rank + 1, so at any moment the ranks work on different owners instead of all on rank 0.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from odc_core.transport.base import SymmetricHeap


@dataclass(frozen=True)
class ShardLayout:
    """How a flat tensor of `numel` elements is split over `world_size` owners.

    Like FSDP's flat parameter: every owner holds ceil(numel / world_size) elements and the
    last shards are padded, so every rank allocates the same heap buffer size.
    """

    numel: int
    world_size: int

    def __post_init__(self) -> None:
        if self.numel < 1 or self.world_size < 1:
            raise ValueError(f"ShardLayout needs numel >= 1 and world_size >= 1, got {self.numel}, {self.world_size}")

    @property
    def shard_numel(self) -> int:
        return -(-self.numel // self.world_size)

    @property
    def padded_numel(self) -> int:
        return self.shard_numel * self.world_size

    def bounds(self, rank: int) -> tuple[int, int]:
        """The elements of the unpadded tensor that `rank` owns (empty for a pure padding shard)."""
        start = min(rank * self.shard_numel, self.numel)
        return start, min(start + self.shard_numel, self.numel)


@functools.lru_cache(maxsize=4096)
def _shard_spans(rank: int, layout: ShardLayout, total: int) -> tuple[tuple[int, int, int], ...]:
    """(owner, start, end) of each owner's part of a flat tensor of `total` elements, in rotated
    order from rank + 1. Cached: the engine gathers the same units every microbatch."""
    spans = []
    for i in range(1, layout.world_size + 1):
        owner = (rank + i) % layout.world_size
        start = owner * layout.shard_numel
        end = min(start + layout.shard_numel, total)
        if end > start:
            spans.append((owner, start, end))
    return tuple(spans)


def _spans(heap: SymmetricHeap, layout: ShardLayout, total: int, what: str) -> tuple[tuple[int, int, int], ...]:
    if layout.world_size != heap.world_size:
        raise ValueError(f"layout is for {layout.world_size} ranks, the heap has {heap.world_size}")
    if total not in (layout.numel, layout.padded_numel):
        raise ValueError(f"{what} has {total} elements; the layout needs {layout.numel} "
                         f"(or {layout.padded_numel} padded)")
    return _shard_spans(heap.rank, layout, total)


def gather(heap: SymmetricHeap, name: str, out: torch.Tensor, layout: ShardLayout) -> None:
    """out = the concatenation of every rank's `name` buffer (all_gather_into_tensor).

    `out` is the padded size or the unpadded one (layout.numel, e.g. a parameter's own
    storage): only the elements it has room for are fetched. It must be contiguous and of
    the buffer's dtype; every shard lands directly in place, without staging.
    """
    if not out.is_contiguous():
        raise ValueError("gather needs a contiguous output tensor")
    flat = out.view(-1)
    for owner, start, end in _spans(heap, layout, flat.numel(), "gather output"):
        heap.get(flat[start:end], name, owner)


def scatter_accumulate(heap: SymmetricHeap, name: str, src: torch.Tensor, layout: ShardLayout) -> None:
    """Add each owner's slice of `src` into its `name` accumulator (reduce_scatter_tensor, SUM).

    Unlike the collective, the sum builds up in the owners' persistent buffers as pushes
    arrive; the owner reads it after the minibatch synchronisation. `src` may be shorter
    than the padded size (padding adds nothing) and of lower precision than the accumulator
    (bf16 gradients into fp32). The transport chunks the adds and locks only each chunk.
    """
    flat = src.reshape(-1)
    for owner, start, end in _spans(heap, layout, flat.numel(), "scatter_accumulate source"):
        heap.accumulate(name, owner, 0, flat[start:end])
