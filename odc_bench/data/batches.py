"""From samples to what a model trains on: packed microbatches and their labelled tokens.

A packed microbatch is one flat token stream holding several documents; positions restart per
document, and no document learns from its neighbour.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def packed_batch(docs: Sequence[torch.Tensor]) -> dict[str, object]:
    """Pack token sequences into one microbatch: ids, restarting positions, labels, doc lengths.

    Labels are the next token inside the same document; the last token of each document has
    no label (-100).
    """
    import torch  # here: planning reads labelled_tokens, and the simulator never imports torch

    lens = [int(d.numel()) for d in docs]
    input_ids = torch.cat(list(docs))
    position_ids = torch.cat([torch.arange(n) for n in lens])
    labels = torch.cat([torch.cat([d[1:], torch.tensor([-100], dtype=d.dtype)]) for d in docs])
    return dict(input_ids=input_ids, position_ids=position_ids, labels=labels, doc_lens=lens)


def on_device(batch: dict[str, object], device: torch.device) -> dict[str, object]:
    """A packed microbatch's tensors on `device`. To CUDA they go from pinned memory without a
    wait: a copy from pageable memory makes the host wait for every kernel already queued on
    the stream (the previous microbatch's backward), so the host could never run ahead of the
    device across microbatches. torch's caching host allocator keeps the pinned source alive
    until its copy has run."""
    import torch

    if device.type != "cuda":
        return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
    return {k: v.pin_memory().to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


def labelled_tokens(lengths: Sequence[int]) -> int:
    """Tokens that carry a loss term: every token but the last of each document."""
    return sum(n - 1 for n in lengths)
