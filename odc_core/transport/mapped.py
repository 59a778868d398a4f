"""A whole gather in one device op and a whole scatter_accumulate in one kernel launch, for heaps
whose peers' buffers are tensors in this process (cuda_ipc, nvshmem).

A gather made of one get per owner costs a slice, a view and a copy launched from Python per
owner: on an H200 a gather of two 8 MiB shards took 35 µs where the device copies in 12
(results/gpu/h200-2026-11-27). Such a heap instead concatenates the owners' mapped shards into
the output with one `torch.cat(out=)`: one launch whatever the number of owners, of the
vectorised copy kernel torch uses for contiguous inputs along their first dimension. The views
of a gather's sources are made once per buffer and set of spans, and kept until the heap closes
(they are views of its own mappings, which hold no other memory).

One op needs every source on the output's device: where a peer's memory lives on another GPU
(cuda_ipc with a GPU per rank) or the output is on the host, each owner's shard is one copy,
which torch makes peer to peer or device to host. The scatter's one launch is atomic_add.py's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from odc_core.transport.atomic_add import SpansAdd, atomic_add_

Span = tuple[int, int, int]  # (owner, start, end): out[start:end] comes from the owner's buffer


@dataclass(frozen=True)
class MappedGather:
    """A gather's sources, in the order of their place in the output, and where they land."""

    sources: tuple[torch.Tensor, ...]
    spans: tuple[Span, ...]
    # The sources tile out[lo:hi] in order (a gather's spans always do; checked, not assumed).
    tiled: bool

    @classmethod
    def of(cls, spans: Sequence[Span], view: Callable[[int, int], torch.Tensor]) -> MappedGather:
        """view(owner, numel): the first `numel` elements of the owner's buffer as mapped here
        (the heap's own checks included)."""
        ordered = tuple(sorted(spans, key=lambda span: span[1]))
        sources = tuple(view(owner, end - start) for owner, start, end in ordered)
        tiled = all(a[2] == b[1] for a, b in zip(ordered, ordered[1:], strict=False))
        return cls(sources, ordered, tiled)

    def one_op(self, out: torch.Tensor) -> bool:
        """Whether one concatenation can fill `out`: the spans tile it and every source is on its
        device."""
        return self.tiled and all(s.device == out.device for s in self.sources)

    def run(self, out: torch.Tensor) -> None:
        """out[start:end] = each source, on the current stream. `out`: flat, contiguous, of the
        sources' dtype."""
        if out.dtype != self.sources[0].dtype:
            raise TypeError(f"gather of {self.sources[0].dtype} shards into a {out.dtype} tensor; dtypes must match")
        lo, hi = self.spans[0][1], self.spans[-1][2]
        if hi > out.numel():
            raise ValueError(f"gather writes elements up to {hi}; the output has {out.numel()}")
        if self.one_op(out):
            torch.cat(self.sources, out=out if (lo, hi) == (0, out.numel()) else out[lo:hi])
            return
        for source, (_, start, end) in zip(self.sources, self.spans, strict=True):
            out[start:end].copy_(source, non_blocking=True)


class SpanOps:
    """A mapped heap's one-sided data ops: single gets and atomic adds into one owner's buffer,
    and whole gathers and scatters (primitives.gather and scatter_accumulate use them where a heap
    has them), each plan made once per buffer and set of spans and kept until the heap closes.
    view(name, owner, offset, numel): a slice of the owner's buffer as mapped here, with the
    heap's own checks."""

    def __init__(self, view: Callable[[str, int, int, int], torch.Tensor], device: torch.device) -> None:
        self._view, self._device = view, device
        self._gathers: dict[tuple[str, tuple[Span, ...]], MappedGather] = {}
        self._pushes: dict[tuple[str, tuple[Span, ...]], SpansAdd] = {}

    def get(self, out: torch.Tensor, name: str, peer: int, offset: int = 0) -> None:
        """out = peer's name[offset:offset + out.numel()], on the current stream."""
        src = self._view(name, peer, offset, out.numel())
        if out.dtype != src.dtype:
            raise TypeError(f"get of {name!r} ({src.dtype}) into a {out.dtype} tensor; dtypes must match")
        out.copy_(src.view(out.shape), non_blocking=True)

    def accumulate(self, name: str, peer: int, offset: int, src: torch.Tensor) -> None:
        """peer's name[offset:offset + src.numel()] += src, atomically."""
        atomic_add_(self._view(name, peer, offset, src.numel()), src.to(self._device, non_blocking=True))

    def get_spans(self, out: torch.Tensor, name: str, spans: tuple[Span, ...]) -> None:
        """out[start:end] = owner's name[:end - start] for each (owner, start, end)."""
        plan = self._gathers.get((name, spans))
        if plan is None:
            plan = self._gathers[(name, spans)] = MappedGather.of(
                spans, lambda owner, numel: self._view(name, owner, 0, numel))
        plan.run(out)

    def accumulate_spans(self, name: str, src: torch.Tensor, spans: tuple[Span, ...]) -> None:
        """owner's name[:end - start] += src[start:end] for each (owner, start, end), atomically."""
        plan = self._pushes.get((name, spans))
        if plan is None:
            plan = self._pushes[(name, spans)] = SpansAdd.of(
                spans, lambda owner, numel: self._view(name, owner, 0, numel), self._device)
        plan.run(src.to(self._device, non_blocking=True))

    def clear(self) -> None:
        """Drop every plan and so the views they hold (the heap closes)."""
        self._gathers, self._pushes = {}, {}
