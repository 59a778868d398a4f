"""Where the samples' lengths come from: a length profile or real data (conf/dataset/*.yaml)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from odc_bench.config.fields import require


@dataclass(frozen=True, kw_only=True, slots=True)
class GrpoConfig:
    """dataset=grpo: a GRPO workload's lengths, prompts answered by groups of responses.

    The defaults and which of them the paper publishes: odc_bench/data/rl.py. A PPO minibatch
    is world_size x minibatch_size samples of whole groups, so it holds that many / group_size
    prompts.
    """

    group_size: int = 16  # G, verl's rollout.n
    num_prompts: int = 512  # prompts in the pool (one training batch)
    mean_sample: float = 9_000  # tokens, prompt plus response
    max_response_length: int = 16_384  # the generation limit
    clip_fraction: float = 0.10  # share of responses cut at the limit
    group_correlation: float = 0.5  # share of a response's log-variance its group shares
    prompt_median: float = 160
    prompt_sigma: float = 0.4
    min_prompt_length: int = 32
    max_prompt_length: int = 1_024

    def __post_init__(self) -> None:
        for key in ("group_size", "num_prompts", "max_response_length", "min_prompt_length"):
            value = getattr(self, key)
            require(value >= 1, f"dataset.grpo.{key} must be at least 1, got {value}")
        require(self.min_prompt_length <= self.max_prompt_length,
                f"dataset.grpo.min_prompt_length ({self.min_prompt_length}) must be at most "
                f"dataset.grpo.max_prompt_length ({self.max_prompt_length})")
        require(0 < self.clip_fraction < 1,
                f"dataset.grpo.clip_fraction must lie strictly between 0 and 1, got {self.clip_fraction}")
        require(0 <= self.group_correlation <= 1,
                f"dataset.grpo.group_correlation must lie between 0 and 1, got {self.group_correlation}")
        require(self.prompt_median > 0 and self.prompt_sigma >= 0,
                f"dataset.grpo.prompt_median must be positive and prompt_sigma at least 0, got "
                f"{self.prompt_median} and {self.prompt_sigma}")


@dataclass(frozen=True, kw_only=True, slots=True)
class DatasetConfig:
    name: str
    # profile: lengths drawn from a named profile (odc_bench/data/profiles.py); jsonl, hf_disk:
    # real data (odc_bench/data/real.py); grpo: prompts x groups of responses (data/rl.py).
    loader: Literal["profile", "jsonl", "hf_disk", "grpo"] = "profile"
    profile: str | None = None
    path: str | None = None
    field: str | None = None
    text_field: str = "text"
    tokenizer: str | None = None
    split: str | None = "train"
    length_scale: float = 1.0
    num_samples: int | None = None
    cache_dir: str | None = None
    # What the samples' token ids are (data/tokens.py): the data's own (jsonl, hf_disk sources
    # that give ids; data/ids.py), synthetic progressions, or walks on a seeded Markov chain whose
    # loss floor is known (data/learnable.py), for loss curves. null: the data's own where the
    # source gives ids at their own lengths (length_scale 1), synthetic otherwise; a planned run
    # records what it resolved to.
    tokens: Literal["data", "synthetic", "learnable"] | None = None
    grpo: GrpoConfig | None = None

    def __post_init__(self) -> None:
        require(self.length_scale > 0, f"dataset.length_scale must be a positive number, got {self.length_scale!r}")
        require(self.num_samples is None or self.num_samples >= 1,
                f"dataset.num_samples must be null or a positive integer, got {self.num_samples!r}")
        require(self.loader != "profile" or self.profile is not None,
                "dataset.profile is null; name a length profile or choose dataset=jsonl or dataset=hf_disk")
        require(self.loader != "grpo" or self.grpo is not None,
                "dataset.loader=grpo needs the dataset.grpo section; use dataset=grpo")
        require(self.tokens != "data" or self.loader in ("jsonl", "hf_disk"),
                f"dataset.tokens=data trains on a file's token ids, but dataset={self.name} has none; choose "
                f"dataset=jsonl or dataset=hf_disk, or dataset.tokens=synthetic")
        require(self.tokens != "data" or self.length_scale == 1,
                f"dataset.tokens=data trains on the data's ids as they are, which dataset.length_scale="
                f"{self.length_scale:g} would change; set dataset.length_scale=1, or dataset.tokens=synthetic")
        require(self.loader != "grpo" or self.num_samples is None,
                "dataset.num_samples does not apply to dataset=grpo (its pool is whole groups); "
                "set dataset.grpo.num_prompts instead")
