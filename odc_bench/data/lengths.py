"""The pool of sample lengths a run draws its minibatches from, and which samples each minibatch takes.

The pool is a profile's draw, real data, or a GRPO workload's groups; minibatches are a seeded
permutation of the pool read in order, or, for GRPO, whole groups (data/rl.py).
"""

from __future__ import annotations

from decimal import Decimal

import numpy as np

from odc_bench.config.dataset import DatasetConfig
from odc_bench.config.fields import require
from odc_bench.data.profiles import PROFILES, profile_lengths, profile_max_len
from odc_bench.data.real import COUNT_LIMIT, load_lengths
from odc_bench.data.rl import group_minibatches, grpo_lengths, grpo_max_len
from odc_bench.sizes import host_available_bytes, size_label

# What each sample takes at the least while a pool is drawn (the profiles and GRPO hold a few
# arrays of the pool at once), and once drawn into a minibatch and planned (its id and length in
# lists, its share of the plans); tests/unit/test_sim_memory.py checks that neither takes less.
# A size whose least is over this host's memory is refused before numpy's allocation fails or a
# list grows until the kernel kills the process.
POOL_SAMPLE_BYTES = 24
DRAWN_SAMPLE_BYTES = 128


def require_room(count: int, bytes_each: int, what: str, fix: str) -> None:
    """ConfigError, one line, when `count` items of at least `bytes_each` bytes each are more than
    this host's available memory: their allocation would end in a traceback, or a list of them
    would grow until the kernel kills the process."""
    need, have = count * bytes_each, host_available_bytes()
    require(need <= have, f"{what} takes at least {size_label(need)} of memory, more than the {size_label(have)} this "
                          f"host has available; {fix}")


def _require_scaled_counts(longest: int, scale: float) -> None:
    """ConfigError, one line, when the scale makes a sample as long as no sample can be (the token
    count readers' limit), where the scaled counts overflowed int64 or float."""
    top = longest * scale
    require(top < COUNT_LIMIT, f"dataset.length_scale={scale} makes samples of up to {top:.4g} tokens, beyond any "
                               f"sequence a model takes (counts are below {COUNT_LIMIT}); lower dataset.length_scale")


def dataset_lengths(ds: DatasetConfig, seed: int) -> np.ndarray:
    """The pool's sample lengths, scaled by dataset.length_scale; DataError/ConfigError when unusable."""
    if ds.loader == "profile":
        require(ds.profile in PROFILES,
                f"unknown dataset profile {ds.profile!r}; choose one of {', '.join(sorted(PROFILES))}")
        count = ds.num_samples or PROFILES[str(ds.profile)].num_samples
        require_room(count, POOL_SAMPLE_BYTES, f"a pool of dataset.num_samples={count} samples",
                     "lower dataset.num_samples")
        _require_scaled_counts(PROFILES[str(ds.profile)].max_len, ds.length_scale)
        return profile_lengths(str(ds.profile), ds.length_scale, seed, ds.num_samples)
    if ds.loader == "grpo":
        assert ds.grpo is not None, "DatasetConfig refuses loader=grpo without its section"
        g, prompts = ds.grpo.group_size, ds.grpo.num_prompts
        require_room(prompts * g, POOL_SAMPLE_BYTES, f"a pool of dataset.grpo.num_prompts x group_size = {prompts} x "
                     f"{g} samples", "lower dataset.grpo.num_prompts or dataset.grpo.group_size")
        _require_scaled_counts(grpo_max_len(ds.grpo), ds.length_scale)
        return grpo_lengths(seed, ds.grpo, ds.length_scale)
    raw = load_lengths(ds.loader, ds.path, field=ds.field, text_field=ds.text_field, tokenizer=ds.tokenizer,
                       split=ds.split, cache_dir=ds.cache_dir)
    _require_scaled_counts(int(raw[:ds.num_samples].max()), ds.length_scale)
    return np.maximum(2, np.rint(raw[:ds.num_samples] * ds.length_scale)).astype(np.int64)


def dataset_max_len(ds: DatasetConfig, lengths: np.ndarray) -> int:
    """The longest sample the dataset can hold: the paper's default microbatch limit."""
    if ds.loader == "profile":
        return profile_max_len(str(ds.profile), ds.length_scale)
    if ds.loader == "grpo":
        assert ds.grpo is not None
        return grpo_max_len(ds.grpo, ds.length_scale)
    return int(lengths.max())


def microbatch_limit(ds: DatasetConfig, lengths: np.ndarray, max_tokens: int | None, packing_ratio: float) -> int:
    """The microbatch token limit: max_tokens, or the dataset's longest sample x packing_ratio (the
    paper's default); ConfigError, one line, for one below 2 or as long as no device holds."""
    key, how = "max_tokens", "max_tokens"
    if max_tokens is None:
        max_tokens = int(dataset_max_len(ds, lengths) * packing_ratio)
        key, how = "packing_ratio", f"the longest sample x packing_ratio={packing_ratio}"
    require(max_tokens >= 2, f"max_tokens must be null or an integer >= 2, got {max_tokens}")
    shown = max_tokens if max_tokens < 10**20 else f"{Decimal(max_tokens):.3e}"  # packing_ratio=1e300: 300 digits
    require(max_tokens < COUNT_LIMIT, f"a microbatch limit of {shown} tokens ({how}) is beyond what any device holds "
                                      f"(limits are below {COUNT_LIMIT}); lower {key}")
    return max_tokens


def reuse_note(pool_size: int, drawn: int) -> str:
    """How often a run's draws reuse each sample of its pool, or "" when none is drawn twice."""
    if drawn <= pool_size:
        return ""
    return f"each used {drawn / pool_size:.3g} times on average"


def minibatch_samples(ds: DatasetConfig, pool_size: int, global_size: int, num_minibatches: int,
                      seed: int) -> list[list[int]]:
    """Sample ids of each minibatch; ConfigError when a minibatch cannot be drawn from the pool, or
    the draws are more than this host's memory holds.

    A seeded permutation of the pool, read in order and wrapping around; for GRPO whole groups
    (a PPO minibatch is prompts x G, GRPO's advantages being normalised within a group).
    """
    if ds.loader == "grpo":
        assert ds.grpo is not None
        g, prompts = ds.grpo.group_size, ds.grpo.num_prompts
        require(global_size % g == 0,
                f"dataset=grpo draws whole groups of dataset.grpo.group_size={g} responses, but a minibatch of "
                f"world_size x minibatch_size = {global_size} samples is not a multiple of {g}; choose minibatch_size "
                f"so that world_size x minibatch_size divides by {g}")
        require(global_size // g <= prompts,
                f"a minibatch of {global_size} samples needs {global_size // g} prompts, more than "
                f"dataset.grpo.num_prompts={prompts}; raise dataset.grpo.num_prompts or lower minibatch_size")
        _require_draw_room(global_size, num_minibatches)
        return group_minibatches(prompts, g, global_size // g, num_minibatches, seed)
    more = (f"raise dataset.num_samples to at least {global_size} (the profile's pool)" if ds.loader == "profile" else
            f"give data with at least {global_size} samples (dataset.num_samples only takes the first N of them, it "
            f"adds none)")
    if ds.loader == "jsonl" and pool_size == 1:
        # The likeliest one-sample file: token counts written as one JSON array, which is a line
        # of token ids.
        more += "; a line holding one JSON array of numbers is one sample's token ids: write token counts one per line"
    require(pool_size >= global_size,
            f"the dataset has {pool_size} usable sample{'s' * (pool_size != 1)}, fewer than one minibatch of "
            f"world_size x minibatch_size = {global_size}; lower minibatch_size or world_size until their product "
            f"is at most {pool_size}, or {more}")
    _require_draw_room(global_size, num_minibatches)
    order = np.random.default_rng(seed + 1).permutation(pool_size)
    return order[np.arange(num_minibatches * global_size) % pool_size].reshape(num_minibatches, global_size).tolist()


def _require_draw_room(global_size: int, num_minibatches: int) -> None:
    require_room(num_minibatches * global_size, DRAWN_SAMPLE_BYTES, f"planning num_minibatches={num_minibatches} "
                 f"minibatches of world_size x minibatch_size = {global_size} samples", "lower num_minibatches")
