"""A real source's own token ids as a run's tokens (dataset.tokens=data): which ids a run
trains on, the check that the model can embed them, and the ranks' reader.

The ids come from the caches beside the lengths (data/real.py); every rank maps the ids file
and copies out only the samples it trains on, so no rank reads the source again.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from odc_bench.config.dataset import DatasetConfig
from odc_bench.data.real import Pool, load_pool
from odc_bench.errors import DataError

if TYPE_CHECKING:
    import torch


def real_pool(ds: DatasetConfig) -> Pool:
    return load_pool(ds.loader, ds.path, field=ds.field, text_field=ds.text_field, tokenizer=ds.tokenizer,
                     split=ds.split, cache_dir=ds.cache_dir)


def check_vocabulary(pool: Pool, num_samples: int | None, vocab_size: int) -> None:
    """DataError naming the first sample (its line or row) with an id the model has no embedding for."""
    starts = np.cumsum(pool.raw_lengths) - pool.raw_lengths
    # the ids out of range first (almost always none), then which of them a run can draw
    bad = np.flatnonzero(np.asarray(pool.ids) >= vocab_size)
    raw_of = np.searchsorted(starts, bad, side="right") - 1
    drawn = np.isin(raw_of, pool.usable[:num_samples])
    if not drawn.any():
        return
    first, raw = int(bad[drawn][0]), int(raw_of[drawn][0])
    sample = int(np.searchsorted(pool.usable, raw))
    raise DataError(f"{pool.where(sample)}: token id {int(pool.ids[first])} at position {first - int(starts[raw])} "
                    f"is outside the model's vocabulary (model.vocab_size={vocab_size}: ids 0 to {vocab_size - 1}); "
                    f"tokenize with the model's tokenizer or choose a model with a larger vocabulary, or train on "
                    f"synthetic ids of the same lengths with dataset.tokens=synthetic")


def resolve_tokens(ds: DatasetConfig, vocab_size: int, check_ids: bool = True) -> DatasetConfig:
    """The dataset with `tokens` decided (see DatasetConfig.tokens); DataError when the ids cannot be
    trained on (against the vocabulary only with `check_ids`)."""
    if ds.tokens not in (None, "data"):
        return ds
    pool = real_pool(ds) if ds.loader in ("jsonl", "hf_disk") else None
    if ds.tokens is None:
        use_data = pool is not None and pool.has_ids and ds.length_scale == 1
        if not use_data:
            return replace(ds, tokens="synthetic")
    assert pool is not None, "DatasetConfig refuses tokens=data without a real source"
    if not pool.has_ids:
        raise DataError(f"{pool.source} gives token counts, not ids, so dataset.tokens=data has nothing to train "
                        f"on; give every sample as a list of ids (dataset=hf_disk: with dataset.tokenizer), or "
                        f"set dataset.tokens=synthetic")
    if check_ids:
        check_vocabulary(pool, ds.num_samples, vocab_size)
    return replace(ds, tokens="data")


class DataTokens:
    """The TokenSource of dataset.tokens=data: sample i of the pool is its own ids (seed and vocabulary
    play no part; the vocabulary was checked when the run was planned)."""

    def __init__(self, ds: DatasetConfig) -> None:
        pool = real_pool(ds)
        self.ids, self.starts, self.lengths = pool.ids, pool.starts, pool.lengths

    def __call__(self, seed: int, sample_index: int, length: int, vocab_size: int) -> torch.Tensor:
        if length != self.lengths[sample_index]:
            raise ValueError(f"sample {sample_index} has {self.lengths[sample_index]} ids, asked for {length}")
        import torch  # here: resolving a run's dataset never needs it, only a rank reading ids

        return torch.from_numpy(np.array(self.sample(sample_index), dtype=np.int64))

    def sample(self, sample_index: int) -> np.ndarray:
        """The usable sample's ids, as the source stores them (a view of the ids file)."""
        start = int(self.starts[sample_index])
        return self.ids[start:start + int(self.lengths[sample_index])]
