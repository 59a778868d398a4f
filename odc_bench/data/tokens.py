"""Seeded synthetic token ids with enough structure for the loss to fall.

Each sample is an arithmetic progression modulo the vocabulary with a sample-specific step,
with 10% of positions replaced by random tokens. A model can learn to continue the
progression from context, so loss curves mean something; ids depend only on (seed, sample
index, length), never on which rank processes the sample.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from odc_bench.config.dataset import DatasetConfig


def sample_tokens(seed: int, sample_index: int, length: int, vocab_size: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed((seed * 1_000_003 + sample_index) % (2**63 - 1))
    start = torch.randint(vocab_size, (1,), generator=gen)
    step = torch.randint(1, 9, (1,), generator=gen)
    ids = (start + step * torch.arange(length)) % vocab_size
    noise = torch.rand(length, generator=gen) < 0.1
    ids[noise] = torch.randint(vocab_size, (int(noise.sum()),), generator=gen)
    return ids


# (seed, sample index, length, vocabulary size) -> the sample's token ids
TokenSource = Callable[[int, int, int, int], torch.Tensor]


def token_source(ds: DatasetConfig) -> TokenSource:
    """The ids dataset.tokens names: `synthetic` (above), `learnable` (data/learnable.py) or `data`
    (the source's own, data/ids.py; a planned run's config has `tokens` decided)."""
    if ds.tokens == "data":
        from odc_bench.data.ids import DataTokens

        return DataTokens(ds)
    if ds.tokens == "learnable":
        from odc_bench.data.learnable import learnable_tokens

        return learnable_tokens
    return sample_tokens
