"""gather and scatter_accumulate: the ODC replacements for all-gather and reduce-scatter.

Both are one-sided: a rank that calls them touches its peers' heap buffers and never waits
for a peer to take part, so ranks that run different amounts of work between minibatch
synchronisations do not wait on each other. Peers are visited in rotated order starting at
rank + 1, so at any moment the ranks work on different owners instead of all on rank 0; a
heap that maps its peers' buffers gathers from all of them in one device op instead
(transport/mapped.py).

The owners of a layout's shards are every rank of the heap, or (hybrid sharding) a group of
them, `owners`: shard i lives on heap rank owners[i], and no other rank is touched.
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
def _shard_spans(rank: int, layout: ShardLayout, total: int,
                 owners: tuple[int, ...] | None) -> tuple[tuple[int, int, int], ...]:
    """(heap rank, start, end) of each owner's part of a flat tensor of `total` elements, in
    rotated order from the shard after this rank's own. Cached: the engine gathers the same
    units every microbatch."""
    here = rank if owners is None else (owners.index(rank) if rank in owners else -1)
    spans = []
    for i in range(1, layout.world_size + 1):
        index = (here + i) % layout.world_size
        start = index * layout.shard_numel
        end = min(start + layout.shard_numel, total)
        if end > start:
            spans.append((index if owners is None else owners[index], start, end))
    return tuple(spans)


def _spans(heap: SymmetricHeap, layout: ShardLayout, total: int, what: str,
           owners: tuple[int, ...] | None) -> tuple[tuple[int, int, int], ...]:
    group = heap.world_size if owners is None else len(owners)
    if layout.world_size != group:
        raise ValueError(f"layout is for {layout.world_size} owners, there are {group}")
    if owners is not None and not all(0 <= r < heap.world_size for r in owners):
        raise ValueError(f"owners {owners} are not all ranks of a heap of {heap.world_size}")
    if total not in (layout.numel, layout.padded_numel):
        raise ValueError(f"{what} has {total} elements; the layout needs {layout.numel} "
                         f"(or {layout.padded_numel} padded)")
    return _shard_spans(heap.rank, layout, total, owners)


def gather(heap: SymmetricHeap, name: str, out: torch.Tensor, layout: ShardLayout,
           owners: tuple[int, ...] | None = None) -> None:
    """out = the concatenation of every rank's `name` buffer (all_gather_into_tensor).

    `out` is the padded size or the unpadded one (layout.numel, e.g. a parameter's own
    storage): only the elements it has room for are fetched. It must be contiguous and of
    the buffer's dtype; every shard lands directly in place, without staging.
    """
    if not out.is_contiguous():
        raise ValueError("gather needs a contiguous output tensor")
    flat = out.view(-1)
    spans = _spans(heap, layout, flat.numel(), "gather output", owners)
    whole = getattr(heap, "get_spans", None)
    if whole is not None:  # a heap that maps its peers' buffers: the gather in one op
        whole(flat, name, spans)
        return
    for owner, start, end in spans:
        heap.get(flat[start:end], name, owner)


def scatter_accumulate(heap: SymmetricHeap, name: str, src: torch.Tensor, layout: ShardLayout,
                       owners: tuple[int, ...] | None = None) -> None:
    """Add each owner's slice of `src` into its `name` accumulator (reduce_scatter_tensor, SUM).

    Unlike the collective, the sum builds up in the owners' persistent buffers as pushes
    arrive; the owner reads it after the minibatch synchronisation. `src` may be shorter
    than the padded size (padding adds nothing) and of lower precision than the accumulator
    (bf16 gradients into fp32). The transport chunks the adds and locks only each chunk.
    """
    flat = src.reshape(-1)
    spans = _spans(heap, layout, flat.numel(), "scatter_accumulate source", owners)
    whole = getattr(heap, "accumulate_spans", None)
    if whole is not None:  # a heap that maps its peers' buffers: every push in one launch
        whole(name, flat, spans)
        return
    for owner, start, end in spans:
        heap.accumulate(name, owner, 0, flat[start:end])
