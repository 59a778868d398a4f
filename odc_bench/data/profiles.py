"""Sequence-length profiles of the paper's datasets.

The paper publishes summary numbers and plots (Fig. 7), not the per-sample lengths, so each
profile is a log-normal fitted to those numbers and bounded to the dataset's range. The
shape parameter (sigma) is our assumption, chosen to match the published plots' skew; load
the real data (odc_bench.data.real) when exact lengths matter.

| profile   | source numbers                                   | fitted here                          |
|-----------|--------------------------------------------------|--------------------------------------|
| longalign | LongAlign-10k: mean ~16.5K tokens, max 64K       | sigma 0.60, truncated to [1K, 64K]   |
| swe_smith | SWE-smith trajectories: mean ~34.7K, mode ~18K,  | sigma 0.66, truncated to [2K, 128K]  |
|           | long tail past 100K                              |                                      |
| aime      | AIME RL rollouts: mean ~9K, less long-tailed;    | sigma 0.45, clipped to [512, 16K]:   |
|           | responses stop at the generation limit           | overlong responses pile up at 16K    |
| fixed     | (control) every sample at LongAlign's 64K maximum | no spread: the balanced workload     |
| pareto    | (synthetic) a heavy power-law tail: what the     | Pareto, tail index 1.2, truncated to |
|           | minibatch barrier costs most on (stale-synch-    | [2K, 128K]: mean ~7.0K, median ~3.6K,|
|           | ronous ODC, docs/staleness.md)                   | p99 ~66K                             |

The pareto profile has no published source: P(length > x) falls as x^-1.2 from 2K tokens to
SWE-smith's 128K limit, so most samples are short and a few are up to 64 times the shortest;
at the paper's golden setting (8 ranks, 4 samples each, the 1.5B quadratic cost) the
per-minibatch lower bound alone idles about 68% of rank-time, against LongAlign's 8%
(`python -m odc_bench.tools.balancer_report --profile pareto`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LengthProfile:
    name: str
    mean: float
    sigma: float
    min_len: int
    max_len: int
    num_samples: int
    # "truncate": draws outside the range are redrawn (SFT corpora filtered by length);
    # "clip": draws above the range are cut to max_len (RL responses hitting the limit).
    bound: str = "truncate"
    # > 0: a Pareto distribution with this tail index on [min_len, max_len] instead of the
    # log-normal (mean and sigma then only describe it).
    tail_index: float = 0.0

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        if self.tail_index > 0:
            # Inverse CDF of the Pareto truncated to [min_len, max_len].
            a, b, alpha = self.min_len, self.max_len, self.tail_index
            u = rng.random(n)
            return np.rint(a / (1 - u * (1 - (a / b) ** alpha)) ** (1 / alpha)).astype(np.int64)
        if self.sigma == 0:
            return np.full(n, round(self.mean), dtype=np.int64)
        mu = self._fit_mu()
        if self.bound == "clip":
            x = rng.lognormal(mu, self.sigma, n)
            return np.clip(np.rint(x), self.min_len, self.max_len).astype(np.int64)
        out = np.empty(0)
        while out.size < n:
            x = rng.lognormal(mu, self.sigma, 2 * n)
            out = np.concatenate([out, x[(x >= self.min_len) & (x <= self.max_len)]])
        return np.rint(out[:n]).astype(np.int64)

    def _fit_mu(self) -> float:
        """The log-mean whose bounded distribution has the published mean (bisection)."""
        lo, hi = math.log(self.min_len), math.log(self.max_len)
        for _ in range(60):
            mid = (lo + hi) / 2
            if self._bounded_mean(mid) < self.mean:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    def _bounded_mean(self, mu: float) -> float:
        grid = np.exp(np.linspace(mu - 8 * self.sigma, mu + 8 * self.sigma, 20001))
        pdf = np.exp(-((np.log(grid) - mu) ** 2) / (2 * self.sigma**2)) / grid
        w = pdf * np.gradient(grid)
        if self.bound == "clip":
            return float((np.clip(grid, self.min_len, self.max_len) * w).sum() / w.sum())
        inside = (grid >= self.min_len) & (grid <= self.max_len)
        return float((grid[inside] * w[inside]).sum() / w[inside].sum())


def pareto_mean(low: int, high: int, alpha: float) -> float:
    """The mean of a Pareto distribution with tail index alpha truncated to [low, high]."""
    tail = 1 - (low / high) ** alpha
    if alpha == 1:
        return low * math.log(high / low) / tail
    return alpha * low**alpha / tail * (low ** (1 - alpha) - high ** (1 - alpha)) / (alpha - 1)


PROFILES: dict[str, LengthProfile] = {
    "longalign": LengthProfile("longalign", mean=16_500, sigma=0.60, min_len=1_024, max_len=65_536,
                               num_samples=10_000),
    "swe_smith": LengthProfile("swe_smith", mean=34_700, sigma=0.66, min_len=2_048, max_len=131_072,
                               num_samples=5_000),
    "aime": LengthProfile("aime", mean=9_000, sigma=0.45, min_len=512, max_len=16_384,
                          num_samples=8_192, bound="clip"),
    "fixed": LengthProfile("fixed", mean=65_536, sigma=0.0, min_len=65_536, max_len=65_536, num_samples=1_024),
    "pareto": LengthProfile("pareto", mean=pareto_mean(2_048, 131_072, 1.2), sigma=0.0, min_len=2_048,
                            max_len=131_072, num_samples=8_192, tail_index=1.2),
}


def profile_lengths(name: str, length_scale: float, seed: int, num_samples: int | None = None) -> np.ndarray:
    """The dataset's lengths, scaled; the scale keeps the shape and shrinks every sample.

    Lengths are drawn once per (profile, seed), then scaled, so a smaller scale gives the
    same samples in proportion. Scaled lengths are at least 2 tokens (one labelled token).
    """
    if name not in PROFILES:
        raise KeyError(name)
    prof = PROFILES[name]
    raw = prof.sample(num_samples or prof.num_samples, np.random.default_rng(seed))
    return np.maximum(2, np.rint(raw * length_scale)).astype(np.int64)


def profile_max_len(name: str, length_scale: float) -> int:
    """The dataset's longest possible sample after scaling: the default microbatch limit."""
    return max(2, round(PROFILES[name].max_len * length_scale))
