"""The symmetric-heap protocol every transport implements (CPU shared memory, CUDA).

A symmetric heap is a set of named buffers that every rank allocates with the same shape
and dtype, in the same order. After allocation any rank can read a peer's buffer (get) or
add into it (accumulate) without the peer taking part: this is what lets ranks progress
independently between minibatch synchronisations.

Ordering: a rank's one-sided operations are complete when they return (or after quiet() for
transports that may return early). Flags written with store() become visible to peers after
the data written before them (TSO on x86; transports on weaker memory models fence).
"""

from __future__ import annotations

from typing import Protocol

import torch


class PeerTimeout(TimeoutError):
    """A wait on a peer outlived its timeout; the message names the peer and what was awaited."""

    def __init__(self, peer: int, what: str, timeout_s: float) -> None:
        super().__init__(f"timed out after {timeout_s:.1f}s waiting for rank {peer}: {what}")
        self.peer, self.what, self.timeout_s = peer, what, timeout_s


class SymmetricHeap(Protocol):
    rank: int
    world_size: int
    # Bytes of heap this rank owns (its own buffers, not its mappings of peers').
    heap_bytes: int

    def alloc(self, name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """Collective over ranks: allocate `name` (zero-filled) on every rank and return this
        rank's buffer, flat. Returns only once every peer's buffer can be reached."""
        ...

    def get(self, out: torch.Tensor, name: str, peer: int, offset: int = 0) -> None:
        """One-sided read: out[:] = peer's name[offset : offset + out.numel()]. Same dtype."""
        ...

    def accumulate(self, name: str, peer: int, offset: int, src: torch.Tensor) -> None:
        """One-sided add: peer's name[offset : offset + src.numel()] += src, in the buffer's
        dtype (src may be lower precision). Exactly once, safe while other ranks add into the
        same region concurrently, no participation by the peer."""
        ...

    def fetch_add(self, name: str, peer: int, index: int, value: int = 1) -> int:
        """Atomically add `value` to element `index` of peer's int64 buffer; return the old value."""
        ...

    def store(self, name: str, index: int, value: int) -> None:
        """Write element `index` of this rank's own int64 buffer (a flag peers may wait on)."""
        ...

    def load(self, name: str, peer: int, index: int) -> int:
        """Read element `index` of peer's int64 buffer."""
        ...

    def wait_until(self, name: str, peer: int, index: int, at_least: int, timeout_s: float) -> None:
        """Block until peer's int64 name[index] >= at_least; raise PeerTimeout naming the peer."""
        ...

    def quiet(self) -> None:
        """Complete every one-sided operation this rank has issued."""
        ...

    def barrier(self, timeout_s: float) -> None:
        """Control-plane barrier over all ranks; PeerTimeout names a rank that did not arrive."""
        ...

    def close(self) -> None:
        """Unmap peers and remove this rank's segments. Idempotent."""
        ...


# A heap that maps its peers' buffers into this process (cuda_ipc, nvshmem) also offers
#     get_spans(out, name, spans): out[start:end] = owner's name[:end - start], and
#     accumulate_spans(name, src, spans): owner's name[:end - start] += src[start:end],
# for every (owner, start, end) of spans: a whole gather in one device op and a whole
# scatter_accumulate in one kernel launch (transport/mapped.py); primitives.py uses them where
# present. Not protocol methods: the host transports do one get or accumulate per owner.
