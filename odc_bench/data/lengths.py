"""The pool of sample lengths a run draws its minibatches from: a profile's draw or real data."""

from __future__ import annotations

import numpy as np

from odc_bench.config.dataset import DatasetConfig
from odc_bench.config.fields import require
from odc_bench.data.profiles import PROFILES, profile_lengths, profile_max_len
from odc_bench.data.real import load_lengths


def dataset_lengths(ds: DatasetConfig, seed: int) -> np.ndarray:
    """The pool's sample lengths, scaled by dataset.length_scale; DataError/ConfigError when unusable."""
    if ds.loader == "profile":
        require(ds.profile in PROFILES,
                f"unknown dataset profile {ds.profile!r}; choose one of {', '.join(sorted(PROFILES))}")
        return profile_lengths(str(ds.profile), ds.length_scale, seed, ds.num_samples)
    raw = load_lengths(ds.loader, ds.path, field=ds.field, text_field=ds.text_field, tokenizer=ds.tokenizer,
                       split=ds.split, cache_dir=ds.cache_dir)
    return np.maximum(2, np.rint(raw[:ds.num_samples] * ds.length_scale)).astype(np.int64)


def dataset_max_len(ds: DatasetConfig, lengths: np.ndarray) -> int:
    """The longest sample the dataset can hold: the paper's default microbatch limit."""
    if ds.loader == "profile":
        return profile_max_len(str(ds.profile), ds.length_scale)
    return int(lengths.max())
