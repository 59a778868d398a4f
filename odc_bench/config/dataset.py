"""Where the samples' lengths come from: a length profile or real data (conf/dataset/*.yaml)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from odc_bench.config.fields import require


@dataclass(frozen=True, kw_only=True, slots=True)
class DatasetConfig:
    name: str
    # profile: lengths drawn from a named profile (odc_bench/data/profiles.py); jsonl, hf_disk:
    # real data (odc_bench/data/real.py).
    loader: Literal["profile", "jsonl", "hf_disk"] = "profile"
    profile: str | None = None
    path: str | None = None
    field: str | None = None
    text_field: str = "text"
    tokenizer: str | None = None
    split: str | None = "train"
    length_scale: float = 1.0
    num_samples: int | None = None
    cache_dir: str | None = None
    # What the samples' token ids are (data/tokens.py): synthetic progressions, or walks on a
    # seeded Markov chain whose loss floor is known (data/learnable.py), for loss curves.
    tokens: Literal["synthetic", "learnable"] = "synthetic"

    def __post_init__(self) -> None:
        require(self.length_scale > 0, f"dataset.length_scale must be a positive number, got {self.length_scale!r}")
        require(self.num_samples is None or self.num_samples >= 1,
                f"dataset.num_samples must be null or a positive integer, got {self.num_samples!r}")
        require(self.loader != "profile" or self.profile is not None,
                "dataset.profile is null; name a length profile or choose dataset=jsonl or dataset=hf_disk")
